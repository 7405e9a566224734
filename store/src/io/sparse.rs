//! Sparse-file calls std has no wrapper for: punching a hole, and listing a file's holes.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// `fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)` over `offset..offset + len`.
#[expect(unsafe_code, reason = "fallocate has no safe wrapper in std")]
pub(crate) fn punch_hole(f: &File, offset: u64, len: u64) -> io::Result<()> {
    let to_off = |v: u64| libc::off_t::try_from(v).map_err(|_| io::Error::other("range too large"));
    let (offset, len) = (to_off(offset)?, to_off(len)?);
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate only reads its integer arguments; the descriptor is open (borrowed from
    // `f`) for the duration of the call.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset, len) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `lseek(fd, offset, whence)`; `None` where the kernel answers ENXIO (no such data or hole
/// past `offset`).
#[expect(
    unsafe_code,
    reason = "lseek with SEEK_DATA/SEEK_HOLE has no safe wrapper in std"
)]
fn seek(f: &File, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    let offset = libc::off_t::try_from(offset).map_err(|_| io::Error::other("offset too large"))?;
    // SAFETY: lseek only reads its integer arguments and moves the descriptor's file position,
    // which nothing here uses (every read and write is positioned); the descriptor is open
    // (borrowed from `f`) for the duration of the call.
    let r = unsafe { libc::lseek(f.as_raw_fd(), offset, whence) };
    if r >= 0 {
        return Ok(u64::try_from(r).ok());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENXIO) {
        Ok(None)
    } else {
        Err(e)
    }
}

/// The holes of `f` before its end, in order (`SEEK_HOLE`/`SEEK_DATA`). A file system that
/// cannot tell reports none.
pub(crate) fn holes(f: &File) -> io::Result<Vec<(u64, u64)>> {
    let size = f.metadata()?.len();
    let mut out = Vec::new();
    let mut at = 0;
    while at < size {
        let Some(hole) = seek(f, at, libc::SEEK_HOLE)? else {
            break;
        };
        if hole >= size {
            break;
        }
        let data = seek(f, hole, libc::SEEK_DATA)?.unwrap_or(size).min(size);
        if data <= hole {
            break;
        }
        out.push((hole, data));
        at = data;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn a_punched_range_reads_as_zeros_and_is_listed_as_a_hole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let f = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        f.write_all_at(&vec![7u8; 64 << 10], 0).unwrap();
        f.sync_all().unwrap();
        assert_eq!(holes(&f).unwrap(), Vec::new());
        match punch_hole(&f, 16 << 10, 8 << 10) {
            Ok(()) => {}
            // A file system without holes: nothing more to check.
            Err(e) if e.kind() == io::ErrorKind::Unsupported => return,
            Err(e) => panic!("punch: {e}"),
        }
        let mut buf = vec![1u8; 64 << 10];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert!(buf[..16 << 10].iter().all(|b| *b == 7));
        assert!(buf[16 << 10..24 << 10].iter().all(|b| *b == 0));
        assert!(buf[24 << 10..].iter().all(|b| *b == 7));
        assert_eq!(f.metadata().unwrap().len(), 64 << 10, "the size is kept");
        let h = holes(&f).unwrap();
        // A file system may report the hole only once its blocks are freed, page-aligned.
        assert!(
            h.is_empty() || h == vec![(16 << 10, 24 << 10)],
            "holes: {h:?}"
        );
    }
}
