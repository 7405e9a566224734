//! The manifest file: appends checksummed records (`wal`), replays them on open, truncates a torn
//! tail, and rewrites itself as one checkpoint when it grows long.

use std::path::PathBuf;
use std::sync::Arc;

use orbitkv_wal::{ManifestRecord, ManifestState, ReplayStop, encode_record, replay};

use crate::dir::Layout;
use crate::error::{Error, Result, WriteRefusal, io_err};
use crate::io::{Io, IoFile, OpenMode};
use crate::recover::read_whole;

/// Records appended before the manifest is rewritten as a checkpoint, by default.
pub const CHECKPOINT_EVERY: u64 = 4096;

/// The largest manifest a store opens: a larger one is damaged (a sparse or runaway file) and
/// refused without being read. Records other than a checkpoint are under a KiB each. A
/// checkpoint is at most [`orbitkv_wal::record::MAX_RECORD_PAYLOAD`] (64 MiB) and is written
/// once the log reaches [`crate::StoreConfig::checkpoint_every`] records or a quarter of this
/// size, whichever comes first, at the next segment seal.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 30;

/// The open manifest.
pub(crate) struct Manifest {
    path: PathBuf,
    file: Arc<dyn IoFile>,
    len: u64,
    /// Set when a failed append could not be rolled back: appends are refused from then on.
    uncertain: Option<String>,
    since_checkpoint: u64,
    pub(crate) state: ManifestState,
}

/// What opening the manifest found.
pub(crate) struct Opened {
    pub(crate) manifest: Manifest,
    pub(crate) bytes_read: u64,
    pub(crate) truncated: bool,
}

impl Manifest {
    /// Opens (or creates) and replays the manifest. A torn tail is truncated (left in place when
    /// `read_only`: the replay stops before it); corruption or an invalid record refuses the
    /// open.
    pub(crate) fn open(io: &dyn Io, layout: &Layout, read_only: bool) -> Result<Opened> {
        let path = layout.manifest();
        if !io.exists(&path) && read_only {
            return Err(Error::Damaged {
                path: layout.root.clone(),
                reason: "no manifest".to_owned(),
            });
        }
        if !io.exists(&path) {
            let f = io
                .open(&path, OpenMode::CreateNew)
                .map_err(io_err(&path, "create"))?;
            f.sync().map_err(io_err(&path, "fsync"))?;
            io.sync_dir(&layout.root)
                .map_err(io_err(&layout.root, "fsync directory"))?;
        }
        let mode = if read_only {
            OpenMode::Read
        } else {
            OpenMode::ReadWrite
        };
        let file = io.open(&path, mode).map_err(io_err(&path, "open"))?;
        let bytes = match read_whole(file.as_ref(), MAX_MANIFEST_BYTES) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
                return Err(Error::Damaged {
                    path: layout.root.clone(),
                    reason: format!("manifest: {e}"),
                });
            }
            Err(e) => return Err(io_err(&path, "read")(e)),
        };
        let len = bytes.len() as u64;
        let r = replay(&bytes);
        let truncated = match &r.stop {
            ReplayStop::CleanEnd => false,
            ReplayStop::TornTail { error } if read_only => {
                tracing::warn!(
                    valid = r.valid_len,
                    "manifest: a torn tail, left in place (read-only) ({error})"
                );
                true
            }
            ReplayStop::TornTail { error } => {
                tracing::warn!(
                    valid = r.valid_len,
                    "manifest: truncating a torn tail ({error})"
                );
                file.set_len(r.valid_len)
                    .map_err(io_err(&path, "truncate"))?;
                file.sync().map_err(io_err(&path, "fsync"))?;
                true
            }
            ReplayStop::Corrupt {
                error,
                next_valid_at,
            } => {
                return Err(Error::Damaged {
                    path: layout.root.clone(),
                    reason: format!(
                        "manifest is corrupt at byte {} ({error}); a valid record follows at {next_valid_at}",
                        r.valid_len
                    ),
                });
            }
            ReplayStop::DamagedStart { error } => {
                return Err(Error::Damaged {
                    path: layout.root.clone(),
                    reason: format!(
                        "manifest's first record is damaged ({error}); it was written whole, so it is not a torn tail"
                    ),
                });
            }
            ReplayStop::Invalid { error } => {
                return Err(Error::Damaged {
                    path: layout.root.clone(),
                    reason: format!("manifest holds a contradictory record ({error})"),
                });
            }
        };
        Ok(Opened {
            manifest: Manifest {
                path,
                file,
                len: r.valid_len,
                uncertain: None,
                since_checkpoint: r.records,
                state: r.state,
            },
            bytes_read: len,
            truncated,
        })
    }

    /// Appends `rec` with `sequence`, durably (fsync before returning); the state applies it.
    /// A failed write or fsync is rolled back (the file cut back to its length before, synced),
    /// so the record never takes effect, even at the next open from the page cache; the
    /// sequence stays free. If the rollback fails too, every later append is refused
    /// ([`WriteRefusal::ManifestUncertain`]) until the store is opened again.
    pub(crate) fn append(&mut self, sequence: u64, rec: ManifestRecord) -> Result<()> {
        if let Some(detail) = &self.uncertain {
            return Err(Error::WritesRefused(WriteRefusal::ManifestUncertain {
                detail: detail.clone(),
            }));
        }
        let mut next = self.state.clone();
        next.apply(sequence, &rec, self.len)?;
        let mut buf = Vec::new();
        encode_record(sequence, &rec, &mut buf)?;
        let written = self
            .file
            .write_all_at(&buf, self.len)
            .map_err(io_err(&self.path, "write"))
            .and_then(|()| self.file.sync().map_err(io_err(&self.path, "fsync")));
        if let Err(e) = written {
            let rolled_back = self.file.set_len(self.len).and_then(|()| self.file.sync());
            if let Err(r) = rolled_back {
                self.uncertain = Some(format!("{e}; rolling back: {r}"));
            }
            return Err(e);
        }
        self.len += buf.len() as u64;
        self.since_checkpoint += 1;
        self.state = next;
        Ok(())
    }

    /// True when a failed append could not be rolled back (appends are refused).
    pub(crate) fn is_uncertain(&self) -> bool {
        self.uncertain.is_some()
    }

    /// True when the log has grown past `every` records since its last checkpoint, or past a
    /// quarter of [`MAX_MANIFEST_BYTES`].
    pub(crate) fn wants_checkpoint(&self, every: u64) -> bool {
        self.since_checkpoint >= every || self.len >= MAX_MANIFEST_BYTES / 4
    }

    /// The manifest file's length.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Rewrites the manifest as one checkpoint record with `sequence`: a temporary file, fsync,
    /// rename, directory fsync. Before the rename a failure leaves the manifest as it was (the
    /// temporary file removed, as far as it can be). Once the rename has happened the new file is
    /// adopted whatever follows (appending to the replaced file would lose records); an error
    /// after that point means the rename may not be durable, and the caller must stop writing.
    pub(crate) fn checkpoint(
        &mut self,
        io: &dyn Io,
        sequence: u64,
    ) -> std::result::Result<(), CheckpointFailure> {
        let unchanged = |error: Error| CheckpointFailure {
            error,
            replaced: false,
        };
        let mut state = ManifestState::default();
        let rec = self.state.checkpoint();
        state
            .apply(sequence, &rec, 0)
            .map_err(|e| unchanged(e.into()))?;
        let mut buf = Vec::new();
        encode_record(sequence, &rec, &mut buf).map_err(|e| unchanged(e.into()))?;
        let tmp = self.path.with_extension("tmp");
        let written = (|| -> Result<Arc<dyn IoFile>> {
            if io.exists(&tmp) {
                io.remove_file(&tmp).map_err(io_err(&tmp, "remove"))?;
            }
            let f = io
                .open(&tmp, OpenMode::CreateNew)
                .map_err(io_err(&tmp, "create"))?;
            f.write_all_at(&buf, 0).map_err(io_err(&tmp, "write"))?;
            f.sync().map_err(io_err(&tmp, "fsync"))?;
            io.rename(&tmp, &self.path)
                .map_err(io_err(&self.path, "rename"))?;
            Ok(f)
        })();
        let f = match written {
            Ok(f) => f,
            Err(error) => {
                // A rename either happened or did not: `manifest.log` is still the old file.
                let _ = io.remove_file(&tmp);
                return Err(unchanged(error));
            }
        };
        // Renamed: from here on only the new file is `manifest.log`.
        self.file = f;
        self.len = buf.len() as u64;
        self.since_checkpoint = 1;
        self.state = state;
        let dir = self.path.parent().unwrap_or(std::path::Path::new("."));
        io.sync_dir(dir)
            .map_err(io_err(dir, "fsync directory"))
            .map_err(|error| CheckpointFailure {
                error,
                replaced: true,
            })
    }
}

/// A failed [`Manifest::checkpoint`]: the error, and whether the manifest file had been replaced
/// by then (its directory entry then may not be durable).
#[derive(Debug)]
pub(crate) struct CheckpointFailure {
    pub(crate) error: Error,
    pub(crate) replaced: bool,
}
