//! `orbitkv identity`: output forms, defaults reporting, environment variables, hub snapshots and
//! refusals with exit code 2.

mod common;

use std::fs;
use std::os::unix::fs::symlink;

use std::path::PathBuf;

use common::{Run, orbitkv};

fn tiny_model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/tiny-model")
}

trait FirstLine {
    fn first_line(&self) -> &str;
}

impl FirstLine for Run {
    fn first_line(&self) -> &str {
        self.stdout.lines().next().unwrap_or("")
    }
}

/// The tiny model's identity under the inspection defaults. It changes only when the identity
/// encoding, the fingerprint format or the test model changes — each needs a version bump.
const TINY_IDENTITY: &str = "v1:4bc09d8edfde15b2c99b859c6f6ed9a824ad5399bde1ef7de8cfcd1bfc5feb38";

fn tiny() -> String {
    tiny_model().display().to_string()
}

#[test]
fn prints_identity_first_and_says_which_defaults_were_used() {
    let r = orbitkv(&["identity", &tiny()], &[], None).ok();
    assert_eq!(r.first_line(), TINY_IDENTITY);
    assert!(r.stdout.contains("defaults used"));
    assert!(r.stdout.contains("--engine"));

    let explicit = orbitkv(
        &[
            "identity",
            &tiny(),
            "--engine",
            "vllm@0.33.0",
            "--dtype",
            "bfloat16",
            "--kv-dtype",
            "bfloat16",
            "--quantization",
            "none",
            "--attention-backend",
            "FLASH_ATTN",
            "--cache-variant",
            "paged",
        ],
        &[],
        None,
    )
    .ok();
    assert_eq!(explicit.first_line(), TINY_IDENTITY);
    assert!(!explicit.stdout.contains("defaults used"));

    let fp8 = orbitkv(&["identity", &tiny(), "--kv-dtype", "fp8_e4m3"], &[], None).ok();
    assert_ne!(fp8.first_line(), TINY_IDENTITY);
    let sglang = orbitkv(
        &["identity", &tiny(), "--engine", "sglang@0.5.23"],
        &[],
        None,
    )
    .ok();
    assert_ne!(sglang.first_line(), TINY_IDENTITY);
}

#[test]
fn json_is_one_document_with_every_field() {
    let r = orbitkv(&["identity", &tiny(), "--json"], &[], None).ok();
    let v = r.json();
    assert_eq!(v["identity"], TINY_IDENTITY);
    assert_eq!(v["model_digest"]["kind"], "artifacts");
    let files: Vec<&str> = v["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        files,
        ["config.json", "generation_config.json", "model.safetensors"]
    );
    let names: Vec<&str> = v["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(names[0], "model.artifacts_digest");
    assert!(names.contains(&"model.config") && names.contains(&"cache.variant"));
    assert_eq!(v["defaults_used"].as_array().unwrap().len(), 6);
}

#[test]
fn relocated_copy_keeps_identity() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("models/elsewhere");
    fs::create_dir_all(&copy).unwrap();
    for f in fs::read_dir(tiny_model()).unwrap() {
        let f = f.unwrap();
        fs::copy(f.path(), copy.join(f.file_name())).unwrap();
    }
    fs::write(copy.join("README.md"), "a model card").unwrap();
    let r = orbitkv(&["identity", copy.to_str().unwrap()], &[], None).ok();
    assert_eq!(r.first_line(), TINY_IDENTITY);
}

#[test]
fn operator_fingerprint_and_scope_variables() {
    let fp = "0".repeat(64);
    let r = orbitkv(
        &["identity", &tiny(), "--json"],
        &[
            ("ORBITKV_MODEL_FINGERPRINT", &fp),
            ("ORBITKV_CACHE_SCOPE", "tenant-a"),
        ],
        None,
    )
    .ok();
    let v = r.json();
    assert_eq!(v["model_digest"]["kind"], "operator");
    assert_eq!(v["hashed_bytes"], 0);
    assert_eq!(v["cache_scope"], "tenant-a");
    assert_ne!(v["identity"], TINY_IDENTITY);

    let bad = orbitkv(
        &["identity", &tiny()],
        &[("ORBITKV_MODEL_FINGERPRINT", "ABC")],
        None,
    )
    .refused();
    assert!(
        bad.stderr.contains("ORBITKV_MODEL_FINGERPRINT"),
        "{}",
        bad.stderr
    );
    assert!(bad.stdout.is_empty());
    let bad = orbitkv(
        &["identity", &tiny()],
        &[("ORBITKV_CACHE_SCOPE", "a b")],
        None,
    )
    .refused();
    assert!(bad.stderr.contains("ORBITKV_CACHE_SCOPE"), "{}", bad.stderr);
}

#[test]
fn hub_snapshot_from_local_cache() {
    let cache = tempfile::tempdir().unwrap();
    let rev = "89abcdef0123456789abcdef0123456789abcdef";
    let repo = cache.path().join("models--orbitkv--tiny-model");
    let snap = repo.join("snapshots").join(rev);
    fs::create_dir_all(repo.join("blobs")).unwrap();
    fs::create_dir_all(&snap).unwrap();
    for f in fs::read_dir(tiny_model()).unwrap() {
        let f = f.unwrap();
        let blob = format!("blob-{}", f.file_name().to_str().unwrap());
        fs::copy(f.path(), repo.join("blobs").join(&blob)).unwrap();
        symlink(format!("../../blobs/{blob}"), snap.join(f.file_name())).unwrap();
    }
    let cache_arg = cache.path().to_str().unwrap();
    let r = orbitkv(
        &[
            "identity",
            "orbitkv/tiny-model",
            "--revision",
            rev,
            "--hub-cache",
            cache_arg,
        ],
        &[],
        None,
    )
    .ok();
    assert_eq!(r.first_line(), TINY_IDENTITY);
    // HF_HUB_CACHE is honoured too.
    let r = orbitkv(
        &["identity", "orbitkv/tiny-model", "--revision", rev],
        &[("HF_HUB_CACHE", cache_arg)],
        None,
    )
    .ok();
    assert_eq!(r.first_line(), TINY_IDENTITY);
    for bad_rev in ["main", "v1.0", &rev[..7], &rev.to_uppercase()] {
        orbitkv(
            &[
                "identity",
                "orbitkv/tiny-model",
                "--revision",
                bad_rev,
                "--hub-cache",
                cache_arg,
            ],
            &[],
            None,
        )
        .refused();
    }
    orbitkv(
        &["identity", "orbitkv/tiny-model", "--hub-cache", cache_arg],
        &[],
        None,
    )
    .refused();
    let missing = "0000000000000000000000000000000000000000";
    let r = orbitkv(
        &[
            "identity",
            "orbitkv/tiny-model",
            "--revision",
            missing,
            "--hub-cache",
            cache_arg,
        ],
        &[],
        None,
    )
    .refused();
    assert!(r.stderr.contains("nothing is downloaded"), "{}", r.stderr);
}

#[test]
fn refusals_exit_2_with_one_line() {
    for args in [
        vec!["identity"],
        vec!["identity", "/no/such/model/dir"],
        vec!["identity", "not a model"],
        vec!["identity", "TINY", "--engine", "tgi@1.0"],
        vec!["identity", "TINY", "--engine", "vllm"],
        vec!["identity", "TINY", "--dtype", "b float"],
        vec!["identity", "TINY", "--threads", "0"],
        vec![
            "identity",
            "TINY",
            "--revision",
            "89abcdef0123456789abcdef0123456789abcdef",
        ],
        vec!["no-such-command"],
    ] {
        let tiny = tiny();
        let args: Vec<&str> = args
            .iter()
            .map(|a| if *a == "TINY" { tiny.as_str() } else { a })
            .collect();
        orbitkv(&args, &[], None).refused();
    }
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("model.safetensors"), b"x").unwrap();
    let r = orbitkv(&["identity", dir.path().to_str().unwrap()], &[], None).refused();
    assert!(r.stderr.contains("config.json"), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1);
}
