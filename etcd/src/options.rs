//! What a call can ask for beyond its key: connection settings, read
//! options, and the parts of a transaction.
//!
//! The builders mirror the words of etcd's API (a range end, a limit, a
//! compare on a key's create revision) and build the request messages of
//! [`crate::pb`]; only what accel asks of etcd is here.

use std::fmt;
use std::time::Duration;

use crate::pb::etcdserverpb::{
    compare, request_op, Compare as PbCompare, DeleteRangeRequest, PutRequest, RangeRequest,
    RequestOp, TxnRequest,
};

/// The first key after every key that starts with `prefix`: the range end
/// that makes a range "every key with this prefix". A prefix of nothing
/// but `0xff` bytes (or none) has no such key; etcd's `"\0"` then means
/// "to the end of the key space".
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// How to reach the members.
#[derive(Clone, Default)]
pub struct ConnectOptions {
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) keep_alive: Option<(Duration, Duration)>,
    pub(crate) require_leader: bool,
    pub(crate) user: Option<(String, String)>,
    pub(crate) tls: Option<TlsOptions>,
}

impl fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the password.
        f.debug_struct("ConnectOptions")
            .field("connect_timeout", &self.connect_timeout)
            .field("keep_alive", &self.keep_alive)
            .field("require_leader", &self.require_leader)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("tls", &self.tls)
            .finish()
    }
}

impl ConnectOptions {
    /// No timeout, no keep-alive, no credentials, plain HTTP/2.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long making a connection to one member may take.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// HTTP/2 pings every `interval` (idle or not), the connection given up
    /// when one is not answered within `timeout`: a member that vanished
    /// without closing the connection is noticed.
    pub fn with_keep_alive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keep_alive = Some((interval, timeout));
        self
    }

    /// Whether every call asks for a member that has a leader (etcd's
    /// `hasleader` metadata): a member cut off from the others then refuses
    /// with `UNAVAILABLE` instead of answering from a stale view or waiting.
    pub fn with_require_leader(mut self, require: bool) -> Self {
        self.require_leader = require;
        self
    }

    /// Authenticate as `user`; the token is renewed whenever etcd stops
    /// accepting it.
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }

    /// TLS for `https://` endpoints.
    pub fn with_tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// TLS to the members, from PEM: the CA that signed their certificates and
/// this client's own certificate and key (mutual TLS).
#[derive(Clone, Default)]
pub struct TlsOptions {
    pub(crate) ca: Option<Vec<u8>>,
    pub(crate) identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("TlsOptions")
            .field("ca", &self.ca.is_some())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

impl TlsOptions {
    /// TLS with no CA or identity set.
    pub fn new() -> Self {
        Self::default()
    }

    /// The CA certificate(s), PEM, that the members' certificates must chain to.
    pub fn ca_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca = Some(pem.into());
        self
    }

    /// This client's certificate and private key, PEM.
    pub fn identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    pub(crate) fn config(&self) -> tonic::transport::ClientTlsConfig {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let mut config = ClientTlsConfig::new();
        if let Some(ca) = &self.ca {
            config = config.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        config
    }
}

/// Which keys a get reads, and how.
#[derive(Debug, Clone, Default)]
pub struct GetOptions {
    end: RangeEnd,
    limit: i64,
    revision: i64,
    keys_only: bool,
}

/// Where a range ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum RangeEnd {
    /// The key alone.
    #[default]
    Key,
    /// Every key starting with the key.
    Prefix,
    /// Up to this key (excluded).
    Before(Vec<u8>),
}

impl RangeEnd {
    fn of(&self, key: &[u8]) -> Vec<u8> {
        match self {
            RangeEnd::Key => Vec::new(),
            RangeEnd::Prefix => prefix_end(key),
            RangeEnd::Before(end) => end.clone(),
        }
    }
}

impl GetOptions {
    /// The key alone, its value included, now.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every key starting with the key.
    pub fn with_prefix(mut self) -> Self {
        self.end = RangeEnd::Prefix;
        self
    }

    /// The keys from the key up to `end` (excluded).
    pub fn with_range(mut self, end: impl Into<Vec<u8>>) -> Self {
        self.end = RangeEnd::Before(end.into());
        self
    }

    /// At most `limit` keys (the response's `more` says if some were left).
    pub fn with_limit(mut self, limit: i64) -> Self {
        self.limit = limit;
        self
    }

    /// Read the store as it was at `revision`.
    pub fn with_revision(mut self, revision: i64) -> Self {
        self.revision = revision;
        self
    }

    /// Leave the values out.
    pub fn with_keys_only(mut self) -> Self {
        self.keys_only = true;
        self
    }

    pub(crate) fn request(&self, key: Vec<u8>) -> RangeRequest {
        RangeRequest {
            range_end: self.end.of(&key),
            key,
            limit: self.limit,
            revision: self.revision,
            keys_only: self.keys_only,
            ..Default::default()
        }
    }
}

/// Which keys a delete removes.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    end: RangeEnd,
}

impl DeleteOptions {
    /// The key alone.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every key starting with the key.
    pub fn with_prefix(mut self) -> Self {
        self.end = RangeEnd::Prefix;
        self
    }

    pub(crate) fn request(&self, key: Vec<u8>) -> DeleteRangeRequest {
        DeleteRangeRequest {
            range_end: self.end.of(&key),
            key,
            ..Default::default()
        }
    }
}

/// How a compare relates the key's value to the given one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    /// The key's equals the given.
    Equal,
    /// The key's is greater.
    Greater,
    /// The key's is less.
    Less,
    /// The key's differs.
    NotEqual,
}

impl CompareOp {
    fn wire(self) -> compare::CompareResult {
        match self {
            CompareOp::Equal => compare::CompareResult::Equal,
            CompareOp::Greater => compare::CompareResult::Greater,
            CompareOp::Less => compare::CompareResult::Less,
            CompareOp::NotEqual => compare::CompareResult::NotEqual,
        }
    }
}

/// A condition of a transaction on one key. A key that does not exist has
/// version, create and mod revision 0.
#[derive(Debug, Clone, PartialEq)]
pub struct Compare(PbCompare);

impl Compare {
    fn new(
        key: impl Into<Vec<u8>>,
        op: CompareOp,
        target: compare::CompareTarget,
        value: compare::TargetUnion,
    ) -> Self {
        Compare(PbCompare {
            result: op.wire() as i32,
            target: target as i32,
            key: key.into(),
            target_union: Some(value),
        })
    }

    /// On the key's version (changes since it was created).
    pub fn version(key: impl Into<Vec<u8>>, op: CompareOp, version: i64) -> Self {
        use compare::{CompareTarget, TargetUnion};
        Self::new(
            key,
            op,
            CompareTarget::Version,
            TargetUnion::Version(version),
        )
    }

    /// On the revision at which the key was created.
    pub fn create_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Self {
        use compare::{CompareTarget, TargetUnion};
        Self::new(
            key,
            op,
            CompareTarget::Create,
            TargetUnion::CreateRevision(revision),
        )
    }

    /// On the revision of the key's last change.
    pub fn mod_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Self {
        use compare::{CompareTarget, TargetUnion};
        Self::new(
            key,
            op,
            CompareTarget::Mod,
            TargetUnion::ModRevision(revision),
        )
    }

    /// On the key's value.
    pub fn value(key: impl Into<Vec<u8>>, op: CompareOp, value: impl Into<Vec<u8>>) -> Self {
        use compare::{CompareTarget, TargetUnion};
        Self::new(
            key,
            op,
            CompareTarget::Value,
            TargetUnion::Value(value.into()),
        )
    }
}

/// One operation of a transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct TxnOp(RequestOp);

impl TxnOp {
    /// Writes `value` at `key`.
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        TxnOp(RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: key.into(),
                value: value.into(),
                ..Default::default()
            })),
        })
    }

    /// Writes `value` at `key`, attached to `lease`: the key goes when the
    /// lease ends.
    pub fn put_with_lease(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: i64) -> Self {
        TxnOp(RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: key.into(),
                value: value.into(),
                lease,
                ..Default::default()
            })),
        })
    }

    /// Deletes `key` (or the keys `options` say).
    pub fn delete(key: impl Into<Vec<u8>>, options: Option<DeleteOptions>) -> Self {
        let request = options.unwrap_or_default().request(key.into());
        TxnOp(RequestOp {
            request: Some(request_op::Request::RequestDeleteRange(request)),
        })
    }

    /// Reads `key` (or the keys `options` say).
    pub fn get(key: impl Into<Vec<u8>>, options: Option<GetOptions>) -> Self {
        let request = options.unwrap_or_default().request(key.into());
        TxnOp(RequestOp {
            request: Some(request_op::Request::RequestRange(request)),
        })
    }
}

/// A transaction: if every compare holds, the `and_then` operations run,
/// else the `or_else` ones; either way atomically.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Txn(TxnRequest);

impl Txn {
    /// No conditions, no operations.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds conditions (all must hold).
    pub fn when(mut self, compares: impl IntoIterator<Item = Compare>) -> Self {
        self.0.compare.extend(compares.into_iter().map(|c| c.0));
        self
    }

    /// Adds operations run when the conditions hold.
    pub fn and_then(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Self {
        self.0.success.extend(ops.into_iter().map(|o| o.0));
        self
    }

    /// Adds operations run when a condition fails.
    pub fn or_else(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Self {
        self.0.failure.extend(ops.into_iter().map(|o| o.0));
        self
    }

    pub(crate) fn request(&self) -> TxnRequest {
        self.0.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_of_a_prefix_is_the_first_key_past_it() {
        assert_eq!(prefix_end(b"/accel/jobs/"), b"/accel/jobs0".to_vec());
        // 'ÿ' is c3 bf in UTF-8: the last byte goes up.
        assert_eq!(prefix_end("a\u{ff}".as_bytes()), vec![0x61, 0xc3, 0xc0]);
        // Trailing 0xff bytes cannot go up: the byte before them does.
        assert_eq!(prefix_end(&[0x61, 0xff, 0xff]), vec![0x62]);
        // Nothing can: every key from here on.
        assert_eq!(prefix_end(&[0xff, 0xff]), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }

    #[test]
    fn get_options_build_the_range_request() {
        let r = GetOptions::new().request(b"k".to_vec());
        assert_eq!(
            (r.key.as_slice(), r.range_end.as_slice()),
            (&b"k"[..], &b""[..])
        );
        let r = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_limit(10)
            .with_revision(7)
            .request(b"/p/".to_vec());
        assert_eq!(r.range_end, b"/p0".to_vec());
        assert!(r.keys_only);
        assert_eq!((r.limit, r.revision), (10, 7));
        let r = GetOptions::new().with_range("b").request(b"a".to_vec());
        assert_eq!(r.range_end, b"b".to_vec());
        let d = DeleteOptions::new().with_prefix().request(b"/j/".to_vec());
        assert_eq!(d.range_end, b"/j0".to_vec());
    }

    #[test]
    fn a_txn_carries_its_compares_and_both_branches() {
        let t = Txn::new()
            .when([Compare::create_revision("lead", CompareOp::Equal, 5)])
            .and_then([TxnOp::put("k", "v"), TxnOp::delete("d", None)])
            .or_else([TxnOp::get("k", None)])
            .request();
        assert_eq!(t.compare.len(), 1);
        let c = &t.compare[0];
        assert_eq!(c.target, compare::CompareTarget::Create as i32);
        assert_eq!(c.result, compare::CompareResult::Equal as i32);
        assert_eq!(
            c.target_union,
            Some(compare::TargetUnion::CreateRevision(5))
        );
        assert_eq!((t.success.len(), t.failure.len()), (2, 1));
        let c = Compare::value("k", CompareOp::NotEqual, "x").0;
        assert_eq!(c.target, compare::CompareTarget::Value as i32);
        assert_eq!(c.result, compare::CompareResult::NotEqual as i32);
    }
}
