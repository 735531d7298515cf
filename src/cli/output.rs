//! What client commands print: `-o table` (the default, for people) or
//! `-o json` (for scripts). A command prints one JSON document (an array for
//! listings, an object otherwise); a command that keeps printing (`tail`,
//! `stats --watch`) prints one JSON object per line. Errors go to stderr, so
//! stdout holds only results.

use chrono::{DateTime, Utc};
use clap::ValueEnum;
use serde_json::Value;

#[derive(Clone, Copy, Debug, Default, ValueEnum, PartialEq, Eq)]
pub enum Output {
    /// Aligned columns and lines for people.
    #[default]
    Table,
    /// JSON for scripts.
    Json,
}

/// One JSON document, indented.
pub fn print_json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

/// One JSON object on one line (for commands that keep printing).
pub fn print_json_line(v: &Value) {
    println!("{v}");
}

/// Columns aligned to their widest cell; the last column is not padded.
pub fn print_table(head: &[&str], rows: impl Iterator<Item = Vec<String>>) {
    let rows: Vec<Vec<String>> = rows.collect();
    let mut width: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = width[i]));
            }
        }
        println!("{}", s.trim_end());
    };
    line(head.to_vec());
    for r in &rows {
        line(r.iter().map(String::as_str).collect());
    }
}

/// At most `n` characters on one line (`…` marks a cut).
pub fn truncate(s: &str, n: usize) -> String {
    let s = s.replace(['\n', '\r', '\t'], " ");
    if s.chars().count() <= n {
        s
    } else {
        format!("{}…", s.chars().take(n - 1).collect::<String>())
    }
}

pub fn rfc3339(t: &prost_types::Timestamp) -> String {
    DateTime::<Utc>::from_timestamp(t.seconds, t.nanos.max(0) as u32)
        .map_or_else(|| "-".into(), |t| t.to_rfc3339())
}

/// An instant in JSON: RFC 3339, or null.
pub fn opt_ts(t: Option<&prost_types::Timestamp>) -> Value {
    t.map_or(Value::Null, |t| Value::String(rfc3339(t)))
}

/// Null for an empty string.
pub fn none_if_empty(s: &str) -> Value {
    if s.is_empty() {
        Value::Null
    } else {
        Value::String(s.to_owned())
    }
}

/// Sets `payload` (text) or, for a payload that is not UTF-8, `payload_hex`
/// on a JSON object, so the JSON stays valid.
pub fn set_payload(v: &mut Value, payload: &[u8]) {
    set_bytes(v, "payload", payload);
}

/// `v[name]` = the bytes as text when they are UTF-8, else null and
/// `v[name_hex]` their hex.
pub fn set_bytes(v: &mut Value, name: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(s) => v[name] = Value::String(s.to_owned()),
        Err(_) => {
            v[name] = Value::Null;
            v[format!("{name}_hex")] =
                Value::String(bytes.iter().map(|b| format!("{b:02x}")).collect());
        }
    }
}
