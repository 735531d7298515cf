//! Errors of every layer, and their one mapping to `tonic::Status`.
//!
//! Handlers return [`Error`]; the exhaustive `From<Error> for Status` below is
//! the only place a gRPC code is chosen, so a new variant forces a decision.
//! Internal details (SQL errors) are logged, never sent to clients.
//!
//! This module depends on no other module of the crate, so every layer can
//! return its errors without an import circle.

use std::sync::Arc;

use tonic::{Code, Status};

use uuid::Uuid;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// Malformed input. `field` names the request field (e.g. `jobs[2].queue`).
    #[error("{field}: {rule}")]
    InvalidArgument { field: String, rule: String },
    /// A size or count limit was exceeded.
    #[error("{field}: {rule}")]
    TooLarge { field: String, rule: String },
    /// The token is not the job's current lease: the lease expired and the job
    /// went elsewhere, or the job was already settled.
    #[error(
        "job {0} is not leased under this lease_token (lease expired, job re-leased or already settled)"
    )]
    StaleLease(Uuid),
    /// An unknown queue or job, named (admin lookups).
    #[error("{0}")]
    NotFound(String),
    /// A name already taken (CreateSchedule), named.
    #[error("{0}")]
    AlreadyExists(String),
    /// No valid bearer token. The message never contains the token.
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// A valid token whose grants do not cover the request. `token` is the
    /// token's name from the auth file, never its secret.
    #[error("token {token:?} has no {action} permission on {scope}")]
    PermissionDenied {
        token: String,
        /// The action's name (`enqueue`, `consume`, `admin`).
        action: &'static str,
        scope: String,
    },
    /// A broker-wide limit (`limit` names the flag) was reached.
    #[error("{limit}: {what}")]
    LimitReached { limit: &'static str, what: String },
    /// The broker is draining: clients should retry against another replica.
    #[error("broker is shutting down")]
    Draining,
    /// PostgreSQL is unreachable (or the broker is overloaded waiting for it).
    #[error("database unavailable")]
    Unavailable(#[source] Arc<sqlx::Error>),
    /// Any other database error: a bug or an operator problem, logged in full.
    #[error("database error")]
    Database(#[source] Arc<sqlx::Error>),
    /// The queue is placed on a cluster this broker was not given
    /// (docs/SCALING.md): its brokers are configured differently.
    #[error("the queue is placed on cluster {0}, which this broker has no --database-url for")]
    ClusterUnknown(u16),
    /// PostgreSQL clusters (named, comma-separated) that the call needed
    /// did not answer (docs/SCALING.md, "Admin calls"): several clusters
    /// only; one database says [`Error::Unavailable`] as before.
    #[error("PostgreSQL cluster {clusters} unavailable")]
    ClusterUnavailable {
        clusters: String,
        source: Option<Arc<sqlx::Error>>,
    },
    /// A broker-internal failure (a background task is gone).
    #[error("internal error: {0}")]
    Internal(&'static str),
}

impl Error {
    pub fn invalid(field: impl Into<String>, rule: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field: field.into(),
            rule: rule.into(),
        }
    }

    pub fn too_large(field: impl Into<String>, rule: impl Into<String>) -> Self {
        Error::TooLarge {
            field: field.into(),
            rule: rule.into(),
        }
    }

    /// An outage of the cluster `name` names it (several clusters only:
    /// callers pass their store's name only then). Other errors are kept.
    pub fn on_cluster(self, name: &str) -> Self {
        match self {
            Error::Unavailable(source) => Error::ClusterUnavailable {
                clusters: name.to_owned(),
                source: Some(source),
            },
            other => other,
        }
    }

    /// Whether the error is an outage (the caller may retry elsewhere or
    /// later), as opposed to a bad request or a bug.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Error::Unavailable(_) | Error::ClusterUnavailable { .. }
        )
    }

    /// Prefixes the field name, for errors found inside a nested message
    /// (`jobs[3]` + `queue` → `jobs[3].queue`).
    pub fn in_field(self, prefix: &str) -> Self {
        match self {
            Error::InvalidArgument { field, rule } => Error::InvalidArgument {
                field: format!("{prefix}.{field}"),
                rule,
            },
            Error::TooLarge { field, rule } => Error::TooLarge {
                field: format!("{prefix}.{field}"),
                rule,
            },
            other => other,
        }
    }
}

/// Translates a database error by SQLSTATE class: connection trouble is
/// UNAVAILABLE (clients retry), anything else is a server fault.
impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        let unavailable = match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Tls(_) => true,
            // 08: connection exception; 57P01-57P03: admin/crash shutdown,
            // cannot connect now; 53: insufficient resources (too many
            // connections, disk full). Any FATAL error ends the session: the
            // server refused or dropped us (e.g. database not accepting
            // connections), which is an outage to the client, not a bug.
            sqlx::Error::Database(db) => {
                let fatal = db
                    .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                    .is_some_and(|e| {
                        matches!(
                            e.severity(),
                            sqlx::postgres::PgSeverity::Fatal | sqlx::postgres::PgSeverity::Panic
                        )
                    });
                // 40001 / 40P01: serialization failure, deadlock: transient,
                // the client retries. 57014: the statement was cancelled,
                // by the broker's statement_timeout (the database is too
                // slow or a lock is held too long) or by an operator.
                fatal
                    || db.code().is_some_and(|code| {
                        code.starts_with("08")
                            || code.starts_with("53")
                            || matches!(
                                &*code,
                                "57P01" | "57P02" | "57P03" | "57014" | "40001" | "40P01"
                            )
                    })
            }
            _ => false,
        };
        if unavailable {
            Error::Unavailable(Arc::new(e))
        } else {
            Error::Database(Arc::new(e))
        }
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        match e {
            Error::InvalidArgument { .. } => Status::new(Code::InvalidArgument, e.to_string()),
            Error::TooLarge { .. } => Status::new(Code::ResourceExhausted, e.to_string()),
            Error::StaleLease(_) => Status::new(Code::FailedPrecondition, e.to_string()),
            Error::NotFound(_) => Status::new(Code::NotFound, e.to_string()),
            Error::AlreadyExists(_) => Status::new(Code::AlreadyExists, e.to_string()),
            Error::Unauthenticated(_) => Status::new(Code::Unauthenticated, e.to_string()),
            Error::PermissionDenied {
                ref token,
                action,
                ref scope,
            } => {
                // An audit trail of refusals: the token's name, never its secret.
                tracing::info!(token, %action, scope, "permission denied");
                Status::new(Code::PermissionDenied, e.to_string())
            }
            Error::LimitReached { .. } => Status::new(Code::ResourceExhausted, e.to_string()),
            Error::Draining => Status::new(Code::Unavailable, e.to_string()),
            Error::Unavailable(ref source) => {
                tracing::warn!(error = %source, "database unavailable");
                Status::new(Code::Unavailable, e.to_string())
            }
            Error::Database(ref source) => {
                tracing::error!(error = ?source, "database error");
                Status::new(Code::Internal, e.to_string())
            }
            Error::ClusterUnknown(id) => {
                tracing::warn!(
                    cluster = id,
                    "queue placed on a cluster this broker does not know"
                );
                Status::new(Code::Unavailable, e.to_string())
            }
            Error::ClusterUnavailable {
                ref clusters,
                ref source,
            } => {
                match source {
                    Some(source) => {
                        tracing::warn!(clusters, error = %source, "cluster unavailable")
                    }
                    None => tracing::warn!(clusters, "cluster unavailable"),
                }
                Status::new(Code::Unavailable, e.to_string())
            }
            Error::Internal(what) => {
                tracing::error!(what, "internal error");
                Status::new(Code::Internal, e.to_string())
            }
        }
    }
}
