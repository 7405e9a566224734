//! The adapters' error type. Every variant names the file, variable or value at fault, so an
//! operator can act on the one line it prints.

use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why an identity could not be established (the cache then refuses to start: fail closed).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading a file or directory failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A symbolic link whose target does not exist.
    #[error("{}: dangling symbolic link", path.display())]
    DanglingLink {
        /// The link.
        path: PathBuf,
    },
    /// A symbolic link cycle.
    #[error("{}: symbolic link loop", path.display())]
    LinkLoop {
        /// Where the loop was detected.
        path: PathBuf,
    },
    /// Something that is neither a regular file nor a directory (socket, FIFO, device).
    #[error("{}: not a regular file or directory", path.display())]
    NotRegular {
        /// The path.
        path: PathBuf,
    },
    /// The model argument names something that is not a directory.
    #[error("{}: not a directory (a model directory holds config.json and the weights)", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// A path that is not UTF-8 cannot be named canonically.
    #[error("{}: path is not valid UTF-8", path.display())]
    NonUtf8Path {
        /// The path.
        path: PathBuf,
    },
    /// A file changed size while it was being hashed.
    #[error("{}: file changed while it was being read", path.display())]
    FileChanged {
        /// The path.
        path: PathBuf,
    },
    /// No artifact files at all.
    #[error("{}: no model files found", path.display())]
    EmptyModelDir {
        /// The directory.
        path: PathBuf,
    },
    /// The model directory has no `config.json`.
    #[error("{}: no config.json (the model configuration is part of the identity)", path.display())]
    MissingConfig {
        /// The directory.
        path: PathBuf,
    },
    /// `config.json` is larger than any real model configuration.
    #[error("{}: config.json is larger than {limit} bytes", path.display())]
    ConfigTooLarge {
        /// The file.
        path: PathBuf,
        /// The limit.
        limit: u64,
    },
    /// The directory is a LoRA/PEFT adapter, or a LoRA adapter is active.
    #[error(
        "{what}: LoRA adapters are unsupported until their identity can be named; serve the base model without LoRA"
    )]
    Lora {
        /// What revealed the adapter.
        what: String,
    },
    /// An environment variable is set to something unusable.
    #[error("{var}: {reason}")]
    Env {
        /// The variable.
        var: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// A hub repository id that is not `org/name`.
    #[error("{repo:?}: {reason}")]
    HubRepo {
        /// The id given.
        repo: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A hub revision that is not a full commit hash.
    #[error(
        "revision {revision:?}: a hub model must name a full 40-hex commit; branches, tags and short hashes are refused"
    )]
    HubRevision {
        /// The revision given.
        revision: String,
    },
    /// An `org/name` argument that is no local directory, given without `--revision`.
    #[error("{repo}: no such directory; read as a hub id it needs --revision <40-hex commit>")]
    HubRevisionMissing {
        /// The id given.
        repo: String,
    },
    /// The snapshot is not in the local hub cache (nothing is ever downloaded).
    #[error("{}: snapshot not in the local hub cache (nothing is downloaded)", path.display())]
    HubSnapshotMissing {
        /// The snapshot directory looked for.
        path: PathBuf,
    },
    /// No hub cache location could be determined.
    #[error(
        "no hub cache: pass --hub-cache DIR or set HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME or HOME"
    )]
    NoHubCache,
    /// Neither an existing directory nor an `org/name` hub id.
    #[error("{0:?}: neither a model directory nor an org/name hub id")]
    UnknownModel(String),
    /// The state vocabulary refused a value (identity builder, labels, scope).
    #[error(transparent)]
    State(#[from] orbitkv_state::Error),
}
