//! The client: its members, credentials, and the calls accel makes.
//!
//! Every call goes to the current member ([`crate::endpoints`]); a call
//! that gets no answer or `UNAVAILABLE` makes the next member current, so
//! a caller's retry goes elsewhere (the client itself never repeats a call
//! etcd may have applied). A call refused for its token is sent once more
//! after authenticating anew: etcd refused it before applying it.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Response, Status, Streaming};

use crate::endpoints::Endpoints;
use crate::error::{must_reauthenticate, Error};
use crate::options::{prefix_end, ConnectOptions, GetOptions, Txn};
use crate::pb::etcdserverpb::{
    auth_client::AuthClient, kv_client::KvClient, lease_client::LeaseClient,
    watch_client::WatchClient, watch_request, AuthenticateRequest, LeaseGrantRequest,
    LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseRevokeRequest,
    LeaseRevokeResponse, PutRequest, PutResponse, RangeResponse, TxnResponse, WatchCreateRequest,
    WatchRequest, WatchResponse,
};
use crate::pb::v3electionpb::{
    election_client::ElectionClient, CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest,
    LeaderResponse, ResignRequest, ResignResponse,
};

/// The metadata asking for a member with a leader.
const REQUIRE_LEADER: &str = "hasleader";
/// The metadata carrying the authentication token.
const TOKEN: &str = "token";
/// Requests a stream's sender buffers.
const STREAM_BUFFER: usize = 4;

/// An etcd client. Clones share the connections, the current member and
/// the token.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field(
                "endpoints",
                &self
                    .shared
                    .members
                    .iter()
                    .map(|m| &m.url)
                    .collect::<Vec<_>>(),
            )
            .field("current", &self.shared.endpoints().current())
            .finish_non_exhaustive()
    }
}

struct Shared {
    members: Vec<Member>,
    endpoints: Mutex<Endpoints>,
    require_leader: bool,
    user: Option<(String, String)>,
    token: RwLock<Option<MetadataValue<Ascii>>>,
    /// Held while authenticating, so concurrent refusals renew once.
    authenticating: tokio::sync::Mutex<()>,
}

struct Member {
    url: String,
    channel: Channel,
}

impl Shared {
    fn endpoints(&self) -> std::sync::MutexGuard<'_, Endpoints> {
        self.endpoints
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn token(&self) -> Option<MetadataValue<Ascii>> {
        self.token
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_token(&self, token: MetadataValue<Ascii>) {
        *self.token.write().unwrap_or_else(PoisonError::into_inner) = Some(token);
    }

    /// The current member's index, URL and channel.
    fn current(&self) -> (usize, &str, Channel) {
        let index = self.endpoints().current();
        let member = &self.members[index.min(self.members.len() - 1)];
        (index, &member.url, member.channel.clone())
    }

    /// Notes how a call to member `index` went; classifies its error.
    fn outcome<T>(&self, index: usize, result: Result<Response<T>, Status>) -> Result<T, Error> {
        match result {
            Ok(r) => Ok(r.into_inner()),
            Err(status) => {
                let e = Error::from_call(&self.members[index].url, status);
                if e.is_transient() {
                    self.endpoints().failed(index);
                }
                Err(e)
            }
        }
    }
}

/// What a call sends along with its message.
#[derive(Clone)]
struct Stamp {
    require_leader: bool,
    token: Option<MetadataValue<Ascii>>,
}

impl Stamp {
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let metadata = request.metadata_mut();
        if self.require_leader {
            metadata.insert(REQUIRE_LEADER, MetadataValue::from_static("true"));
        }
        if let Some(token) = &self.token {
            metadata.insert(TOKEN, token.clone());
        }
        request
    }
}

impl Client {
    /// Connects to the first of `endpoints` (etcd client URLs,
    /// `http://HOST:PORT` or `https://HOST:PORT`) that accepts a
    /// connection, trying them in order, and authenticates if `options`
    /// has a user. The others are connected to when they are needed.
    pub async fn connect<E: AsRef<str>>(
        endpoints: impl IntoIterator<Item = E>,
        options: Option<ConnectOptions>,
    ) -> Result<Self, Error> {
        let options = options.unwrap_or_default();
        let tls = options.tls.as_ref().map(|t| t.config());
        let mut configured = Vec::new();
        for url in endpoints {
            let url = url.as_ref();
            let secure = match url.split_once("://") {
                Some(("http", rest)) if !rest.is_empty() => false,
                Some(("https", rest)) if !rest.is_empty() => true,
                _ => {
                    return Err(Error::InvalidEndpoint {
                        endpoint: url.to_owned(),
                        reason: "it must start with http:// or https://".into(),
                    })
                }
            };
            let mut endpoint =
                Endpoint::from_shared(url.to_owned()).map_err(|e| Error::InvalidEndpoint {
                    endpoint: url.to_owned(),
                    reason: e.to_string(),
                })?;
            if let Some(timeout) = options.connect_timeout {
                endpoint = endpoint.connect_timeout(timeout);
            }
            if let Some((interval, timeout)) = options.keep_alive {
                endpoint = endpoint
                    .http2_keep_alive_interval(interval)
                    .keep_alive_timeout(timeout)
                    .keep_alive_while_idle(true);
            }
            if secure {
                let config = tls.clone().unwrap_or_default();
                endpoint = endpoint.tls_config(config).map_err(|e| Error::InvalidEndpoint {
                    endpoint: url.to_owned(),
                    reason: format!("its TLS settings are unusable (check the CA, certificate and key PEM files): {e}"),
                })?;
            }
            configured.push((url.to_owned(), endpoint));
        }
        if configured.is_empty() {
            return Err(Error::NoEndpoints);
        }
        let mut order = Endpoints::new(configured.len());
        let mut connected = None;
        let mut last = None;
        for index in order.order().collect::<Vec<_>>() {
            match configured[index].1.connect().await {
                Ok(channel) => {
                    connected = Some((index, channel));
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let Some((first, channel)) = connected else {
            let endpoints = configured
                .iter()
                .map(|(url, _)| url.as_str())
                .collect::<Vec<_>>()
                .join(",");
            return match last {
                Some(source) => Err(Error::Connect { endpoints, source }),
                None => Err(Error::NoEndpoints),
            };
        };
        order.answered(first);
        let mut channel = Some(channel);
        let members = configured
            .into_iter()
            .enumerate()
            .map(|(index, (url, endpoint))| Member {
                channel: match channel.take_if(|_| index == first) {
                    Some(c) => c,
                    None => endpoint.connect_lazy(),
                },
                url,
            })
            .collect();
        let client = Client {
            shared: Arc::new(Shared {
                members,
                endpoints: Mutex::new(order),
                require_leader: options.require_leader,
                user: options.user,
                token: RwLock::new(None),
                authenticating: tokio::sync::Mutex::new(()),
            }),
        };
        if client.shared.user.is_some() {
            client.authenticate(None).await?;
        }
        Ok(client)
    }

    /// Gets a new token, unless the one in use is no longer `stale` (a
    /// concurrent call renewed it meanwhile).
    async fn authenticate(&self, stale: Option<&MetadataValue<Ascii>>) -> Result<(), Error> {
        let Some((name, password)) = &self.shared.user else {
            return Ok(());
        };
        let _one = self.shared.authenticating.lock().await;
        if self.shared.token().as_ref() != stale {
            return Ok(());
        }
        let (index, _, channel) = self.shared.current();
        let stamp = Stamp {
            require_leader: self.shared.require_leader,
            token: None,
        };
        let request = stamp.request(AuthenticateRequest {
            name: name.clone(),
            password: password.clone(),
        });
        let answer = AuthClient::new(channel).authenticate(request).await;
        let token = self.shared.outcome(index, answer)?.token;
        let token = MetadataValue::try_from(token).map_err(|_| Error::InvalidToken)?;
        self.shared.set_token(token);
        Ok(())
    }

    /// Makes one call at the current member; once more after
    /// authenticating anew if etcd refused the token.
    async fn call<T, F, Fut>(&self, call: F) -> Result<T, Error>
    where
        F: Fn(Channel, Stamp) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let (index, _, channel) = self.shared.current();
        let token = self.shared.token();
        let stamp = Stamp {
            require_leader: self.shared.require_leader,
            token: token.clone(),
        };
        match call(channel.clone(), stamp.clone()).await {
            Err(status) if must_reauthenticate(&status, self.shared.user.is_some()) => {
                self.authenticate(token.as_ref()).await?;
                let stamp = Stamp {
                    token: self.shared.token(),
                    ..stamp
                };
                let answer = call(channel, stamp).await;
                self.shared.outcome(index, answer)
            }
            answer => self.shared.outcome(index, answer),
        }
    }

    /// Reads `key` (or the keys `options` say).
    pub async fn get(
        &self,
        key: impl Into<Vec<u8>>,
        options: Option<GetOptions>,
    ) -> Result<RangeResponse, Error> {
        let request = options.unwrap_or_default().request(key.into());
        self.call(|ch, stamp| {
            let request = stamp.request(request.clone());
            async move { KvClient::new(ch).range(request).await }
        })
        .await
    }

    /// Writes `value` at `key`.
    pub async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<PutResponse, Error> {
        let request = PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        };
        self.call(|ch, stamp| {
            let request = stamp.request(request.clone());
            async move { KvClient::new(ch).put(request).await }
        })
        .await
    }

    /// Writes `value` at `key`, attached to `lease`: the key goes when the
    /// lease ends (revoked, or expired without renewal).
    pub async fn put_with_lease(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        lease: i64,
    ) -> Result<PutResponse, Error> {
        let request = PutRequest {
            key: key.into(),
            value: value.into(),
            lease,
            ..Default::default()
        };
        self.call(|ch, stamp| {
            let request = stamp.request(request.clone());
            async move { KvClient::new(ch).put(request).await }
        })
        .await
    }

    /// Runs a transaction.
    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse, Error> {
        let request = txn.request();
        self.call(|ch, stamp| {
            let request = stamp.request(request.clone());
            async move { KvClient::new(ch).txn(request).await }
        })
        .await
    }

    /// A lease of `ttl` seconds, its id chosen by etcd.
    pub async fn lease_grant(&self, ttl: i64) -> Result<LeaseGrantResponse, Error> {
        self.call(|ch, stamp| {
            let request = stamp.request(LeaseGrantRequest { ttl, id: 0 });
            async move { LeaseClient::new(ch).lease_grant(request).await }
        })
        .await
    }

    /// Ends lease `id`, deleting the keys attached to it.
    pub async fn lease_revoke(&self, id: i64) -> Result<LeaseRevokeResponse, Error> {
        self.call(|ch, stamp| {
            let request = stamp.request(LeaseRevokeRequest { id });
            async move { LeaseClient::new(ch).lease_revoke(request).await }
        })
        .await
    }

    /// Opens a keep-alive stream for lease `id`: each
    /// [`LeaseKeeper::keep_alive`] renews it, and the stream answers each
    /// with the lease's new TTL. One renewal is sent on opening (etcd
    /// answers a stream only once it has a request), so its answer is the
    /// stream's first message.
    pub async fn lease_keep_alive(
        &self,
        id: i64,
    ) -> Result<(LeaseKeeper, Messages<LeaseKeepAliveResponse>), Error> {
        let (index, url, _) = self.shared.current();
        let url = url.to_owned();
        let (sender, stream) = self
            .call(|ch, stamp| {
                let (sender, receiver) = mpsc::channel(STREAM_BUFFER);
                let opened = sender.try_send(LeaseKeepAliveRequest { id }).is_ok();
                let request = stamp.request(ReceiverStream::new(receiver));
                async move {
                    if !opened {
                        return Err(Status::internal("cannot queue the first renewal"));
                    }
                    let stream = LeaseClient::new(ch).lease_keep_alive(request).await?;
                    Ok(stream.map(|s| (sender, s)))
                }
            })
            .await?;
        Ok((
            LeaseKeeper { id, sender },
            Messages::new(self.shared.clone(), index, url, stream),
        ))
    }

    /// Waits until this campaign (`value` announced, under `lease`) leads
    /// election `name`; the answer holds the leader key.
    pub async fn campaign(
        &self,
        name: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        lease: i64,
    ) -> Result<CampaignResponse, Error> {
        let message = CampaignRequest {
            name: name.into(),
            lease,
            value: value.into(),
        };
        self.call(|ch, stamp| {
            let request = stamp.request(message.clone());
            async move { ElectionClient::new(ch).campaign(request).await }
        })
        .await
    }

    /// The current leader of election `name`; an error when none leads.
    pub async fn leader(&self, name: impl Into<Vec<u8>>) -> Result<LeaderResponse, Error> {
        let message = LeaderRequest { name: name.into() };
        self.call(|ch, stamp| {
            let request = stamp.request(message.clone());
            async move { ElectionClient::new(ch).leader(request).await }
        })
        .await
    }

    /// Streams the leader of election `name` each time it changes. The
    /// stream opens once someone leads.
    pub async fn observe(
        &self,
        name: impl Into<Vec<u8>>,
    ) -> Result<Messages<LeaderResponse>, Error> {
        let (index, url, _) = self.shared.current();
        let url = url.to_owned();
        let message = LeaderRequest { name: name.into() };
        let stream = self
            .call(|ch, stamp| {
                let request = stamp.request(message.clone());
                async move { ElectionClient::new(ch).observe(request).await }
            })
            .await?;
        Ok(Messages::new(self.shared.clone(), index, url, stream))
    }

    /// Gives up the leadership `leader` proves.
    pub async fn resign(&self, leader: LeaderKey) -> Result<ResignResponse, Error> {
        let message = ResignRequest {
            leader: Some(leader),
        };
        self.call(|ch, stamp| {
            let request = stamp.request(message.clone());
            async move { ElectionClient::new(ch).resign(request).await }
        })
        .await
    }

    /// Watches `key` from now on: once this returns, etcd has the watch, and
    /// every later change of the key comes on the stream.
    pub async fn watch(&self, key: impl Into<Vec<u8>>) -> Result<WatchStream, Error> {
        self.watch_range(key.into(), Vec::new()).await
    }

    /// Watches every key that starts with `prefix` from now on, as
    /// [`Client::watch`] does one key: a key created, changed or deleted
    /// (its lease ended, say) comes on the stream as an event.
    pub async fn watch_prefix(&self, prefix: impl Into<Vec<u8>>) -> Result<WatchStream, Error> {
        let prefix = prefix.into();
        let end = prefix_end(&prefix);
        self.watch_range(prefix, end).await
    }

    async fn watch_range(&self, key: Vec<u8>, range_end: Vec<u8>) -> Result<WatchStream, Error> {
        let (index, url, _) = self.shared.current();
        let url = url.to_owned();
        let create = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key,
                    range_end,
                    ..Default::default()
                },
            )),
        };
        let (sender, stream) = self
            .call(|ch, stamp| {
                let (sender, receiver) = mpsc::channel(STREAM_BUFFER);
                let opened = sender.try_send(create.clone()).is_ok();
                let request = stamp.request(ReceiverStream::new(receiver));
                async move {
                    if !opened {
                        return Err(Status::internal("cannot queue the watch's creation"));
                    }
                    let stream = WatchClient::new(ch).watch(request).await?;
                    Ok(stream.map(|s| (sender, s)))
                }
            })
            .await?;
        let mut watch = WatchStream {
            _requests: sender,
            messages: Messages::new(self.shared.clone(), index, url, stream),
        };
        // The first answer confirms the watch (or says why not).
        match watch.messages.message().await? {
            Some(r) if r.created && !r.canceled => Ok(watch),
            Some(r) => Err(Error::WatchCanceled(r.cancel_reason)),
            None => Err(Error::WatchCanceled(
                "the stream ended before etcd confirmed the watch".into(),
            )),
        }
    }
}

/// Renews a lease on its keep-alive stream.
#[derive(Debug)]
pub struct LeaseKeeper {
    id: i64,
    sender: mpsc::Sender<LeaseKeepAliveRequest>,
}

impl LeaseKeeper {
    /// The lease's id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Asks for one renewal; its answer comes on the stream.
    pub async fn keep_alive(&mut self) -> Result<(), Error> {
        self.sender
            .send(LeaseKeepAliveRequest { id: self.id })
            .await
            .map_err(|_| Error::StreamClosed("lease keep-alive"))
    }
}

/// Messages etcd streams to a call.
pub struct Messages<T> {
    shared: Arc<Shared>,
    index: usize,
    url: String,
    inner: Streaming<T>,
}

impl<T> std::fmt::Debug for Messages<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Messages")
            .field("endpoint", &self.url)
            .finish_non_exhaustive()
    }
}

impl<T> Messages<T> {
    fn new(shared: Arc<Shared>, index: usize, url: String, inner: Streaming<T>) -> Self {
        Self {
            shared,
            index,
            url,
            inner,
        }
    }

    /// The next message; `None` once the stream has ended. A stream that
    /// broke makes the next member current, as a failed call does.
    pub async fn message(&mut self) -> Result<Option<T>, Error> {
        match self.inner.message().await {
            Ok(m) => Ok(m),
            Err(status) => {
                let e = Error::from_call(&self.url, status);
                if e.is_transient() {
                    self.shared.endpoints().failed(self.index);
                }
                Err(e)
            }
        }
    }
}

/// The changes of a watched key.
#[derive(Debug)]
pub struct WatchStream {
    /// Kept open: closing it would end the watch.
    _requests: mpsc::Sender<WatchRequest>,
    messages: Messages<WatchResponse>,
}

impl WatchStream {
    /// The next batch of events; `None` once the stream has ended.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, Error> {
        match self.messages.message().await? {
            Some(r) if r.canceled => Err(Error::WatchCanceled(r.cancel_reason)),
            other => Ok(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connecting_without_a_usable_endpoint_says_which() {
        let none: [&str; 0] = [];
        assert!(matches!(
            Client::connect(none, None).await,
            Err(Error::NoEndpoints)
        ));
        match Client::connect(["127.0.0.1:2379"], None).await {
            Err(e @ Error::InvalidEndpoint { .. }) => {
                assert!(e.to_string().contains("http://"), "{e}")
            }
            other => panic!("a URL without a scheme is refused, not {other:?}"),
        }
        // Two closed ports: both are tried, and both named.
        let closed = |_| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
            format!("http://{}", l.local_addr().expect("its address"))
        };
        let endpoints: Vec<String> = (0..2).map(closed).collect();
        let options = ConnectOptions::new().with_connect_timeout(std::time::Duration::from_secs(2));
        match Client::connect(&endpoints, Some(options)).await {
            Err(e @ Error::Connect { .. }) => {
                assert!(e.is_transient());
                let text = e.to_string();
                assert!(text.contains("refused"), "the reason is named: {text}");
                assert!(
                    endpoints.iter().all(|u| text.contains(u.as_str())),
                    "{text}"
                );
            }
            other => panic!("no member to connect to, not {other:?}"),
        }
    }
}
