//! Transparent huge pages for the buffers the store writes from: the store's one `madvise`
//! call, in its own file for its `unsafe`.

use std::mem::MaybeUninit;

/// The transparent huge page size on x86-64 and arm64 with 4 KiB base pages.
pub const HUGE_PAGE: usize = 2 << 20;

/// Advises the kernel to back the whole huge pages within `spare` with transparent huge pages
/// (where they are enabled for advised memory). Best effort: a kernel without them, or one
/// that refuses, keeps small pages, which only costs speed.
pub fn advise_huge_pages(spare: &mut [MaybeUninit<u8>]) {
    let at = spare.as_mut_ptr() as usize;
    let start = at.next_multiple_of(HUGE_PAGE);
    let end = (at + spare.len()) / HUGE_PAGE * HUGE_PAGE;
    if end <= start {
        return;
    }
    // SAFETY: `[start, end)` lies within `spare`, memory this process owns and borrows
    // mutably for the call, so no other mapping is touched. `MADV_HUGEPAGE` changes only which
    // physical pages back the range, never its contents or its mapping.
    #[expect(unsafe_code, reason = "madvise takes a raw address range")]
    let r = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    if r != 0 {
        tracing::debug!(
            "transparent huge pages not advised: {}",
            std::io::Error::last_os_error()
        );
    }
}
