//! The CUDA pool: engine pages in device memory, leased and fenced like host pages.
//! Its fencing is the shared [`FencedStates`]; its copies go through a [`DeviceCopier`].
//! This file holds no `unsafe`.

#![forbid(unsafe_code)]

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::copier::DeviceCopier;
use super::driver::{Cuda, DeviceRegion};
use crate::backend::{CopyOut, PageLease, PagePool, StagedLoad};
use crate::error::{Error, Result};
use crate::host::FencedStates;
use crate::pool::{PageRef, PoolSpec, generation_of};
use crate::staging::Item;

/// A pool of engine pages in device memory, fenced by the same [`FencedStates`] as the host
/// backend's pools (generation and lease count in one atomic). Copies go through a
/// [`DeviceCopier`].
pub struct CudaPool {
    // Dropped first: its stream drains before the region closes.
    copier: Mutex<DeviceCopier>,
    spec: PoolSpec,
    epoch: u64,
    cuda: Cuda,
    region: DeviceRegion,
    states: FencedStates,
    detached: AtomicBool,
}

impl CudaPool {
    /// A pool of `spec`'s pages in `region`, fenced by the state words the engine shares in
    /// `states`, copying through `staging` bytes of pinned memory.
    pub fn new(
        cuda: Cuda,
        spec: PoolSpec,
        epoch: u64,
        region: DeviceRegion,
        states: FencedStates,
        staging: usize,
    ) -> Result<Self> {
        spec.validate()?;
        region.at(
            0,
            usize::try_from(spec.page_bytes * u64::from(spec.pages)).unwrap_or(usize::MAX),
        )?;
        cuda.bind()?;
        let copier = DeviceCopier::new(&cuda, staging)?;
        Ok(Self {
            states,
            spec,
            epoch,
            cuda,
            region,
            copier: Mutex::new(copier),
            detached: AtomicBool::new(false),
        })
    }

    /// The device region.
    pub fn region(&self) -> &DeviceRegion {
        &self.region
    }

    fn check_attached(&self) -> Result<()> {
        if self.detached.load(Ordering::Acquire) {
            return Err(Error::Detached {
                pool: self.spec.pool,
            });
        }
        Ok(())
    }

    fn copier(&self) -> Result<std::sync::MutexGuard<'_, DeviceCopier>> {
        self.cuda.bind()?;
        Ok(self.copier.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl PagePool for CudaPool {
    fn spec(&self) -> &PoolSpec {
        &self.spec
    }

    fn epoch(&self) -> u64 {
        self.epoch
    }

    fn take_lease(&self, page: PageRef) -> Result<()> {
        self.check_attached()?;
        self.states.lease(page)
    }

    fn release(&self, index: u32) {
        self.states.release(index);
    }

    fn generation(&self, index: u32) -> Result<u64> {
        self.states.generation(index)
    }

    fn copy_in(
        &self,
        lease: &PageLease,
        group: u32,
        layers: Range<u32>,
        bytes: &[u8],
    ) -> Result<()> {
        self.check_attached()?;
        self.states.check(lease.page())?;
        let item = Item {
            page: lease.page(),
            group,
            layers,
        };
        self.copier()?
            .load(&self.region, &self.spec, &[item], &[bytes], |_| {})
    }

    fn copy_out(&self, lease: &PageLease, group: u32, out: &mut Vec<u8>) -> Result<()> {
        let mut one = [CopyOut { lease, group, out }];
        let r = self.copy_out_many(&mut one).pop();
        r.unwrap_or_else(|| Err(Error::Geometry("no result for the page".into())))
    }

    /// Fences every page, copies them out in batches through both staging halves, then
    /// re-checks each page's generation (as the host backend does: a page reused during the
    /// copy is not kept).
    fn copy_out_many(&self, pages: &mut [CopyOut<'_>]) -> Vec<Result<()>> {
        let mut results = Vec::with_capacity(pages.len());
        let mut items = Vec::with_capacity(pages.len());
        // Per item: its page's position, its generation before the copy, its buffer's length.
        let mut copying = Vec::with_capacity(pages.len());
        for (i, c) in pages.iter().enumerate() {
            let fenced = self.check_attached().and_then(|()| {
                let page = c.lease.page();
                let before = generation_of(self.states.check(page)?);
                let layers = self.spec.group(c.group)?.all_layers();
                let group = c.group;
                Ok((
                    Item {
                        page,
                        group,
                        layers,
                    },
                    before,
                ))
            });
            match fenced {
                Ok((item, before)) => {
                    items.push(item);
                    copying.push((i, before, c.out.len()));
                    results.push(Ok(()));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        if items.is_empty() {
            return results;
        }
        let copied = self.copier().and_then(|mut copier| {
            copier.copy_out(&self.region, &self.spec, &items, |j, bytes| {
                pages[copying[j].0].out.extend_from_slice(bytes);
            })
        });
        for (it, &(i, before, len)) in items.iter().zip(&copying) {
            let r = match &copied {
                Ok(()) => self.states.check_unchanged(it.page, before),
                Err(e) => Err(each_page(e)),
            };
            if let Err(e) = r {
                pages[i].out.truncate(len);
                results[i] = Err(e);
            }
        }
        results
    }

    fn detach(&self) {
        // Copies hold the copier's lock: taking it waits for one in progress.
        self.detached.store(true, Ordering::Release);
        drop(self.copier.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn staged(&self) -> Option<&dyn StagedLoad> {
        Some(self)
    }
}

impl StagedLoad for CudaPool {
    fn load_staged(
        &self,
        items: &[Item],
        fill: &mut dyn FnMut(usize, &mut [u8]) -> bool,
        claim: &mut dyn FnMut(usize) -> bool,
        done: &mut dyn FnMut(usize, Result<()>),
    ) -> Result<()> {
        self.check_attached()?;
        let mut copier = self.copier()?;
        // Fenced before anything is filled: each page at the generation its item names.
        let mut fenced = vec![true; items.len()];
        for (i, it) in items.iter().enumerate() {
            if let Err(e) = self.states.check(it.page) {
                fenced[i] = false;
                done(i, Err(e));
            }
        }
        copier.load_with(
            &self.region,
            &self.spec,
            items,
            |i, dst| fenced[i] && fill(i, dst),
            claim,
            |i| done(i, Ok(())),
        )
    }
}

/// What a batch's failure gives each of its pages: an error of the same kind.
fn each_page(e: &Error) -> Error {
    match e {
        Error::Geometry(s) => Error::Geometry(s.clone()),
        Error::Region(s) => Error::Region(s.clone()),
        &Error::Length { expected, got } => Error::Length { expected, got },
        Error::Device { call, detail } => Error::Device {
            call,
            detail: detail.clone(),
        },
        other => Error::Device {
            call: "copy out",
            detail: other.to_string(),
        },
    }
}
