//! Every engine-produced vector (shared reference file and the generated file) must be matched bit
//! for bit; every input the engines refuse must be refused.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use orbitkv_state::engine_hash::{sglang, vllm};
use orbitkv_state::hex;
use serde_json::Value;

fn load(name: &str) -> Value {
    let path = format!("{}/tests/vectors/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn tokens(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

fn opt_str(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn hex32(s: &str) -> [u8; 32] {
    hex::decode_array(s, "vector").unwrap()
}

fn vllm_extras(case: &Value) -> vllm::RequestExtras {
    let lora = case
        .get("lora")
        .filter(|l| !l.is_null())
        .map(|l| (opt_str(l, "name").unwrap(), opt_str(l, "path").unwrap()));
    let mm = case
        .get("mm")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .map(|m| vllm::MmItem {
                    identifier: opt_str(m, "identifier").unwrap(),
                    offset: m["offset"].as_u64().unwrap(),
                    length: m["length"].as_u64().unwrap(),
                })
                .collect()
        })
        .unwrap_or_default();
    let prompt_embeds = case
        .get("prompt_embeds_block_digests_hex")
        .and_then(Value::as_array)
        .map(|d| {
            d.iter()
                .map(|h| hex::decode(h.as_str().unwrap(), "digest").unwrap())
                .collect()
        });
    vllm::RequestExtras {
        lora,
        cache_salt: opt_str(case, "cache_salt"),
        mm,
        prompt_embeds,
    }
}

/// The seed field is `seed` in the generated file and `PYTHONHASHSEED` in the shared one.
fn vllm_seed(case: &Value) -> Option<String> {
    opt_str(case, "seed").or_else(|| opt_str(case, "PYTHONHASHSEED"))
}

fn check_vllm(case: &Value) {
    let name = case["name"].as_str().unwrap();
    let algo = vllm::VllmHashAlgo::from_name(case["algo"].as_str().unwrap()).unwrap();
    let seed = vllm_seed(case);
    let block_size = case["block_size"].as_u64().unwrap() as usize;
    let hasher = vllm::VllmHasher::new(algo, block_size, seed.as_deref()).unwrap();
    assert_eq!(
        hex::encode(hasher.none_hash()),
        case["none_hash_hex"].as_str().unwrap(),
        "{name}: NONE_HASH"
    );
    let toks = tokens(&case["token_ids"]);
    let start = case.get("start_token").and_then(Value::as_u64).unwrap_or(0);
    let parent = opt_str(case, "parent_hex").map(|p| hex::decode(&p, "parent").unwrap());
    let extras = vllm_extras(case);
    let hashes = hasher
        .block_hashes(&toks, start, parent.as_deref(), &extras)
        .unwrap();
    let want: Vec<&str> = case["block_hashes_hex"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap())
        .collect();
    let got: Vec<String> = hashes.iter().map(|h| hex::encode(h)).collect();
    assert_eq!(got, want, "{name}: block hashes");
    let events: Vec<u64> = hashes.iter().map(|h| vllm::event_int(h)).collect();
    assert_eq!(
        events,
        tokens(&case["kv_event_int_hashes"]),
        "{name}: event ints"
    );
    if let Some(ser) = case.get("serialized_block0_hex").and_then(Value::as_str) {
        let first = &toks[..block_size.min(toks.len())];
        let extra = hasher
            .extra_keys(&extras, start, start + block_size as u64, 0)
            .unwrap();
        let p = parent
            .clone()
            .unwrap_or_else(|| hasher.none_hash().to_vec());
        assert_eq!(
            hex::encode(&vllm::serialize_block(&p, first, &extra)),
            ser,
            "{name}: CBOR of block 0"
        );
    }
}

fn check_sglang(case: &Value) {
    let name = case["name"].as_str().unwrap();
    let toks = tokens(&case["token_ids"]);
    let extra_key = opt_str(case, "extra_key");
    let salt = opt_str(case, "cache_salt");
    let seed = sglang::namespace_seed(extra_key.as_deref(), salt.as_deref());
    assert_eq!(
        seed.map(|s| hex::encode(&s)),
        opt_str(case, "namespace_seed_hex"),
        "{name}: namespace seed"
    );
    // SGLang treats an empty prior string as no prior.
    let prior = opt_str(case, "prior_hash_hex")
        .filter(|p| !p.is_empty())
        .map(|p| hex32(&p));
    let prior = sglang::storage_prior(prior, extra_key.as_deref(), salt.as_deref());
    match case["page_size"].as_u64() {
        Some(page) => {
            let got = sglang::page_hashes(&toks, page as usize, prior).unwrap();
            let got_hex: Vec<String> = got.iter().map(|h| hex::encode(h)).collect();
            let want: Vec<String> = case["output"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h.as_str().unwrap().to_owned())
                .collect();
            assert_eq!(got_hex, want, "{name}: page hashes");
            let events: Vec<i64> = got.iter().map(sglang::event_int64).collect();
            let want_events: Vec<i64> = case["event_int64"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_i64().unwrap())
                .collect();
            assert_eq!(events, want_events, "{name}: event ints");
        }
        None => {
            let got = sglang::sequence_hash(&toks, prior).unwrap();
            assert_eq!(
                hex::encode(&got),
                case["output"].as_str().unwrap(),
                "{name}"
            );
            assert_eq!(
                sglang::event_int64(&got),
                case["event_int64"].as_i64().unwrap(),
                "{name}: event int"
            );
        }
    }
}

#[test]
fn shared_reference_vectors() {
    let v = load("engine_hashes.json");
    let vl = v["vllm"].as_array().unwrap();
    let sg = v["sglang"].as_array().unwrap();
    assert!(!vl.is_empty() && !sg.is_empty());
    vl.iter().for_each(check_vllm);
    sg.iter().for_each(check_sglang);
}

#[test]
fn generated_engine_vectors() {
    let v = load("engine_generated.json");
    let vl = v["vllm"].as_array().unwrap();
    let sg = v["sglang"].as_array().unwrap();
    assert!(vl.len() >= 40 && sg.len() >= 30, "vector file shrank");
    vl.iter().for_each(check_vllm);
    sg.iter().for_each(check_sglang);
}

/// Inputs the engines refuse are refused here too (those that a `u64` token list can express).
#[test]
fn engine_refusals_are_refused() {
    let v = load("engine_generated.json");
    let errors = v["errors"].as_array().unwrap();
    assert!(!errors.is_empty());
    for e in errors {
        let name = e["name"].as_str().unwrap();
        let input = &e["input"];
        let Some(toks) = input["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(Value::as_u64)
            .collect::<Option<Vec<u64>>>()
        else {
            continue; // negative token ids: not representable as u64, refused by parsing
        };
        let refused = match e["engine"].as_str().unwrap() {
            "sglang" => sglang_refuses(input, &toks),
            "vllm" => {
                let algo = vllm::VllmHashAlgo::from_name(input["algo"].as_str().unwrap()).unwrap();
                match vllm::VllmHasher::new(
                    algo,
                    input["block_size"].as_u64().unwrap() as usize,
                    vllm_seed(input).as_deref(),
                ) {
                    Err(_) => true,
                    Ok(h) => h.block_hashes(&toks, 0, None, &vllm_extras(input)).is_err(),
                }
            }
            other => panic!("unknown engine {other}"),
        };
        assert!(refused, "{name}: accepted an input the engine refuses");
    }
}

fn sglang_refuses(input: &Value, toks: &[u64]) -> bool {
    let prior = match opt_str(input, "prior_hash_hex").filter(|p| !p.is_empty()) {
        None => None,
        Some(p) => match hex::decode_array::<32>(&p, "prior") {
            Ok(p) => Some(p),
            Err(_) => return true,
        },
    };
    match input["page_size"].as_i64() {
        None => sglang::sequence_hash(toks, prior).is_err(),
        Some(p) => match usize::try_from(p) {
            Err(_) => true, // a negative page size is not representable
            Ok(p) => sglang::page_hashes(toks, p, prior).is_err(),
        },
    }
}
