//! Exit codes of every client command, and the one place gRPC status codes
//! and connection failures are mapped onto them.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | ok |
//! | 1 | any other error: the broker refused or failed the request (`FAILED_PRECONDITION`, `RESOURCE_EXHAUSTED`, `INTERNAL`, ...), or a local one |
//! | 2 | usage: bad flags or values (clap), an unusable address or TLS file, or the broker said `INVALID_ARGUMENT` / `OUT_OF_RANGE` |
//! | 3 | not found: `NOT_FOUND` (unknown queue or job) |
//! | 4 | unavailable: the broker cannot be reached, or said `UNAVAILABLE` / `DEADLINE_EXCEEDED` |
//! | 5 | denied: `UNAUTHENTICATED` (no or unknown token), `PERMISSION_DENIED` (outside the token's grants), or the TLS handshake failed (the broker's certificate is not signed by `--tls-ca`) |

use std::error::Error as StdError;
use std::fmt;

use leaseq_client::ConnectError;
use tonic::Code;

/// What a client command's exit code says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    Error = 1,
    Usage = 2,
    NotFound = 3,
    Unavailable = 4,
    Denied = 5,
}

impl Exit {
    /// The exit code for a gRPC status code.
    pub fn of(code: Code) -> Exit {
        match code {
            Code::Ok => Exit::Ok,
            Code::InvalidArgument | Code::OutOfRange => Exit::Usage,
            Code::NotFound => Exit::NotFound,
            Code::Unavailable | Code::DeadlineExceeded => Exit::Unavailable,
            Code::Unauthenticated | Code::PermissionDenied => Exit::Denied,
            _ => Exit::Error,
        }
    }

    pub fn code(self) -> i32 {
        self as i32
    }
}

/// A failed client command: its exit code and what to tell the user.
#[derive(Debug)]
pub struct CliError {
    pub exit: Exit,
    pub message: String,
}

impl CliError {
    pub fn new(exit: Exit, message: impl Into<String>) -> CliError {
        CliError {
            exit,
            message: message.into(),
        }
    }

    pub fn usage(message: impl Into<String>) -> CliError {
        CliError::new(Exit::Usage, message)
    }

    pub fn error(message: impl Into<String>) -> CliError {
        CliError::new(Exit::Error, message)
    }

    /// `addr` could not be connected to: unreachable (4), or the TLS
    /// handshake failed (5).
    pub fn connecting(addr: &str, e: &(dyn StdError + 'static)) -> CliError {
        let detail = chain(e);
        if tls_refused(e) {
            CliError::new(
                Exit::Denied,
                format!("connecting to {addr}: TLS handshake failed: {detail}"),
            )
        } else {
            CliError::new(
                Exit::Unavailable,
                format!("connecting to {addr}: {detail}{}", plaintext_hint(addr, e)),
            )
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<tonic::Status> for CliError {
    fn from(s: tonic::Status) -> CliError {
        let mut exit = Exit::of(s.code());
        let mut message = format!("{:?}: {}", s.code(), s.message());
        if let Some(source) = s.source() {
            if tls_refused(source) {
                // The broker refused the TLS handshake after it seemed done
                // (TLS 1.3 reports a refused client certificate so).
                exit = Exit::Denied;
                message = format!("{message}: TLS handshake failed: {}", chain(source));
            } else {
                // Not the broker's answer (that has no source) but the
                // connection failing under the call, whatever code tonic
                // gave it (UNKNOWN "transport error", CANCELLED "connection
                // closed", ...): e.g. a broker that wanted a client
                // certificate hung up before its alert was read.
                exit = Exit::Unavailable;
                message = format!("{message}: {}", chain(source));
            }
        }
        CliError { exit, message }
    }
}

impl From<ConnectError> for CliError {
    fn from(e: ConnectError) -> CliError {
        match &e {
            ConnectError::Config(m) => CliError::usage(m.clone()),
            ConnectError::Transport { addr, source } => CliError::connecting(addr, source),
        }
    }
}

/// Prints the error (if any) on stderr and returns the exit code.
pub fn report(result: Result<(), CliError>) -> i32 {
    match result {
        Ok(()) => Exit::Ok.code(),
        Err(e) => {
            eprintln!("error: {}", e.message);
            e.exit.code()
        }
    }
}

/// `e` and its sources, `: `-separated, without repeats (transport errors
/// often say the same thing at two levels).
fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(e) = next {
        let s = e.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
        next = e.source();
    }
    parts.join(": ")
}

/// Whether `e` comes from a failed TLS handshake: rustls reports a
/// certificate it does not trust, an alert from the peer, or bytes that are
/// not TLS as `io::ErrorKind::InvalidData` (and nothing else on a
/// connection does).
fn tls_refused(e: &(dyn StdError + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::InvalidData)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// A plaintext connection that was made but failed: perhaps the broker
/// serves TLS.
fn plaintext_hint(addr: &str, e: &(dyn StdError + 'static)) -> &'static str {
    use std::io::ErrorKind::*;
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                ConnectionRefused | TimedOut | NotFound | HostUnreachable | NetworkUnreachable
            )
        {
            return "";
        }
        next = e.source();
    }
    if addr.starts_with("http://") {
        " (if the broker serves TLS, use an https:// address and --tls-ca)"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_map_onto_the_documented_exit_codes() {
        for (code, exit) in [
            (Code::InvalidArgument, 2),
            (Code::OutOfRange, 2),
            (Code::NotFound, 3),
            (Code::Unavailable, 4),
            (Code::DeadlineExceeded, 4),
            (Code::Unauthenticated, 5),
            (Code::PermissionDenied, 5),
            (Code::FailedPrecondition, 1),
            (Code::ResourceExhausted, 1),
            (Code::Internal, 1),
            (Code::Unimplemented, 1),
        ] {
            let e = CliError::from(tonic::Status::new(code, "x"));
            assert_eq!(e.exit.code(), exit, "{code:?}");
            assert!(e.message.contains("x"), "{}", e.message);
        }
    }

    #[test]
    fn calls_failed_by_the_connection_are_unavailable_or_denied() {
        use std::io::{Error, ErrorKind};
        let reset =
            tonic::Status::from_error(Box::new(Error::new(ErrorKind::ConnectionReset, "reset")));
        assert_eq!(CliError::from(reset).exit, Exit::Unavailable);
        let alert = tonic::Status::from_error(Box::new(Error::new(
            ErrorKind::InvalidData,
            "received fatal alert: CertificateRequired",
        )));
        let e = CliError::from(alert);
        assert_eq!(e.exit, Exit::Denied);
        assert!(e.message.contains("CertificateRequired"), "{}", e.message);
    }

    #[test]
    fn tls_failures_are_told_from_unreachable_brokers() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = CliError::connecting("http://127.0.0.1:1", &refused);
        assert_eq!(e.exit, Exit::Unavailable);
        assert!(!e.message.contains("https://"), "{}", e.message);
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let e = CliError::connecting("http://127.0.0.1:1", &reset);
        assert_eq!(e.exit, Exit::Unavailable);
        assert!(e.message.contains("https://"), "{}", e.message);
        let bad_cert = std::io::Error::new(std::io::ErrorKind::InvalidData, "UnknownIssuer");
        let e = CliError::connecting("https://127.0.0.1:1", &bad_cert);
        assert_eq!(e.exit, Exit::Denied);
        assert!(e.message.contains("TLS handshake failed"), "{}", e.message);
    }
}
