//! `orbitkv crashtest` for 20 cycles: the real daemon killed with SIGKILL under load from dense
//! and hybrid engines, restarted on the same data directory, every acknowledged page checked on
//! disk and through the daemon, and on disk again after every later kill until evicted (its
//! segment reclaimed, or, under the default record-lru, its frame punched out). Nothing
//! acknowledged is lost, no byte is wrong, no retired page comes back; kills landed
//! mid-publish; eviction and compaction ran. The same, shorter, under a log policy, and with
//! SSD admission. And the harness does notice a loss.

mod common;

use common::daemon::{bin, report};

#[test]
fn twenty_sigkills_lose_no_acknowledged_page_and_serve_no_wrong_byte() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let data = dir.path().join("data");
    let out = bin()
        .env_remove("ORBITKV_LOG")
        .args(["crashtest", "--json", "--cycles", "20", "--seed", "7"])
        .args(["--ssd-bytes", "128MiB", "--compact-interval", "100ms"])
        .arg("--data-dir")
        .arg(&data)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let doc = report(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{doc:#}\n{stderr}");
    let n = |k: &str| {
        doc[k]
            .as_u64()
            .unwrap_or_else(|| panic!("no {k} in {doc:#}"))
    };
    assert_eq!(n("cycles"), 20);
    assert_eq!(n("lost"), 0, "{doc:#}");
    assert_eq!(n("wrong"), 0, "{doc:#}");
    assert_eq!(n("resurrected"), 0, "{doc:#}");
    assert_eq!(n("load_wrong_bytes"), 0, "{doc:#}");
    assert_eq!(n("unproven"), 0, "{doc:#}");
    assert_eq!(n("own_cycle_reclaims"), 0, "{doc:#}");
    assert!(n("acknowledged") > 0, "{doc:#}");
    assert_eq!(
        n("checked"),
        n("acknowledged") + n("retired"),
        "every page is checked on disk: {doc:#}"
    );
    assert!(n("served") > 0, "{doc:#}");
    // Pages are looked up again after later kills; the ones gone were reclaimed.
    assert!(n("rechecked") > n("acknowledged"), "{doc:#}");
    assert!(n("evicted") > 0, "{doc:#}");
    assert!(doc["kills"]["publish"].as_u64() > Some(0), "{doc:#}");
    assert!(n("reclaimed_segments") > 0, "{doc:#}");
    assert!(n("compactions") > 0, "{doc:#}");
    assert!(n("retires") > 0, "{doc:#}");
    assert_eq!(doc["clean_stop"], true, "{doc:#}");
    // A passing run removes its data directory.
    assert!(!data.exists());
}

/// The same under a log policy (whole segments reclaimed, records read copied forward): the
/// default, record-lru, punches records out instead.
#[test]
fn ten_sigkills_under_a_log_policy_lose_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let data = dir.path().join("data");
    let out = bin()
        .env_remove("ORBITKV_LOG")
        .args(["crashtest", "--json", "--cycles", "10", "--seed", "5"])
        .args(["--policy", "fifo-reinsert", "--ssd-bytes", "128MiB"])
        .args(["--compact-interval", "100ms", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let doc = report(&out);
    assert!(out.status.success(), "{doc:#}");
    for k in [
        "lost",
        "wrong",
        "resurrected",
        "load_wrong_bytes",
        "own_cycle_reclaims",
    ] {
        assert_eq!(doc[k].as_u64(), Some(0), "{k}: {doc:#}");
    }
    assert!(doc["evicted"].as_u64() > Some(0), "{doc:#}");
    assert!(doc["reclaimed_segments"].as_u64() > Some(0), "{doc:#}");
}

/// The same with adaptive SSD admission: pages the daemon holds back in DRAM are answered
/// `held`, never acknowledged, and lost to a kill by design; nothing acknowledged is lost, and
/// nothing wrong is served. Each restart forgets what admission measured, so how many pages a
/// run holds back depends on how far each cycle gets: seeds are run until one holds some back
/// (at most three), and every run must lose nothing.
#[test]
fn sigkills_with_admission_lose_nothing_acknowledged() {
    let mut held = 0;
    for seed in ["4", "5", "2"] {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let data = dir.path().join("data");
        let out = bin()
            .env_remove("ORBITKV_LOG")
            .args(["crashtest", "--json", "--cycles", "60", "--seed", seed])
            .args(["--admission", "--ssd-bytes", "16MiB", "--data-dir"])
            .arg(&data)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let doc = report(&out);
        assert!(out.status.success(), "{doc:#}");
        for k in ["lost", "wrong", "resurrected", "load_wrong_bytes"] {
            assert_eq!(doc[k].as_u64(), Some(0), "{k}: {doc:#}");
        }
        assert!(doc["acknowledged"].as_u64() > Some(0), "{doc:#}");
        held = doc["held_pages"].as_u64().unwrap_or(0);
        if held > 0 {
            break;
        }
    }
    assert!(held > 0, "no run held a page back");
}

/// The harness itself: segment files deleted behind the store's back after each kill (its
/// hidden self-test flag) must show as lost pages, exit 3.
#[test]
fn the_harness_reports_pages_deleted_behind_the_stores_back_as_lost() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let data = dir.path().join("data");
    let out = bin()
        .env_remove("ORBITKV_LOG")
        .args(["crashtest", "--json", "--cycles", "2", "--seed", "3"])
        .args(["--ssd-bytes", "64MiB", "--sabotage", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let doc = report(&out);
    assert_eq!(out.status.code(), Some(3), "{doc:#}");
    assert!(doc["lost"].as_u64() > Some(0), "{doc:#}");
    let problems = doc["problems"].to_string();
    assert!(problems.contains("missing on disk"), "{doc:#}");
    // A failing run keeps its data directory.
    assert!(data.exists());
}

#[test]
fn a_data_directory_in_use_is_refused() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.path().join("something"), b"x").unwrap_or_else(|e| panic!("{e}"));
    let out = bin()
        .args(["crashtest", "--cycles", "1", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not empty"), "{stderr}");
    let out = bin()
        .args(["crashtest", "--cycles", "1", "--ssd-bytes", "64MiB"])
        .args(["--cycle-bytes", "32MiB", "--data-dir"])
        .arg(dir.path().join("new"))
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2));
}
