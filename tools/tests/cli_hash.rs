//! `orbitkv hash`: engine vectors through the command line, token sources, chain continuation and
//! refusals.

mod common;

use common::orbitkv;

fn seq(n: u64) -> String {
    (0..n).map(|t| t.to_string()).collect::<Vec<_>>().join(",")
}

#[test]
fn vllm_sha256_matches_engine_vector() {
    let r = orbitkv(
        &[
            "hash",
            "vllm",
            "--algo",
            "sha256_cbor",
            "--block-size",
            "16",
            "--tokens",
            &seq(32),
        ],
        &[],
        None,
    )
    .ok();
    assert_eq!(
        r.stdout,
        "dc918a88b139e5afe60b88eda27508d4aee16c10fdc354791efea06206ac0749\n\
         c300ec275d7bf08af8fc63e76cdc0086911bbc7091e03c5cf892553bef84ef0c\n"
    );
    // A trailing partial block gets no hash.
    let partial = orbitkv(
        &[
            "hash",
            "vllm",
            "--algo",
            "sha256_cbor",
            "--block-size",
            "16",
            "--tokens",
            &seq(40),
        ],
        &[],
        None,
    )
    .ok();
    assert_eq!(partial.stdout, r.stdout);
}

#[test]
fn vllm_seed_flag_overrides_pythonhashseed() {
    let args = [
        "hash",
        "vllm",
        "--algo",
        "xxhash_cbor",
        "--block-size",
        "16",
        "--tokens",
        &seq(32),
    ];
    let want = "6efc8ab550d01924572df847da62bd96\ndd4a1f893f4dc3bdf86c85561fed34c4\n";
    assert_eq!(
        orbitkv(&args, &[("PYTHONHASHSEED", "42")], None)
            .ok()
            .stdout,
        want
    );
    let mut with_flag = args.to_vec();
    with_flag.extend(["--seed", "42"]);
    assert_eq!(
        orbitkv(&with_flag, &[("PYTHONHASHSEED", "7")], None)
            .ok()
            .stdout,
        want
    );
    let r = orbitkv(&args, &[], None).refused();
    assert!(r.stderr.contains("seed"), "{}", r.stderr);
}

#[test]
fn vllm_parent_continues_a_chain_and_json() {
    let all = orbitkv(
        &[
            "hash",
            "vllm",
            "--algo",
            "sha256_cbor",
            "--block-size",
            "4",
            "--tokens",
            &seq(12),
            "--json",
        ],
        &[],
        None,
    )
    .ok()
    .json();
    let hashes: Vec<String> = all["hashes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(hashes.len(), 3);
    let tail = orbitkv(
        &[
            "hash",
            "vllm",
            "--algo",
            "sha256_cbor",
            "--block-size",
            "4",
            "--parent",
            &hashes[0],
            "--tokens",
            "4,5,6,7,8,9,10,11",
        ],
        &[],
        None,
    )
    .ok();
    assert_eq!(tail.stdout, format!("{}\n{}\n", hashes[1], hashes[2]));
    // Salt only enters block 0, so it cannot be combined with --parent.
    orbitkv(
        &[
            "hash",
            "vllm",
            "--algo",
            "sha256_cbor",
            "--block-size",
            "4",
            "--parent",
            &hashes[0],
            "--cache-salt",
            "s",
            "--tokens",
            "1,2,3,4",
        ],
        &[],
        None,
    )
    .refused();
    orbitkv(
        &[
            "hash",
            "vllm",
            "--algo",
            "sha256_cbor",
            "--block-size",
            "4",
            "--parent",
            "abcd",
            "--tokens",
            "1",
        ],
        &[],
        None,
    )
    .refused();
}

#[test]
fn salt_and_lora_change_hashes() {
    let base = [
        "hash",
        "vllm",
        "--algo",
        "sha256_cbor",
        "--block-size",
        "4",
        "--tokens",
        "1,2,3,4",
    ];
    let plain = orbitkv(&base, &[], None).ok().stdout;
    let mut salted = base.to_vec();
    salted.extend(["--cache-salt", "tenant"]);
    let salted = orbitkv(&salted, &[], None).ok().stdout;
    let mut lora = base.to_vec();
    lora.extend(["--lora-name", "a", "--lora-path", "/p"]);
    let lora = orbitkv(&lora, &[], None).ok().stdout;
    assert_ne!(plain, salted);
    assert_ne!(plain, lora);
    let mut half = base.to_vec();
    half.extend(["--lora-name", "a"]);
    orbitkv(&half, &[], None).refused();
}

#[test]
fn sglang_pages_whole_sequence_and_namespace() {
    let pages = orbitkv(
        &["hash", "sglang", "--page-size", "4", "--tokens", &seq(16)],
        &[],
        None,
    )
    .ok();
    assert_eq!(pages.stdout.lines().count(), 4);
    assert!(
        pages
            .stdout
            .starts_with("baed642339816affb3fe8719792d0e4ce82f12db72b7373d244eaa65445800fe\n")
    );
    let whole = orbitkv(&["hash", "sglang", "--tokens", "1,2,3,4,5"], &[], None).ok();
    assert_eq!(
        whole.stdout,
        "4f6addc9659d6fb90fe94b6688a79f2a1fa8d36ec43f8f3e1d9b6528c448a384\n"
    );
    let seed = orbitkv(
        &[
            "hash",
            "sglang-namespace",
            "--extra-key",
            "lora-7",
            "--cache-salt",
            "tenant-A",
        ],
        &[],
        None,
    )
    .ok();
    assert_eq!(
        seed.stdout,
        "00d510e103355ac5bdd6d13fd185b47f941b6d680fbb56a2ff1f23cca080ae71\n"
    );
    let namespaced = orbitkv(
        &[
            "hash",
            "sglang",
            "--page-size",
            "4",
            "--extra-key",
            "lora-7",
            "--cache-salt",
            "tenant-A",
            "--tokens",
            &seq(8),
        ],
        &[],
        None,
    )
    .ok();
    let explicit = orbitkv(
        &[
            "hash",
            "sglang",
            "--page-size",
            "4",
            "--prior",
            seed.stdout.trim(),
            "--tokens",
            &seq(8),
        ],
        &[],
        None,
    )
    .ok();
    assert_eq!(namespaced.stdout, explicit.stdout);
    assert!(
        namespaced
            .stdout
            .starts_with("8f510c8ca5982d2586ca3cc1ca8bdc271ac42dbe7a0bc4bef250a671a35693aa")
    );
    orbitkv(&["hash", "sglang-namespace"], &[], None).refused();
}

#[test]
fn token_files_and_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("tokens.txt");
    std::fs::write(&f, "0 1 2 3\n4,5,6,7\n8 9 10 11 12 13 14 15\n").unwrap();
    let from_file = orbitkv(
        &[
            "hash",
            "sglang",
            "--page-size",
            "4",
            "--tokens-file",
            f.to_str().unwrap(),
        ],
        &[],
        None,
    )
    .ok();
    let from_stdin = orbitkv(
        &["hash", "sglang", "--page-size", "4", "--tokens-file", "-"],
        &[],
        Some(&seq(16).replace(',', " ")),
    )
    .ok();
    assert_eq!(from_file.stdout, from_stdin.stdout);
    assert_eq!(from_file.stdout.lines().count(), 4);
}

#[test]
fn bad_arguments_are_refused_not_panicked() {
    for args in [
        vec!["hash", "sglang", "--tokens", "1,-2"],
        vec!["hash", "sglang", "--tokens", "1,x"],
        vec!["hash", "sglang", "--page-size", "0", "--tokens", "1"],
        vec!["hash", "sglang", "--tokens", "9223372036854775808"],
        vec!["hash", "sglang", "--prior", "xyz", "--tokens", "1"],
        vec!["hash", "sglang"],
        vec!["hash", "sglang", "--tokens", "1", "--tokens-file", "-"],
        vec!["hash", "sglang", "--tokens-file", "/no/such/file"],
        vec![
            "hash",
            "vllm",
            "--algo",
            "sha256",
            "--block-size",
            "4",
            "--tokens",
            "1",
        ],
        vec![
            "hash",
            "vllm",
            "--algo",
            "sha256_cbor",
            "--block-size",
            "0",
            "--tokens",
            "1",
        ],
        vec!["hash", "vllm", "--algo", "sha256_cbor", "--tokens", "1"],
        vec!["hash", "tgi", "--tokens", "1"],
    ] {
        orbitkv(&args, &[], None).refused();
    }
}

#[test]
fn non_utf8_pythonhashseed_is_refused() {
    use std::os::unix::ffi::OsStrExt;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orbitkv"))
        .args([
            "hash",
            "vllm",
            "--algo",
            "sha256_cbor",
            "--block-size",
            "1",
            "--tokens",
            "1",
        ])
        .env("PYTHONHASHSEED", std::ffi::OsStr::from_bytes(&[0xff, 0xfe]))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
}
