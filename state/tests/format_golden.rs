//! Encodings written by hand from docs/format.md (the fuzz seeds) decode to what the document says,
//! and re-encode to the same bytes: the document and the code agree.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use orbitkv_state::{
    CacheGroupId, Component, Dim, EngineKind, HashDomain, RankSpec, StateFormat, StateKey,
};

fn seed(target: &str, name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../fuzz/seeds/{target}/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(path).unwrap()
}

#[test]
fn state_format_seed_matches_the_byte_table() {
    let bytes = seed("state_format_decode", "bf16_tp2_rank1");
    let f = StateFormat::decode(&bytes).unwrap();
    assert_eq!(f.dtype.as_str(), "bfloat16");
    assert_eq!(f.block_tokens, 16);
    assert_eq!(f.layers, 32);
    assert_eq!(f.layout[0].dim, Dim::Layer);
    assert_eq!(f.layout[4].dim, Dim::HeadDim);
    assert_eq!(f.layout[4].stride, 2);
    assert_eq!(f.heads.kv_heads, 8);
    assert_eq!(f.parallel.tensor, 2);
    assert_eq!(f.rank, RankSpec::Rank(1));
    assert_eq!(f.compat.engine, EngineKind::Vllm);
    assert_eq!(f.compat.attention_backend.as_str(), "FLASH_ATTN");
    assert_eq!(f.encode().unwrap(), bytes);

    let r = StateFormat::decode(&seed("state_format_decode", "replicated_sglang")).unwrap();
    assert_eq!(r.rank, RankSpec::Replicated);
    assert_eq!(r.compat.engine, EngineKind::Sglang);
}

#[test]
fn state_key_seeds_match_the_byte_table() {
    let k = StateKey::decode(&seed("state_key_decode", "vllm_xxhash")).unwrap();
    assert_eq!(k.hash.domain(), HashDomain::VllmXxhashCbor);
    assert_eq!(k.hash.native(), &[0xab; 16]);
    assert_eq!(k.hash.as_bytes().len(), 28);
    let k = StateKey::decode(&seed("state_key_decode", "ssm_replicated")).unwrap();
    assert_eq!(k.hash.domain(), HashDomain::SglangSha256);
    assert_eq!(k.hash.group(), CacheGroupId(3));
    assert_eq!(k.hash.component(), Component::SsmState);
    assert_eq!(k.hash.rank(), RankSpec::Replicated);
    assert_eq!(k.namespace.0[31], 31);
}
