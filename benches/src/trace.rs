//! Mooncake-format request traces (JSON Lines).
//!
//! Each line is one request: `{"timestamp": ms, "input_length": tokens,
//! "output_length": tokens, "hash_ids": [block ids]}`, where each id names
//! one 512-token block and two requests with the same first k ids share a
//! k-block prefix. See `benches/data/PROVENANCE.md`.

use std::io::BufRead;

use kvslice_core::Error;
use serde_json::Value;

/// Tokens per trace block.
pub const TRACE_BLOCK_TOKENS: u32 = 512;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRequest {
    /// Arrival time in milliseconds.
    pub timestamp: u64,
    /// Prompt tokens.
    pub input_length: u64,
    /// Generated tokens.
    pub output_length: u64,
    /// One id per 512-token block of the prompt.
    pub hash_ids: Vec<u64>,
}

fn bad(line: u64, reason: &'static str) -> Error {
    Error::MalformedTrace { line, reason }
}

fn uint(
    obj: &serde_json::Map<String, Value>,
    field: &str,
    line: u64,
    missing: &'static str,
    wrong: &'static str,
) -> Result<u64, Error> {
    obj.get(field)
        .ok_or(bad(line, missing))?
        .as_u64()
        .ok_or(bad(line, wrong))
}

/// Parses one trace line (`line` is its 1-based number, for errors).
///
/// ```
/// use kvslice_benches::trace::parse_line;
///
/// let r = parse_line(r#"{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]}"#, 1)?;
/// assert_eq!(r.hash_ids, [7, 8]);
/// let err = parse_line(r#"{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [7]}"#, 9).unwrap_err();
/// assert_eq!(err.to_string(), "malformed trace line 9: hash_ids must have one id per 512 tokens of input_length");
/// # Ok::<(), kvslice_core::Error>(())
/// ```
pub fn parse_line(text: &str, line: u64) -> Result<TraceRequest, Error> {
    let value: Value = serde_json::from_str(text).map_err(|_| bad(line, "not valid JSON"))?;
    let obj = value.as_object().ok_or(bad(line, "not a JSON object"))?;
    let timestamp = uint(
        obj,
        "timestamp",
        line,
        "missing timestamp",
        "timestamp is not a non-negative integer",
    )?;
    let input_length = uint(
        obj,
        "input_length",
        line,
        "missing input_length",
        "input_length is not a non-negative integer",
    )?;
    let output_length = uint(
        obj,
        "output_length",
        line,
        "missing output_length",
        "output_length is not a non-negative integer",
    )?;
    let ids = obj
        .get("hash_ids")
        .ok_or(bad(line, "missing hash_ids"))?
        .as_array()
        .ok_or(bad(line, "hash_ids is not an array"))?;
    let hash_ids = ids
        .iter()
        .map(|v| {
            v.as_u64().ok_or(bad(
                line,
                "hash_ids holds something other than non-negative integers",
            ))
        })
        .collect::<Result<Vec<u64>, Error>>()?;
    if input_length == 0 {
        return Err(bad(line, "input_length is zero"));
    }
    if input_length.div_ceil(u64::from(TRACE_BLOCK_TOKENS)) != hash_ids.len() as u64 {
        return Err(bad(
            line,
            "hash_ids must have one id per 512 tokens of input_length",
        ));
    }
    Ok(TraceRequest {
        timestamp,
        input_length,
        output_length,
        hash_ids,
    })
}

/// Fuzz harness: arbitrary bytes into the parser, line by line and as a
/// whole trace. A value or an error, never a panic; a line that parses
/// reads the same written back as JSON; a trace holds the lines that
/// parse, in timestamp order, and skips and counts the rest (or, not
/// skipping, is refused for them).
pub fn fuzz_trace_line(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(r) = parse_line(&text, 1) {
        // What was read is what the line says: written back as JSON, it
        // reads the same.
        let again = serde_json::json!({
            "timestamp": r.timestamp,
            "input_length": r.input_length,
            "output_length": r.output_length,
            "hash_ids": r.hash_ids,
        });
        assert_eq!(parse_line(&again.to_string(), 1).as_ref(), Ok(&r));
        assert!(r.input_length > 0);
        assert_eq!(
            r.input_length.div_ceil(u64::from(TRACE_BLOCK_TOKENS)),
            r.hash_ids.len() as u64
        );
    }
    // A whole trace: every line that is not blank is read or (skipping)
    // counted; without skipping, it reads exactly when nothing would be
    // skipped, and the same requests, in timestamp order, ties in line
    // order.
    let lines: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    let mut want: Vec<TraceRequest> = Vec::new();
    let mut bad_lines = 0;
    for (i, bytes) in lines.iter().enumerate() {
        match std::str::from_utf8(bytes) {
            Ok(t) if t.trim().is_empty() => {}
            Ok(t) => match parse_line(t, i as u64 + 1) {
                Ok(r) => want.push(r),
                Err(_) => bad_lines += 1,
            },
            Err(_) => bad_lines += 1,
        }
    }
    want.sort_by_key(|r| r.timestamp);
    let skipping = Trace::read(data, true).expect("skipping reads anything");
    assert_eq!(skipping.requests, want);
    assert_eq!(skipping.skipped_lines, bad_lines);
    match Trace::read(data, false) {
        Ok(t) => {
            assert_eq!(bad_lines, 0);
            assert_eq!(t.requests, want);
        }
        Err(_) => assert!(bad_lines > 0, "a trace of good lines refused"),
    }
}

/// A parsed trace, requests in timestamp order (stable for ties).
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// The requests.
    pub requests: Vec<TraceRequest>,
    /// Lines skipped as malformed (only with `skip_bad_lines`).
    pub skipped_lines: u64,
}

impl Trace {
    /// Reads a JSONL trace. A malformed line is an error naming its line
    /// number, unless `skip_bad_lines`, when it is skipped and counted.
    /// Blank lines are ignored.
    pub fn read(input: impl BufRead, skip_bad_lines: bool) -> Result<Self, TraceError> {
        let mut trace = Trace::default();
        for (i, bytes) in input.split(b'\n').enumerate() {
            let line = i as u64 + 1;
            let bytes = bytes.map_err(|e| TraceError::Io(e.to_string()))?;
            // A line that is not UTF-8 is a malformed line like any other.
            let parsed = match std::str::from_utf8(&bytes) {
                Ok(text) if text.trim().is_empty() => continue,
                Ok(text) => parse_line(text, line),
                Err(_) => Err(bad(line, "not valid UTF-8")),
            };
            match parsed {
                Ok(r) => trace.requests.push(r),
                Err(_) if skip_bad_lines => trace.skipped_lines += 1,
                Err(e) => return Err(TraceError::Parse(e)),
            }
        }
        trace.requests.sort_by_key(|r| r.timestamp);
        Ok(trace)
    }

    /// Total block lookups the trace makes.
    pub fn blocks(&self) -> u64 {
        self.requests.iter().map(|r| r.hash_ids.len() as u64).sum()
    }
}

/// Why a trace could not be read.
#[derive(Debug)]
pub enum TraceError {
    /// Reading failed.
    Io(String),
    /// A line was malformed.
    Parse(Error),
}

impl std::fmt::Display for TraceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TraceError::Io(e) => write!(f, "reading the trace: {e}"),
            TraceError::Parse(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for TraceError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_lines_name_their_problem() {
        let cases = [
            ("", "not valid JSON"),
            ("[1]", "not a JSON object"),
            (
                r#"{"input_length": 1, "output_length": 1, "hash_ids": [1]}"#,
                "missing timestamp",
            ),
            (
                r#"{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}"#,
                "timestamp is not a non-negative integer",
            ),
            (
                r#"{"timestamp": 1.5, "input_length": 1, "output_length": 1, "hash_ids": [1]}"#,
                "timestamp is not a non-negative integer",
            ),
            (
                r#"{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": 3}"#,
                "hash_ids is not an array",
            ),
            (
                r#"{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": ["a"]}"#,
                "hash_ids holds something other than non-negative integers",
            ),
            (
                r#"{"timestamp": 1, "input_length": 0, "output_length": 1, "hash_ids": []}"#,
                "input_length is zero",
            ),
            (
                r#"{"timestamp": 1, "input_length": 513, "output_length": 1, "hash_ids": [1]}"#,
                "hash_ids must have one id per 512 tokens of input_length",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(
                parse_line(text, 4),
                Err(Error::MalformedTrace {
                    line: 4,
                    reason: want
                }),
                "{text}"
            );
        }
    }

    #[test]
    fn reading_sorts_skips_and_counts() {
        let text = "{\"timestamp\": 9, \"input_length\": 1, \"output_length\": 0, \"hash_ids\": [2]}\n\nnot json\n{\"timestamp\": 3, \"input_length\": 512, \"output_length\": 0, \"hash_ids\": [1]}\n";
        let err = Trace::read(text.as_bytes(), false).unwrap_err();
        assert_eq!(err.to_string(), "malformed trace line 3: not valid JSON");
        let t = Trace::read(text.as_bytes(), true).unwrap();
        assert_eq!(t.skipped_lines, 1);
        assert_eq!(
            t.requests.iter().map(|r| r.timestamp).collect::<Vec<_>>(),
            [3, 9]
        );
        assert_eq!(t.blocks(), 2);
        // A line that is not UTF-8 is malformed like any other.
        let mut bytes = text.as_bytes().to_vec();
        bytes.extend_from_slice(b"\xff\xfe\r\n");
        let err = Trace::read(&bytes[..], false).unwrap_err();
        assert_eq!(err.to_string(), "malformed trace line 3: not valid JSON");
        let t = Trace::read(&bytes[..], true).unwrap();
        assert_eq!((t.skipped_lines, t.requests.len()), (2, 2));
        let err = Trace::read(&b"\xff\n"[..], false).unwrap_err();
        assert_eq!(err.to_string(), "malformed trace line 1: not valid UTF-8");
    }
}
