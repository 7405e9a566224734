//! Content fingerprint of a model directory (docs/format.md, "Model directory digest").
//!
//! Every regular file except a short ignore list is hashed by content; symbolic links are followed
//! to their targets. A file's digest is always the root of a two-level tree over fixed
//! [`CHUNK_SIZE`] chunks — the same bytes give the same digest whatever the thread count — and the
//! chunks of all files are hashed in parallel, so one 40 GB file does not serialize startup.
//! Timestamps never stand in for content: every byte is read every time (they only help detect a
//! file changing while it is read, which is refused).

use std::collections::HashSet;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Chunk size of the file tree: fixed by format version 1, never tuned at run time.
pub const CHUNK_SIZE: u64 = 4 << 20;
/// Version of the directory digest.
pub const DIR_DIGEST_VERSION: u32 = 1;
/// Domain tag of the directory digest.
pub const DIR_DIGEST_DOMAIN: &str = "orbitkv.model-dir";
/// Leaf prefix: `SHA-256(0x00 ‖ chunk)`.
const LEAF_TAG: u8 = 0x00;
/// Root prefix: `SHA-256(0x01 ‖ u64 LE size ‖ leaves)`.
const ROOT_TAG: u8 = 0x01;
/// Read granularity inside a chunk: small enough to stay in cache between read and hash.
const READ_BUF: usize = 256 << 10;

/// Directory names never descended into: VCS metadata and caches (`.huggingface/` is the hub
/// library's legacy download metadata).
pub const IGNORED_DIRS: &[&str] = &[
    ".git",
    ".hg",
    ".svn",
    ".cache",
    ".huggingface",
    "__pycache__",
];
/// File names ignored exactly (`.git` as a file is a worktree or submodule pointer).
pub const IGNORED_FILES: &[&str] = &[".git", ".gitattributes", ".gitignore", ".DS_Store"];
/// Documentation stems ignored with any extension, case-insensitively (`README.md`, `LICENSE`).
pub const IGNORED_DOC_STEMS: &[&str] = &[
    "readme",
    "license",
    "licence",
    "notice",
    "copying",
    "changelog",
    "use_policy",
];

/// True when `name` (a file name, not a path) is on the ignore list.
pub fn is_ignored_file(name: &str) -> bool {
    if IGNORED_FILES.contains(&name) {
        return true;
    }
    let stem = name.split('.').next().unwrap_or(name).to_ascii_lowercase();
    IGNORED_DOC_STEMS.contains(&stem.as_str())
}

/// One hashed file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDigest {
    /// Path relative to the model directory, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Root of the file's chunk tree.
    pub digest: [u8; 32],
}

/// The fingerprint of a model directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirFingerprint {
    /// Digest over the sorted (path, size, digest) list.
    pub digest: [u8; 32],
    /// Every hashed file, sorted by path bytes.
    pub files: Vec<FileDigest>,
    /// Total bytes hashed.
    pub total_bytes: u64,
}

/// Receives fingerprinting progress (a progress bar, a log line), from any worker thread.
pub trait Progress: Sync {
    /// Called once, before hashing, with the work ahead.
    fn start(&self, total_bytes: u64, files: usize) {
        let _ = (total_bytes, files);
    }
    /// Called with the number of bytes just hashed.
    fn advance(&self, bytes: u64);
}

/// How to fingerprint.
pub struct FingerprintOptions<'a> {
    /// Worker threads (at least one).
    pub threads: usize,
    /// Progress receiver.
    pub progress: Option<&'a dyn Progress>,
}

impl Default for FingerprintOptions<'_> {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, usize::from),
            progress: None,
        }
    }
}

struct Entry {
    rel: String,
    abs: PathBuf,
    size: u64,
    stamp: Stamp,
}

/// What identifies a file's version for change detection while hashing (never to skip reading).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
}

impl Stamp {
    fn of(m: &fs::Metadata) -> Self {
        Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_owned(),
        source,
    }
}

/// `metadata` following links, with dangling links and loops told apart.
fn follow(path: &Path) -> Result<fs::Metadata> {
    match fs::metadata(path) {
        Ok(m) => Ok(m),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(Error::LinkLoop {
            path: path.to_owned(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let is_link = fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
            if is_link {
                Err(Error::DanglingLink {
                    path: path.to_owned(),
                })
            } else {
                Err(io_err(path)(e))
            }
        }
        Err(e) => Err(io_err(path)(e)),
    }
}

fn walk(
    dir: &Path,
    rel: &str,
    ancestors: &mut HashSet<(u64, u64)>,
    out: &mut Vec<Entry>,
) -> Result<()> {
    let meta = follow(dir)?;
    if !ancestors.insert((meta.dev(), meta.ino())) {
        return Err(Error::LinkLoop {
            path: dir.to_owned(),
        });
    }
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            return Err(Error::NonUtf8Path { path: entry.path() });
        };
        names.push(name.to_owned());
    }
    names.sort();
    for name in names {
        let abs = dir.join(&name);
        let child_rel = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        let m = follow(&abs)?;
        if m.is_dir() {
            if IGNORED_DIRS.contains(&name.as_str()) {
                continue;
            }
            walk(&abs, &child_rel, ancestors, out)?;
        } else if m.is_file() {
            if is_ignored_file(&name) {
                continue;
            }
            out.push(Entry {
                rel: child_rel,
                abs,
                size: m.len(),
                stamp: Stamp::of(&m),
            });
        } else {
            return Err(Error::NotRegular { path: abs });
        }
    }
    ancestors.remove(&(meta.dev(), meta.ino()));
    Ok(())
}

fn list_entries(root: &Path) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    walk(root, "", &mut HashSet::new(), &mut out)?;
    out.sort_by(|a, b| a.rel.as_bytes().cmp(b.rel.as_bytes()));
    Ok(out)
}

/// Lists the files that enter the fingerprint, sorted by relative path: (path, location, size).
pub fn list_files(root: &Path) -> Result<Vec<(String, PathBuf, u64)>> {
    Ok(list_entries(root)?
        .into_iter()
        .map(|e| (e.rel, e.abs, e.size))
        .collect())
}

/// Number of chunks of a file of `size` bytes (zero for an empty file).
pub fn chunk_count(size: u64) -> u64 {
    size.div_ceil(CHUNK_SIZE)
}

/// `SHA-256(0x00 ‖ chunk)`.
pub fn leaf_digest(chunk: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update([LEAF_TAG]);
    h.update(chunk);
    h.finalize().into()
}

/// `SHA-256(0x01 ‖ u64 LE size ‖ leaf_0 ‖ … ‖ leaf_{n−1})`.
pub fn root_digest(size: u64, leaves: &[[u8; 32]]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update([ROOT_TAG]);
    h.update(size.to_le_bytes());
    for leaf in leaves {
        h.update(leaf);
    }
    h.finalize().into()
}

/// The digest of in-memory file contents (the same tree, for tests and tools).
pub fn bytes_digest(data: &[u8]) -> [u8; 32] {
    let leaves: Vec<[u8; 32]> = data.chunks(CHUNK_SIZE as usize).map(leaf_digest).collect();
    root_digest(data.len() as u64, &leaves)
}

/// The directory digest over an already sorted file list.
pub fn dir_digest(files: &[FileDigest]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((DIR_DIGEST_DOMAIN.len() as u32).to_le_bytes());
    h.update(DIR_DIGEST_DOMAIN.as_bytes());
    h.update(DIR_DIGEST_VERSION.to_le_bytes());
    h.update((files.len() as u64).to_le_bytes());
    for f in files {
        h.update((f.path.len() as u32).to_le_bytes());
        h.update(f.path.as_bytes());
        h.update(f.size.to_le_bytes());
        h.update(f.digest);
    }
    h.finalize().into()
}

/// Hashes one chunk of `file`, reading exactly `len` bytes at `offset`.
fn hash_chunk(file: &File, path: &Path, offset: u64, len: u64, buf: &mut [u8]) -> Result<[u8; 32]> {
    let mut h = Sha256::new();
    h.update([LEAF_TAG]);
    let mut done = 0u64;
    while done < len {
        let want = usize::try_from(len - done)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = file
            .read_at(&mut buf[..want], offset + done)
            .map_err(io_err(path))?;
        if n == 0 {
            return Err(Error::FileChanged {
                path: path.to_owned(),
            });
        }
        h.update(&buf[..n]);
        done += n as u64;
    }
    Ok(h.finalize().into())
}

/// Fingerprints the model directory `root`.
pub fn fingerprint_dir(root: &Path, opts: &FingerprintOptions<'_>) -> Result<DirFingerprint> {
    let files = list_entries(root)?;
    if files.is_empty() {
        return Err(Error::EmptyModelDir {
            path: root.to_owned(),
        });
    }
    // Work items: every chunk of every file, in file order.
    let mut items: Vec<(usize, u64)> = Vec::new();
    for (fi, f) in files.iter().enumerate() {
        items.extend((0..chunk_count(f.size)).map(|c| (fi, c)));
    }
    if let Some(p) = opts.progress {
        p.start(files.iter().map(|f| f.size).sum(), files.len());
    }
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    let threads = opts.threads.max(1).min(items.len().max(1));
    let results: Vec<Vec<(usize, u64, [u8; 32])>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut buf = vec![0u8; READ_BUF];
                    let mut open: Option<(usize, File)> = None;
                    let mut out = Vec::new();
                    while !failed.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(fi, chunk)) = items.get(i) else {
                            break;
                        };
                        let entry = &files[fi];
                        let (abs, size) = (&entry.abs, entry.size);
                        let offset = chunk * CHUNK_SIZE;
                        let len = CHUNK_SIZE.min(size - offset);
                        let res = (|| {
                            let file = match open.take() {
                                Some((f, file)) if f == fi => file,
                                _ => {
                                    let file = File::open(abs).map_err(io_err(abs))?;
                                    let m = file.metadata().map_err(io_err(abs))?;
                                    if Stamp::of(&m) != entry.stamp {
                                        return Err(Error::FileChanged { path: abs.clone() });
                                    }
                                    file
                                }
                            };
                            let d = hash_chunk(&file, abs, offset, len, &mut buf)?;
                            if offset + len == size {
                                // The last chunk: the file must not have grown.
                                let mut probe = [0u8; 1];
                                if file.read_at(&mut probe, size).map_err(io_err(abs))? != 0 {
                                    return Err(Error::FileChanged { path: abs.clone() });
                                }
                            }
                            open = Some((fi, file));
                            Ok(d)
                        })();
                        match res {
                            Ok(d) => {
                                out.push((fi, chunk, d));
                                if let Some(p) = opts.progress {
                                    p.advance(len);
                                }
                            }
                            Err(e) => {
                                failed.store(true, Ordering::Relaxed);
                                if let Ok(mut slot) = first_error.lock() {
                                    slot.get_or_insert(e);
                                }
                                break;
                            }
                        }
                    }
                    out
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_default())
            .collect()
    });
    if let Some(e) = first_error.into_inner().ok().flatten() {
        return Err(e);
    }
    // Anything rewritten, replaced or resized while it was read is refused, never mixed.
    for f in &files {
        if Stamp::of(&follow(&f.abs)?) != f.stamp {
            return Err(Error::FileChanged {
                path: f.abs.clone(),
            });
        }
    }
    let mut leaves: Vec<Vec<[u8; 32]>> = files
        .iter()
        .map(|f| vec![[0u8; 32]; chunk_count(f.size) as usize])
        .collect();
    let mut filled = 0usize;
    for (fi, chunk, d) in results.into_iter().flatten() {
        leaves[fi][chunk as usize] = d;
        filled += 1;
    }
    if filled != items.len() {
        // A worker panicked (its results were lost): never return a partial fingerprint.
        return Err(Error::FileChanged {
            path: root.to_owned(),
        });
    }
    let mut total = 0u64;
    let digests: Vec<FileDigest> = files
        .into_iter()
        .zip(leaves)
        .map(|(f, leaves)| {
            total += f.size;
            FileDigest {
                digest: root_digest(f.size, &leaves),
                path: f.rel,
                size: f.size,
            }
        })
        .collect();
    tracing::debug!(
        files = digests.len(),
        bytes = total,
        threads,
        "fingerprinted model directory"
    );
    Ok(DirFingerprint {
        digest: dir_digest(&digests),
        files: digests,
        total_bytes: total,
    })
}
