// I/O paths only some machines have (O_DIRECT in the temp directory, io_uring): a test that
// cannot run one says so on a line starting `SKIPPED:`, or fails where the environment requires
// the path (`.ci/run` requires each one its machine has). Shared with the store's unit tests
// through `include!`, so it names no crate and has no inner attributes or `//!` docs.

/// Set to `1`: a test that would skip the `O_DIRECT` path fails instead.
pub const REQUIRE_DIRECT: &str = "ORBITKV_REQUIRE_DIRECT";
/// Set to `1`: a test that would skip the io_uring path fails instead.
pub const REQUIRE_URING: &str = "ORBITKV_REQUIRE_URING";

/// Reports that the running test skips `what` because of `why`: a panic when the variable
/// `require` is `1`, else a `SKIPPED:` line on stderr, written past the test harness's capture so
/// that a passing run shows it too.
pub fn skipped(require: &str, what: &str, why: &dyn std::fmt::Display) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("test");
    if std::env::var_os(require).is_some_and(|v| v == "1") {
        panic!("{test}: {what} is unavailable here ({why}), and {require}=1 requires it");
    }
    let line = format!("SKIPPED: {test}: {what} is unavailable here ({why}); {require}=1 fails\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
}

/// `probe`'s value, or `None` after reporting the skip of `what` as [`skipped`] does.
pub fn or_skip<T, E: std::fmt::Display>(
    probe: Result<T, E>,
    require: &str,
    what: &str,
) -> Option<T> {
    match probe {
        Ok(v) => Some(v),
        Err(e) => {
            skipped(require, what, &e);
            None
        }
    }
}
