//! The offline store commands as an operator scripts them: `fsck` exit codes (0 clean, 1
//! repaired, 4 left, 8 operational), `--repair` on a damaged store, `inspect --json`, `compact`,
//! `retire`.

use std::path::Path;
use std::process::{Command, Output};

fn orbitkv(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_orbitkv"))
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .env_remove("ORBITKV_LOG")
        .output()
        .unwrap_or_else(|e| panic!("run orbitkv: {e}"))
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

#[test]
fn fsck_finds_repairs_and_reports_with_e2fsck_exit_codes() {
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dir = root.path().join("store");
    let w = orbitkv(
        &[
            "bench", "write", "--count", "40", "--seed", "5", "--size", "20KiB",
        ],
        &dir,
    );
    assert_eq!(code(&w), 0, "{}", String::from_utf8_lossy(&w.stderr));
    assert_eq!(code(&orbitkv(&["fsck"], &dir)), 0);

    // Damage one record's payload in the first segment.
    let seg = dir.join("segments/00000001.seg");
    let mut b = std::fs::read(&seg).unwrap_or_else(|e| panic!("{e}"));
    b[4096 + 256 + 1000] ^= 0x10;
    std::fs::write(&seg, &b).unwrap_or_else(|e| panic!("{e}"));

    let found = orbitkv(&["fsck", "--json"], &dir);
    assert_eq!(code(&found), 4);
    let v = json(&found);
    assert_eq!(v["before"]["clean"], false);
    assert!(
        v["before"]["problems"][0]
            .as_str()
            .unwrap_or("")
            .contains("bad record")
    );

    let fixed = orbitkv(&["fsck", "--repair", "--json"], &dir);
    assert_eq!(
        code(&fixed),
        1,
        "{}",
        String::from_utf8_lossy(&fixed.stderr)
    );
    assert_eq!(json(&fixed)["after"]["clean"], true);
    assert_eq!(code(&orbitkv(&["fsck"], &dir)), 0);

    // Exactly one bundle is gone; none comes back with different bytes.
    let v = orbitkv(
        &["bench", "verify", "--json", "--count", "40", "--seed", "5"],
        &dir,
    );
    assert_eq!(code(&v), 0);
    assert_eq!(
        String::from_utf8_lossy(&v.stdout).trim(),
        r#"{"found":39,"missing":1,"mismatched":0}"#
    );
}

#[test]
fn fsck_on_a_missing_store_is_an_operational_error() {
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let o = orbitkv(&["fsck"], &root.path().join("nothing-here"));
    assert_eq!(code(&o), 8);
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
}

#[test]
fn inspect_compact_and_retire() {
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dir = root.path().join("store");
    for seed in [1, 1] {
        // The same bundles twice: the first copies become dead.
        let w = orbitkv(
            &[
                "bench",
                "write",
                "--count",
                "30",
                "--seed",
                &seed.to_string(),
            ],
            &dir,
        );
        assert_eq!(code(&w), 0);
    }
    let before = json(&orbitkv(&["inspect", "--json"], &dir));
    let ns = before["namespaces"][0]["namespace"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    assert_eq!(before["namespaces"][0]["live_records"], 30);
    assert_eq!(before["namespaces"][0]["model"], "orbitkv-bench");
    let c = orbitkv(&["compact", "--json", "--threshold", "0.9"], &dir);
    assert_eq!(code(&c), 0, "{}", String::from_utf8_lossy(&c.stderr));
    let cj = json(&c);
    assert_eq!(cj["dropped_dead"], 30, "{cj}");
    let v = orbitkv(
        &["bench", "verify", "--json", "--count", "30", "--seed", "1"],
        &dir,
    );
    assert_eq!(
        String::from_utf8_lossy(&v.stdout).trim(),
        r#"{"found":30,"missing":0,"mismatched":0}"#
    );

    let r = orbitkv(&["retire", "--json", "--namespace", &ns], &dir);
    assert_eq!(code(&r), 0, "{}", String::from_utf8_lossy(&r.stderr));
    let v = orbitkv(
        &["bench", "verify", "--json", "--count", "30", "--seed", "1"],
        &dir,
    );
    assert_eq!(
        String::from_utf8_lossy(&v.stdout).trim(),
        r#"{"found":0,"missing":30,"mismatched":0}"#
    );
    let after = json(&orbitkv(&["inspect", "--json"], &dir));
    assert!(after["namespaces"][0]["retired_below"].is_u64());
    assert_eq!(code(&orbitkv(&["retire", "--namespace", "zz"], &dir)), 2);
    assert_eq!(code(&orbitkv(&["fsck"], &dir)), 0);
}

/// `orbitkv ARGS --data-dir DIR` with DIR bind-mounted read-only over itself (as a file system
/// remounted read-only after disk errors), in a user and mount namespace of its own; `None`
/// where this machine gives none.
fn on_read_only_mount(args: &str, dir: &Path) -> Option<Output> {
    let probe = Command::new("unshare").args(["-rm", "true"]).output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIPPED: no user and mount namespaces (unshare -rm) for a read-only mount");
        return None;
    }
    let script = format!(
        "mount --bind \"$1\" \"$1\" && mount -o remount,ro,bind \"$1\" && exec \"$2\" {args} --data-dir \"$1\""
    );
    Some(
        Command::new("unshare")
            .args(["-rm", "sh", "-c", &script, "sh"])
            .arg(dir)
            .arg(env!("CARGO_BIN_EXE_orbitkv"))
            .env_remove("ORBITKV_LOG")
            .output()
            .unwrap_or_else(|e| panic!("run unshare: {e}")),
    )
}

#[test]
fn fsck_and_inspect_read_a_store_on_a_read_only_file_system() {
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dir = root.path().join("store");
    let w = orbitkv(
        &[
            "bench", "write", "--count", "12", "--seed", "3", "--size", "20KiB",
        ],
        &dir,
    );
    assert_eq!(code(&w), 0, "{}", String::from_utf8_lossy(&w.stderr));
    // With the lock file a daemon leaves, and without one.
    for lock_file in [true, false] {
        if !lock_file {
            std::fs::remove_file(dir.join("LOCK")).unwrap_or_else(|e| panic!("{e}"));
        }
        let Some(f) = on_read_only_mount("fsck --json", &dir) else {
            return;
        };
        assert_eq!(code(&f), 0, "{}", String::from_utf8_lossy(&f.stderr));
        assert_eq!(json(&f)["before"]["clean"], true);
        let Some(i) = on_read_only_mount("inspect --json", &dir) else {
            return;
        };
        assert_eq!(code(&i), 0, "{}", String::from_utf8_lossy(&i.stderr));
        assert_eq!(
            json(&i)["indexed_records"],
            12,
            "{}",
            String::from_utf8_lossy(&i.stdout)
        );
    }
}
