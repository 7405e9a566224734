//! Engine-native prefix hashes, bit-exact with the engines' own code, so OrbitKV can derive or
//! check the same chained block hashes vLLM and SGLang compute (tests compare against vectors the
//! engines themselves produced).

mod cbor;
pub mod sglang;
pub mod vllm;
