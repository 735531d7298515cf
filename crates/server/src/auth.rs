//! Bearer-token authentication and per-queue permissions.
//!
//! The tokens file (`--auth-file`) lists tokens by the SHA-256 of their secret,
//! never the secret itself, each with grants: a set of queue patterns and the
//! actions allowed on them:
//!
//! ```json
//! {"tokens": [
//!   {"name": "worker-a", "sha256": "<64 hex digits>",
//!    "grants": [{"queues": "emails*", "actions": ["enqueue", "consume"]},
//!               {"queues": ["audit", "billing"], "actions": ["consume"]}]},
//!   {"name": "ops", "sha256": "<64 hex digits>",
//!    "grants": [{"queues": "*", "actions": ["admin"]}]}
//! ]}
//! ```
//!
//! A queue pattern is an exact queue name, or a prefix ending in `*` (`*` alone
//! matches every queue). [`Authenticator`] is a tonic interceptor: it checks
//! `authorization: Bearer <token>` before the request body is even decoded and
//! attaches the caller's [`Identity`] to the request; handlers then ask that
//! identity for the permission each queue needs ([`Identity::require`]).
//! [`AdminGate`] does both for services where every call needs `admin` on
//! every queue (`leaseq.v1.AdminService`). docs/SECURITY.md has the model.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::domain::{MAX_QUEUE_LEN, QueueName};
use crate::error::{Error, Result};

/// What a grant allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Enqueue and EnqueueBatch.
    Enqueue,
    /// Subscribe, Ack, Nack, ExtendLease.
    Consume,
    /// The admin service.
    Admin,
}

impl Action {
    const ALL: [Action; 3] = [Action::Enqueue, Action::Consume, Action::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Enqueue => "enqueue",
            Action::Consume => "consume",
            Action::Admin => "admin",
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An exact queue name, or every queue whose name starts with a prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
enum QueuePattern {
    Exact(String),
    Prefix(String),
}

impl QueuePattern {
    fn parse(s: &str) -> std::result::Result<QueuePattern, String> {
        match s.strip_suffix('*') {
            Some(prefix) => {
                let ok = prefix.len() < MAX_QUEUE_LEN
                    && prefix.bytes().enumerate().all(|(i, b)| {
                        b.is_ascii_alphanumeric()
                            || (i > 0 && matches!(b, b'.' | b'_' | b':' | b'-'))
                    });
                if ok {
                    Ok(QueuePattern::Prefix(prefix.to_owned()))
                } else {
                    Err(format!(
                        "{s:?} is not a queue name or a queue-name prefix ending in '*'"
                    ))
                }
            }
            None => QueueName::parse(s)
                .map(|q| QueuePattern::Exact(q.as_str().to_owned()))
                .ok_or_else(|| {
                    format!("{s:?} is not a queue name or a queue-name prefix ending in '*'")
                }),
        }
    }

    fn matches(&self, queue: &str) -> bool {
        match self {
            QueuePattern::Exact(name) => name == queue,
            QueuePattern::Prefix(prefix) => queue.starts_with(prefix.as_str()),
        }
    }

    fn is_everything(&self) -> bool {
        matches!(self, QueuePattern::Prefix(p) if p.is_empty())
    }
}

#[derive(Clone, Debug)]
struct Grant {
    queues: Vec<QueuePattern>,
    /// Bit set of [`Action::bit`].
    actions: u8,
}

/// A token's name and what it may do. The secret is never kept.
#[derive(Debug)]
pub struct Principal {
    pub name: String,
    grants: Vec<Grant>,
}

impl Principal {
    /// Whether some grant allows `action` on `queue`.
    pub fn allows(&self, action: Action, queue: &str) -> bool {
        self.grants
            .iter()
            .any(|g| g.actions & action.bit() != 0 && g.queues.iter().any(|p| p.matches(queue)))
    }

    /// Whether some grant allows `action` on every queue (pattern `*`).
    pub fn allows_everywhere(&self, action: Action) -> bool {
        self.grants
            .iter()
            .any(|g| g.actions & action.bit() != 0 && g.queues.iter().any(|p| p.is_everything()))
    }

    /// Whether some grant allows `action` on at least one queue.
    pub fn allows_somewhere(&self, action: Action) -> bool {
        self.grants.iter().any(|g| g.actions & action.bit() != 0)
    }
}

/// Who is calling. [`Authenticator`] puts it in the request extensions.
#[derive(Clone, Debug)]
pub enum Identity {
    /// Authentication is off (no `--auth-file`): everything is allowed.
    Anonymous,
    /// A caller that presented a valid token.
    Token(Arc<Principal>),
}

impl Identity {
    /// The identity [`Authenticator`] attached to `request`. A handler
    /// reached without the interceptor is a wiring bug: it fails closed.
    pub fn of<T>(request: &Request<T>) -> Result<Identity> {
        request
            .extensions()
            .get::<Identity>()
            .cloned()
            .ok_or(Error::Internal(
                "request reached a handler without authentication",
            ))
    }

    /// PERMISSION_DENIED unless `action` is allowed on every one of `queues`.
    pub fn require<'a>(
        &self,
        action: Action,
        queues: impl IntoIterator<Item = &'a QueueName>,
    ) -> Result<()> {
        let Identity::Token(p) = self else {
            return Ok(());
        };
        for queue in queues {
            if !p.allows(action, queue.as_str()) {
                return Err(Error::PermissionDenied {
                    token: p.name.clone(),
                    action: action.as_str(),
                    scope: format!("queue {:?}", queue.as_str()),
                });
            }
        }
        Ok(())
    }

    /// PERMISSION_DENIED unless `action` is allowed on at least one queue.
    /// Used where the request names no queue (Ack / Nack / ExtendLease carry
    /// a lease token, which is itself the capability: see docs/SECURITY.md).
    pub fn require_somewhere(&self, action: Action) -> Result<()> {
        match self {
            Identity::Token(p) if !p.allows_somewhere(action) => Err(Error::PermissionDenied {
                token: p.name.clone(),
                action: action.as_str(),
                scope: "any queue".into(),
            }),
            _ => Ok(()),
        }
    }

    /// PERMISSION_DENIED unless `action` is allowed on every queue (`*`).
    pub fn require_everywhere(&self, action: Action) -> Result<()> {
        match self {
            Identity::Token(p) if !p.allows_everywhere(action) => Err(Error::PermissionDenied {
                token: p.name.clone(),
                action: action.as_str(),
                scope: "every queue (\"*\")".into(),
            }),
            _ => Ok(()),
        }
    }

    /// The token's name, for logs; `None` when authentication is off.
    pub fn name(&self) -> Option<&str> {
        match self {
            Identity::Anonymous => None,
            Identity::Token(p) => Some(&p.name),
        }
    }
}

struct Entry {
    digest: [u8; 32],
    principal: Arc<Principal>,
}

/// The parsed tokens file.
pub struct TokenSet {
    entries: Vec<Entry>,
}

impl fmt::Debug for TokenSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Names only: hashes are not secrets, but they have no business in logs.
        f.debug_list()
            .entries(self.entries.iter().map(|e| &e.principal.name))
            .finish()
    }
}

/// SHA-256 of a token, as stored in the tokens file (lowercase hex).
pub fn hash_token(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A fresh random token: 256 bits from the OS generator, as 64 hex digits.
pub fn generate_token() -> String {
    // Two v4 UUIDs are 244 random bits from getrandom; hashing them spreads
    // them over the 256-bit output without adding a dependency.
    let seed = format!("{}{}", uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    hash_token(&seed)
}

fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl TokenSet {
    pub fn load(path: &Path) -> anyhow::Result<TokenSet> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the auth file {}", path.display()))?;
        TokenSet::parse(&text).map_err(|e| anyhow::anyhow!("auth file {}: {e}", path.display()))
    }

    /// Parses the JSON tokens file; errors name the offending path
    /// (`tokens[1].grants[0].actions[2]: ...`).
    pub fn parse(text: &str) -> std::result::Result<TokenSet, String> {
        let root: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let tokens = root
            .get("tokens")
            .and_then(Value::as_array)
            .ok_or("tokens: must be an array")?;
        let mut entries: Vec<Entry> = Vec::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            let at = format!("tokens[{i}]");
            let name = t
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty() && n.len() <= 128)
                .ok_or(format!("{at}.name: must be a string of 1-128 characters"))?;
            let digest = t
                .get("sha256")
                .and_then(Value::as_str)
                .and_then(parse_hex32)
                .ok_or(format!(
                    "{at}.sha256: must be 64 hex digits (leaseq hash-token)"
                ))?;
            if entries.iter().any(|e| e.principal.name == name) {
                return Err(format!("{at}.name: {name:?} is used twice"));
            }
            if entries.iter().any(|e| e.digest == digest) {
                return Err(format!("{at}.sha256: the same token is listed twice"));
            }
            let grants = t
                .get("grants")
                .and_then(Value::as_array)
                .ok_or(format!("{at}.grants: must be an array"))?
                .iter()
                .enumerate()
                .map(|(j, g)| parse_grant(g, &format!("{at}.grants[{j}]")))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            entries.push(Entry {
                digest,
                principal: Arc::new(Principal {
                    name: name.to_owned(),
                    grants,
                }),
            });
        }
        Ok(TokenSet { entries })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The principal whose token's SHA-256 is `digest` (the tokens file's
    /// `sha256`, as a console session keeps it), compared in constant time.
    pub fn by_digest(&self, digest: &str) -> Option<Arc<Principal>> {
        let digest = parse_hex32(digest)?;
        let mut found = None;
        for e in &self.entries {
            if bool::from(e.digest.ct_eq(&digest)) {
                found = Some(e.principal.clone());
            }
        }
        found
    }

    /// The principal whose token hashes to the same digest as `token`.
    ///
    /// Every entry is compared, in constant time, whatever matches: the time
    /// taken says nothing about how close a guess came or which entry it hit.
    pub fn authenticate(&self, token: &str) -> Option<Arc<Principal>> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for e in &self.entries {
            if bool::from(e.digest.ct_eq(&digest)) {
                found = Some(e.principal.clone());
            }
        }
        found
    }
}

fn parse_grant(g: &Value, at: &str) -> std::result::Result<Grant, String> {
    let patterns: Vec<&str> = match g.get("queues") {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .map(Value::as_str)
            .collect::<Option<_>>()
            .ok_or(format!("{at}.queues: must be strings"))?,
        _ => {
            return Err(format!(
                "{at}.queues: must be a queue pattern or a non-empty array of them"
            ));
        }
    };
    let queues = patterns
        .into_iter()
        .map(|p| QueuePattern::parse(p).map_err(|e| format!("{at}.queues: {e}")))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let actions = g
        .get("actions")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .ok_or(format!(
            "{at}.actions: must be a non-empty array of \"enqueue\", \"consume\", \"admin\""
        ))?;
    let mut bits = 0u8;
    for (k, a) in actions.iter().enumerate() {
        let action = Action::ALL
            .into_iter()
            .find(|x| a.as_str() == Some(x.as_str()))
            .ok_or(format!(
                "{at}.actions[{k}]: must be \"enqueue\", \"consume\" or \"admin\""
            ))?;
        bits |= action.bit();
    }
    Ok(Grant {
        queues,
        actions: bits,
    })
}

/// The `authorization` metadata value's token, if it is `Bearer <token>`.
fn bearer<T>(request: &Request<T>) -> Result<&str> {
    let value = request
        .metadata()
        .get("authorization")
        .ok_or(Error::Unauthenticated(
            "missing credentials: send metadata \"authorization: Bearer <token>\"",
        ))?;
    let value = value
        .to_str()
        .map_err(|_| Error::Unauthenticated("authorization metadata must be \"Bearer <token>\""))?;
    let (scheme, token) = value.split_once(' ').ok_or(Error::Unauthenticated(
        "authorization metadata must be \"Bearer <token>\"",
    ))?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(Error::Unauthenticated(
            "authorization metadata must be \"Bearer <token>\"",
        ));
    }
    Ok(token.trim())
}

/// Tonic interceptor: checks the bearer token (UNAUTHENTICATED when missing
/// or unknown) and attaches the caller's [`Identity`]. With no tokens file
/// every caller is [`Identity::Anonymous`].
#[derive(Clone, Debug)]
pub struct Authenticator {
    tokens: Option<Arc<TokenSet>>,
}

impl Authenticator {
    /// `None` turns authentication off.
    pub fn new(tokens: Option<TokenSet>) -> Authenticator {
        Authenticator {
            tokens: tokens.map(Arc::new),
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.tokens.is_some()
    }

    /// The caller's identity, from the request's metadata.
    pub fn identify<T>(&self, request: &Request<T>) -> Result<Identity> {
        let Some(tokens) = &self.tokens else {
            return Ok(Identity::Anonymous);
        };
        let token = bearer(request)?;
        tokens
            .authenticate(token)
            .map(Identity::Token)
            .ok_or(Error::Unauthenticated("invalid bearer token"))
    }
}

impl Authenticator {
    /// A console login: the identity of `token` and the SHA-256 a session
    /// keeps of it (None without `--auth-file`, where every visitor is
    /// anonymous). None when the token is not in the tokens file.
    pub fn login(&self, token: &str) -> Option<(Identity, Option<String>)> {
        let Some(tokens) = &self.tokens else {
            return Some((Identity::Anonymous, None));
        };
        let principal = tokens.authenticate(token)?;
        Some((Identity::Token(principal), Some(hash_token(token))))
    }

    /// The identity a console session names by its token's SHA-256, as this
    /// broker's tokens file has it now: None when the token was removed or
    /// its secret changed, and for an anonymous session when authentication
    /// is on (a replica with `--auth-file` never accepts one made without).
    pub fn session_identity(&self, token_sha256: Option<&str>) -> Option<Identity> {
        match (&self.tokens, token_sha256) {
            (None, None) => Some(Identity::Anonymous),
            (None, Some(_)) | (Some(_), None) => None,
            (Some(tokens), Some(digest)) => tokens.by_digest(digest).map(Identity::Token),
        }
    }
}

impl Interceptor for Authenticator {
    fn call(&mut self, mut request: Request<()>) -> std::result::Result<Request<()>, Status> {
        let identity = self.identify(&request)?;
        request.extensions_mut().insert(identity);
        Ok(request)
    }
}

/// Interceptor for services where every call is an admin call over the whole
/// broker (`leaseq.v1.AdminService`): authenticates, then requires `admin` on
/// `*`. Apply with `InterceptedService::new(AdminServiceServer::new(..), AdminGate::new(auth))`.
/// Handlers that act on one queue can use the plain [`Authenticator`] and
/// `Identity::require(Action::Admin, [queue])` instead.
#[derive(Clone, Debug)]
pub struct AdminGate(Authenticator);

impl AdminGate {
    pub fn new(auth: Authenticator) -> AdminGate {
        AdminGate(auth)
    }
}

impl Interceptor for AdminGate {
    fn call(&mut self, request: Request<()>) -> std::result::Result<Request<()>, Status> {
        let request = self.0.call(request)?;
        Identity::of(&request)?.require_everywhere(Action::Admin)?;
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(grants: &str) -> TokenSet {
        TokenSet::parse(&format!(
            r#"{{"tokens":[{{"name":"t","sha256":"{}","grants":{grants}}}]}}"#,
            hash_token("secret")
        ))
        .unwrap()
    }

    #[test]
    fn patterns() {
        let s = set(
            r#"[{"queues":"emails*","actions":["enqueue"]},{"queues":["a","b"],"actions":["consume"]}]"#,
        );
        let p = s.authenticate("secret").unwrap();
        assert!(p.allows(Action::Enqueue, "emails"));
        assert!(p.allows(Action::Enqueue, "emails.eu"));
        assert!(!p.allows(Action::Enqueue, "email"));
        assert!(!p.allows(Action::Consume, "emails"));
        assert!(p.allows(Action::Consume, "a"));
        assert!(!p.allows(Action::Consume, "ab"));
        assert!(!p.allows_everywhere(Action::Enqueue));
        assert!(p.allows_somewhere(Action::Consume));
        assert!(!p.allows_somewhere(Action::Admin));
        assert!(s.authenticate("secreT").is_none());
        assert!(s.authenticate("").is_none());
        let all = set(r#"[{"queues":"*","actions":["admin"]}]"#);
        assert!(
            all.authenticate("secret")
                .unwrap()
                .allows_everywhere(Action::Admin)
        );
    }

    #[test]
    fn console_sessions_name_the_token_by_its_digest() {
        let auth = Authenticator::new(Some(set(r#"[{"queues":"*","actions":["admin"]}]"#)));
        let (who, digest) = auth.login("secret").unwrap();
        assert_eq!(who.name(), Some("t"));
        let digest = digest.unwrap();
        assert_eq!(digest, hash_token("secret"));
        assert_eq!(
            auth.session_identity(Some(&digest)).unwrap().name(),
            Some("t")
        );
        assert!(auth.login("wrong").is_none());
        assert!(auth.session_identity(Some(&hash_token("wrong"))).is_none());
        assert!(auth.session_identity(Some("not hex")).is_none());
        assert!(
            auth.session_identity(None).is_none(),
            "no anonymous session with tokens on"
        );
        let open = Authenticator::new(None);
        assert!(matches!(
            open.login("anything"),
            Some((Identity::Anonymous, None))
        ));
        assert!(matches!(
            open.session_identity(None),
            Some(Identity::Anonymous)
        ));
        assert!(open.session_identity(Some(&digest)).is_none());
    }

    #[test]
    fn bad_files_name_the_field() {
        let cases = [
            ("[]", "tokens"),
            (r#"{"tokens":[{"sha256":"00"}]}"#, "tokens[0].name"),
            (
                r#"{"tokens":[{"name":"x","sha256":"zz","grants":[]}]}"#,
                "tokens[0].sha256",
            ),
        ];
        for (text, field) in cases {
            let e = TokenSet::parse(text).unwrap_err();
            assert!(e.starts_with(field), "{e}");
        }
        let h = hash_token("s");
        for (grants, field) in [
            (r#"[{"queues":"a b","actions":["enqueue"]}]"#, "queues"),
            (r#"[{"queues":"a*b*","actions":["enqueue"]}]"#, "queues"),
            (r#"[{"queues":".x*","actions":["enqueue"]}]"#, "queues"),
            (r#"[{"queues":[],"actions":["enqueue"]}]"#, "queues"),
            (r#"[{"queues":"a","actions":["delete"]}]"#, "actions[0]"),
            (r#"[{"queues":"a","actions":[]}]"#, "actions"),
        ] {
            let text = format!(r#"{{"tokens":[{{"name":"x","sha256":"{h}","grants":{grants}}}]}}"#);
            let e = TokenSet::parse(&text).unwrap_err();
            assert!(
                e.starts_with(&format!("tokens[0].grants[0].{field}")),
                "{e}"
            );
        }
        let dup = format!(
            r#"{{"tokens":[{{"name":"x","sha256":"{h}","grants":[]}},{{"name":"y","sha256":"{h}","grants":[]}}]}}"#
        );
        assert!(TokenSet::parse(&dup).unwrap_err().contains("twice"));
    }

    #[test]
    fn hashes() {
        assert_eq!(
            hash_token("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let t = generate_token();
        assert_eq!(t.len(), 64);
        assert_ne!(t, generate_token());
    }

    /// (Moved here from tests/security.rs: it checks the gate itself, not
    /// a broker.)
    #[test]
    fn admin_gate_requires_admin_on_every_queue() {
        use tonic::service::Interceptor;
        let h = hash_token;
        let file = serde_json::json!({"tokens": [
            {"name": "ops", "sha256": h("ops"), "grants": [{"queues": "*", "actions": ["admin"]}]},
            {"name": "team", "sha256": h("team"),
             "grants": [{"queues": "emails*", "actions": ["admin", "consume"]}]},
        ]});
        let mut gate = AdminGate::new(Authenticator::new(Some(
            TokenSet::parse(&file.to_string()).unwrap(),
        )));
        let call = |gate: &mut AdminGate, t: Option<&str>| {
            let mut r = tonic::Request::new(());
            if let Some(t) = t {
                r.metadata_mut()
                    .insert("authorization", format!("Bearer {t}").parse().unwrap());
            }
            gate.call(r).map(drop).map_err(|s| s.code())
        };
        assert_eq!(call(&mut gate, Some("ops")), Ok(()));
        assert_eq!(
            call(&mut gate, Some("team")),
            Err(tonic::Code::PermissionDenied)
        );
        assert_eq!(
            call(&mut gate, Some("nobody")),
            Err(tonic::Code::Unauthenticated)
        );
        assert_eq!(call(&mut gate, None), Err(tonic::Code::Unauthenticated));
        // With auth off the gate lets everyone through, like every other service.
        let mut open = AdminGate::new(Authenticator::new(None));
        assert_eq!(call(&mut open, None), Ok(()));
    }
}
