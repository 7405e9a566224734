//! The data directory's layout and its header.
//!
//! ```text
//! D/orbitkv.dir            data-directory header (format version; written once)
//! D/LOCK                   exclusive lock while the store is open (made if missing)
//! D/manifest.log           the manifest log
//! D/segments/<id>.seg      segment files, id as 8 hex digits
//! ```

use std::any::Any;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use orbitkv_segments::{DIR_HEADER_FILE, DIR_HEADER_LEN, DataDirHeader, STORE_FORMAT_VERSION};

use crate::error::{Error, Result, io_err};
use crate::io::{Io, OpenMode};

/// The manifest's file name.
pub const MANIFEST_FILE: &str = "manifest.log";
/// The lock file's name.
pub const LOCK_FILE: &str = "LOCK";
/// The segments' directory.
pub const SEGMENTS_DIR: &str = "segments";
/// A reclaimed segment's file, kept in the segments directory for the next segment to reuse.
pub const SPARE_SEGMENT: &str = "spare.free";

/// Paths inside a data directory.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The data directory.
    pub root: PathBuf,
}

impl Layout {
    /// The layout of `root`.
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_owned(),
        }
    }
    /// `orbitkv.dir`.
    pub fn header(&self) -> PathBuf {
        self.root.join(DIR_HEADER_FILE)
    }
    /// `manifest.log`.
    pub fn manifest(&self) -> PathBuf {
        self.root.join(MANIFEST_FILE)
    }
    /// `LOCK`.
    pub fn lock(&self) -> PathBuf {
        self.root.join(LOCK_FILE)
    }
    /// `segments/`.
    pub fn segments(&self) -> PathBuf {
        self.root.join(SEGMENTS_DIR)
    }
    /// The file of segment `id`.
    pub fn segment(&self, id: u64) -> PathBuf {
        self.segments().join(format!("{id:08x}.seg"))
    }
    /// The spare segment file ([`SPARE_SEGMENT`]).
    pub fn spare_segment(&self) -> PathBuf {
        self.segments().join(SPARE_SEGMENT)
    }
}

/// Takes the directory's exclusive lock: `Locked` while another process holds it. A read-only
/// use goes on without it when the lock file is missing and cannot be made there (a read-only
/// file system, a directory the user cannot write): no daemon has the store open, since one
/// would have made the file. Returns the guard, if any.
pub(crate) fn lock(
    io: &dyn Io,
    layout: &Layout,
    read_only: bool,
) -> Result<Option<Box<dyn Any + Send + Sync>>> {
    let path = layout.lock();
    match io.lock_exclusive(&path) {
        Ok(guard) => Ok(Some(guard)),
        Err(e) if e.kind() == ErrorKind::WouldBlock => Err(Error::Locked {
            path: layout.root.clone(),
        }),
        Err(e)
            if read_only
                && matches!(
                    e.kind(),
                    ErrorKind::ReadOnlyFilesystem | ErrorKind::PermissionDenied
                )
                && !io.exists(&path) =>
        {
            tracing::info!(path = %path.display(), "no lock file, and none can be made ({e}): reading unlocked");
            Ok(None)
        }
        Err(e) => Err(io_err(&path, "lock")(e)),
    }
}

/// Writes `bytes` to `path` atomically and durably: a temporary file, fsync, rename, directory
/// fsync.
pub(crate) fn write_atomic(io: &dyn Io, path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    if io.exists(&tmp) {
        io.remove_file(&tmp).map_err(io_err(&tmp, "remove"))?;
    }
    let f = io
        .open(&tmp, OpenMode::CreateNew)
        .map_err(io_err(&tmp, "create"))?;
    f.write_all_at(bytes, 0).map_err(io_err(&tmp, "write"))?;
    f.sync().map_err(io_err(&tmp, "fsync"))?;
    io.rename(&tmp, path).map_err(io_err(path, "rename"))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    io.sync_dir(dir).map_err(io_err(dir, "fsync directory"))?;
    Ok(())
}

/// Reads and checks the data-directory header, or writes a new one when the directory holds no
/// store yet. Returns the header and whether the store is new.
pub(crate) fn open_header(
    io: &dyn Io,
    layout: &Layout,
    now_ms: u64,
    id: [u8; 16],
) -> Result<(DataDirHeader, bool)> {
    let path = layout.header();
    if !io.exists(&path) {
        if io.exists(&layout.manifest()) {
            return Err(Error::Damaged {
                path: layout.root.clone(),
                reason: format!("{DIR_HEADER_FILE} is missing but a manifest exists"),
            });
        }
        let h = DataDirHeader {
            directory_id: id,
            created_unix_ms: now_ms,
            flags: 0,
        };
        write_atomic(io, &path, &h.encode())?;
        return Ok((h, true));
    }
    let f = io
        .open(&path, OpenMode::Read)
        .map_err(io_err(&path, "open"))?;
    let mut buf = [0u8; DIR_HEADER_LEN];
    f.read_exact_at(&mut buf, 0)
        .map_err(io_err(&path, "read"))?;
    match DataDirHeader::decode(&buf) {
        Ok(h) => Ok((h, false)),
        Err(orbitkv_segments::Error::UnsupportedVersion { found, .. }) => {
            Err(Error::IncompatibleStore {
                path: layout.root.clone(),
                found,
                supported: STORE_FORMAT_VERSION,
            })
        }
        Err(e) => Err(Error::Damaged {
            path: layout.root.clone(),
            reason: format!("{DIR_HEADER_FILE}: {e}"),
        }),
    }
}
