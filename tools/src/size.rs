//! Byte sizes with units, as operators write them: `4096`, `64KiB`, `2GiB`, `1.5GB`, `512k`.

/// Parses a size: a number (decimal point allowed) and an optional unit — `B`, `K`/`KB` (10^3),
/// `KiB` (2^10), `M`/`MB`, `MiB`, `G`/`GB`, `GiB`, `T`/`TB`, `TiB`; case-insensitive for the
/// letters, one optional space.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    let mult: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" => 1e12,
        "tib" => 1024.0f64.powi(4),
        _ => {
            return Err(format!(
                "{text:?}: unknown size unit {unit:?} (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            ));
        }
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{text:?}: not a size (e.g. 4096, 64MiB, 2GiB)"))?;
    let bytes = n * mult;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("{text:?}: size out of range"));
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5 GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("512k").unwrap(), 512_000);
        assert_eq!(parse_size("3mib").unwrap(), 3 << 20);
        for bad in ["", "x", "12 parsecs", "-1", "1e3", "GiB"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }
}
