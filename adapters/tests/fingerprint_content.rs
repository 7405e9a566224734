//! The model fingerprint is by content: relocation keeps it, an equal-sized equal-timestamp
//! replacement changes it, links are followed, broken links and loops are refused, the ignore list
//! is honoured, and the digest does not depend on the thread count.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, SystemTime};

use orbitkv_adapters::Error;
use orbitkv_adapters::identity::fingerprint::{
    self, CHUNK_SIZE, FingerprintOptions, bytes_digest, fingerprint_dir,
};

fn write(dir: &Path, rel: &str, data: &[u8]) {
    let p = dir.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, data).unwrap();
}

fn model(dir: &Path) {
    write(dir, "config.json", br#"{"model_type":"llama"}"#);
    write(dir, "model.safetensors", &vec![7u8; 1000]);
    write(dir, "tokenizer.json", b"{}");
    write(dir, "modeling_custom.py", b"print(1)");
    write(dir, "sub/processor_config.json", b"{}");
}

fn digest(dir: &Path, threads: usize) -> [u8; 32] {
    fingerprint_dir(
        dir,
        &FingerprintOptions {
            threads,
            progress: None,
        },
    )
    .unwrap()
    .digest
}

#[test]
fn relocation_keeps_the_digest() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    model(a.path());
    model(&b.path().join("elsewhere/deeper"));
    assert_eq!(
        digest(a.path(), 1),
        digest(&b.path().join("elsewhere/deeper"), 2)
    );
}

#[test]
fn equal_size_equal_mtime_replacement_changes_the_digest() {
    let a = tempfile::tempdir().unwrap();
    model(a.path());
    let weights = a.path().join("model.safetensors");
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    fs::File::options()
        .write(true)
        .open(&weights)
        .unwrap()
        .set_modified(t)
        .unwrap();
    let before = digest(a.path(), 2);
    let mut data = fs::read(&weights).unwrap();
    data[500] ^= 1;
    fs::write(&weights, &data).unwrap();
    fs::File::options()
        .write(true)
        .open(&weights)
        .unwrap()
        .set_modified(t)
        .unwrap();
    assert_eq!(fs::metadata(&weights).unwrap().modified().unwrap(), t);
    assert_ne!(before, digest(a.path(), 2));
}

#[test]
fn any_file_addition_rename_or_edit_changes_the_digest() {
    let a = tempfile::tempdir().unwrap();
    model(a.path());
    let base = digest(a.path(), 2);
    write(a.path(), "extra.bin", b"");
    let added = digest(a.path(), 2);
    assert_ne!(base, added);
    fs::rename(a.path().join("extra.bin"), a.path().join("extra2.bin")).unwrap();
    assert_ne!(added, digest(a.path(), 2));
}

#[test]
fn ignore_list_is_honoured() {
    let a = tempfile::tempdir().unwrap();
    model(a.path());
    let base = digest(a.path(), 1);
    write(a.path(), "README.md", b"docs");
    write(a.path(), "LICENSE", b"text");
    write(a.path(), "sub/license.txt", b"text");
    write(a.path(), ".gitattributes", b"*.bin lfs");
    write(a.path(), ".git/objects/x", b"vcs");
    write(a.path(), ".cache/huggingface/download/x.lock", b"lock");
    write(
        a.path(),
        "__pycache__/modeling_custom.cpython-311.pyc",
        b"pyc",
    );
    assert_eq!(base, digest(a.path(), 1));
}

#[test]
fn hub_style_symlinks_are_followed_to_content() {
    let root = tempfile::tempdir().unwrap();
    let blobs = root.path().join("blobs");
    let snap = root.path().join("snapshots/rev");
    fs::create_dir_all(&blobs).unwrap();
    fs::create_dir_all(snap.join("sub")).unwrap();
    let plain = tempfile::tempdir().unwrap();
    model(plain.path());
    for rel in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "modeling_custom.py",
        "sub/processor_config.json",
    ] {
        let blob = blobs.join(rel.replace('/', "_"));
        fs::copy(plain.path().join(rel), &blob).unwrap();
        let depth = rel.matches('/').count();
        let target = format!(
            "{}../../blobs/{}",
            "../".repeat(depth),
            rel.replace('/', "_")
        );
        symlink(target, snap.join(rel)).unwrap();
    }
    assert_eq!(digest(&snap, 2), digest(plain.path(), 2));
}

#[test]
fn dangling_links_and_loops_are_refused() {
    let a = tempfile::tempdir().unwrap();
    model(a.path());
    symlink("missing.bin", a.path().join("broken.bin")).unwrap();
    assert!(matches!(
        fingerprint_dir(a.path(), &FingerprintOptions::default()),
        Err(Error::DanglingLink { .. })
    ));
    fs::remove_file(a.path().join("broken.bin")).unwrap();

    symlink("self", a.path().join("self")).unwrap();
    assert!(matches!(
        fingerprint_dir(a.path(), &FingerprintOptions::default()),
        Err(Error::LinkLoop { .. })
    ));
    fs::remove_file(a.path().join("self")).unwrap();

    symlink(a.path(), a.path().join("sub/up")).unwrap();
    assert!(matches!(
        fingerprint_dir(a.path(), &FingerprintOptions::default()),
        Err(Error::LinkLoop { .. })
    ));
}

#[test]
fn empty_directory_is_refused() {
    let a = tempfile::tempdir().unwrap();
    write(a.path(), "README.md", b"only docs");
    assert!(matches!(
        fingerprint_dir(a.path(), &FingerprintOptions::default()),
        Err(Error::EmptyModelDir { .. })
    ));
}

#[test]
fn chunk_tree_is_independent_of_threads_and_matches_reference() {
    let a = tempfile::tempdir().unwrap();
    // Sizes around the chunk boundary, and an empty file.
    let sizes = [
        0,
        1,
        CHUNK_SIZE - 1,
        CHUNK_SIZE,
        CHUNK_SIZE + 1,
        2 * CHUNK_SIZE + 17,
    ];
    let mut expected = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        let data: Vec<u8> = (0..*size).map(|j| (j as u8) ^ (i as u8)).collect();
        let name = format!("w{i}.bin");
        write(a.path(), &name, &data);
        expected.push((name, *size, bytes_digest(&data)));
    }
    let one = fingerprint_dir(
        a.path(),
        &FingerprintOptions {
            threads: 1,
            progress: None,
        },
    )
    .unwrap();
    for threads in [2, 3, 8] {
        assert_eq!(digest(a.path(), threads), one.digest);
    }
    let got: Vec<_> = one
        .files
        .iter()
        .map(|f| (f.path.clone(), f.size, f.digest))
        .collect();
    assert_eq!(got, expected);
    // The tree root commits to the size: equal leaves, different length, different digest.
    assert_ne!(bytes_digest(&[]), bytes_digest(&[0]));
}

#[test]
fn progress_reports_every_byte() {
    use std::sync::atomic::{AtomicU64, Ordering};
    #[derive(Default)]
    struct Seen {
        total: AtomicU64,
        done: AtomicU64,
    }
    impl fingerprint::Progress for Seen {
        fn start(&self, total: u64, _files: usize) {
            self.total.store(total, Ordering::Relaxed);
        }
        fn advance(&self, n: u64) {
            self.done.fetch_add(n, Ordering::Relaxed);
        }
    }
    let a = tempfile::tempdir().unwrap();
    model(a.path());
    write(a.path(), "big.bin", &vec![1u8; (CHUNK_SIZE + 5) as usize]);
    let seen = Seen::default();
    let fp = fingerprint_dir(
        a.path(),
        &FingerprintOptions {
            threads: 2,
            progress: Some(&seen),
        },
    )
    .unwrap();
    assert_eq!(seen.done.load(Ordering::Relaxed), fp.total_bytes);
    assert_eq!(seen.total.load(Ordering::Relaxed), fp.total_bytes);
}

/// Pins the documented format (docs/format.md, "Model directory digest") with digests computed
/// from the document by an independent implementation, not by this crate.
#[test]
fn directory_digest_matches_the_documented_format() {
    let a = tempfile::tempdir().unwrap();
    let big: Vec<u8> = (0..CHUNK_SIZE + 5)
        .map(|i| ((i * 7 + 3) % 256) as u8)
        .collect();
    write(a.path(), "a.bin", &big);
    write(a.path(), "empty.bin", b"");
    write(a.path(), "sub/c.json", br#"{"x":1}"#);
    write(a.path(), "README.md", b"ignored");
    write(a.path(), ".git", b"gitdir: /somewhere/else");
    write(a.path(), ".huggingface/download/a.bin.metadata", b"ignored");
    let fp = fingerprint_dir(a.path(), &FingerprintOptions::default()).unwrap();
    let hex = |d: &[u8; 32]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
    assert_eq!(
        hex(&fp.files[0].digest),
        "45accbd3017c735e08425dd10e299b6240cf72d91490ca292b58b66fde56d5e5"
    );
    assert_eq!(
        hex(&fp.digest),
        "c01dabfc22daaa3468995fb16f48cf50c0fceb136710fa5f3e532d768aecf031"
    );
}
