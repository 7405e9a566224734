//! Synthetic Mooncake-format request traces for the shapes a KV cache sees, each seeded and
//! parameterised, and the statistics that compare traces (`orbitkv bench trace-gen`,
//! `orbitkv bench trace-stats`).
//!
//! A request is a sequence of blocks of [`BLOCK_TOKENS`] tokens. Each block's content is a
//! number; a block's hash id names the content of the whole prefix up to it, so two requests
//! share an id exactly when they share that prefix (ids are given out in order of first use).

use std::collections::HashMap;

/// Tokens per trace block (Mooncake's).
pub const BLOCK_TOKENS: u64 = 512;

/// The shapes generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// Users in multi-turn conversations: each turn's prompt is the history (every earlier
    /// prompt and answer) and a new message; think times between turns.
    MultiTurn,
    /// Agents re-reading one long shared tool and system prompt, each call with a short suffix
    /// of its own.
    Agent,
    /// Many users sharing a few system prompts, each user's rounds growing a history on it
    /// (LMCache's multi-round QA shape).
    SharedPrompt,
    /// Long documents, each asked about again and again (popularity skewed), a short question
    /// each time.
    Documents,
    /// One-shot traffic: no request shares a block with another.
    OneShot,
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct Params {
    /// The shape.
    pub shape: Shape,
    /// The seed: the same parameters and seed give the same trace.
    pub seed: u64,
    /// Requests to write.
    pub requests: usize,
    /// Users (conversations, agents, or readers) active at once.
    pub users: usize,
    /// Blocks of a shared prompt (system prompt, tool prompt) or of a document.
    pub shared_blocks: u64,
    /// Blocks a user's new message adds (mean).
    pub message_blocks: u64,
    /// Blocks an answer adds to the history (mean).
    pub answer_blocks: u64,
    /// Distinct shared prompts or documents.
    pub prompts: usize,
    /// Turns (rounds) of one conversation before its user starts another.
    pub turns: usize,
    /// Mean think time between a user's turns, ms.
    pub think_ms: u64,
}

impl Params {
    /// Defaults for `shape` (a chat-sized workload), `requests` requests from `seed`.
    pub fn new(shape: Shape, seed: u64, requests: usize) -> Self {
        Self {
            shape,
            seed,
            requests,
            users: 64,
            shared_blocks: 8,
            message_blocks: 2,
            answer_blocks: 1,
            prompts: 4,
            turns: 8,
            think_ms: 30_000,
        }
    }
}

/// One generated request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Arrival, ms from the trace's start.
    pub timestamp: u64,
    /// Prompt tokens.
    pub input_length: u64,
    /// Answer tokens.
    pub output_length: u64,
    /// The prompt's chained block ids.
    pub hash_ids: Vec<u64>,
}

/// The simulator's SplitMix64 stream, with the draws a trace needs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        orbitkv_sim::payload::splitmix64(&mut self.0)
    }
    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in `0..n` (`n` ≥ 1).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// Exponential with mean `mean`.
    fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
    /// At least 1, around `mean` (geometric).
    fn count(&mut self, mean: u64) -> u64 {
        1 + self.exp(mean.saturating_sub(1) as f64) as u64
    }
    /// Zipf-like rank in `0..n`: rank r with weight 1 / (r + 1).
    fn zipf(&mut self, n: usize) -> usize {
        let h: f64 = (1..=n).map(|k| 1.0 / k as f64).sum();
        let mut x = self.unit() * h;
        for k in 0..n {
            x -= 1.0 / (k + 1) as f64;
            if x <= 0.0 {
                return k;
            }
        }
        n.saturating_sub(1)
    }
}

/// Gives out chained ids: one per (prefix id, block content), in order of first use.
#[derive(Default)]
struct Chain {
    ids: HashMap<(Option<u64>, u64), u64>,
}

impl Chain {
    fn ids(&mut self, blocks: &[u64]) -> Vec<u64> {
        let mut parent = None;
        blocks
            .iter()
            .map(|&b| {
                let next = self.ids.len() as u64;
                let id = *self.ids.entry((parent, b)).or_insert(next);
                parent = Some(id);
                id
            })
            .collect()
    }
}

/// One user's state: the blocks of its conversation so far, and when it speaks next.
struct User {
    history: Vec<u64>,
    turn: usize,
    next_ms: f64,
    prompt: usize,
}

/// Generates the trace `p` describes, in arrival order.
pub fn generate(p: &Params) -> Vec<Request> {
    let mut rng = Rng(p.seed ^ 0x6F72_6269_746B_7600);
    // Block contents: fresh numbers, never repeated unless a prefix is meant to be shared.
    let mut fresh = 1u64 << 32;
    let mut new_block = || {
        fresh += 1;
        fresh
    };
    let prompts: Vec<Vec<u64>> = (0..p.prompts.max(1))
        .map(|_| (0..p.shared_blocks).map(|_| new_block()).collect())
        .collect();
    let users = p.users.max(1);
    let mut state: Vec<User> = (0..users)
        .map(|_| User {
            history: Vec::new(),
            turn: 0,
            next_ms: rng.exp(p.think_ms as f64),
            prompt: 0,
        })
        .collect();
    let mut chain = Chain::default();
    let mut out = Vec::with_capacity(p.requests);
    let mut clock = 0.0f64;
    for _ in 0..p.requests {
        // The user who speaks next.
        let (u, at) = state
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.next_ms))
            .fold((0, f64::MAX), |best, x| if x.1 < best.1 { x } else { best });
        clock = clock.max(at);
        let user = &mut state[u];
        let output = rng.count(p.answer_blocks) * BLOCK_TOKENS - rng.below(BLOCK_TOKENS);
        let blocks: Vec<u64> = match p.shape {
            Shape::MultiTurn | Shape::SharedPrompt => {
                if user.turn == 0 {
                    user.prompt = rng.zipf(prompts.len());
                    user.history = match p.shape {
                        Shape::SharedPrompt => prompts[user.prompt].clone(),
                        _ => Vec::new(),
                    };
                }
                let message = rng.count(p.message_blocks);
                user.history.extend((0..message).map(|_| new_block()));
                let prompt = user.history.clone();
                // The answer joins the history the next turn sees.
                user.history
                    .extend((0..output.div_ceil(BLOCK_TOKENS)).map(|_| new_block()));
                user.turn = (user.turn + 1) % p.turns.max(1);
                prompt
            }
            Shape::Agent => {
                let mut b = prompts[0].clone();
                b.extend((0..rng.count(p.message_blocks)).map(|_| new_block()));
                b
            }
            Shape::Documents => {
                let mut b = prompts[rng.zipf(prompts.len())].clone();
                b.push(new_block());
                b
            }
            Shape::OneShot => (0..p.shared_blocks + rng.count(p.message_blocks))
                .map(|_| new_block())
                .collect(),
        };
        user.next_ms = clock + rng.exp(p.think_ms as f64);
        let input_length = blocks.len() as u64 * BLOCK_TOKENS - rng.below(BLOCK_TOKENS);
        out.push(Request {
            timestamp: clock as u64,
            input_length,
            output_length: output,
            hash_ids: chain.ids(&blocks),
        });
    }
    out
}

/// How a trace reuses its blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// Requests.
    pub requests: usize,
    /// Block references.
    pub references: u64,
    /// Distinct blocks.
    pub distinct: u64,
    /// References to a block referenced before.
    pub reuse_fraction: f64,
    /// Reuse distance (distinct blocks referenced since the block's last reference), at the
    /// 50th, 90th and 99th percentile of reuses, as a fraction of the distinct blocks.
    pub reuse_distance: [f64; 3],
    /// Leading blocks of a request referenced before (its longest shared prefix), mean and
    /// 90th percentile, in blocks.
    pub shared_prefix: [f64; 2],
    /// The fraction of a request's blocks in its shared prefix, mean over requests.
    pub shared_fraction: f64,
}

/// The statistics of `trace` (each request's block ids).
pub fn stats(trace: &[Vec<u64>]) -> Stats {
    let total: usize = trace.iter().map(Vec::len).sum();
    // A Fenwick tree over reference positions marks each block's latest reference: the
    // distinct blocks since a block's last reference are the marks after that position.
    let mut tree = vec![0i64; total + 1];
    let add = |tree: &mut Vec<i64>, i: usize, d: i64| {
        let mut i = i + 1;
        while i < tree.len() {
            tree[i] += d;
            i += i & i.wrapping_neg();
        }
    };
    let sum = |tree: &Vec<i64>, i: usize| {
        let (mut i, mut s) = (i, 0);
        while i > 0 {
            s += tree[i];
            i -= i & i.wrapping_neg();
        }
        s
    };
    let mut last: HashMap<u64, usize> = HashMap::new();
    let (mut distances, mut prefixes, mut fractions) = (Vec::new(), Vec::new(), Vec::new());
    let mut at = 0usize;
    for req in trace {
        let mut prefix = 0usize;
        let mut leading = true;
        for &id in req {
            match last.get(&id) {
                Some(&p) => {
                    distances.push((sum(&tree, at) - sum(&tree, p + 1)) as f64);
                    add(&mut tree, p, -1);
                    prefix += usize::from(leading);
                }
                None => leading = false,
            }
            add(&mut tree, at, 1);
            last.insert(id, at);
            at += 1;
        }
        prefixes.push(prefix as f64);
        fractions.push(if req.is_empty() {
            0.0
        } else {
            prefix as f64 / req.len() as f64
        });
    }
    let distinct = last.len() as u64;
    let pct = |v: &mut Vec<f64>, q: f64| {
        if v.is_empty() {
            return 0.0;
        }
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * q).round() as usize]
    };
    let reuses = distances.len();
    let scale = distinct.max(1) as f64;
    Stats {
        requests: trace.len(),
        references: total as u64,
        distinct,
        reuse_fraction: reuses as f64 / total.max(1) as f64,
        reuse_distance: [0.5, 0.9, 0.99].map(|q| pct(&mut distances, q) / scale),
        shared_prefix: [
            prefixes.iter().sum::<f64>() / prefixes.len().max(1) as f64,
            pct(&mut prefixes, 0.9),
        ],
        shared_fraction: fractions.iter().sum::<f64>() / fractions.len().max(1) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(t: &[Request]) -> Vec<Vec<u64>> {
        t.iter().map(|r| r.hash_ids.clone()).collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_trace_and_another_seed_another() {
        for shape in [
            Shape::MultiTurn,
            Shape::Agent,
            Shape::SharedPrompt,
            Shape::Documents,
            Shape::OneShot,
        ] {
            let a = generate(&Params::new(shape, 1, 300));
            assert_eq!(a, generate(&Params::new(shape, 1, 300)), "{shape:?}");
            assert_ne!(a, generate(&Params::new(shape, 2, 300)), "{shape:?}");
            assert_eq!(a.len(), 300);
            assert!(a.windows(2).all(|w| w[0].timestamp <= w[1].timestamp));
            for r in &a {
                let blocks = r.hash_ids.len() as u64;
                assert!(r.input_length > (blocks - 1) * BLOCK_TOKENS, "{r:?}");
                assert!(r.input_length <= blocks * BLOCK_TOKENS, "{r:?}");
            }
        }
    }

    #[test]
    fn a_shared_id_means_a_shared_prefix() {
        // Ids are chained: wherever two requests hold the same id, every id before it agrees.
        let t = ids(&generate(&Params::new(Shape::SharedPrompt, 3, 500)));
        let mut prefix_of: HashMap<u64, Vec<u64>> = HashMap::new();
        for r in &t {
            for (i, id) in r.iter().enumerate() {
                let before = &r[..i];
                let seen = prefix_of.entry(*id).or_insert_with(|| before.to_vec());
                assert_eq!(seen.as_slice(), before);
            }
        }
    }

    #[test]
    fn each_shape_reuses_as_it_should() {
        let s = |shape| stats(&ids(&generate(&Params::new(shape, 7, 2000))));
        let one = s(Shape::OneShot);
        assert_eq!(one.reuse_fraction, 0.0);
        assert_eq!(one.distinct, one.references);
        // An agent re-reads its 8-block prompt every call: most references are reuses, and
        // every request's shared prefix is the prompt (once the first has run).
        let agent = s(Shape::Agent);
        assert!(agent.reuse_fraction > 0.6, "{agent:?}");
        assert!(agent.shared_prefix[0] > 7.9, "{agent:?}");
        // A conversation re-reads its growing history: deeper shared prefixes than the agent's.
        let chat = s(Shape::MultiTurn);
        assert!(chat.reuse_fraction > 0.5, "{chat:?}");
        let shared = s(Shape::SharedPrompt);
        assert!(
            shared.shared_prefix[0] > chat.shared_prefix[0],
            "{shared:?} {chat:?}"
        );
        let docs = s(Shape::Documents);
        assert!(docs.reuse_fraction > 0.8, "{docs:?}");
    }

    #[test]
    fn reuse_distance_counts_distinct_blocks_between() {
        // a b c a: 2 distinct blocks between the two a's; then b: a and c since b (the second
        // a moved a's last reference later).
        let st = stats(&[vec![1, 2, 3], vec![1, 2]]);
        assert_eq!((st.references, st.distinct), (5, 3));
        assert!((st.reuse_fraction - 0.4).abs() < 1e-9);
        assert!((st.reuse_distance[0] * 3.0 - 2.0).abs() < 1e-9);
        assert_eq!(st.shared_prefix[0], 1.0);
    }
}
