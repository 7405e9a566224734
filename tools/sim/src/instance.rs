//! A simulated engine instance's description: its cache groups, their state formats, the
//! storage layout, the recovery rules and the registrations of its scheduler and workers, all
//! deterministic from a few parameters. Changing one parameter changes exactly the fields the
//! seal compares that it should (a dtype the formats, a head size the layout, a scope the
//! namespace).

use orbitkv_gpu_bridge::{GroupGeometry, PoolId, PoolSpec};
use orbitkv_state::{
    Axis, CacheGroupId, CacheGroupSpec, Component, Dim, EngineKind, HashDomain, HeadShape, ImplTag,
    Label, ParallelShape, RankSpec, Rule, StateFormat, StorageLayout,
};

use orbitkv_protocol::Role;
use orbitkv_protocol::message::Register;

/// Bytes per element of every simulated tensor (a 16-bit dtype).
const ELEM: u64 = 2;
/// The hybrid contract's sliding window, in blocks.
pub const WINDOW_BLOCKS: u32 = 3;
/// The hybrid contract's recurrent-state checkpoint grid, in blocks.
pub const CHECKPOINT_BLOCKS: u32 = 4;

/// Which cache groups the instance has, and so which recovery contract it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimContract {
    /// One dense-attention group (rule `prefix`).
    Dense,
    /// A sliding-window attention group (rule `window` of [`WINDOW_BLOCKS`] blocks) and a
    /// recurrent-state group (rule `checkpoint` every [`CHECKPOINT_BLOCKS`] blocks).
    Hybrid,
}

impl SimContract {
    /// Parses `dense` or `hybrid`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "dense" => Some(SimContract::Dense),
            "hybrid" => Some(SimContract::Hybrid),
            _ => None,
        }
    }
}

/// Where the instance's pages lie in its pool (the placement only: records are the same bytes
/// whichever it is, so instances placing pages differently share them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimPlacement {
    /// Each page one run of bytes, its groups one after another, each layer K then V.
    Page,
    /// Layer-outermost, as vLLM's `LBNHC`: each group's layers one after another, each layer
    /// every page's K, then every page's V.
    Layer,
    /// K and V apart, as SGLang's `layer_first`: each group's K buffer, then its V buffer, each
    /// layer-major with every page's run in a layer.
    KvBuffers,
    /// K and V apart, as SGLang's `page_first`: each page's K one run, token-major with every
    /// layer inside each token. Another byte order (a state format of its own): it shares only
    /// with engines placing pages the same way, and no layer sub-range loads into it.
    PageFirst,
}

impl SimPlacement {
    /// Parses `page`, `layer`, `kv-buffers` or `page-first`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "page" => Some(SimPlacement::Page),
            "layer" => Some(SimPlacement::Layer),
            "kv-buffers" => Some(SimPlacement::KvBuffers),
            "page-first" => Some(SimPlacement::PageFirst),
            _ => None,
        }
    }
}

/// One cache group of a simulated instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimGroup {
    /// Its id (its index in the layout).
    pub id: u32,
    /// What it holds.
    pub component: Component,
    /// Its recovery rule.
    pub rule: Rule,
    /// Bytes of one layer of one page.
    pub layer_bytes: u64,
    /// Where the group's bytes start within a pool page.
    pub offset: u64,
}

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
    /// KV-cache dtype (the formats' quantization label; `none` when it is the compute dtype).
    pub kv_dtype: String,
    /// The engine release the formats name.
    pub release: String,
    /// The computation identity digest.
    pub identity: [u8; 32],
    /// The cache scope ("" for none).
    pub scope: String,
    /// How long the daemon waits for every rank.
    pub seal_timeout_ms: u32,
    /// The instance has no scheduler process (as SGLang): its workers seal alone.
    pub no_scheduler: bool,
    /// The cache groups.
    pub contract: SimContract,
    /// Model layers.
    pub layers: u32,
    /// KV heads per rank.
    pub kv_heads: u32,
    /// Elements per head.
    pub head_size: u32,
    /// Where pages lie in the pool.
    pub placement: SimPlacement,
    /// Whether every group's pages share the same bytes (vLLM's hybrid allocator); the groups
    /// must then have pages of one size.
    pub aliased: bool,
    /// Pipeline stages' layer counts (rank `r` is stage `r / (workers / stages)`); empty: one
    /// stage of [`SimInstance::layers`] layers.
    pub pipeline_layers: Vec<u32>,
    /// The KV byte order in a layer: head-major (vLLM `HND`) rather than token-major (`NHD`).
    /// A state format's byte order: instances that differ in it never share records.
    pub head_major: bool,
}

impl SimInstance {
    /// A dense instance of `workers` ranks: 2 layers, one 4-element KV head, 16-token blocks of
    /// bfloat16.
    pub fn new(name: &str, workers: u32) -> Self {
        Self {
            name: name.to_owned(),
            workers,
            block_tokens: 16,
            dtype: "bfloat16".to_owned(),
            kv_dtype: "none".to_owned(),
            release: "0.33.0".to_owned(),
            identity: [0x11; 32],
            scope: String::new(),
            seal_timeout_ms: 10_000,
            no_scheduler: false,
            contract: SimContract::Dense,
            layers: 2,
            kv_heads: 1,
            head_size: 4,
            placement: SimPlacement::Page,
            aliased: false,
            pipeline_layers: Vec::new(),
            head_major: false,
        }
    }

    fn label(v: &str) -> Result<Label, orbitkv_state::Error> {
        Label::new("sim", v)
    }

    /// Bytes of one token's keys and values in one layer.
    fn token_bytes(&self) -> u64 {
        u64::from(self.kv_heads) * u64::from(self.head_size) * 2 * ELEM
    }

    /// Bytes of one layer's recurrent state.
    fn state_layer_bytes(&self) -> u64 {
        u64::from(self.kv_heads) * u64::from(self.head_size) * u64::from(self.head_size) * ELEM
    }

    /// The instance's cache groups, in id order, placed one after another in a pool page.
    pub fn groups(&self) -> Vec<SimGroup> {
        let bt = u64::from(self.block_tokens);
        let kv_layer = bt * self.token_bytes();
        match self.contract {
            SimContract::Dense => vec![SimGroup {
                id: 0,
                component: Component::DenseKv,
                rule: Rule::Prefix,
                layer_bytes: kv_layer,
                offset: 0,
            }],
            SimContract::Hybrid => vec![
                SimGroup {
                    id: 0,
                    component: Component::SlidingWindowKv,
                    rule: Rule::Window {
                        tokens: u64::from(WINDOW_BLOCKS) * bt,
                    },
                    layer_bytes: kv_layer,
                    offset: 0,
                },
                SimGroup {
                    id: 1,
                    component: Component::SsmState,
                    rule: Rule::Checkpoint {
                        grid: u64::from(CHECKPOINT_BLOCKS) * bt,
                    },
                    layer_bytes: self.state_layer_bytes(),
                    offset: kv_layer * u64::from(self.rank_layers(0)),
                },
            ],
        }
    }

    /// Pipeline stages.
    fn stages(&self) -> u32 {
        u32::try_from(self.pipeline_layers.len())
            .unwrap_or(u32::MAX)
            .max(1)
    }

    /// Layers rank `rank` holds: its pipeline stage's.
    pub fn rank_layers(&self, rank: u32) -> u32 {
        let tensor = (self.workers / self.stages()).max(1);
        self.pipeline_layers
            .get((rank / tensor) as usize)
            .copied()
            .unwrap_or(self.layers)
    }

    /// Bytes of one page of `group` (all its layers) at rank 0.
    pub fn group_page_bytes(&self, group: &SimGroup) -> u64 {
        self.group_page_bytes_at(group, 0)
    }

    /// Bytes of one page of `group` (all its layers) at rank `rank`.
    pub fn group_page_bytes_at(&self, group: &SimGroup, rank: u32) -> u64 {
        group.layer_bytes * u64::from(self.rank_layers(rank))
    }

    /// The state format of `group` at `rank`.
    pub fn group_format(
        &self,
        group: &SimGroup,
        rank: u32,
    ) -> Result<StateFormat, orbitkv_state::Error> {
        let bt = u64::from(self.block_tokens);
        let (kvh, hs) = (u64::from(self.kv_heads), u64::from(self.head_size));
        let layers = self.rank_layers(rank);
        let layer = Axis {
            dim: Dim::Layer,
            extent: u64::from(layers),
            stride: group.layer_bytes,
        };
        let layout = match group.component {
            Component::SsmState => vec![
                layer,
                Axis {
                    dim: Dim::KvHead,
                    extent: kvh,
                    stride: hs * hs * ELEM,
                },
                Axis {
                    dim: Dim::State,
                    extent: hs * hs,
                    stride: ELEM,
                },
            ],
            // K, then V; each token-major (NHD), or head-major (HND) when `head_major`.
            _ => {
                let (token, head) = if self.head_major {
                    (hs * ELEM, bt * hs * ELEM)
                } else {
                    (kvh * hs * ELEM, hs * ELEM)
                };
                let mut axes = vec![
                    layer,
                    Axis {
                        dim: Dim::KvSplit,
                        extent: 2,
                        stride: bt * kvh * hs * ELEM,
                    },
                    Axis {
                        dim: Dim::Token,
                        extent: bt,
                        stride: token,
                    },
                    Axis {
                        dim: Dim::KvHead,
                        extent: kvh,
                        stride: head,
                    },
                    Axis {
                        dim: Dim::HeadDim,
                        extent: hs,
                        stride: ELEM,
                    },
                ];
                if self.head_major {
                    axes.swap(2, 3);
                }
                if self.placement == SimPlacement::PageFirst {
                    // Layers inside tokens: K, then V, each [token][layer][head][dim].
                    let n = u64::from(layers);
                    axes = vec![
                        Axis {
                            dim: Dim::KvSplit,
                            extent: 2,
                            stride: n * bt * kvh * hs * ELEM,
                        },
                        Axis {
                            dim: Dim::Token,
                            extent: bt,
                            stride: n * kvh * hs * ELEM,
                        },
                        Axis {
                            dim: Dim::Layer,
                            extent: n,
                            stride: kvh * hs * ELEM,
                        },
                        Axis {
                            dim: Dim::KvHead,
                            extent: kvh,
                            stride: hs * ELEM,
                        },
                        Axis {
                            dim: Dim::HeadDim,
                            extent: hs,
                            stride: ELEM,
                        },
                    ];
                }
                axes
            }
        };
        Ok(StateFormat {
            dtype: Self::label(&self.dtype)?,
            kv_quant: Self::label(&self.kv_dtype)?,
            block_tokens: self.block_tokens,
            layers,
            layout,
            heads: HeadShape {
                kv_heads: self.kv_heads,
                head_size_k: self.head_size,
                head_size_v: self.head_size,
            },
            parallel: self.parallel(),
            rank: RankSpec::Rank(rank),
            compat: ImplTag {
                engine: EngineKind::Vllm,
                release: Self::label(&self.release)?,
                attention_backend: Self::label("flash_attn")?,
            },
        })
    }

    fn parallel(&self) -> ParallelShape {
        let stages = self.stages();
        ParallelShape {
            tensor: (self.workers / stages).max(1),
            pipeline: stages,
            context: 1,
        }
    }

    /// The state format of group 0 at `rank`.
    pub fn format(&self, rank: u32) -> Result<StateFormat, orbitkv_state::Error> {
        self.group_format(&self.groups()[0], rank)
    }

    /// Bytes of one page of group 0, per rank.
    pub fn page_bytes(&self) -> u64 {
        self.group_page_bytes(&self.groups()[0])
    }

    /// Rank 0's host pool of `pages` pages (see [`SimInstance::pool_spec_at`]).
    pub fn pool_spec(&self, pool: u32, pages: u32) -> PoolSpec {
        self.pool_spec_at(0, pool, pages)
    }

    /// Rank `rank`'s host pool of `pages` pages, each holding one page of every group (of the
    /// largest group when aliased), placed as [`SimInstance::placement`] says.
    pub fn pool_spec_at(&self, rank: u32, pool: u32, pages: u32) -> PoolSpec {
        let groups = self.groups();
        let sizes: Vec<u64> = groups
            .iter()
            .map(|g| self.group_page_bytes_at(g, rank))
            .collect();
        // Groups one after another in a page (not aliased).
        let starts: Vec<u64> = sizes
            .iter()
            .scan(0u64, |at, n| {
                let start = *at;
                *at += n;
                Some(start)
            })
            .collect();
        let page_bytes = if self.aliased {
            sizes.iter().copied().max().unwrap_or(0)
        } else {
            sizes.iter().sum()
        };
        let (n, layers) = (u64::from(pages), u64::from(self.rank_layers(rank)));
        PoolSpec {
            pool: PoolId(pool),
            page_bytes,
            pages,
            aliased: self.aliased,
            groups: groups
                .iter()
                .zip(starts)
                .map(|(g, start)| {
                    // Placed apart, attention KV splits into K and V; a recurrent state does
                    // not, nor does a layer lying whole in its page.
                    let split =
                        self.placement != SimPlacement::Page && g.component != Component::SsmState;
                    let parts: u32 = if split { 2 } else { 1 };
                    let run = g.layer_bytes / u64::from(parts);
                    let offset = if self.aliased { 0 } else { start };
                    let (page_stride, layer_stride, part_stride, base) = match self.placement {
                        SimPlacement::Page => (page_bytes, g.layer_bytes, run, offset),
                        SimPlacement::Layer => (run, n * g.layer_bytes, n * run, n * offset),
                        SimPlacement::KvBuffers => (run, n * run, layers * n * run, n * offset),
                        SimPlacement::PageFirst => {
                            let page = layers * run;
                            (page, run, n * page, n * offset)
                        }
                    };
                    GroupGeometry {
                        group: g.id,
                        layers: self.rank_layers(rank),
                        offset: base,
                        page_stride,
                        layer_stride,
                        layer_bytes: g.layer_bytes,
                        parts,
                        part_stride,
                        layers_inside: split && self.placement == SimPlacement::PageFirst,
                    }
                })
                .collect(),
        }
    }

    /// The instance's storage layout.
    pub fn layout(&self) -> Result<StorageLayout, orbitkv_state::Error> {
        let groups = self
            .groups()
            .iter()
            .map(|g| {
                let formats = (0..self.workers)
                    .map(|r| self.group_format(g, r))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(CacheGroupSpec {
                    id: CacheGroupId(g.id),
                    component: g.component,
                    block_tokens: self.block_tokens,
                    page_bytes: self.group_page_bytes(g),
                    formats,
                })
            })
            .collect::<Result<Vec<_>, orbitkv_state::Error>>()?;
        StorageLayout::new(self.parallel(), groups)
    }

    /// The registration of the scheduler (`Role::Scheduler`, rank 0) or worker `rank`.
    pub fn registration(&self, role: Role, rank: u32) -> Result<Register, orbitkv_state::Error> {
        let groups = self.groups();
        let formats = match role {
            Role::Scheduler => Vec::new(),
            Role::Worker => groups
                .iter()
                .map(|g| self.group_format(g, rank)?.encode())
                .collect::<Result<Vec<_>, _>>()?,
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
            rules: groups.iter().map(|g| (g.id, g.rule)).collect(),
            scope: self.scope.clone(),
            formats,
            seal_timeout_ms: self.seal_timeout_ms,
            no_scheduler: self.no_scheduler,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Change = Box<dyn Fn(&mut SimInstance)>;

    #[test]
    fn every_parameter_that_shapes_bytes_changes_the_layout() {
        let base = SimInstance::new("a", 2);
        let digest = |s: &SimInstance| s.layout().map(|l| l.digest()).map_err(|e| e.to_string());
        let d0 = digest(&base);
        assert!(d0.is_ok(), "{d0:?}");
        let changes: Vec<(&str, Change)> = vec![
            ("dtype", Box::new(|s| s.dtype = "float16".into())),
            ("kv dtype", Box::new(|s| s.kv_dtype = "fp8_e4m3".into())),
            ("release", Box::new(|s| s.release = "0.34.0".into())),
            ("block size", Box::new(|s| s.block_tokens = 32)),
            ("workers", Box::new(|s| s.workers = 1)),
            ("head size", Box::new(|s| s.head_size = 8)),
            ("contract", Box::new(|s| s.contract = SimContract::Hybrid)),
        ];
        for (what, change) in changes {
            let mut s = base.clone();
            change(&mut s);
            assert_ne!(digest(&s), d0, "{what}");
        }
    }

    #[test]
    fn a_hybrid_pool_page_holds_both_groups_apart() {
        let mut s = SimInstance::new("h", 1);
        s.contract = SimContract::Hybrid;
        let spec = s.pool_spec(1, 4);
        assert!(spec.validate().is_ok(), "{:?}", spec.validate());
        let g = s.groups();
        assert_eq!(g.len(), 2);
        assert_eq!(g[1].offset, s.group_page_bytes(&g[0]));
        assert_eq!(
            spec.page_bytes,
            s.group_page_bytes(&g[0]) + s.group_page_bytes(&g[1])
        );
        for r in [Role::Scheduler, Role::Worker] {
            assert!(s.registration(r, 0).is_ok());
        }
    }
}
