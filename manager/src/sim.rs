//! A simulated engine instance's description: a small dense-KV layout and the registrations of
//! its scheduler and workers, deterministic from a few parameters. The simulated engine, the
//! load generator and the tests register with it; changing one parameter changes exactly one
//! field the seal compares.

use orbitkv_state::{
    Axis, CacheGroupId, CacheGroupSpec, Component, Dim, EngineKind, HashDomain, HeadShape, ImplTag,
    Label, ParallelShape, RankSpec, Rule, StateFormat, StorageLayout,
};

use crate::protocol::Role;
use crate::protocol::message::Register;

/// What a simulated instance is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimInstance {
    /// The instance's name.
    pub name: String,
    /// Worker ranks (tensor parallel).
    pub workers: u32,
    /// Tokens per block.
    pub block_tokens: u32,
    /// Compute dtype.
    pub dtype: String,
    /// The computation identity digest.
    pub identity: [u8; 32],
    /// The cache scope ("" for none).
    pub scope: String,
    /// How long the daemon waits for every rank.
    pub seal_timeout_ms: u32,
}

impl SimInstance {
    /// An instance of `workers` ranks with 16-token blocks of bfloat16.
    pub fn new(name: &str, workers: u32) -> Self {
        Self {
            name: name.to_owned(),
            workers,
            block_tokens: 16,
            dtype: "bfloat16".to_owned(),
            identity: [0x11; 32],
            scope: String::new(),
            seal_timeout_ms: 10_000,
        }
    }

    fn label(v: &str) -> Result<Label, orbitkv_state::Error> {
        Label::new("sim", v)
    }

    /// The state format of `rank`: 2 layers of `block_tokens` tokens × 4 elements.
    pub fn format(&self, rank: u32) -> Result<StateFormat, orbitkv_state::Error> {
        let bt = u64::from(self.block_tokens);
        Ok(StateFormat {
            dtype: Self::label(&self.dtype)?,
            kv_quant: Self::label("none")?,
            block_tokens: self.block_tokens,
            layers: 2,
            layout: vec![
                Axis {
                    dim: Dim::Layer,
                    extent: 2,
                    stride: bt * 4 * 2,
                },
                Axis {
                    dim: Dim::Token,
                    extent: bt,
                    stride: 4 * 2,
                },
                Axis {
                    dim: Dim::HeadDim,
                    extent: 4,
                    stride: 2,
                },
            ],
            heads: HeadShape {
                kv_heads: 1,
                head_size_k: 4,
                head_size_v: 4,
            },
            parallel: ParallelShape {
                tensor: self.workers,
                pipeline: 1,
                context: 1,
            },
            rank: RankSpec::Rank(rank),
            compat: ImplTag {
                engine: EngineKind::Vllm,
                release: Self::label("0.33.0")?,
                attention_backend: Self::label("flash_attn")?,
            },
        })
    }

    /// Bytes of one page per rank.
    pub fn page_bytes(&self) -> u64 {
        u64::from(self.block_tokens) * 4 * 2 * 2
    }

    /// A host pool of `pages` pages holding this instance's one group (two layers, packed).
    pub fn pool_spec(&self, pool: u32, pages: u32) -> orbitkv_gpu_bridge::PoolSpec {
        let layer = self.page_bytes() / 2;
        orbitkv_gpu_bridge::PoolSpec {
            pool: orbitkv_gpu_bridge::PoolId(pool),
            page_bytes: self.page_bytes(),
            pages,
            groups: vec![orbitkv_gpu_bridge::GroupGeometry {
                group: 0,
                layers: 2,
                offset: 0,
                layer_stride: layer,
                layer_bytes: layer,
            }],
        }
    }

    /// The instance's storage layout: one dense-KV group.
    pub fn layout(&self) -> Result<StorageLayout, orbitkv_state::Error> {
        let formats = (0..self.workers)
            .map(|r| self.format(r))
            .collect::<Result<Vec<_>, _>>()?;
        StorageLayout::new(
            ParallelShape {
                tensor: self.workers,
                pipeline: 1,
                context: 1,
            },
            vec![CacheGroupSpec {
                id: CacheGroupId(0),
                component: Component::DenseKv,
                block_tokens: self.block_tokens,
                page_bytes: self.page_bytes(),
                formats,
            }],
        )
    }

    /// The registration of the scheduler (`Role::Scheduler`, rank 0) or worker `rank`.
    pub fn registration(&self, role: Role, rank: u32) -> Result<Register, orbitkv_state::Error> {
        let formats = match role {
            Role::Scheduler => Vec::new(),
            Role::Worker => vec![self.format(rank)?.encode()?],
        };
        Ok(Register {
            instance: self.name.clone(),
            role,
            rank,
            workers: self.workers,
            identity: self.identity,
            model: "sim/dense-2l".to_owned(),
            revision: "sim".to_owned(),
            domain: HashDomain::VllmSha256Cbor,
            layout: self.layout()?.encode().to_vec(),
            rules: vec![(0, Rule::Prefix)],
            scope: self.scope.clone(),
            formats,
            seal_timeout_ms: self.seal_timeout_ms,
        })
    }
}
