//! Mooncake-format request traces: JSON lines, each with `hash_ids` (one id per 512-token
//! chained prefix block; a shared id is a shared prefix) and optionally `input_length`.

use std::io::BufRead;
use std::path::Path;

use serde_json::Value;

use crate::Failure;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRequest {
    /// Its prefix blocks' ids, in order.
    pub hash_ids: Vec<u64>,
    /// Its prompt length in tokens, when the trace gives one.
    pub input_length: Option<u64>,
}

/// Reads up to `limit` requests of the trace at `path`; a malformed line is refused with its
/// line number.
pub fn load(path: &Path, limit: Option<usize>) -> Result<Vec<TraceRequest>, Failure> {
    let file = std::fs::File::open(path)
        .map_err(|e| Failure::refused(format!("{}: {e}", path.display())))?;
    let mut out = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        if limit.is_some_and(|l| out.len() >= l) {
            break;
        }
        let line = line.map_err(|e| Failure::refused(format!("{}: {e}", path.display())))?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: &str| Failure::refused(format!("{}:{}: {why}", path.display(), n + 1));
        let v: Value = serde_json::from_str(&line).map_err(|e| bad(&e.to_string()))?;
        let ids = v
            .get("hash_ids")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no hash_ids array"))?;
        let hash_ids = ids
            .iter()
            .map(|x| {
                x.as_u64()
                    .ok_or_else(|| bad("a hash id is not an unsigned integer"))
            })
            .collect::<Result<Vec<u64>, Failure>>()?;
        let input_length = match v.get("input_length") {
            None => None,
            Some(x) => Some(
                x.as_u64()
                    .ok_or_else(|| bad("input_length is not an unsigned integer"))?,
            ),
        };
        out.push(TraceRequest {
            hash_ids,
            input_length,
        });
    }
    Ok(out)
}
