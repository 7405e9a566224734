//! Tests of the host backend across its files: region checks, shared state words, mid-copy reuse.

use std::fs::File;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::layout::Layout;
use super::*;
use crate::backend::{PageLease, PagePool};
use crate::error::{Error, Result};
use crate::pool::{GroupGeometry, PageRef, PoolId, PoolSpec, generation_of};

fn spec(page_bytes: u64, pages: u32) -> PoolSpec {
    PoolSpec {
        pool: PoolId(2),
        page_bytes,
        pages,
        aliased: false,
        groups: vec![GroupGeometry {
            group: 0,
            layers: 4,
            offset: 0,
            layer_stride: page_bytes / 4,
            layer_bytes: page_bytes / 4,
            page_stride: page_bytes,
            parts: 1,
            part_stride: 0,
            layers_inside: false,
        }],
    }
}

fn attach(pool: &HostPool, spec: PoolSpec) -> Result<Arc<AttachedPool>> {
    let fd = pool.fd().try_clone_to_owned().map_err(|source| Error::Io {
        what: "dup",
        source,
    })?;
    AttachedPool::attach(fd, spec, 1)
}

#[test]
fn a_device_pools_state_words_are_shared_and_fence_alike() -> Result<()> {
    let engine = HostPool::create_states(spec(1 << 20, 64))?;
    let dup = || {
        engine
            .fd()
            .try_clone_to_owned()
            .map_err(|source| Error::Io {
                what: "dup",
                source,
            })
    };
    let manager = FencedStates::attach(dup()?, &spec(1 << 20, 64))?;
    // The region holds the words only: 64 MiB of pages are not in it.
    let size = File::from(dup()?)
        .metadata()
        .map_err(|source| Error::Io {
            what: "stat",
            source,
        })?
        .len();
    assert_eq!(size, DATA_ALIGN);
    // The engine reuses page 3; the manager sees the new generation and leases it there.
    let p = engine.reuse(3)?;
    assert_eq!(generation_of(manager.state(3)?.load()), p.generation);
    manager.state(3)?.lease(p)?;
    assert!(matches!(engine.reuse(3), Err(Error::PageLeased { .. })));
    assert_eq!(engine.leases(3)?, 1);
    manager.state(3)?.release();
    let q = engine.reuse(3)?;
    assert!(matches!(
        manager.state(3)?.lease(p),
        Err(Error::StaleGeneration { .. })
    ));
    manager.state(3)?.lease(q)?;
    assert!(matches!(
        manager.state(64),
        Err(Error::IndexOutOfRange { .. })
    ));
    // No page bytes to write or read here.
    assert!(
        matches!(engine.write(0, 0, &[1; 8]), Err(Error::Region(m)) if m.contains("device memory"))
    );
    assert!(matches!(
        engine.read(0, 0, &mut [0; 8]),
        Err(Error::Region(_))
    ));
    // A states-only region is not a host pool, and a host pool's region is not one.
    assert!(matches!(
        AttachedPool::attach(dup()?, spec(1 << 20, 64), 1),
        Err(Error::Region(_))
    ));
    let host = HostPool::create(spec(4096, 8))?;
    let host_fd = host.fd().try_clone_to_owned().map_err(|source| Error::Io {
        what: "dup",
        source,
    })?;
    assert!(matches!(
        FencedStates::attach(host_fd, &spec(4096, 8)),
        Err(Error::Region(_))
    ));
    Ok(())
}

#[test]
fn a_region_must_match_its_registration() -> Result<()> {
    let pool = HostPool::create(spec(4096, 8))?;
    assert!(attach(&pool, spec(4096, 8)).is_ok());
    // Another page count or size: the region's size or header disagrees.
    assert!(matches!(
        attach(&pool, spec(4096, 9)),
        Err(Error::Region(_))
    ));
    assert!(matches!(
        attach(&pool, spec(8192, 4)),
        Err(Error::Region(_))
    ));
    let mut other = spec(4096, 8);
    other.pool = PoolId(3);
    assert!(matches!(attach(&pool, other), Err(Error::Region(m)) if m.contains("pool id")));
    // Bad magic.
    pool.states().region().write(0, b"NOTAPOOL")?;
    assert!(matches!(attach(&pool, spec(4096, 8)), Err(Error::Region(m)) if m.contains("magic")));
    Ok(())
}

#[test]
fn an_unsealed_region_is_refused() -> Result<()> {
    let f = tempfile::tempfile().map_err(|source| Error::Io {
        what: "tmp",
        source,
    })?;
    let layout = Layout::of(&spec(4096, 8), true)?;
    f.set_len(layout.len).map_err(|source| Error::Io {
        what: "len",
        source,
    })?;
    let fd = f.as_fd().try_clone_to_owned().map_err(|source| Error::Io {
        what: "dup",
        source,
    })?;
    assert!(matches!(
        AttachedPool::attach(fd, spec(4096, 8), 1),
        Err(Error::Region(m)) if m.contains("sealed")
    ));
    Ok(())
}

#[test]
fn no_copy_out_of_a_page_reused_mid_copy_is_kept() -> Result<()> {
    // 4 MiB pages, so copies take long enough to overlap the engine's reuses.
    let page_bytes = 4u64 << 20;
    let engine = Arc::new(HostPool::create(spec(page_bytes, 1))?);
    let manager = attach(&engine, spec(page_bytes, 1))?;
    let fill = move |g: u64| vec![(g % 251) as u8 + 1; page_bytes as usize];
    engine.write(0, 0, &fill(0))?;
    // The generation whose bytes are completely written.
    let ready = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (engine, ready, stop) = (engine.clone(), ready.clone(), stop.clone());
        std::thread::spawn(move || -> Result<()> {
            let mut k = 0u64;
            while !stop.load(Ordering::Acquire) {
                // An engine that reallocates without asking: bump, then write; then the
                // page stays put for a varying while (0 to 1.2 ms), so some copies finish
                // and others overlap the next reuse.
                let r = engine.reuse_ignoring_leases(0)?;
                // Back to front, so the engine's writes cross the manager's front-to-back
                // copy instead of trailing it.
                let bytes = fill(r.generation);
                for (i, chunk) in bytes.chunks(64 << 10).enumerate().rev() {
                    engine.write(0, (i as u64) << 16, chunk)?;
                }
                ready.store(r.generation, Ordering::Release);
                k += 1;
                std::thread::sleep(std::time::Duration::from_micros((k % 7) * 200));
            }
            Ok(())
        })
    };
    let (mut kept, mut discarded, mut stale) = (0, 0, 0);
    let pool: Arc<dyn PagePool> = manager.clone();
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while (kept < 20 || discarded + stale < 20) && std::time::Instant::now() < deadline {
        let page = PageRef {
            pool: PoolId(2),
            index: 0,
            generation: ready.load(Ordering::Acquire),
        };
        let lease = match PageLease::take(pool.clone(), page) {
            Ok(l) => l,
            Err(Error::StaleGeneration { .. }) => {
                stale += 1;
                continue;
            }
            Err(e) => return Err(e),
        };
        out.clear();
        match manager.copy_out(&lease, 0, &mut out) {
            Ok(()) => {
                kept += 1;
                assert!(
                    out == fill(page.generation),
                    "a kept copy holds other bytes than generation {}",
                    page.generation
                );
            }
            Err(Error::ChangedDuringCopy { .. }) => {
                discarded += 1;
                assert!(out.is_empty());
            }
            Err(Error::StaleGeneration { .. }) => stale += 1,
            Err(e) => return Err(e),
        }
    }
    stop.store(true, Ordering::Release);
    churn
        .join()
        .unwrap_or_else(|_| panic!("the engine thread panicked"))?;
    eprintln!("kept {kept}, discarded mid-copy {discarded}, stale before copying {stale}");
    assert!(kept > 0, "no copy ever finished between reuses");
    assert!(
        discarded + stale > 0,
        "the engine never reused the page during a copy"
    );
    Ok(())
}

#[test]
fn engine_memory_is_mapped_only_when_sealed_against_shrinking() -> Result<()> {
    let s = spec(4096, 4);
    let dup = |f: std::os::fd::BorrowedFd<'_>| {
        f.try_clone_to_owned().map_err(|source| Error::Io {
            what: "dup",
            source,
        })
    };
    let states = HostPool::create_states(s.clone())?;
    // An unsealed memfd: copied through the descriptor.
    let file = engine_memory(4 * 4096 + 100)?;
    let p = AttachedPool::attach_engine_memory(
        dup(states.fd())?,
        dup(file.as_fd())?,
        100,
        s.clone(),
        1,
    )?;
    assert!(p.copies_through_file());
    // One byte short of the pages from that offset: refused.
    assert!(
        AttachedPool::attach_engine_memory(
            dup(states.fd())?,
            dup(file.as_fd())?,
            101,
            s.clone(),
            1
        )
        .is_err()
    );
    // A file that is not memory: refused.
    let proc = File::open("/proc/self/status").map_err(|source| Error::Io {
        what: "open",
        source,
    })?;
    assert!(
        AttachedPool::attach_engine_memory(dup(states.fd())?, dup(proc.as_fd())?, 0, s.clone(), 1)
            .is_err()
    );
    // A memfd of hugetlbfs, sealed or not: refused, as engine memory and as a region. A hole
    // punched in it would fault a mapping of it; it takes no pread/pwrite either.
    match engine_pool::hugetlb_memfd(2 << 20) {
        Ok(huge) => {
            assert!(
                AttachedPool::attach_engine_memory(
                    dup(states.fd())?,
                    dup(huge.as_fd())?,
                    0,
                    s.clone(),
                    1
                )
                .is_err()
            );
            assert!(
                AttachedPool::attach(dup(huge.as_fd())?, s.clone(), 1)
                    .is_err_and(|e| e.to_string().contains("hugetlbfs"))
            );
        }
        // A kernel without hugetlbfs has no such memfd to refuse.
        Err(e) => println!("SKIPPED: no hugetlbfs memfd here ({e})"),
    }
    // A memfd sealed against shrinking (a host pool's region): mapped.
    let host = HostPool::create(s.clone())?;
    let p = AttachedPool::attach_engine_memory(
        dup(states.fd())?,
        dup(host.fd())?,
        host.data_offset(),
        s,
        1,
    )?;
    assert!(!p.copies_through_file());
    Ok(())
}

#[test]
fn an_unregistered_pool_is_let_go_of_once_no_copy_holds_it() -> Result<()> {
    use std::time::Duration;
    let engine = HostPool::create(spec(4096, 4))?;
    let bridge = crate::Bridge::new();
    bridge.register(attach(&engine, spec(4096, 4))?)?;
    // A copy in progress holds the pool: ending the registration waits for it, then says so.
    let lease = bridge.lease(1, engine.page_ref(0)?)?;
    let held = bridge.unregister_and_release(PoolId(2), Duration::from_millis(20))?;
    assert!(!held, "let go of while a copy held it");
    drop(lease);
    // Gone from the bridge either way: no new copy starts, and a second end is refused.
    assert!(matches!(
        bridge.lease(1, engine.page_ref(1)?),
        Err(Error::UnknownPool { .. })
    ));
    assert!(matches!(
        bridge.unregister_and_release(PoolId(2), Duration::ZERO),
        Err(Error::UnknownPool { .. })
    ));
    // Without a copy holding it, let go of at once.
    bridge.register(attach(&engine, spec(4096, 4))?)?;
    assert!(bridge.unregister_and_release(PoolId(2), Duration::ZERO)?);
    Ok(())
}

#[test]
fn a_batched_copy_out_gives_each_page_its_bytes_or_its_own_error() -> Result<()> {
    let (page, pages) = (4096u64, 4u32);
    let mut other = spec(page, pages);
    other.pool = PoolId(3);
    let engines = [
        HostPool::create(spec(page, pages))?,
        HostPool::create(other)?,
    ];
    let bridge = crate::Bridge::new();
    for e in &engines {
        bridge.register(attach(e, e.spec().clone())?)?;
        for i in 0..pages {
            let bytes = vec![(e.spec().pool.0 * 16 + i) as u8; page as usize];
            e.write_group(i, 0, &bytes)?;
        }
    }
    // Pool 2's pages 0 and 1, pool 3's page 2, pool 2's page 3 (three runs of one pool), and
    // pool 2's page 2 naming a group the pool lacks.
    let named = [(0, 0, 0), (0, 1, 0), (1, 2, 0), (0, 3, 0), (0, 2, 9)];
    let leases = named
        .iter()
        .map(|&(e, i, _)| bridge.lease(1, engines[e].page_ref(i)?))
        .collect::<Result<Vec<_>>>()?;
    let mut outs: Vec<Vec<u8>> = vec![vec![0xee]; named.len()];
    let mut pages_out: Vec<crate::CopyOut<'_>> = leases
        .iter()
        .zip(&named)
        .zip(&mut outs)
        .map(|((lease, &(_, _, group)), out)| crate::CopyOut { lease, group, out })
        .collect();
    let results = bridge.publish_appending_many(&mut pages_out);
    assert_eq!(results.len(), named.len());
    for (k, (&(e, i, group), r)) in named.iter().zip(&results).enumerate() {
        let out = &outs[k];
        if group == 9 {
            assert!(matches!(r, Err(Error::Geometry(_))), "page {k}: {r:?}");
            assert_eq!(out, &[0xee], "a refused page's buffer is as it was");
        } else {
            assert!(r.is_ok(), "page {k}: {r:?}");
            let fill = (engines[e].spec().pool.0 * 16 + i) as u8;
            assert_eq!(out[0], 0xee, "appended after what was there");
            assert!(out[1..].iter().all(|&b| b == fill), "page {k}: other bytes");
            assert_eq!(out.len(), 1 + page as usize);
        }
    }
    Ok(())
}
