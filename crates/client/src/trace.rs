//! W3C trace context (`traceparent`, `tracestate`) carried in job headers,
//! so a trace can follow a job from its producer to its handler, across
//! languages: the Python and Node clients write and read the same headers.
//!
//! What is automatic: the worker reads `traceparent` from each delivery
//! and records its trace id on the job's `tracing` span (field
//! `trace_id`), so the worker's logs for a job carry the producer's trace
//! id. With the `otel` feature, enqueue also writes the current
//! OpenTelemetry span's context into the job's headers, and the worker runs
//! each handler in a consumer span that is a child of the producer's (see
//! [`crate::otel`], when built with the feature). Without it, set the
//! headers with [`Job::headers`] and read them from [`Delivery::headers`].
//!
//! [`Job::headers`]: crate::Job::headers
//! [`Delivery::headers`]: crate::Delivery::headers

use std::fmt;

/// The header holding the W3C `traceparent`.
pub const TRACEPARENT: &str = "traceparent";
/// The header holding the W3C `tracestate`.
pub const TRACESTATE: &str = "tracestate";

/// A parsed W3C `traceparent` (`00-<trace id>-<parent span id>-<flags>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    /// The producer's span.
    pub parent_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    /// Parses a version-00 `traceparent` (and, as the spec asks, the first
    /// four fields of a later version). None for anything malformed, and
    /// for the all-zero trace or span ids the spec declares invalid.
    pub fn parse(s: &str) -> Option<TraceParent> {
        let s = s.trim();
        let mut parts = s.split('-');
        let version = parts.next()?;
        let (trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?);
        if version.len() != 2 || version == "ff" || !is_lower_hex(version) {
            return None;
        }
        if version == "00" && (parts.next().is_some() || s.len() != 55) {
            return None;
        }
        let trace_id: [u8; 16] = hex(trace)?;
        let parent_id: [u8; 8] = hex(parent)?;
        let [flags]: [u8; 1] = hex(flags)?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            parent_id,
            flags,
        })
    }

    /// The trace id as 32 lower-case hex digits.
    pub fn trace_id_hex(&self) -> String {
        to_hex(&self.trace_id)
    }

    /// The parent span id as 16 lower-case hex digits.
    pub fn parent_id_hex(&self) -> String {
        to_hex(&self.parent_id)
    }

    /// The producer's sampling decision.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

impl fmt::Display for TraceParent {
    /// The header value, version 00.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            to_hex(&self.trace_id),
            to_hex(&self.parent_id),
            self.flags
        )
    }
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !is_lower_hex(s) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_prints_the_spec_example() {
        let tp = TraceParent::parse(TP).unwrap();
        assert_eq!(tp.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(tp.parent_id_hex(), "00f067aa0ba902b7");
        assert!(tp.sampled());
        assert_eq!(tp.to_string(), TP);
    }

    #[test]
    fn refuses_malformed_values() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        // A later version may append fields.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more";
        assert!(!TraceParent::parse(later).unwrap().sampled());
    }
}
