//! Where results go: text lines, or exactly one JSON document, on stdout.

use std::io::Write;

use serde_json::Value;

use crate::Failure;

/// The stdout writer for one command.
pub struct Output {
    json: bool,
}

impl Output {
    /// `json` selects one JSON document instead of text.
    pub fn new(json: bool) -> Self {
        Self { json }
    }
    /// True when the command must print JSON.
    pub fn json(&self) -> bool {
        self.json
    }
    /// Prints `text` (text mode) or `doc` (JSON mode).
    pub fn emit(&self, text: &str, doc: impl FnOnce() -> Value) -> Result<(), Failure> {
        let mut stdout = std::io::stdout().lock();
        let res = if self.json {
            let doc = doc();
            serde_json::to_writer(&mut stdout, &doc)
                .map_err(std::io::Error::other)
                .and_then(|()| stdout.write_all(b"\n"))
        } else {
            stdout.write_all(text.as_bytes())
        };
        res.and_then(|()| stdout.flush())
            .map_err(|e| Failure::internal(format!("writing to stdout: {e}")))
    }
}
