//! The segment format's own cost, against the floor of the same bytes in the same run:
//!
//! - frame encode (copy + CRC32C fused, header) and decode (header verify + copy + CRC32C fused) of
//!   256 KiB and 2 MiB payloads, against a memcpy plus a CRC32C pass over the same bytes
//!   (target: baseline time / frame time >= 0.85);
//! - opening a sealed 256 MiB segment from its footer alone against a full strict scan (reported);
//! - zstd on bf16 KV-like data: compression ratio and speed at levels 1 and 3 (decides the default).

use orbitkv_testkit::Xorshift;
use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, Throughput};
use orbitkv_benches::{Target, record, report};
use orbitkv_segments::frame::encode_frame;
use orbitkv_segments::{
    Alignment, Compression, FRAME_HEADER_LEN, FrameBody, FrameHeader, RecordMeta, ScanMode,
    Scanner, SegmentBuilder, SegmentHeader, TRAILER_LEN, Trailer,
};
use orbitkv_state::{
    CacheGroupId, Component, FormatDigest, HashDomain, Namespace, RankSpec, StateKey, TokenRange,
};

fn header(alignment: Alignment) -> SegmentHeader {
    SegmentHeader {
        segment_id: 1,
        sequence: 1,
        created_unix_ms: 0,
        directory_id: [0; 16],
        alignment,
        compression: false,
    }
}

fn meta(i: u64) -> Option<RecordMeta> {
    let mut native = [0u8; 32];
    native[..8].copy_from_slice(&i.to_le_bytes());
    Some(RecordMeta {
        key: StateKey::new(
            Namespace([1; 32]),
            HashDomain::VllmSha256Cbor,
            &native,
            CacheGroupId(0),
            Component::DenseKv,
            RankSpec::Rank(0),
        )
        .ok()?,
        parent: None,
        range: TokenRange::new(i * 16, i * 16 + 16).ok()?,
        format: FormatDigest([2; 32]),
    })
}

/// bf16 values of a unit normal distribution (KV activations are roughly normal), deterministic.
fn bf16_kv(len: usize) -> Vec<u8> {
    let mut x = Xorshift::new(0x2545_f491_4f6c_dd1du64);
    let mut uniform = move || ((x.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let (u1, u2) = (uniform(), uniform());
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        let bits = (z as f32).to_bits();
        out.extend_from_slice(&((bits >> 16) as u16).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn frames(c: &mut Criterion) {
    let seg = header(Alignment::Packed);
    for (name, len) in [("256KiB", 256usize << 10), ("2MiB", 2 << 20)] {
        let payload = bf16_kv(len);
        let Some(m) = meta(1) else { return };
        let mut g = c.benchmark_group(format!("frame_{name}"));
        g.throughput(Throughput::Bytes(len as u64));
        let mut out = Vec::with_capacity(len + 8192);
        g.bench_function("encode", |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    out.clear();
                    let h = encode_frame(
                        &seg,
                        FrameBody::Record(m.clone()),
                        7,
                        black_box(&payload),
                        Compression::None,
                        &mut out,
                    );
                    black_box((h.is_ok(), &out));
                }
                record(&format!("encode_{name}"), iters, t.elapsed())
            })
        });
        let mut frame = Vec::new();
        let _ = encode_frame(
            &seg,
            FrameBody::Record(m.clone()),
            7,
            &payload,
            Compression::None,
            &mut frame,
        );
        let mut dst = vec![0u8; len];
        g.bench_function("decode_verify_copy", |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    let ok = FrameHeader::decode(black_box(&frame), 0).and_then(|h| {
                        h.copy_payload(
                            &frame[FRAME_HEADER_LEN..FRAME_HEADER_LEN + len],
                            &mut dst,
                            0,
                        )
                    });
                    black_box((ok.is_ok(), &dst));
                }
                record(&format!("decode_{name}"), iters, t.elapsed())
            })
        });
        let mut copy = vec![0u8; len];
        g.bench_function("memcpy_then_crc32c", |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    copy.copy_from_slice(black_box(&payload));
                    black_box(crc32c::crc32c(&copy));
                }
                record(&format!("baseline_{name}"), iters, t.elapsed())
            })
        });
        g.finish();
    }
}

fn sealed_open(c: &mut Criterion) {
    const RECORD: usize = 256 << 10;
    const RECORDS: u64 = 1024; // 256 MiB of payload
    let mut b = SegmentBuilder::new(header(Alignment::Direct), Compression::None);
    let payload = bf16_kv(RECORD);
    for i in 0..RECORDS {
        let Some(m) = meta(i) else { return };
        if b.append_record(m, i + 1, &payload).is_err() {
            eprintln!("building the segment failed");
            return;
        }
    }
    let file = b.seal();
    let len = file.len() as u64;
    let mut g = c.benchmark_group("sealed_segment_256MiB");
    g.sample_size(10);
    g.bench_function("open_from_footer", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                let entries =
                    Trailer::decode(&file[file.len() - TRAILER_LEN..], len).and_then(|t| {
                        t.open_footer(
                            &file[t.footer_offset as usize
                                ..(t.footer_offset + t.footer_len) as usize],
                            Alignment::Direct,
                        )
                    });
                black_box(entries.map(|f| f.entries.len()).ok());
            }
            record("open_footer", iters, t.elapsed())
        })
    });
    g.bench_function("full_strict_scan", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                let data_end = Trailer::decode(&file[file.len() - TRAILER_LEN..], len)
                    .map(|t| t.footer_offset as usize)
                    .unwrap_or(file.len());
                let h = SegmentHeader::decode(&file);
                if let Ok(h) = h {
                    black_box(Scanner::new(&file[..data_end], h, ScanMode::Strict).count());
                }
            }
            record("full_scan", iters, t.elapsed())
        })
    });
    g.finish();
    if let Ok(t) = Trailer::decode(&file[file.len() - TRAILER_LEN..], len) {
        println!(
            "sealed open reads {} bytes (trailer + footer) of a {} byte segment: {:.3}%",
            TRAILER_LEN as u64 + t.footer_len,
            len,
            100.0 * (TRAILER_LEN as u64 + t.footer_len) as f64 / len as f64
        );
    }
}

fn zstd_on_kv(c: &mut Criterion) {
    let data = bf16_kv(2 << 20);
    let mut g = c.benchmark_group("zstd_bf16_kv_2MiB");
    g.throughput(Throughput::Bytes(data.len() as u64));
    for level in [1, 3] {
        let compressed = zstd::bulk::compress(&data, level).unwrap_or_default();
        println!(
            "zstd level {level} on bf16 KV-like data: {} -> {} bytes (ratio {:.3})",
            data.len(),
            compressed.len(),
            data.len() as f64 / compressed.len().max(1) as f64
        );
        g.bench_function(format!("compress_level{level}"), |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    black_box(
                        zstd::bulk::compress(black_box(&data), level)
                            .map(|v| v.len())
                            .ok(),
                    );
                }
                record(&format!("zstd{level}"), iters, t.elapsed())
            })
        });
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    frames(&mut c);
    sealed_open(&mut c);
    zstd_on_kv(&mut c);
    c.final_summary();
    for name in ["256KiB", "2MiB"] {
        report(
            &format!("frame encode {name}: (memcpy + crc32c) / encode"),
            &format!("encode_{name}"),
            &format!("baseline_{name}"),
            false,
            Target::AtLeast(0.85),
        );
        report(
            &format!("frame decode {name}: (memcpy + crc32c) / decode"),
            &format!("decode_{name}"),
            &format!("baseline_{name}"),
            false,
            Target::AtLeast(0.85),
        );
    }
    report(
        "sealed open: footer-only time / full-scan time",
        "open_footer",
        "full_scan",
        true,
        Target::AtMost(1.0),
    );
}
