//! The daemon's configuration file (`orbitkv serve --config FILE`, TOML). Every key is optional;
//! a flag given on the command line overrides the file, and the file overrides the embedded
//! defaults. Unknown keys are refused, so a misspelt option never silently falls back to a
//! default. `deploy/orbitkv.toml` documents every key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use orbitkv_store::Policy;
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

/// A time interval: an integer (seconds), or a string with a unit (`"30s"`, `"500ms"`, `"2m"`);
/// `0` or `"off"` is zero (disabled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval(pub Duration);

impl<'de> Deserialize<'de> for Interval {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Seconds(u64),
            Text(String),
        }
        match Repr::deserialize(d)? {
            Repr::Seconds(n) => Ok(Interval(Duration::from_secs(n))),
            Repr::Text(t) => parse_interval(&t)
                .map(Interval)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// Parses an interval: a number and a unit (`ms`, `s`, `m`, `h`; seconds without one), or
/// `off` (zero).
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("off") {
        return Ok(Duration::ZERO);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "ms" => 1e-3,
        "" | "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "{text:?}: unknown time unit {other:?} (ms, s, m, h, or off)"
            ));
        }
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{text:?}: not an interval (e.g. 30s, 500ms, off)"))?;
    Duration::try_from_secs_f64(n * scale).map_err(|_| format!("{text:?}: interval out of range"))
}

/// Parses a fraction in [0, 1], or `off` (zero).
pub fn parse_fraction(text: &str) -> Result<f64, String> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("off") {
        return Ok(0.0);
    }
    match t.parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(format!("{text:?}: expected a fraction in [0, 1] or off")),
    }
}

/// Parses an SSD admission setting: `adaptive` or `off` (true: adaptive).
pub fn parse_admission(text: &str) -> Result<bool, String> {
    match text.trim() {
        "adaptive" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("{other:?}: expected adaptive or off")),
    }
}

/// Parses a reclaim policy name (`record-lru`, `s3-fifo`, `fifo`, `fifo-reinsert`).
pub fn parse_policy(text: &str) -> Result<Policy, String> {
    Policy::ALL
        .iter()
        .find(|(name, _)| *name == text.trim())
        .map(|(_, p)| *p)
        .ok_or_else(|| {
            let names: Vec<&str> = Policy::ALL.iter().map(|(n, _)| *n).collect();
            format!("{text:?}: unknown policy (one of {})", names.join(", "))
        })
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
    /// A segment is sealed once it would pass this size (at most a 16th of the SSD budget
    /// under `record-lru`, a 64th under the others).
    pub segment_bytes: Option<Size>,
    /// What the SSD tier evicts when full: `record-lru`, `s3-fifo`, `fifo` or `fifo-reinsert`.
    pub policy: Option<String>,
    /// How often sealed segments are compacted in the background (`0` or `"off"`: never).
    pub compact_interval: Option<Interval>,
    /// Sealed segments whose live fraction is below this are compacted (`0`: none).
    pub compact_threshold: Option<f64>,
    /// SSD admission under `record-lru`: `adaptive` or `off`.
    pub admission: Option<String>,
    /// The admission waiting room's bytes, taken from the DRAM tier's budget.
    pub waiting_bytes: Option<Size>,
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
    /// Connections served at once; one more is refused.
    pub max_connections: Option<usize>,
    /// Memory one connection may hold (frame being read, replies waiting, publish copies waiting
    /// to be stored, spare buffers); a request that would pass it is refused.
    pub max_connection_bytes: Option<Size>,
    /// Publish copies the daemon holds until stored, over every connection; a Publish past it
    /// is refused (retry later). Default: a quarter of the memory available at start-up.
    pub max_publish_bytes: Option<Size>,
    /// A reply not taken by the peer within this many milliseconds closes the connection.
    pub send_timeout_ms: Option<u64>,
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
        if let Some(f) = c.capacity.compact_threshold
            && !(0.0..=1.0).contains(&f)
        {
            return Err(Failure::refused(format!(
                "{}: capacity.compact_threshold = {f}: expected a fraction in [0, 1]",
                path.display()
            )));
        }
        if let Some(p) = &c.capacity.policy {
            parse_policy(p).map_err(|e| {
                Failure::refused(format!("{}: capacity.policy = {e}", path.display()))
            })?;
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
        assert_eq!(c.capacity.admission.as_deref(), Some("adaptive"));
        assert_eq!(parse_admission("off"), Ok(false));
        assert!(parse_admission("on").is_err());
        assert_eq!(c.limits.max_message_bytes, Some(Size(16 << 20)));
        assert_eq!(c.limits.frame_timeout_ms, Some(10_000));
        assert_eq!(c.limits.lease_ttl_ms, Some(30_000));
        assert_eq!(c.limits.max_leases_per_client, Some(4096));
        assert_eq!(c.limits.max_pins_per_client, Some(1 << 20));
        assert_eq!(c.limits.max_request_bytes, Some(Size(1 << 30)));
        assert_eq!(c.limits.max_connections, Some(1024));
        assert_eq!(
            c.limits.max_connection_bytes,
            Some(Size((1 << 30) + (128 << 20)))
        );
        assert_eq!(c.limits.max_publish_bytes, Some(Size(4 << 30)));
        assert_eq!(c.limits.send_timeout_ms, Some(10_000));
        assert_eq!(c.capacity.segment_bytes, Some(Size(256 << 20)));
        assert_eq!(c.capacity.policy.as_deref(), Some("record-lru"));
        assert_eq!(
            c.capacity.compact_interval,
            Some(Interval(Duration::from_secs(30)))
        );
        assert_eq!(c.capacity.compact_threshold, Some(0.5));
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
            "[capacity]\ncompact_interval = \"soon\"",
            "[capacity]\ncompact_threshold = 1.5",
            "[capacity]\npolicy = \"lru\"",
        ] {
            let e = ServeConfig::parse(bad, p).map(|_| ()).unwrap_err();
            assert!(e.message.starts_with("f.toml: "), "{bad}: {}", e.message);
        }
        let c = ServeConfig::parse("[capacity]\ndram_bytes = 4096\nssd_bytes = \"2GiB\"", p)
            .unwrap_or_else(|f| panic!("{}", f.message));
        assert_eq!(c.capacity.dram_bytes, Some(Size(4096)));
        assert_eq!(c.capacity.ssd_bytes, Some(Size(2 << 30)));
    }

    #[test]
    fn intervals_fractions_and_policies_parse_as_operators_write_them() {
        let secs = |s: f64| Ok(Duration::from_secs_f64(s));
        assert_eq!(parse_interval("30s"), secs(30.0));
        assert_eq!(parse_interval("30"), secs(30.0));
        assert_eq!(parse_interval("250ms"), secs(0.25));
        assert_eq!(parse_interval("2m"), secs(120.0));
        assert_eq!(parse_interval("off"), Ok(Duration::ZERO));
        assert_eq!(parse_interval("0"), Ok(Duration::ZERO));
        assert!(parse_interval("5 fortnights").is_err());
        assert!(parse_interval("-1s").is_err());
        assert_eq!(parse_fraction("0.3"), Ok(0.3));
        assert_eq!(parse_fraction("off"), Ok(0.0));
        assert!(parse_fraction("2").is_err());
        assert_eq!(parse_policy("fifo"), Ok(Policy::Fifo));
        assert!(parse_policy("lru").is_err());
        let p = Path::new("f.toml");
        let c = ServeConfig::parse("[capacity]\ncompact_interval = 0", p)
            .unwrap_or_else(|f| panic!("{}", f.message));
        assert_eq!(c.capacity.compact_interval, Some(Interval(Duration::ZERO)));
    }
}
