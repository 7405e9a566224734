//! `orbitkv serve` and `orbitkv engine-sim` as real processes: a second instance of the same
//! computation (same model content, settings, layout, scope) is served everything the first
//! published, byte-exact; an instance differing in any single identity field — a weights byte,
//! a tokenizer file, dtype, KV dtype, block size, parallel shape, cache scope, engine release,
//! page layout — gets zero hits.

mod common;

use std::path::Path;

use common::daemon::{Serve, model_copy};

/// A copy of `model` with `file` changed by `change`.
fn variant(model: &Path, to: &Path, file: &str, change: impl FnOnce(&mut Vec<u8>)) -> String {
    let dir = model_copy(to);
    for e in std::fs::read_dir(model).unwrap_or_else(|e| panic!("{e}")) {
        let e = e.unwrap_or_else(|e| panic!("{e}"));
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap_or_else(|e| panic!("{e}"));
    }
    let path = dir.join(file);
    let mut bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{e}"));
    change(&mut bytes);
    std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{e}"));
    dir.display().to_string()
}

fn u(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"))
}

#[test]
fn only_the_same_computation_shares_hits() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let model = model_copy(&dir.path().join("model"));
    let m = model.display().to_string();
    let serve = Serve::start(&dir.path().join("data"));
    let run = |extra: &[&str]| {
        let mut args = vec!["--seed", "7", "--requests", "24"];
        if !extra.contains(&"--model-dir") {
            args.extend(["--model-dir", m.as_str()]);
        }
        args.extend_from_slice(extra);
        let (code, r) = serve.engine_sim(&args);
        assert_eq!(code, Some(0), "{extra:?}: {r}");
        assert_eq!(
            (u(&r, "errors"), u(&r, "wrong_bytes")),
            (0, 0),
            "{extra:?}: {r}"
        );
        assert_eq!(u(&r, "unproven"), 0, "{extra:?}: {r}");
        r
    };
    let first = run(&["--instance", "publisher"]);
    assert!(u(&first, "published_pages") > 0, "{first}");
    // The same computation: everything it asks for was published, and comes back byte-exact.
    let same = run(&["--instance", "same", "--consumer"]);
    assert!(u(&same, "hits") > 0, "{same}");
    assert_eq!(
        u(&same, "proven_tokens"),
        u(&same, "requested_tokens"),
        "{same}"
    );
    assert!(u(&same, "loaded_pages") > 0);
    let weights = variant(
        &model,
        &dir.path().join("weights"),
        "model.safetensors",
        |b| {
            let last = b.len() - 1;
            b[last] ^= 1;
        },
    );
    let tokenizer = variant(&model, &dir.path().join("tok"), "tokenizer.json", |b| {
        let i = b.iter().position(|c| *c == b'a').unwrap_or(0);
        b[i] = b'c';
    });
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("a weights byte", vec!["--model-dir", weights.as_str()]),
        ("a tokenizer file", vec!["--model-dir", tokenizer.as_str()]),
        ("dtype", vec!["--dtype", "float16"]),
        ("KV dtype", vec!["--kv-dtype", "fp8_e4m3"]),
        ("block size", vec!["--block-size", "32"]),
        ("parallel shape", vec!["--ranks", "2"]),
        ("cache scope", vec!["--scope", "tenant-b"]),
        ("engine release", vec!["--engine", "vllm@0.34.0"]),
        ("page layout", vec!["--head-size", "8"]),
    ];
    for (what, change) in cases {
        let mut extra = vec!["--instance", what, "--consumer"];
        extra.extend(change);
        let r = run(&extra);
        assert_eq!(u(&r, "hits"), 0, "{what}: {r}");
        assert_eq!(u(&r, "loaded_pages"), 0, "{what}: {r}");
    }
    // The daemon counted the misses by reason.
    let text = serve.scrape();
    let metric = |name: &str| common::daemon::metric(&text, name);
    assert!(metric("orbitkv_misses_total{reason=\"gap\"}") > 0, "{text}");
    // Every acquire, load and publish was timed; loads read the store (from its DRAM tier).
    for kind in [
        "acquire",
        "load",
        "publish_copied",
        "publish_durable",
        "release",
    ] {
        let n = metric(&format!("orbitkv_request_seconds_count{{kind=\"{kind}\"}}"));
        assert!(n > 0, "{kind}: {text}");
    }
    assert!(
        metric("orbitkv_store_gets_total") >= u(&same, "loaded_pages"),
        "{text}"
    );
    assert!(metric("orbitkv_store_dram_hits_total") > 0, "{text}");
    // Bytes per direction: what the engines loaded (the publisher hit its own earlier
    // requests too) and published.
    assert_eq!(
        metric("orbitkv_loaded_bytes_total"),
        u(&first, "loaded_bytes") + u(&same, "loaded_bytes"),
        "{text}"
    );
    assert_eq!(
        metric("orbitkv_published_bytes_total"),
        u(&first, "published_bytes"),
        "{text}"
    );
    let (status, stderr) = serve.stop();
    assert!(status.success(), "{stderr}");
}
