//! The admin messages: Stats, Retire and Sync, and their answers (StatsReply, Retired, Synced).

use super::Message;
use crate::error::{ProtocolError, Result};
use crate::wire::{Reader, Writer};

pub(super) fn encode_retire(w: &mut Writer, namespace: &[u8; 32]) {
    w.raw(namespace);
}

pub(super) fn decode_retire(r: &mut Reader<'_>) -> Result<Message> {
    Ok(Message::Retire {
        namespace: r.array("namespace")?,
    })
}

pub(super) fn encode_stats_reply(w: &mut Writer, text: &str) {
    w.bytes32(text.as_bytes());
}

pub(super) fn decode_stats_reply(r: &mut Reader<'_>) -> Result<Message> {
    let b = r.bytes32("stats")?;
    Ok(Message::StatsReply {
        text: String::from_utf8(b.to_vec()).map_err(|_| ProtocolError::BadField {
            what: "stats",
            why: "not UTF-8".into(),
        })?,
    })
}

pub(super) fn encode_retired(w: &mut Writer, watermark: u64) {
    w.u64(watermark);
}

pub(super) fn decode_retired(r: &mut Reader<'_>) -> Result<Message> {
    Ok(Message::Retired {
        watermark: r.u64("watermark")?,
    })
}
