//! Token-id lists from `--tokens 1,2,3` or `--tokens-file PATH|-` (commas and/or whitespace).

use std::io::Read;

use crate::Failure;

/// Parses decimal non-negative token ids separated by commas and/or whitespace.
pub fn parse(text: &str) -> Result<Vec<u64>, Failure> {
    text.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .enumerate()
        .map(|(i, t)| {
            t.parse::<u64>().map_err(|_| {
                Failure::refused(format!(
                    "token {i}: {t:?} is not a non-negative integer below 2^64"
                ))
            })
        })
        .collect()
}

/// Reads the token list from the inline argument or the file (`-` = standard input).
pub fn read(inline: Option<&str>, file: Option<&str>) -> Result<Vec<u64>, Failure> {
    match (inline, file) {
        (Some(t), None) => parse(t),
        (None, Some("-")) => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| Failure::refused(format!("standard input: {e}")))?;
            parse(&s)
        }
        (None, Some(path)) => {
            let s = std::fs::read_to_string(path)
                .map_err(|e| Failure::refused(format!("{path}: {e}")))?;
            parse(&s)
        }
        _ => Err(Failure::refused(
            "give exactly one of --tokens or --tokens-file",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_separators_and_refuses_garbage() {
        assert_eq!(parse("1,2, 3\n4\t5").unwrap(), vec![1, 2, 3, 4, 5]);
        assert_eq!(parse("").unwrap(), Vec::<u64>::new());
        assert_eq!(parse("18446744073709551615").unwrap(), vec![u64::MAX]);
        assert!(parse("1,-2").is_err());
        assert!(parse("18446744073709551616").is_err());
        assert!(parse("0x10").is_err());
    }
}
