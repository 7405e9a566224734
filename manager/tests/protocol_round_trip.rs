//! Every message of the protocol survives encode → frame → decode unchanged; every prefix of a
//! frame, every unknown type and version, and arbitrary bytes are refused with a typed error,
//! never a panic.

use orbitkv_gpu_bridge::{GroupGeometry, PageMemory, PageRef, PoolId, PoolSpec};
use orbitkv_protocol::message::{
    GroupHashes, LoadPage, LoadRequest, MAX_QUERY_BLOCKS, MAX_QUERY_GROUPS, Proof, ProofLoad,
    PublishPage, PublishRequest, QueryRequest, Register,
};
use orbitkv_protocol::{
    DEFAULT_MAX_BODY, ErrorCode, HEADER_LEN, Message, PageStatus, ProtocolError, Role, decode_frame,
};
use orbitkv_state::{HashDomain, Rule};
use proptest::prelude::*;

fn page(i: u32) -> PageRef {
    PageRef {
        pool: PoolId(3),
        index: i,
        generation: 9 + u64::from(i),
    }
}

fn query() -> QueryRequest {
    QueryRequest {
        token: [7; 32],
        epoch: 4,
        origin: 16,
        end: 4096,
        groups: vec![
            GroupHashes {
                group: 0,
                hashes: vec![vec![1; 32], vec![2; 32]],
            },
            GroupHashes {
                group: 1,
                hashes: vec![vec![3; 8]],
            },
        ],
    }
}

fn proof() -> Proof {
    Proof {
        boundary: 48,
        loads: vec![ProofLoad {
            group: 0,
            rank: u32::MAX,
            blocks: vec![0, 1, 2],
        }],
    }
}

fn every_message() -> Vec<Message> {
    vec![
        Message::Hello {
            client: "engine-sim".into(),
            pid: 4242,
        },
        Message::Register(Register {
            instance: "vllm-0".into(),
            role: Role::Worker,
            rank: 1,
            workers: 2,
            identity: [5; 32],
            model: "org/tiny".into(),
            revision: "main".into(),
            domain: HashDomain::VllmSha256Cbor,
            layout: vec![1, 2, 3],
            rules: vec![
                (0, Rule::Prefix),
                (1, Rule::Window { tokens: 4096 }),
                (2, Rule::Checkpoint { grid: 512 }),
                (3, Rule::Undefined),
            ],
            scope: "tenant-a".into(),
            formats: vec![vec![9; 40], vec![8; 12]],
            seal_timeout_ms: 30_000,
            no_scheduler: false,
        }),
        Message::RegisterPool {
            token: [1; 32],
            spec: PoolSpec {
                pool: PoolId(3),
                page_bytes: 1 << 20,
                pages: 128,
                aliased: false,
                groups: vec![GroupGeometry {
                    group: 0,
                    layers: 32,
                    offset: 0,
                    layer_stride: 32 << 10,
                    layer_bytes: 32 << 10,
                    page_stride: 1 << 20,
                    parts: 1,
                    part_stride: 0,
                    layers_inside: false,
                }],
            },
            memory: PageMemory::Host,
        },
        Message::RegisterPool {
            token: [9; 32],
            spec: PoolSpec {
                pool: PoolId(4),
                page_bytes: 2 << 20,
                pages: 16,
                aliased: false,
                groups: vec![GroupGeometry {
                    group: 1,
                    layers: 2,
                    offset: 0,
                    layer_stride: 1 << 20,
                    layer_bytes: 1 << 20,
                    page_stride: 2 << 20,
                    parts: 1,
                    part_stride: 0,
                    layers_inside: false,
                }],
            },
            memory: PageMemory::Device {
                device: -1,
                uuid: std::array::from_fn(|i| i as u8 + 1),
                ipc_handle: std::array::from_fn(|i| i as u8 ^ 0xA5),
                offset: 3 << 30,
            },
        },
        Message::Query(query()),
        Message::Acquire(query()),
        Message::Load(LoadRequest {
            token: [2; 32],
            epoch: 4,
            lease: 77,
            pages: vec![LoadPage {
                block: 1,
                group: 0,
                rank: 0,
                page: page(5),
                layer_start: 0,
                layer_end: 32,
            }],
        }),
        Message::Publish(PublishRequest {
            token: [2; 32],
            epoch: 4,
            pages: vec![
                PublishPage {
                    group: 0,
                    rank: 0,
                    hash: vec![8; 32],
                    parent: vec![],
                    start: 0,
                    end: 16,
                    page: page(1),
                },
                PublishPage {
                    group: 0,
                    rank: 0,
                    hash: vec![9; 32],
                    parent: vec![8; 32],
                    start: 16,
                    end: 32,
                    page: page(2),
                },
            ],
        }),
        Message::Release {
            token: [3; 32],
            lease: 77,
        },
        Message::Stats,
        Message::Retire { namespace: [6; 32] },
        Message::Sync,
        Message::Welcome {
            server: "orbitkv 0.1.0".into(),
            max_body: DEFAULT_MAX_BODY,
        },
        Message::Sealed {
            session: 11,
            epoch: 4,
            namespace: [6; 32],
            token: [7; 32],
        },
        Message::PoolRegistered { pool: PoolId(3) },
        Message::UnregisterPool {
            token: [9; 32],
            pool: PoolId(3),
        },
        Message::PoolUnregistered { pool: PoolId(3) },
        Message::Proof(proof()),
        Message::Miss {
            reason: 3,
            detail: "group 0 rank 0: gap at token 32".into(),
        },
        Message::Leased {
            lease: 77,
            ttl_ms: 5000,
            proof: proof(),
        },
        Message::Loaded {
            pages: vec![PageStatus::Ok, PageStatus::BadRecord],
        },
        Message::PublishCopied {
            pages: vec![PageStatus::Ok, PageStatus::ChangedDuringCopy],
        },
        Message::PublishDurable {
            pages: vec![
                PageStatus::Ok,
                PageStatus::Refused,
                PageStatus::RetryLater,
                PageStatus::Rejected,
            ],
            retry_after_ms: 1000,
        },
        Message::Released,
        Message::StatsReply {
            text: "orbitkv_queries_total 3\n".into(),
        },
        Message::Retired { watermark: 1234 },
        Message::Synced,
        Message::Error {
            code: ErrorCode::SealRefused,
            retry_after_ms: 0,
            detail: "ranks disagree on dtype".into(),
        },
        Message::Error {
            code: ErrorCode::RetryLater,
            retry_after_ms: 250,
            detail: "no space left".into(),
        },
        Message::Error {
            code: ErrorCode::UnknownNamespace,
            retry_after_ms: 0,
            detail: "namespace 00 is not registered".into(),
        },
    ]
}

#[test]
fn every_message_round_trips() {
    for (i, m) in every_message().into_iter().enumerate() {
        let f = m
            .encode_frame(i as u64)
            .unwrap_or_else(|e| panic!("{m:?}: {e}"));
        let (req, back) =
            decode_frame(&f, DEFAULT_MAX_BODY).unwrap_or_else(|e| panic!("{m:?}: {e}"));
        assert_eq!(req, i as u64);
        assert_eq!(back, m);
    }
}

#[test]
fn every_prefix_and_every_extension_is_refused() {
    for m in every_message() {
        let f = m.encode_frame(1).unwrap_or_else(|e| panic!("{e}"));
        for cut in 0..f.len() {
            assert!(
                decode_frame(&f[..cut], DEFAULT_MAX_BODY).is_err(),
                "{m:?} cut at {cut}"
            );
        }
        // A body with a byte more (the header saying so): trailing bytes.
        let mut longer = f.clone();
        longer.push(0);
        let len = u32::from_le_bytes([longer[16], longer[17], longer[18], longer[19]]) + 1;
        longer[16..20].copy_from_slice(&len.to_le_bytes());
        assert!(matches!(
            decode_frame(&longer, DEFAULT_MAX_BODY),
            Err(ProtocolError::TrailingBytes { .. } | ProtocolError::BadField { .. })
        ));
    }
}

#[test]
fn unknown_types_versions_and_sizes_are_typed_errors() {
    let f = Message::Sync
        .encode_frame(1)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut t = f.clone();
    t[6..8].copy_from_slice(&0x0999u16.to_le_bytes());
    assert_eq!(
        decode_frame(&t, DEFAULT_MAX_BODY),
        Err(ProtocolError::UnknownType(0x0999))
    );
    let mut v = f.clone();
    v[4..6].copy_from_slice(&9u16.to_le_bytes());
    assert!(matches!(
        decode_frame(&v, DEFAULT_MAX_BODY),
        Err(ProtocolError::UnknownVersion { got: 9, .. })
    ));
    let big = Message::StatsReply {
        text: "x".repeat(100),
    }
    .encode_frame(1)
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        decode_frame(&big, 50),
        Err(ProtocolError::TooLarge { .. })
    ));
    // A count claiming more items than the body holds is refused before anything is reserved.
    let mut q = Message::Query(query())
        .encode_frame(1)
        .unwrap_or_else(|e| panic!("{e}"));
    let groups_at = HEADER_LEN + 32 + 24;
    q[groups_at..groups_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        decode_frame(&q, DEFAULT_MAX_BODY),
        Err(ProtocolError::Truncated { .. })
    ));
}

#[test]
fn a_query_names_a_bounded_number_of_hashes_and_groups() {
    // One-byte hashes: a frame of a few MiB would otherwise decode to millions of allocations.
    let of = |counts: &[usize]| QueryRequest {
        groups: counts
            .iter()
            .enumerate()
            .map(|(g, &k)| GroupHashes {
                group: g as u32,
                hashes: vec![vec![1]; k],
            })
            .collect(),
        ..query()
    };
    let decodes = |q: QueryRequest| {
        let f = Message::Query(q)
            .encode_frame(1)
            .unwrap_or_else(|e| panic!("{e}"));
        decode_frame(&f, DEFAULT_MAX_BODY)
    };
    let half = MAX_QUERY_BLOCKS / 2;
    assert!(decodes(of(&[half, half])).is_ok());
    assert!(matches!(
        decodes(of(&[half, half + 1])),
        Err(ProtocolError::BadField { .. })
    ));
    assert!(decodes(of(&vec![1; MAX_QUERY_GROUPS])).is_ok());
    assert!(matches!(
        decodes(of(&vec![1; MAX_QUERY_GROUPS + 1])),
        Err(ProtocolError::BadField { .. })
    ));
}

#[test]
fn a_register_and_a_pool_carry_a_bounded_number_of_groups() {
    // Empty formats take four bytes each on the wire and far more decoded.
    let decodes = |formats: usize, rules: usize| {
        let Some(Message::Register(mut reg)) = every_message().into_iter().nth(1) else {
            panic!("the second message is a Register");
        };
        reg.formats = vec![Vec::new(); formats];
        reg.rules = vec![(0, Rule::Prefix); rules];
        let f = Message::Register(reg)
            .encode_frame(1)
            .unwrap_or_else(|e| panic!("{e}"));
        decode_frame(&f, DEFAULT_MAX_BODY)
    };
    let most = orbitkv_state::layout::MAX_GROUPS;
    assert!(decodes(most, most).is_ok());
    // A pool's groups likewise.
    let pool = |n: usize| {
        let Some(Message::RegisterPool {
            token,
            mut spec,
            memory,
        }) = every_message().into_iter().nth(2)
        else {
            panic!("the third message is a RegisterPool");
        };
        spec.groups = vec![spec.groups[0]; n];
        let f = Message::RegisterPool {
            token,
            spec,
            memory,
        }
        .encode_frame(1)
        .unwrap_or_else(|e| panic!("{e}"));
        decode_frame(&f, DEFAULT_MAX_BODY)
    };
    assert!(pool(most).is_ok());
    assert!(matches!(
        pool(most + 1),
        Err(ProtocolError::BadField { .. })
    ));
    for (formats, rules) in [(most + 1, 0), (0, most + 1), (1 << 20, 0)] {
        assert!(
            matches!(decodes(formats, rules), Err(ProtocolError::BadField { .. })),
            "{formats} formats, {rules} rules"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bodies_never_panic(kind in prop::sample::select(vec![
        0x0101u16, 0x0102, 0x0103, 0x0104, 0x0110, 0x0111, 0x0112, 0x0113, 0x0114, 0x0120, 0x0121,
        0x0122, 0x0201, 0x0202, 0x0203, 0x0204, 0x0210, 0x0211, 0x0212, 0x0213, 0x0214, 0x0215,
        0x0216, 0x0220, 0x0221, 0x0222, 0x02ff, 0x7777,
    ]), body in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = Message::decode(kind, &body);
    }

    #[test]
    fn a_flipped_byte_decodes_to_an_error_or_to_some_message(i in 0usize..10_000, bit in 0u8..8) {
        for m in every_message() {
            let mut f = m.encode_frame(5).unwrap_or_else(|e| panic!("{e}"));
            let at = i % f.len();
            f[at] ^= 1 << bit;
            let _ = decode_frame(&f, DEFAULT_MAX_BODY);
        }
    }
}

/// The fuzz seeds are encoded by hand from the byte tables in docs/protocol.md: the tables and
/// the code agree.
#[test]
fn frames_encoded_from_the_byte_tables_decode() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/protocol_decode");
    let mut seen = 0;
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap_or_else(|e| panic!("{e}")).path();
        let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{e}"));
        let (_, m) = decode_frame(&bytes, DEFAULT_MAX_BODY)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        if p.ends_with("query") {
            assert_eq!(
                m,
                Message::Query(QueryRequest {
                    groups: vec![GroupHashes {
                        group: 0,
                        hashes: vec![vec![1; 32], vec![2; 32]],
                    }],
                    ..query()
                })
            );
        }
        if p.ends_with("register_pool") {
            // Two aliased groups placed layer-outermost: K and V runs of 1 KiB, 16 pages.
            let g = |group, layers| GroupGeometry {
                group,
                layers,
                offset: 0,
                page_stride: 1024,
                layer_stride: 2 * 16 * 1024,
                layer_bytes: 2048,
                parts: 2,
                part_stride: 16 * 1024,
                layers_inside: false,
            };
            let spec = PoolSpec {
                pool: PoolId(5),
                page_bytes: 8192,
                pages: 16,
                aliased: true,
                groups: vec![g(0, 4), g(1, 2)],
            };
            assert!(spec.validate().is_ok());
            assert_eq!(
                m,
                Message::RegisterPool {
                    token: [7; 32],
                    spec,
                    memory: PageMemory::Host,
                }
            );
        }
        seen += 1;
    }
    assert!(seen >= 6);
}
