//! The transfer messages: Load and Publish, and their per-page answers (Loaded, PublishCopied,
//! PublishDurable).

use orbitkv_gpu_bridge::PageRef;

use super::fields::{page_ref, read_hash, read_page_ref};
use super::{Body, Message, Token};
use crate::error::{ProtocolError, Result};
use crate::wire::{Reader, Writer};

/// One destination page of a Load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadPage {
    /// The block index (into the acquired query's hash list) whose record goes here.
    pub block: u32,
    /// The cache group.
    pub group: u32,
    /// The rank.
    pub rank: u32,
    /// The destination page.
    pub page: PageRef,
    /// First layer to copy.
    pub layer_start: u32,
    /// One past the last layer.
    pub layer_end: u32,
}

/// A Load: copy acquired records into pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadRequest {
    /// The session token.
    pub token: Token,
    /// The session epoch.
    pub epoch: u64,
    /// The lease the records are pinned under.
    pub lease: u64,
    /// The pages to fill.
    pub pages: Vec<LoadPage>,
}

impl Body for LoadRequest {
    fn encode(&self, w: &mut Writer) {
        let l = self;
        w.raw(&l.token)
            .u64(l.epoch)
            .u64(l.lease)
            .u32(l.pages.len() as u32);
        for p in &l.pages {
            w.u32(p.block).u32(p.group).u32(p.rank);
            page_ref(w, &p.page);
            w.u32(p.layer_start).u32(p.layer_end);
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self> {
        let token = r.array("token")?;
        let epoch = r.u64("epoch")?;
        let lease = r.u64("lease")?;
        let n = r.count("load pages", 36)?;
        let mut pages = Vec::with_capacity(n);
        for _ in 0..n {
            let block = r.u32("block")?;
            let group = r.u32("group")?;
            let rank = r.u32("rank")?;
            let page = read_page_ref(r)?;
            let layer_start = r.u32("first layer")?;
            let layer_end = r.u32("layer end")?;
            if layer_end < layer_start {
                return Err(ProtocolError::BadField {
                    what: "layers",
                    why: format!("{layer_start}..{layer_end}"),
                });
            }
            pages.push(LoadPage {
                block,
                group,
                rank,
                page,
                layer_start,
                layer_end,
            });
        }
        Ok(LoadRequest {
            token,
            epoch,
            lease,
            pages,
        })
    }
}

/// One source page of a Publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishPage {
    /// The cache group.
    pub group: u32,
    /// The rank.
    pub rank: u32,
    /// The block's native hash.
    pub hash: Vec<u8>,
    /// The previous block's native hash (empty for the first block).
    pub parent: Vec<u8>,
    /// First token of the block.
    pub start: u64,
    /// One past its last token.
    pub end: u64,
    /// The source page.
    pub page: PageRef,
}

/// A Publish: copy pages out into the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishRequest {
    /// The session token.
    pub token: Token,
    /// The session epoch.
    pub epoch: u64,
    /// The pages and what they hold.
    pub pages: Vec<PublishPage>,
}

impl Body for PublishRequest {
    fn encode(&self, w: &mut Writer) {
        let p = self;
        w.raw(&p.token).u64(p.epoch).u32(p.pages.len() as u32);
        for x in &p.pages {
            w.u32(x.group)
                .u32(x.rank)
                .bytes8(&x.hash)
                .bytes8(&x.parent)
                .u64(x.start)
                .u64(x.end);
            page_ref(w, &x.page);
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self> {
        let token = r.array("token")?;
        let epoch = r.u64("epoch")?;
        let n = r.count("publish pages", 42)?;
        let mut pages = Vec::with_capacity(n);
        for _ in 0..n {
            let group = r.u32("group")?;
            let rank = r.u32("rank")?;
            let hash = read_hash(r, "block hash", false)?;
            let parent = read_hash(r, "parent hash", true)?;
            let start = r.u64("block start")?;
            let end = r.u64("block end")?;
            if end <= start {
                return Err(ProtocolError::BadField {
                    what: "block range",
                    why: format!("{start}..{end}"),
                });
            }
            pages.push(PublishPage {
                group,
                rank,
                hash,
                parent,
                start,
                end,
                page: read_page_ref(r)?,
            });
        }
        Ok(PublishRequest {
            token,
            epoch,
            pages,
        })
    }
}

/// What happened to one page of a Load or Publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageStatus {
    /// Copied.
    Ok,
    /// The page's generation is not the one named.
    StaleGeneration,
    /// The request's epoch is not the pool's.
    StaleEpoch,
    /// The page index is out of range.
    OutOfRange,
    /// No such pool.
    UnknownPool,
    /// The page was reused during the copy; nothing stored.
    ChangedDuringCopy,
    /// The stored record failed verification; recompute.
    BadRecord,
    /// The record is not (or no longer) stored; recompute.
    Missing,
    /// The request does not fit the pool's geometry (layers, lengths).
    BadGeometry,
    /// Refused for good: the store takes no writes until an operator acts (read-only, a failed
    /// manifest checkpoint, ids exhausted), or the pool's memory or device failed. Stop sending
    /// this kind of request to this daemon (Publish) or pool.
    Refused,
    /// Not done now, may be done later: the disk or the SSD tier is full, a failed write sealed
    /// a segment off, the page's lease count is saturated. Send it again later.
    RetryLater,
    /// This record can never be stored as named (its token range conflicts with a stored
    /// record of its key, or it is too large); other pages are unaffected.
    Rejected,
    /// Stored in the daemon's DRAM, waiting for SSD admission: readable (a Query proves it),
    /// not durable (a restart loses it). Not a failure: do not publish it again.
    Held,
}

impl PageStatus {
    const ALL: [PageStatus; 13] = [
        PageStatus::Ok,
        PageStatus::StaleGeneration,
        PageStatus::StaleEpoch,
        PageStatus::OutOfRange,
        PageStatus::UnknownPool,
        PageStatus::ChangedDuringCopy,
        PageStatus::BadRecord,
        PageStatus::Missing,
        PageStatus::BadGeometry,
        PageStatus::Refused,
        PageStatus::RetryLater,
        PageStatus::Rejected,
        PageStatus::Held,
    ];

    /// The wire code.
    pub fn code(self) -> u16 {
        Self::ALL.iter().position(|s| *s == self).unwrap_or(0) as u16
    }

    /// Its name in snake case, as clients show it (`stale_generation`).
    pub const fn name(self) -> &'static str {
        match self {
            PageStatus::Ok => "ok",
            PageStatus::StaleGeneration => "stale_generation",
            PageStatus::StaleEpoch => "stale_epoch",
            PageStatus::OutOfRange => "out_of_range",
            PageStatus::UnknownPool => "unknown_pool",
            PageStatus::ChangedDuringCopy => "changed_during_copy",
            PageStatus::BadRecord => "bad_record",
            PageStatus::Missing => "missing",
            PageStatus::BadGeometry => "bad_geometry",
            PageStatus::Refused => "refused",
            PageStatus::RetryLater => "retry_later",
            PageStatus::Rejected => "rejected",
            PageStatus::Held => "held",
        }
    }

    /// The status of a wire code.
    pub fn from_code(code: u16) -> Result<Self> {
        Self::ALL
            .get(code as usize)
            .copied()
            .ok_or_else(|| ProtocolError::BadField {
                what: "page status",
                why: format!("unknown code {code}"),
            })
    }
}

pub(super) fn encode_statuses(w: &mut Writer, s: &[PageStatus]) {
    w.u32(s.len() as u32);
    for x in s {
        w.u16(x.code());
    }
}

pub(super) fn decode_statuses(r: &mut Reader<'_>) -> Result<Vec<PageStatus>> {
    let n = r.count("page statuses", 2)?;
    (0..n)
        .map(|_| PageStatus::from_code(r.u16("page status")?))
        .collect()
}

pub(super) fn encode_publish_durable(w: &mut Writer, pages: &[PageStatus], retry_after_ms: u32) {
    encode_statuses(w, pages);
    w.u32(retry_after_ms);
}

pub(super) fn decode_publish_durable(r: &mut Reader<'_>) -> Result<Message> {
    Ok(Message::PublishDurable {
        pages: decode_statuses(r)?,
        retry_after_ms: r.u32("retry after")?,
    })
}
