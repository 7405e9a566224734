//! `StateFormat`: what a record's bytes are — dtype, quantization, block size, dimension order and
//! strides, head shape, the parallel shape and the record's rank, and the implementation that wrote
//! them. Two records are byte-compatible only when their format digests are equal.

use std::fmt;

use crate::codec::{Reader, Writer, len_u32, sha256};
use crate::error::{Error, Result};
use crate::hex;
use crate::identity::EngineKind;
use crate::label::Label;

/// Current StateFormat encoding version.
pub const FORMAT_VERSION: u16 = 1;
/// Domain tag of the format digest.
pub const FORMAT_DOMAIN: &str = "orbitkv.state-format";
/// Most dimensions a layout may name.
pub const MAX_DIMS: usize = 16;
/// Largest world size (ranks of one instance) accepted.
pub const MAX_WORLD: u32 = 1 << 20;
/// Rank code meaning "replicated on every rank" (MLA latent KV).
pub const RANK_REPLICATED: u32 = u32::MAX;

/// How an instance is split across ranks. Every factor is at least one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ParallelShape {
    /// Tensor-parallel size.
    pub tensor: u32,
    /// Pipeline-parallel size.
    pub pipeline: u32,
    /// Decode/prefill context-parallel size.
    pub context: u32,
}

impl ParallelShape {
    /// One rank, no parallelism.
    pub const SINGLE: ParallelShape = ParallelShape {
        tensor: 1,
        pipeline: 1,
        context: 1,
    };

    /// Number of ranks, refused when a factor is zero or the product exceeds [`MAX_WORLD`].
    pub fn world(&self) -> Result<u32> {
        // u128: the product of three u32 cannot overflow it.
        let world = u128::from(self.tensor) * u128::from(self.pipeline) * u128::from(self.context);
        if self.tensor == 0 || self.pipeline == 0 || self.context == 0 {
            return Err(Error::InvalidLayout {
                reason: "every parallel factor must be at least 1".to_owned(),
            });
        }
        u32::try_from(world)
            .ok()
            .filter(|w| *w <= MAX_WORLD)
            .ok_or_else(|| Error::InvalidLayout {
                reason: format!("world size {world} exceeds {MAX_WORLD}"),
            })
    }
}

/// Which rank's shard a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RankSpec {
    /// The shard of this rank.
    Rank(u32),
    /// Identical on every rank (stored once), as MLA latent KV.
    Replicated,
}

impl RankSpec {
    /// The `u32` code written into encodings (`0xFFFF_FFFF` = replicated).
    pub const fn code(self) -> u32 {
        match self {
            RankSpec::Rank(r) => r,
            RankSpec::Replicated => RANK_REPLICATED,
        }
    }
    /// Decodes a rank code.
    pub const fn from_code(code: u32) -> Self {
        if code == RANK_REPLICATED {
            RankSpec::Replicated
        } else {
            RankSpec::Rank(code)
        }
    }
}

impl fmt::Display for RankSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RankSpec::Rank(r) => write!(f, "rank {r}"),
            RankSpec::Replicated => f.write_str("replicated"),
        }
    }
}

/// A named axis of a record's tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dim {
    /// Model layer.
    Layer,
    /// Page (block) index.
    Page,
    /// Token within a page.
    Token,
    /// KV head.
    KvHead,
    /// Element within a head.
    HeadDim,
    /// Key versus value half.
    KvSplit,
    /// Element of a state vector (recurrent, conv or latent state).
    State,
}

impl Dim {
    const ALL: [Dim; 7] = [
        Dim::Layer,
        Dim::Page,
        Dim::Token,
        Dim::KvHead,
        Dim::HeadDim,
        Dim::KvSplit,
        Dim::State,
    ];
    /// One-byte code (docs/format.md).
    pub const fn code(self) -> u8 {
        match self {
            Dim::Layer => 1,
            Dim::Page => 2,
            Dim::Token => 3,
            Dim::KvHead => 4,
            Dim::HeadDim => 5,
            Dim::KvSplit => 6,
            Dim::State => 7,
        }
    }
    /// Stable lowercase name (`layer`, `kv_split`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Dim::Layer => "layer",
            Dim::Page => "page",
            Dim::Token => "token",
            Dim::KvHead => "kv_head",
            Dim::HeadDim => "head_dim",
            Dim::KvSplit => "kv_split",
            Dim::State => "state",
        }
    }
    /// The axis of a [`Dim::name`]; unknown names are refused.
    pub fn from_name(name: &str) -> Result<Self> {
        Dim::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| Error::InvalidField {
                field: "layout dimension",
                reason: format!("unknown dimension {name:?}"),
            })
    }
    fn from_code(code: u8) -> Result<Self> {
        Dim::ALL
            .into_iter()
            .find(|d| d.code() == code)
            .ok_or(Error::UnknownCode {
                what: "layout dimension",
                code: u32::from(code),
            })
    }
}

/// One axis of the layout: its extent and its stride in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Axis {
    /// Which axis.
    pub dim: Dim,
    /// Number of elements along it (at least one).
    pub extent: u64,
    /// Distance in bytes between consecutive elements.
    pub stride: u64,
}

/// Head shape of attention state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeadShape {
    /// KV heads held by this record's rank.
    pub kv_heads: u32,
    /// Elements per key head.
    pub head_size_k: u32,
    /// Elements per value head.
    pub head_size_v: u32,
}

/// The implementation that wrote the bytes; two implementations may lay out equal math differently.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ImplTag {
    /// Engine.
    pub engine: EngineKind,
    /// Engine release.
    pub release: Label,
    /// Attention backend.
    pub attention_backend: Label,
}

/// The description of a record's bytes. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StateFormat {
    /// Element dtype (`bfloat16`, `float8_e4m3fn`, ...).
    pub dtype: Label,
    /// KV quantization mode (`none`, `fp8_per_tensor`, ...).
    pub kv_quant: Label,
    /// Tokens per block (page).
    pub block_tokens: u32,
    /// Layers the record covers.
    pub layers: u32,
    /// Axes from outermost to innermost, with strides.
    pub layout: Vec<Axis>,
    /// Head shape.
    pub heads: HeadShape,
    /// The instance's parallel shape.
    pub parallel: ParallelShape,
    /// This record's rank.
    pub rank: RankSpec,
    /// Implementation compatibility tag.
    pub compat: ImplTag,
}

/// SHA-256 of a StateFormat's canonical encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FormatDigest(pub [u8; 32]);

impl fmt::Display for FormatDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(&self.0))
    }
}

impl StateFormat {
    /// Checks internal consistency: sizes positive, axes distinct, rank inside the world.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(Error::InvalidLayout { reason });
        if self.block_tokens == 0 || self.layers == 0 {
            return bad("block size and layer count must be positive".to_owned());
        }
        if self.layout.is_empty() || self.layout.len() > MAX_DIMS {
            return bad(format!("a layout names 1..={MAX_DIMS} axes"));
        }
        for (i, a) in self.layout.iter().enumerate() {
            if a.extent == 0 {
                return bad(format!("axis {:?} has extent 0", a.dim));
            }
            if self.layout[..i].iter().any(|b| b.dim == a.dim) {
                return bad(format!("axis {:?} appears twice", a.dim));
            }
        }
        let world = self.parallel.world()?;
        if let RankSpec::Rank(r) = self.rank
            && r >= world
        {
            return bad(format!("rank {r} outside world of {world}"));
        }
        Ok(())
    }

    /// Bytes a record of this format holds, for a packed layout: the largest `extent × stride`
    /// of its axes (the outermost axis's span). `None` if that overflows.
    pub fn record_bytes(&self) -> Option<u64> {
        self.layout
            .iter()
            .map(|a| a.extent.checked_mul(a.stride))
            .try_fold(0u64, |m, b| b.map(|b| m.max(b)))
    }

    /// Canonical encoding (docs/format.md, "StateFormat"); refused unless the format validates,
    /// so an inconsistent format never gets an encoding or a digest.
    pub fn encode(&self) -> Result<Vec<u8>> {
        self.validate()?;
        Ok(self.encode_valid())
    }

    /// The encoding of a format already validated (axis count ≤ [`MAX_DIMS`]).
    fn encode_valid(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(128);
        w.u16(FORMAT_VERSION)
            .bytes16(self.dtype.as_str().as_bytes())
            .bytes16(self.kv_quant.as_str().as_bytes())
            .u32(self.block_tokens)
            .u32(self.layers)
            .u8(self.layout.len() as u8);
        for a in &self.layout {
            w.u8(a.dim.code()).u64(a.extent).u64(a.stride);
        }
        w.u32(self.heads.kv_heads)
            .u32(self.heads.head_size_k)
            .u32(self.heads.head_size_v)
            .u32(self.parallel.tensor)
            .u32(self.parallel.pipeline)
            .u32(self.parallel.context)
            .u32(self.rank.code())
            .u8(engine_code(self.compat.engine))
            .bytes16(self.compat.release.as_str().as_bytes())
            .bytes16(self.compat.attention_backend.as_str().as_bytes());
        w.into_bytes()
    }

    /// Decodes and validates an encoding produced by [`StateFormat::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let mut r = Reader::new(bytes, "state format");
        let version = r.u16()?;
        if version != FORMAT_VERSION {
            return Err(Error::UnsupportedVersion {
                what: "state format",
                version: u32::from(version),
            });
        }
        let dtype = read_label(&mut r, "format.dtype")?;
        let kv_quant = read_label(&mut r, "format.kv_quant")?;
        let block_tokens = r.u32()?;
        let layers = r.u32()?;
        let ndims = usize::from(r.u8()?);
        if ndims > MAX_DIMS {
            return Err(Error::InvalidLayout {
                reason: format!("{ndims} axes exceed {MAX_DIMS}"),
            });
        }
        let mut layout = Vec::with_capacity(ndims);
        for _ in 0..ndims {
            let dim = Dim::from_code(r.u8()?)?;
            layout.push(Axis {
                dim,
                extent: r.u64()?,
                stride: r.u64()?,
            });
        }
        let heads = HeadShape {
            kv_heads: r.u32()?,
            head_size_k: r.u32()?,
            head_size_v: r.u32()?,
        };
        let parallel = ParallelShape {
            tensor: r.u32()?,
            pipeline: r.u32()?,
            context: r.u32()?,
        };
        let rank = RankSpec::from_code(r.u32()?);
        let engine = engine_from_code(r.u8()?)?;
        let release = read_label(&mut r, "format.release")?;
        let attention_backend = read_label(&mut r, "format.attention_backend")?;
        r.finish()?;
        let format = StateFormat {
            dtype,
            kv_quant,
            block_tokens,
            layers,
            layout,
            heads,
            parallel,
            rank,
            compat: ImplTag {
                engine,
                release,
                attention_backend,
            },
        };
        format.validate()?;
        Ok(format)
    }

    /// The format digest: SHA-256(domain ‖ encoding); refused unless the format validates.
    pub fn digest(&self) -> Result<FormatDigest> {
        Ok(self.encode_and_digest()?.1)
    }

    /// Both the encoding and its digest, validating once.
    pub(crate) fn encode_and_digest(&self) -> Result<(Vec<u8>, FormatDigest)> {
        let enc = self.encode()?;
        let digest = FormatDigest(domain_digest(FORMAT_DOMAIN, &enc));
        Ok((enc, digest))
    }
}

/// SHA-256 over `u32 LE tag length ‖ tag ‖ body`.
pub(crate) fn domain_digest(domain: &str, body: &[u8]) -> [u8; 32] {
    let mut w = Writer::with_capacity(4 + domain.len() + body.len());
    w.u32(len_u32(domain.len()))
        .raw(domain.as_bytes())
        .raw(body);
    sha256(&w.into_bytes())
}

pub(crate) const fn engine_code(e: EngineKind) -> u8 {
    match e {
        EngineKind::Vllm => 1,
        EngineKind::Sglang => 2,
    }
}

pub(crate) fn engine_from_code(code: u8) -> Result<EngineKind> {
    match code {
        1 => Ok(EngineKind::Vllm),
        2 => Ok(EngineKind::Sglang),
        other => Err(Error::UnknownCode {
            what: "engine",
            code: u32::from(other),
        }),
    }
}

fn read_label(r: &mut Reader<'_>, what: &'static str) -> Result<Label> {
    let raw = r.bytes16()?;
    let text = std::str::from_utf8(raw).map_err(|_| Error::InvalidField {
        field: what,
        reason: format!("{}: not UTF-8", r.what()),
    })?;
    Label::new(what, text)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn dim_names_round_trip_and_unknown_refused() {
        for d in Dim::ALL {
            assert_eq!(Dim::from_name(d.name()).unwrap(), d);
        }
        assert!(Dim::from_name("heads").is_err());
    }

    pub(crate) fn sample(rank: RankSpec) -> StateFormat {
        let l = |v: &str| Label::new("t", v).unwrap();
        StateFormat {
            dtype: l("bfloat16"),
            kv_quant: l("none"),
            block_tokens: 16,
            layers: 32,
            layout: vec![
                Axis {
                    dim: Dim::Layer,
                    extent: 32,
                    stride: 2 * 16 * 8 * 128 * 2,
                },
                Axis {
                    dim: Dim::KvSplit,
                    extent: 2,
                    stride: 16 * 8 * 128 * 2,
                },
                Axis {
                    dim: Dim::Token,
                    extent: 16,
                    stride: 8 * 128 * 2,
                },
                Axis {
                    dim: Dim::KvHead,
                    extent: 8,
                    stride: 128 * 2,
                },
                Axis {
                    dim: Dim::HeadDim,
                    extent: 128,
                    stride: 2,
                },
            ],
            heads: HeadShape {
                kv_heads: 8,
                head_size_k: 128,
                head_size_v: 128,
            },
            parallel: ParallelShape {
                tensor: 2,
                pipeline: 1,
                context: 1,
            },
            rank,
            compat: ImplTag {
                engine: EngineKind::Vllm,
                release: l("0.33.0"),
                attention_backend: l("FLASH_ATTN"),
            },
        }
    }

    #[test]
    fn huge_parallel_factors_are_refused_not_overflowed() {
        let p = ParallelShape {
            tensor: u32::MAX,
            pipeline: u32::MAX,
            context: u32::MAX,
        };
        assert!(p.world().is_err());
    }

    #[test]
    fn round_trips_and_digest_depends_on_rank() {
        let f = sample(RankSpec::Rank(1));
        f.validate().unwrap();
        assert_eq!(StateFormat::decode(&f.encode().unwrap()).unwrap(), f);
        assert_ne!(
            f.digest().unwrap(),
            sample(RankSpec::Rank(0)).digest().unwrap()
        );
        assert_ne!(
            f.digest().unwrap(),
            sample(RankSpec::Replicated).digest().unwrap()
        );
    }

    #[test]
    fn decode_rejects_malformed() {
        let bytes = sample(RankSpec::Rank(0)).encode().unwrap();
        for cut in 0..bytes.len() {
            assert!(StateFormat::decode(&bytes[..cut]).is_err(), "cut {cut}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(StateFormat::decode(&extra).is_err());
        let mut v2 = bytes.clone();
        v2[0] = 2;
        assert!(matches!(
            StateFormat::decode(&v2),
            Err(Error::UnsupportedVersion { .. })
        ));
        let out_of_world = sample(RankSpec::Rank(2));
        assert!(out_of_world.encode().is_err() && out_of_world.digest().is_err());
        let mut bytes = sample(RankSpec::Rank(0)).encode_valid();
        // Patch the rank field (after the last axis and the head and parallel shapes) to 2.
        let rank_at = bytes.len() - (1 + 2 + 6 + 2 + 10) - 4;
        bytes[rank_at..rank_at + 4].copy_from_slice(&2u32.to_le_bytes());
        assert!(StateFormat::decode(&bytes).is_err());
        let mut too_many = sample(RankSpec::Rank(0));
        too_many.layout = (0..300)
            .map(|i| Axis {
                dim: Dim::State,
                extent: 1,
                stride: i,
            })
            .collect();
        assert!(too_many.encode().is_err());
    }
}
