//! Hugging Face hub deployments, resolved from a local hub cache only (nothing is downloaded).
//!
//! An `org/name` id must come with a full 40-hex commit revision: a branch, tag or short hash can
//! move, so it cannot name a computation. The snapshot is
//! `<cache>/models--<org>--<name>/snapshots/<commit>/`, whose files are usually symbolic links into
//! `../../blobs/`; the fingerprint follows them to their content.

use std::path::{Path, PathBuf};

use orbitkv_state::hex;

use crate::error::{Error, Result};

/// True when `s` looks like an `org/name` hub id (and so is not meant as a local path).
pub fn looks_like_repo_id(s: &str) -> bool {
    validate_repo(s).is_ok()
}

fn validate_part(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= 96
        && part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !part.starts_with(['.', '-'])
        && !part.contains("--")
        && !part.contains("..")
}

/// Splits and checks an `org/name` id.
pub fn validate_repo(repo: &str) -> Result<(&str, &str)> {
    let Some((org, name)) = repo.split_once('/') else {
        return Err(Error::HubRepo {
            repo: repo.to_owned(),
            reason: "expected org/name",
        });
    };
    if !validate_part(org) || !validate_part(name) {
        return Err(Error::HubRepo {
            repo: repo.to_owned(),
            reason: "org and name must be [A-Za-z0-9._-], not starting with '.' or '-', without '--' or '..'",
        });
    }
    Ok((org, name))
}

/// Checks that `revision` is a full commit: exactly 40 lowercase hex digits.
pub fn validate_revision(revision: &str) -> Result<()> {
    if hex::is_lower_hex(revision, 40) {
        Ok(())
    } else {
        Err(Error::HubRevision {
            revision: revision.to_owned(),
        })
    }
}

/// Where the hub cache is, from (in order) an explicit directory, `HF_HUB_CACHE`, the legacy
/// `HUGGINGFACE_HUB_CACHE`, `HF_HOME/hub`, `XDG_CACHE_HOME/huggingface/hub`,
/// `HOME/.cache/huggingface/hub` (the hub library's own order). `env` reads a variable.
pub fn hub_cache_dir(
    explicit: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_owned());
    }
    let set = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(v) = set("HF_HUB_CACHE").or_else(|| set("HUGGINGFACE_HUB_CACHE")) {
        return Ok(PathBuf::from(v));
    }
    if let Some(v) = set("HF_HOME") {
        return Ok(PathBuf::from(v).join("hub"));
    }
    if let Some(v) = set("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(v).join("huggingface").join("hub"));
    }
    if let Some(v) = set("HOME") {
        return Ok(PathBuf::from(v)
            .join(".cache")
            .join("huggingface")
            .join("hub"));
    }
    Err(Error::NoHubCache)
}

/// The snapshot directory of `repo` at `revision` inside `cache`; it must exist.
pub fn snapshot_dir(cache: &Path, repo: &str, revision: &str) -> Result<PathBuf> {
    let (org, name) = validate_repo(repo)?;
    validate_revision(revision)?;
    let dir = cache
        .join(format!("models--{org}--{name}"))
        .join("snapshots")
        .join(revision);
    if dir.is_dir() {
        Ok(dir)
    } else {
        Err(Error::HubSnapshotMissing { path: dir })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_and_revision_rules() {
        assert!(validate_repo("meta-llama/Llama-3.1-8B").is_ok());
        for bad in [
            "llama", "a/b/c", "/x", "x/", "a--b/c", "../x", ".a/b", "a/b c",
        ] {
            assert!(validate_repo(bad).is_err(), "{bad}");
        }
        assert!(validate_revision(&"a".repeat(40)).is_ok());
        for bad in ["main", "v1.0", "abc1234", &"A".repeat(40), &"a".repeat(41)] {
            assert!(
                matches!(validate_revision(bad), Err(Error::HubRevision { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn cache_dir_precedence() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let all = env(&[("HF_HUB_CACHE", "/a"), ("HF_HOME", "/b"), ("HOME", "/h")]);
        assert_eq!(
            hub_cache_dir(Some(Path::new("/x")), &all).unwrap(),
            Path::new("/x")
        );
        assert_eq!(hub_cache_dir(None, &all).unwrap(), Path::new("/a"));
        let home = env(&[("HF_HOME", "/b"), ("HOME", "/h")]);
        assert_eq!(hub_cache_dir(None, &home).unwrap(), Path::new("/b/hub"));
        let h = env(&[("HOME", "/h")]);
        assert_eq!(
            hub_cache_dir(None, &h).unwrap(),
            Path::new("/h/.cache/huggingface/hub")
        );
        assert!(matches!(
            hub_cache_dir(None, &env(&[])),
            Err(Error::NoHubCache)
        ));
    }
}
