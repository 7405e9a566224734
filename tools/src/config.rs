//! The daemon's configuration file (`orbitkv serve --config FILE`, TOML). Every key is optional;
//! a flag given on the command line overrides the file, and the file overrides the embedded
//! defaults. Unknown keys are refused, so a misspelt option never silently falls back to a
//! default. `deploy/orbitkv.toml` documents every key.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::Failure;

/// A byte size: an integer, or a string with a unit (`"64GiB"`, `"1.5TB"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Bytes(u64),
            Text(String),
        }
        match Repr::deserialize(d)? {
            Repr::Bytes(n) => Ok(Size(n)),
            Repr::Text(t) => crate::size::parse_size(&t)
                .map(Size)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// The data directory.
    pub data_dir: Option<PathBuf>,
    /// The control socket.
    pub socket: Option<PathBuf>,
    /// Where the Prometheus exporter listens.
    pub metrics: Option<String>,
    /// `error`, `warn`, `info`, `debug` or `trace`.
    pub log_level: Option<String>,
    /// Tier budgets.
    #[serde(default)]
    pub capacity: Capacity,
    /// Per-client and per-message limits.
    #[serde(default)]
    pub limits: Limits,
    /// Who may connect besides the daemon's user and root.
    #[serde(default)]
    pub peers: Peers,
}

/// Tier budgets: fixed sizes, or fractions of what the machine has at start.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capacity {
    /// The DRAM tier's budget.
    pub dram_bytes: Option<Size>,
    /// The SSD tier's budget.
    pub ssd_bytes: Option<Size>,
    /// Without `dram_bytes`: this fraction of the memory available at start.
    pub dram_fraction: Option<f64>,
    /// Without `ssd_bytes`: this fraction of the free space under the data directory (plus
    /// what the store already holds).
    pub ssd_fraction: Option<f64>,
}

/// Limits that protect the daemon from one client.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest message body accepted.
    pub max_message_bytes: Option<Size>,
    /// Once a frame has begun, the rest must arrive within this many milliseconds.
    pub frame_timeout_ms: Option<u64>,
    /// A lease unused this long (milliseconds) ends and its pins are given back.
    pub lease_ttl_ms: Option<u64>,
    /// Leases one connection may hold.
    pub max_leases_per_client: Option<usize>,
    /// Store pins one connection's leases may hold.
    pub max_pins_per_client: Option<usize>,
    /// Page bytes one Load or Publish may move.
    pub max_request_bytes: Option<Size>,
}

/// Further peers allowed.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Peers {
    /// User ids.
    #[serde(default)]
    pub uids: Vec<u32>,
    /// Group ids.
    #[serde(default)]
    pub gids: Vec<u32>,
}

impl ServeConfig {
    /// Parses `text` (from `path`, named in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self, Failure> {
        let c: ServeConfig = toml::from_str(text)
            .map_err(|e| Failure::refused(format!("{}: {}", path.display(), e.message())))?;
        for (key, f) in [
            ("capacity.dram_fraction", c.capacity.dram_fraction),
            ("capacity.ssd_fraction", c.capacity.ssd_fraction),
        ] {
            if let Some(f) = f
                && !(f > 0.0 && f <= 1.0)
            {
                return Err(Failure::refused(format!(
                    "{}: {key} = {f}: expected a fraction in (0, 1]",
                    path.display()
                )));
            }
        }
        Ok(c)
    }

    /// Reads and parses the file at `path`.
    pub fn load(path: &Path) -> Result<Self, Failure> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Failure::refused(format!("{}: {e}", path.display())))?;
        Self::parse(&text, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_file_parses_with_every_key() {
        let sample = include_str!("../../deploy/orbitkv.toml");
        // Every key of the sample is commented out: uncommented, it must parse to the documented
        // defaults.
        let text: String = sample
            .lines()
            .map(|l| {
                l.strip_prefix("# ")
                    .filter(|r| r.contains(" = ") || r.starts_with('['))
                    .unwrap_or("")
            })
            .collect::<Vec<_>>()
            .join("\n");
        let c = ServeConfig::parse(&text, Path::new("sample"))
            .unwrap_or_else(|f| panic!("{}", f.message));
        assert_eq!(c.data_dir.as_deref(), Some(Path::new("./orbitkv-data")));
        assert_eq!(c.capacity.dram_fraction, Some(0.25));
        assert_eq!(c.capacity.ssd_fraction, Some(0.8));
        assert_eq!(c.limits.max_message_bytes, Some(Size(16 << 20)));
        assert_eq!(c.limits.frame_timeout_ms, Some(10_000));
        assert_eq!(c.limits.lease_ttl_ms, Some(30_000));
        assert_eq!(c.limits.max_leases_per_client, Some(4096));
        assert_eq!(c.limits.max_pins_per_client, Some(1 << 20));
        assert_eq!(c.limits.max_request_bytes, Some(Size(1 << 30)));
        assert_eq!(c.log_level.as_deref(), Some("warn"));
    }

    #[test]
    fn unknown_keys_bad_sizes_and_bad_fractions_are_refused() {
        let p = Path::new("f.toml");
        for bad in [
            "data_dri = \"x\"",
            "[capacity]\ndram_bytes = \"12 parsecs\"",
            "[capacity]\nssd_fraction = 1.5",
            "[limits]\nmax_leases = 3",
            "socket = 5",
        ] {
            let e = ServeConfig::parse(bad, p).map(|_| ()).unwrap_err();
            assert!(e.message.starts_with("f.toml: "), "{bad}: {}", e.message);
        }
        let c = ServeConfig::parse("[capacity]\ndram_bytes = 4096\nssd_bytes = \"2GiB\"", p)
            .unwrap_or_else(|f| panic!("{}", f.message));
        assert_eq!(c.capacity.dram_bytes, Some(Size(4096)));
        assert_eq!(c.capacity.ssd_bytes, Some(Size(2 << 30)));
    }
}
