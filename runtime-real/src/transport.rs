//! `Transport` on gRPC over HTTP/2 (tonic's connections and server, hyper's HTTP/2).
//!
//! Every node serves one method, `tessera.Node/Call`, carrying the prost-encoded request
//! and reply envelopes as they are. Channels to each address are made once and reused
//! (HTTP/2 multiplexes calls over one connection); every call carries its deadline to
//! the server (`grpc-timeout`) and is abandoned locally when it passes. Message sizes are
//! bounded both ways: bulk data moves in pieces (pushes, piecewise reads and clones), so
//! no message needs to be large.
//!
//! The method is served and called here rather than through a generated stub and codec,
//! which copy every message into a frame buffer on the way out and out of one on the way
//! in. Here a message's pieces ([`Parts`]) go to HTTP/2 as they are, each as its own DATA
//! frames, and a received message is the frames' payloads as they came off the socket:
//! a read's data crosses each process without a copy of Tessera's own. On the wire it is
//! plain gRPC (length-prefixed messages, `grpc-status` trailers); tonic's own client and
//! server talk to it (tested below).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::SinkExt;
use futures::channel::{mpsc, oneshot};
use futures::future::{BoxFuture, poll_fn};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body::{Body as _, Frame, SizeHint};
use tessera_core::auth::{Caller, ServerRole};
use tessera_core::error::RpcError;
use tessera_core::runtime::{Incoming, Parts, Runtime, Transport};
use tessera_core::types::Time;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::server::NamedService;
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status};

use crate::rt::TokioRuntime;
use crate::tls::{Credentials, TlsError};

pub use tessera_core::wire::MAX_MESSAGE;

/// The one method every node serves.
const SERVICE: &str = "tessera.Node";
const PATH: &str = "/tessera.Node/Call";
const GRPC: HeaderValue = HeaderValue::from_static("application/grpc");

/// HTTP/2 flow control: how much a stream, and a whole connection, may have in flight
/// before the receiver must grant more. hyper's defaults (1-2 MiB per stream) make an
/// 8 MiB read wait for several window updates; on loopback and in a rack the
/// round trip is short but the wake-ups are not. A stream may carry a whole piece.
const STREAM_WINDOW: u32 = 16 << 20;
const CONNECTION_WINDOW: u32 = 64 << 20;
/// The largest DATA frame either side accepts: a piece of data up to this size goes in
/// one frame (window allowing) and so arrives in one buffer, which the receiver hands on
/// as it is. The protocol's limit is 16 MiB - 1; the default 16 KiB would cut a 4 MiB
/// read into 256 frames to be joined again.
const MAX_FRAME: u32 = (16 << 20) - 1;
/// Pieces smaller than this are copied in beside the 5-byte message prefix rather than
/// sent as DATA frames of their own: most messages are small, and one frame is cheaper
/// than two.
const JOIN_BELOW: usize = 64 << 10;
/// Received pieces smaller than this are copied out of the buffer they arrived in, and
/// joined to their neighbours.
const COPY_BELOW: usize = 16 << 10;
/// The most header bytes a call may carry (hyper's default, spelled out): a call's
/// headers are a few names and numbers.
const MAX_HEADERS: u32 = 16 << 10;
/// Calls a server's driver has not yet taken, beyond which callers wait. Their bytes are
/// counted in the server's budget while they wait, so this bounds only their number.
const QUEUE: usize = 1024;

/// What one server accepts from the network at once. Every bound here keeps a flood of
/// slow or oversized calls from holding the server's memory; the defaults leave the
/// normal traffic (pushes of 1 MiB, several in flight per client, messages up to
/// [`MAX_MESSAGE`]) far below them.
#[derive(Clone, Debug)]
pub struct ServerLimits {
    /// Connections served at once; more wait in the kernel's accept queue until one
    /// closes.
    pub max_connections: usize,
    /// Calls in progress at once on one connection (HTTP/2
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`); a client's further calls wait on its side.
    pub max_streams: u32,
    /// Bytes of requests the server holds at once, from their first byte off the socket
    /// until the driver has answered or the caller gives up, and of replies, until they
    /// have left for the socket. A request that would pass it is refused
    /// (`UNAVAILABLE`), not buffered; a reply is never refused (its work is done), but
    /// while replies its callers do not read hold the budget, no new request is taken.
    /// At least [`MAX_MESSAGE`], so that any message fits a server that is otherwise
    /// idle.
    pub request_bytes: usize,
    /// The longest a request may take to arrive whole; a sender that stalls is cut off
    /// and what it sent is freed. Also the longest a connection may stay silent: the
    /// server pings each peer several times within it, and a live peer answers, so one
    /// that sends nothing at all (not even the HTTP/2 preface) is closed and its slot
    /// given to another.
    pub receive_timeout: Duration,
    /// Connections one authenticated caller (a certificate's identity) may hold at once;
    /// more are closed as they come, so one caller, however many processes it runs, cannot
    /// take every slot from the rest. Not applied on an insecure transport, where callers
    /// are not told apart (a whole dev cluster calls from one address).
    pub max_per_caller: usize,
    /// A connection that has carried no call for this long is closed, though it answers
    /// pings: its caller reconnects when it next calls, and the slot serves another
    /// meanwhile.
    pub idle_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 512,
            max_streams: 256,
            request_bytes: 256 << 20,
            receive_timeout: Duration::from_secs(30),
            max_per_caller: 128,
            idle_timeout: Duration::from_secs(300),
        }
    }
}

/// TLS handshakes one address may have in progress at once: a peer that opens
/// connections and stalls in the handshake (it needs no certificate for that) holds at
/// most this many slots, each for at most [`HANDSHAKE_TIMEOUT`].
const MAX_HANDSHAKES_PER_ADDRESS: usize = 64;

#[derive(Clone)]
pub struct GrpcTransport {
    /// By address and the role its server must prove: a master's channel and a
    /// chunkserver's to one address (a test's, say) are apart.
    channels: Arc<Mutex<HashMap<(String, ServerRole), Channel>>>,
    connect_timeout: Duration,
    limits: ServerLimits,
    /// What its servers share (a node listens once): the bytes of requests in progress,
    /// and a slot for each connection being served.
    budget: Arc<Budget>,
    slots: Arc<Semaphore>,
    /// Connections open now. Not the slots taken: the accept loop takes a slot before it
    /// waits for the next connection.
    open: Arc<AtomicUsize>,
    /// Mutual TLS, when the node has credentials (`crate::tls`); None: `--insecure`.
    tls: Option<Arc<Secured>>,
}

/// What a secured transport connects and accepts with.
struct Secured {
    acceptor: tokio_rustls::TlsAcceptor,
    /// Calls to a master, which must show a master's certificate, and to a chunkserver.
    master: tonic::transport::ClientTlsConfig,
    chunkserver: tonic::transport::ClientTlsConfig,
}

/// How long a new connection may take over its TLS handshake before it is closed.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for GrpcTransport {
    fn default() -> Self {
        GrpcTransport::new()
    }
}

impl GrpcTransport {
    pub fn new() -> GrpcTransport {
        GrpcTransport::with_limits(ServerLimits::default())
    }

    /// A transport whose servers accept no more than `limits`.
    pub fn with_limits(limits: ServerLimits) -> GrpcTransport {
        GrpcTransport {
            channels: Arc::default(),
            connect_timeout: Duration::from_secs(3),
            budget: Arc::new(Budget::new(limits.request_bytes)),
            slots: Arc::new(Semaphore::new(limits.max_connections)),
            open: Arc::default(),
            limits,
            tls: None,
        }
    }

    /// A transport whose every connection, both ways, is mutually authenticated with
    /// `creds`: its servers take only peers holding a certificate of the same authority,
    /// and hand each request on with the caller that certificate names; its calls go
    /// only to servers holding a node certificate of that authority.
    pub fn secured(limits: ServerLimits, creds: &Credentials) -> Result<GrpcTransport, TlsError> {
        let mut t = GrpcTransport::with_limits(limits);
        t.tls = Some(Arc::new(Secured {
            acceptor: tokio_rustls::TlsAcceptor::from(creds.server_config()?),
            master: creds.client_config(ServerRole::Master),
            chunkserver: creds.client_config(ServerRole::Chunkserver),
        }));
        Ok(t)
    }

    /// Another transport with the same limits and credentials, but connections of its
    /// own (a benchmark's clients, each as a process of its own would be).
    pub fn fresh(&self) -> GrpcTransport {
        let mut t = GrpcTransport::with_limits(self.limits.clone());
        t.tls = self.tls.clone();
        t
    }

    /// As [`GrpcTransport::secured`] when given credentials, else insecure.
    pub fn maybe_secured(
        limits: ServerLimits,
        creds: Option<&Credentials>,
    ) -> Result<GrpcTransport, TlsError> {
        match creds {
            Some(c) => GrpcTransport::secured(limits, c),
            None => Ok(GrpcTransport::with_limits(limits)),
        }
    }

    /// Connections this transport's servers are serving now.
    pub fn connections(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Bytes of requests this transport's servers hold now, and the most they ever held.
    pub fn request_bytes_held(&self) -> (usize, usize) {
        (
            self.budget.used.load(Ordering::Relaxed),
            self.budget.peak.load(Ordering::Relaxed),
        )
    }

    fn channel(&self, to: &str, server: ServerRole) -> Result<Channel, RpcError> {
        let mut channels = self.channels.lock().expect("channel cache");
        let key = (to.to_string(), server);
        if let Some(c) = channels.get(&key) {
            return Ok(c.clone());
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{to}"))
            .map_err(|e| RpcError::Unreachable(format!("{to}: bad address: {e}")))?;
        if let Some(tls) = &self.tls {
            let client = match server {
                ServerRole::Master => &tls.master,
                ServerRole::Chunkserver => &tls.chunkserver,
            };
            endpoint = endpoint
                .tls_config(client.clone())
                .map_err(|e| RpcError::Unreachable(format!("{to}: TLS: {e}")))?;
        }
        let endpoint = endpoint
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_frame_size(MAX_FRAME)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(20));
        // Connects on first use, and reconnects after a failure, by itself.
        let channel = endpoint.connect_lazy();
        channels.insert(key, channel.clone());
        Ok(channel)
    }
}

impl Transport for GrpcTransport {
    fn call_parts(
        &self,
        to: &str,
        server: ServerRole,
        body: Parts,
        deadline: Time,
    ) -> impl Future<Output = Result<Parts, RpcError>> + Send {
        let to = to.to_string();
        let channel = self.channel(&to, server);
        async move {
            let left = deadline.saturating_sub(TokioRuntime.now());
            if left.is_zero() {
                return Err(RpcError::Deadline(to));
            }
            if body.len() > MAX_MESSAGE {
                return Err(RpcError::TooLarge(body.len()));
            }
            let call = call(channel?, body, left);
            match tokio::time::timeout(left, call).await {
                Err(_) => Err(RpcError::Deadline(to)),
                Ok(Ok(reply)) => Ok(reply),
                Ok(Err(status)) => Err(match status.code() {
                    Code::DeadlineExceeded | Code::Cancelled => RpcError::Deadline(to),
                    Code::ResourceExhausted | Code::OutOfRange => RpcError::TooLarge(0),
                    _ => RpcError::Unreachable(format!("{to}: {}", status.message())),
                }),
            }
        }
    }

    fn listen(
        &self,
        addr: &str,
    ) -> impl Future<Output = Result<mpsc::Receiver<Incoming>, RpcError>> + Send {
        let addr = addr.to_string();
        let this = self.clone();
        async move {
            let sock: SocketAddr = tokio::net::lookup_host(&addr)
                .await
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| RpcError::Listen(format!("{addr}: no such address")))?;
            // Bind here, so a port in use is an error now rather than in a background task.
            let listener = tokio::net::TcpListener::bind(sock)
                .await
                .map_err(|e| RpcError::Listen(format!("{addr}: {e}")))?;
            let silent = this.limits.receive_timeout;
            let incoming = accept(
                listener,
                this.slots.clone(),
                this.open.clone(),
                Bounds {
                    silent,
                    idle: this.limits.idle_timeout,
                    per_caller: this.limits.max_per_caller,
                    handshakes: (this.limits.max_connections / 2).max(1),
                },
                this.tls.as_ref().map(|t| t.acceptor.clone()),
            );
            let (tx, rx) = mpsc::channel(QUEUE);
            let service = NodeService {
                // One sender shared by every call: a futures channel gives each sender a
                // slot of its own beyond its capacity, so a sender per call would make
                // the queue as long as the calls are many.
                tx: Arc::new(tokio::sync::Mutex::new(tx)),
                budget: this.budget.clone(),
                receive_timeout: this.limits.receive_timeout,
            };
            // Pings go several times within the silence a connection is allowed, so a
            // live peer is never taken for a silent one.
            let keep_alive =
                (silent / 3).clamp(Duration::from_millis(100), Duration::from_secs(10));
            tokio::spawn(async move {
                // tonic's server applies each call's `grpc-timeout` around the service.
                // The reset-stream limits are hyper's defaults, spelled out because tonic
                // would otherwise turn the second off.
                if let Err(e) = Server::builder()
                    .initial_stream_window_size(STREAM_WINDOW)
                    .initial_connection_window_size(CONNECTION_WINDOW)
                    .max_frame_size(MAX_FRAME)
                    .max_concurrent_streams(this.limits.max_streams)
                    .http2_max_header_list_size(MAX_HEADERS)
                    .http2_max_pending_accept_reset_streams(Some(20))
                    .http2_max_local_error_reset_streams(Some(1024))
                    // A peer that stops answering pings gives its connection's slot back.
                    .http2_keepalive_interval(Some(keep_alive))
                    .http2_keepalive_timeout(Some(silent))
                    .add_service(service)
                    .serve_with_incoming(incoming)
                    .await
                {
                    tracing::error!(addr = %addr, error = %e, "server stopped");
                }
            });
            Ok(rx)
        }
    }
}

/// How long a connection may stay silent, or carry no call, and how many one caller may
/// hold ([`ServerLimits`]).
#[derive(Clone, Copy)]
struct Bounds {
    silent: Duration,
    idle: Duration,
    per_caller: usize,
    /// TLS handshakes in progress from every peer at once: half the connection slots,
    /// so that peers stalling in handshakes from many addresses (they need no
    /// certificate for that) leave the rest to callers who finished theirs. A new
    /// handshake past it ends the oldest one in progress ([`Shaking`]).
    handshakes: usize,
}

impl Bounds {
    /// The longest a TLS handshake may take: [`HANDSHAKE_TIMEOUT`], or less when a
    /// connection may stay silent for less.
    fn handshake(&self) -> Duration {
        HANDSHAKE_TIMEOUT.min(self.silent)
    }
}

/// The TLS handshakes in progress on one listener, oldest first. Past the bound a new
/// one ends the oldest rather than being refused: a peer stalling in handshakes from
/// many addresses then holds no slot longer than it takes others to open as many
/// connections, and a caller's handshake (a few milliseconds) is not held up.
#[derive(Clone, Default)]
struct Shaking(Arc<Mutex<InProgress>>);

/// The next handshake's number, and how to end each in progress, by number.
type InProgress = (u64, std::collections::BTreeMap<u64, oneshot::Sender<()>>);

/// One handshake in [`Shaking`], gone from it when dropped.
struct ShakingShare {
    shaking: Shaking,
    id: u64,
}

impl Shaking {
    /// A handshake begins, ending the oldest if `max` are in progress; the receiver
    /// fires if this one is ended so.
    fn start(&self, max: usize) -> (ShakingShare, oneshot::Receiver<()>) {
        let mut g = self.0.lock().expect("handshakes");
        let (next, in_progress) = &mut *g;
        while in_progress.len() >= max.max(1) {
            if let Some((_, end)) = in_progress.pop_first() {
                let _ = end.send(());
            }
        }
        let id = *next;
        *next += 1;
        let (tx, rx) = oneshot::channel();
        in_progress.insert(id, tx);
        (
            ShakingShare {
                shaking: self.clone(),
                id,
            },
            rx,
        )
    }
}

impl Drop for ShakingShare {
    fn drop(&mut self) {
        self.shaking
            .0
            .lock()
            .expect("handshakes")
            .1
            .remove(&self.id);
    }
}

/// Whose handshakes `ip`'s count among: its own address, or for IPv6 its /64 (one host
/// is commonly given a whole /64, and would otherwise hold as many slots as it picks
/// addresses).
fn handshake_key(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => v4.to_string(),
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        },
    }
}

/// How many connections (or handshakes) each key holds now; a key is gone once it holds
/// none, so the map is no larger than the connections open.
#[derive(Clone, Default)]
struct Tally(Arc<Mutex<HashMap<String, usize>>>);

/// One entry in a [`Tally`], given back when dropped.
struct TallyShare {
    tally: Tally,
    key: String,
}

impl Tally {
    /// One more for `key`, unless it holds `max` already.
    fn take(&self, key: String, max: usize) -> Option<TallyShare> {
        let mut m = self.0.lock().expect("tally");
        let n = m.entry(key.clone()).or_insert(0);
        if *n >= max {
            if *n == 0 {
                m.remove(&key);
            }
            return None;
        }
        *n += 1;
        Some(TallyShare {
            tally: self.clone(),
            key,
        })
    }
}

impl Drop for TallyShare {
    fn drop(&mut self) {
        let mut m = self.tally.0.lock().expect("tally");
        if let Some(n) = m.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.key);
            }
        }
    }
}

/// The connections `listener` accepts, each holding one of `slots` while it is open and
/// closed once it has sent nothing for `bounds.silent`, or carried no call for
/// `bounds.idle`. With every slot taken, no more are accepted: they wait in the kernel's
/// accept queue. With `tls`, each connection's handshake runs in a task of its own (a
/// peer that stalls in it holds up no other), is bounded by [`HANDSHAKE_TIMEOUT`] and,
/// per address, by [`MAX_HANDSHAKES_PER_ADDRESS`], and must show a certificate of the
/// cluster's authority: the connection comes out naming the caller that certificate
/// names, and is closed if that caller holds `bounds.per_caller` connections already.
fn accept(
    listener: tokio::net::TcpListener,
    slots: Arc<Semaphore>,
    open: Arc<AtomicUsize>,
    bounds: Bounds,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> impl futures::Stream<Item = Result<Conn, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Conn>(64);
    let (handshakes, callers) = (Tally::default(), Tally::default());
    let shaking_all = Shaking::default();
    tokio::spawn(async move {
        loop {
            // The semaphore is never closed, so this ends only if it were.
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let (io, remote) = loop {
                match listener.accept().await {
                    Ok(accepted) => break accepted,
                    Err(e) => {
                        // Out of file descriptors, say: waiting a moment beats spinning,
                        // and connections that close meanwhile free some.
                        tracing::warn!(error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            };
            // Small messages go at once rather than waiting to fill a packet.
            if let Err(e) = io.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
            let open = Open::count(open.clone());
            let (tx, tls) = (tx.clone(), tls.clone());
            let (handshakes, callers) = (handshakes.clone(), callers.clone());
            let shaking_all = shaking_all.clone();
            tokio::spawn(async move {
                let (io, caller, held) = match tls {
                    None => (ConnIo::Plain(io), Caller::Insecure, None),
                    Some(acceptor) => {
                        let (all, mut ended) = shaking_all.start(bounds.handshakes);
                        let Some(shaking) =
                            handshakes.take(handshake_key(remote.ip()), MAX_HANDSHAKES_PER_ADDRESS)
                        else {
                            tracing::warn!(peer = %remote, "refused a connection: {MAX_HANDSHAKES_PER_ADDRESS} handshakes from its address are in progress");
                            return;
                        };
                        let shook = tokio::select! {
                            shook = tokio::time::timeout(bounds.handshake(), acceptor.accept(io)) => shook,
                            _ = &mut ended => {
                                tracing::info!(peer = %remote, "closed a connection: its TLS handshake was the oldest of {} in progress", bounds.handshakes);
                                return;
                            }
                        };
                        drop((shaking, all));
                        match shook {
                            Ok(Ok(stream)) => match peer_caller(&stream) {
                                Ok(c) => match callers.take(c.label(), bounds.per_caller) {
                                    Some(held) => (ConnIo::Tls(Box::new(stream)), c, Some(held)),
                                    None => {
                                        tracing::warn!(peer = %remote, caller = %c, "refused a connection: its caller holds {} already", bounds.per_caller);
                                        return;
                                    }
                                },
                                Err(e) => {
                                    tracing::warn!(peer = %remote, error = %e, "refused a connection: its certificate names nobody");
                                    return;
                                }
                            },
                            Ok(Err(e)) => {
                                tracing::info!(peer = %remote, error = %e, "refused a connection: TLS handshake failed");
                                return;
                            }
                            Err(_) => {
                                tracing::info!(peer = %remote, "refused a connection: no TLS handshake within {:?}", bounds.handshake());
                                return;
                            }
                        }
                    }
                };
                let calls = Arc::new(Calls::default());
                let conn = Conn {
                    io,
                    info: PeerInfo {
                        remote: Some(remote),
                        caller,
                        calls: calls.clone(),
                    },
                    _slot: slot,
                    _open: open,
                    _held: held,
                    calls,
                    bounds,
                    heard: tokio::time::Instant::now(),
                    quiet: Box::pin(tokio::time::sleep(bounds.silent)),
                };
                let _ = tx.send(conn).await;
            });
        }
    });
    futures::stream::unfold(rx, |mut rx| async move {
        let conn = rx.recv().await?;
        Some((Ok(conn), rx))
    })
}

/// The calls a connection is carrying, and when the last one ended: a connection with
/// none for [`Bounds::idle`] is closed.
struct Calls {
    now: AtomicUsize,
    /// When the connection was made or a call last ended.
    last: Mutex<tokio::time::Instant>,
}

impl Default for Calls {
    fn default() -> Self {
        Calls {
            now: AtomicUsize::new(0),
            last: Mutex::new(tokio::time::Instant::now()),
        }
    }
}

impl Calls {
    /// The connection has carried no call since `idle` ago.
    fn idle_for(&self, idle: Duration) -> bool {
        self.now.load(Ordering::Relaxed) == 0 && self.last.lock().expect("calls").elapsed() >= idle
    }
}

/// One call in its connection's [`Calls`], until dropped.
struct InCall(Arc<Calls>);

impl InCall {
    fn start(calls: Arc<Calls>) -> InCall {
        calls.now.fetch_add(1, Ordering::Relaxed);
        InCall(calls)
    }
}

impl Drop for InCall {
    fn drop(&mut self) {
        *self.0.last.lock().expect("calls") = tokio::time::Instant::now();
        self.0.now.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The caller a TLS connection's peer certificate names (the handshake checked it is
/// the cluster authority's).
fn peer_caller(
    stream: &tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
) -> Result<Caller, String> {
    let (_, conn) = stream.get_ref();
    let cert = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or("no certificate")?;
    crate::tls::caller_of(cert)
}

/// One open connection in its server's count, until dropped.
struct Open(Arc<AtomicUsize>);

impl Open {
    fn count(open: Arc<AtomicUsize>) -> Open {
        open.fetch_add(1, Ordering::Relaxed);
        Open(open)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Who is at the other end of a connection: its address, and the caller its
/// certificate names ([`Caller::Insecure`] on an insecure transport). Every request on
/// the connection reaches its node with it.
#[derive(Clone)]
pub struct PeerInfo {
    pub remote: Option<SocketAddr>,
    pub caller: Caller,
    calls: Arc<Calls>,
}

impl std::fmt::Debug for PeerInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerInfo")
            .field("remote", &self.remote)
            .field("caller", &self.caller)
            .finish()
    }
}

/// A connection's bytes: as they are, or through TLS.
enum ConnIo {
    Plain(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>),
}

/// An accepted connection, holding its server's connection slot (and its caller's
/// share) until it closes. A connection that sends nothing for `bounds.silent`, or
/// carries no call for `bounds.idle`, fails its next read, which closes it: a peer that
/// connects and never speaks (or stops, without closing), or keeps a connection only
/// alive, cannot keep a slot.
struct Conn {
    io: ConnIo,
    info: PeerInfo,
    _slot: OwnedSemaphorePermit,
    _open: Open,
    _held: Option<TallyShare>,
    calls: Arc<Calls>,
    bounds: Bounds,
    /// When a byte last arrived.
    heard: tokio::time::Instant,
    /// Fires `silent` after a moment when nothing may have arrived since; moved on only
    /// when it fires, not on every read.
    quiet: Pin<Box<tokio::time::Sleep>>,
}

impl Connected for Conn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ConnIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ConnIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ConnIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ConnIo::Plain(s) => s.is_write_vectored(),
            ConnIo::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ConnIo::Plain(s) => Pin::new(s).poll_flush(cx),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ConnIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.heard = tokio::time::Instant::now();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => loop {
                if self.quiet.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let silent = self.bounds.silent;
                let due = self.heard + silent;
                let now = tokio::time::Instant::now();
                if due <= now {
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("the peer sent nothing for {silent:?}"),
                    )));
                }
                // Looked at as often as silence is (pings keep `heard` fresh, so the
                // timer fires about every `silent`).
                if self.calls.idle_for(self.bounds.idle) {
                    tracing::debug!(peer = ?self.info.remote, "closing a connection that carried no call for {:?}", self.bounds.idle);
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("the peer made no call for {:?}", self.bounds.idle),
                    )));
                }
                let idle_due = *self.calls.last.lock().expect("calls") + self.bounds.idle;
                let next = if idle_due > now {
                    due.min(idle_due)
                } else {
                    due
                };
                self.quiet.as_mut().reset(next);
            },
            other => other,
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// One call on `channel`: the request, then the reply's message and `grpc-status`.
async fn call(mut channel: Channel, msg: Parts, timeout: Duration) -> Result<Parts, Status> {
    let mut req = Request::new(Body::new(Pieces::message(msg, None)));
    *req.method_mut() = http::Method::POST;
    // The channel fills in the scheme and authority.
    *req.uri_mut() = http::Uri::from_static(PATH);
    let headers = req.headers_mut();
    headers.insert(header::CONTENT_TYPE, GRPC);
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
    headers.insert("grpc-timeout", grpc_timeout(timeout));
    poll_fn(|cx| channel.poll_ready(cx))
        .await
        .map_err(|e| channel_error(&e))?;
    let resp = channel.call(req).await.map_err(|e| channel_error(&e))?;
    let (head, mut body) = resp.into_parts();
    if head.status != StatusCode::OK {
        return Err(Status::unavailable(format!(
            "answered HTTP {} rather than gRPC",
            head.status
        )));
    }
    // A "trailers-only" reply: the status is in the headers, and there is no message.
    if let Some(status) = status_in(&head.headers) {
        return Err(if status.code() == Code::Ok {
            Status::internal("the reply has no message")
        } else {
            status
        });
    }
    let (msg, trailers) = match read_message(&mut body, MAX_MESSAGE, None).await? {
        Next::Message(m) => (Some(m), read_trailers(&mut body).await?),
        Next::End(trailers) => (None, trailers),
    };
    match trailers.as_ref().and_then(status_in) {
        Some(s) if s.code() == Code::Ok => {
            msg.ok_or_else(|| Status::internal("the reply has no message"))
        }
        Some(s) => Err(s),
        None => Err(Status::internal("the reply ended without a grpc-status")),
    }
}

/// The `grpc-status` (and message) in `headers`, if they carry one. Read by hand rather
/// than with `Status::from_header_map`, which panics on malformed status details.
fn status_in(headers: &HeaderMap) -> Option<Status> {
    let code = Code::from_bytes(headers.get("grpc-status")?.as_bytes());
    let message = headers
        .get("grpc-message")
        .map(|m| percent_decode(m.as_bytes()))
        .unwrap_or_default();
    Some(Status::new(code, message))
}

/// gRPC percent-encodes `grpc-message`; a malformed escape is kept as it is.
fn percent_decode(s: &[u8]) -> String {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if s[i] == b'%'
            && let (Some(h), Some(l)) = (
                s.get(i + 1).copied().and_then(hex),
                s.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `grpc-timeout`: at most 8 digits, in the finest unit that fits.
fn grpc_timeout(d: Duration) -> HeaderValue {
    let units: [(char, u128); 4] = [
        ('u', d.as_micros()),
        ('m', d.as_millis()),
        ('S', d.as_secs() as u128),
        ('M', d.as_secs() as u128 / 60),
    ];
    let (unit, value) = units
        .into_iter()
        .find(|(_, v)| *v <= 99_999_999)
        .unwrap_or(('H', 99_999_999));
    HeaderValue::try_from(format!("{value}{unit}")).expect("digits and a letter")
}

/// A call the connection failed: its deadline passed (the channel enforces the
/// `grpc-timeout` it carries), or the server could not be reached.
fn channel_error(e: &(dyn std::error::Error + 'static)) -> Status {
    let mut source = Some(e);
    while let Some(inner) = source {
        if inner.is::<tonic::TimeoutExpired>() {
            return Status::deadline_exceeded(describe(e));
        }
        source = inner.source();
    }
    Status::unavailable(describe(e))
}

fn describe(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// What a body holds next: one message, or its end (with trailers, if it has them).
enum Next {
    Message(Parts),
    End(Option<HeaderMap>),
}

/// Bytes of requests a server holds, against its limit. Each call takes its share as its
/// bytes come off the socket and gives it back when it ends ([`Held`]).
struct Budget {
    limit: usize,
    used: AtomicUsize,
    /// The most ever held at once: what a test of the limit reads.
    peak: AtomicUsize,
}

impl Budget {
    fn new(limit: usize) -> Budget {
        Budget {
            limit,
            used: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// Takes `n` bytes if they fit under the limit.
    fn take(&self, n: usize) -> bool {
        let taken = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&u| u <= self.limit)
            });
        match taken {
            Ok(before) => {
                self.peak.fetch_max(before + n, Ordering::Relaxed);
                true
            }
            Err(_) => false,
        }
    }

    /// Takes `n` bytes whatever the limit: for a reply, whose work is done.
    fn force(&self, n: usize) {
        let before = self.used.fetch_add(n, Ordering::AcqRel);
        self.peak.fetch_max(before + n, Ordering::Relaxed);
    }

    fn give_back(&self, n: usize) {
        let before = self.used.fetch_sub(n, Ordering::AcqRel);
        assert!(before >= n, "gave back more request bytes than were taken");
    }
}

/// One call's share of its server's [`Budget`], given back when the call ends however it
/// ends: answered, refused, or dropped because its caller went away.
struct Held {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Held {
    fn new(budget: Arc<Budget>) -> Held {
        Held { budget, bytes: 0 }
    }

    /// Counts `n` more bytes of the request, or refuses them: the server already holds
    /// as many bytes of requests as it may.
    fn add(&mut self, n: usize) -> Result<(), Status> {
        if !self.budget.take(n) {
            return Err(Status::unavailable(format!(
                "busy: {} of {} bytes of requests in progress",
                self.budget.used.load(Ordering::Relaxed),
                self.budget.limit
            )));
        }
        self.bytes += n;
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

/// A piece of a reply, holding its share of the server's [`Budget`] until the last
/// reference to it is gone: HTTP/2 keeps a piece it was given until it has written it to
/// the socket, however slowly the caller reads.
struct Counted {
    bytes: Bytes,
    budget: Arc<Budget>,
}

impl Counted {
    fn wrap(bytes: Bytes, budget: &Arc<Budget>) -> Bytes {
        budget.force(bytes.len());
        Bytes::from_owner(Counted {
            bytes,
            budget: budget.clone(),
        })
    }
}

impl AsRef<[u8]> for Counted {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes.len());
    }
}

/// Reads one length-prefixed gRPC message from `body`, as the pieces it arrived in. A
/// message bigger than `limit`, a compressed one, or one cut short is an error; so is a
/// second message (the method is unary). A server counts what it keeps in `held`, and
/// stops reading (refusing the call) when that would pass its budget.
async fn read_message(
    body: &mut Body,
    limit: usize,
    mut held: Option<&mut Held>,
) -> Result<Next, Status> {
    let mut prefix = BytesMut::new();
    let mut need = None::<usize>;
    let mut pieces = Vec::new();
    let mut small = BytesMut::new();
    let mut got = 0;
    loop {
        let frame = poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await;
        let mut data = match frame {
            None if prefix.is_empty() => return Ok(Next::End(None)),
            Some(Err(e)) => return Err(e),
            Some(Ok(f)) => match f.into_data() {
                Ok(d) => d,
                Err(f) if prefix.is_empty() => return Ok(Next::End(f.into_trailers().ok())),
                Err(_) => return Err(Status::internal("the message was cut short")),
            },
            None => return Err(Status::internal("the message was cut short")),
        };
        if need.is_none() {
            let take = data.len().min(5 - prefix.len());
            prefix.put(data.split_to(take));
            if prefix.len() < 5 {
                continue;
            }
            if prefix[0] != 0 {
                return Err(Status::unimplemented(
                    "compressed messages are not accepted",
                ));
            }
            let len = u32::from_be_bytes(prefix[1..5].try_into().expect("4 bytes")) as usize;
            if len > limit {
                return Err(Status::resource_exhausted(format!(
                    "a message of {len} bytes is over the limit of {limit}"
                )));
            }
            need = Some(len);
        }
        let len = need.expect("prefix read");
        if got + data.len() > len {
            return Err(Status::unimplemented(
                "more than one message in a unary call",
            ));
        }
        got += data.len();
        if !data.is_empty() {
            if let Some(held) = held.as_deref_mut() {
                held.add(data.len())?;
            }
            if data.len() < COPY_BELOW {
                // A small frame's payload points into a larger buffer read off the
                // socket, which it would keep alive: copied, it costs what it counts.
                small.extend_from_slice(&data);
            } else {
                if !small.is_empty() {
                    pieces.push(small.split().freeze());
                }
                pieces.push(data);
            }
        }
        if got == len {
            if !small.is_empty() {
                pieces.push(small.split().freeze());
            }
            return Ok(Next::Message(Parts(pieces)));
        }
    }
}

/// Reads what is left of `body` after its message: its trailers, if any. More data is an
/// error (the method is unary).
async fn read_trailers(body: &mut Body) -> Result<Option<HeaderMap>, Status> {
    loop {
        match poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
            None => return Ok(None),
            Some(Err(e)) => return Err(e),
            Some(Ok(f)) => match f.into_data() {
                Ok(d) if d.is_empty() => {}
                Ok(_) => {
                    return Err(Status::unimplemented(
                        "more than one message in a unary call",
                    ));
                }
                Err(f) => return Ok(f.into_trailers().ok()),
            },
        }
    }
}

/// An HTTP body of one gRPC message given as pieces, then trailers (a reply's status).
struct Pieces {
    pieces: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Pieces {
    fn message(msg: Parts, trailers: Option<HeaderMap>) -> Pieces {
        let len = msg.len();
        let mut head = BytesMut::with_capacity(5 + len.min(JOIN_BELOW));
        head.put_u8(0); // not compressed
        head.put_u32(len as u32);
        let mut pieces = VecDeque::with_capacity(msg.0.len() + 1);
        for p in msg.0 {
            if pieces.is_empty() && p.len() < JOIN_BELOW {
                head.put(p);
            } else {
                if pieces.is_empty() {
                    pieces.push_back(head.split().freeze());
                }
                pieces.push_back(p);
            }
        }
        if pieces.is_empty() {
            pieces.push_back(head.freeze());
        }
        Pieces { pieces, trailers }
    }
}

impl http_body::Body for Pieces {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(p) = self.pieces.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(p))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.pieces.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = SizeHint::new();
        hint.set_lower(self.pieces.iter().map(|p| p.remaining() as u64).sum());
        hint
    }
}

/// Serves `tessera.Node/Call`: hands each call to the node's driver and sends back its
/// reply.
#[derive(Clone)]
struct NodeService {
    tx: Arc<tokio::sync::Mutex<mpsc::Sender<Incoming>>>,
    budget: Arc<Budget>,
    receive_timeout: Duration,
}

impl NamedService for NodeService {
    const NAME: &'static str = SERVICE;
}

impl Service<Request<Body>> for NodeService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let tx = self.tx.clone();
        let held = Held::new(self.budget.clone());
        let receive_timeout = self.receive_timeout;
        let in_call = req
            .extensions()
            .get::<PeerInfo>()
            .map(|i| InCall::start(i.calls.clone()));
        Box::pin(async move {
            let _in_call = in_call;
            Ok(match serve(tx, held, receive_timeout, req).await {
                Ok(r) => r,
                Err(status) => status.into_http(),
            })
        })
    }
}

/// One call: its request read whole within `receive_timeout` and counted in `held`, then
/// handed to the driver, then its reply. Returning (or being dropped, when the caller
/// goes away) frees the request's share of the budget, and drops its stream, with
/// whatever HTTP/2 had buffered of it; the reply's pieces hold their share until they
/// have been written out (or the stream is dropped).
async fn serve(
    tx: Arc<tokio::sync::Mutex<mpsc::Sender<Incoming>>>,
    mut held: Held,
    receive_timeout: Duration,
    req: Request<Body>,
) -> Result<Response<Body>, Status> {
    if req.uri().path() != PATH {
        return Err(Status::unimplemented(format!(
            "no method {}",
            req.uri().path()
        )));
    }
    let info = req.extensions().get::<PeerInfo>();
    let peer = info
        .and_then(|i| i.remote)
        .map(|a| a.to_string())
        .unwrap_or_default();
    // A connection that reached here passed its handshake: on a secured transport it
    // named its caller there. Without that (a transport that was never secured), no
    // caller is known.
    let from = info.map_or(Caller::Insecure, |i| i.caller.clone());
    let mut body = req.into_body();
    let receive = async {
        let Next::Message(msg) = read_message(&mut body, MAX_MESSAGE, Some(&mut held)).await?
        else {
            return Err(Status::internal("the request has no message"));
        };
        // The body ends with the message (a unary call); a second one is refused.
        read_trailers(&mut body).await?;
        Ok(msg)
    };
    let msg = tokio::time::timeout(receive_timeout, receive)
        .await
        .map_err(|_| {
            Status::deadline_exceeded(format!(
                "the request did not arrive whole within {receive_timeout:?}"
            ))
        })??;
    let (reply, answer) = oneshot::channel();
    let arrived = TokioRuntime.now();
    // Waits while the driver's queue is full; the caller's deadline (`grpc-timeout`)
    // bounds the wait.
    tx.lock()
        .await
        .send(Incoming {
            body: msg,
            arrived,
            peer,
            from,
            reply,
        })
        .await
        .map_err(|_| Status::unavailable("node stopping"))?;
    let reply = answer
        .await
        .map_err(|_| Status::unavailable("node dropped the request"))?;
    // The request is answered: its bytes are the node's to keep or free now, and the
    // reply's are counted instead, until they have gone out.
    let budget = held.budget.clone();
    drop(held);
    if reply.len() > MAX_MESSAGE {
        return Err(Status::resource_exhausted(format!(
            "a reply of {} bytes is over the limit of {MAX_MESSAGE}",
            reply.len()
        )));
    }
    let mut ok = HeaderMap::new();
    ok.insert("grpc-status", HeaderValue::from_static("0"));
    let mut body = Pieces::message(reply, Some(ok));
    for p in &mut body.pieces {
        *p = Counted::wrap(std::mem::take(p), &budget);
    }
    let mut resp = Response::new(Body::new(body));
    resp.headers_mut().insert(header::CONTENT_TYPE, GRPC);
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use futures::StreamExt;
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

    use super::*;

    /// The role every test node's calls mean to reach (its credentials, when it has
    /// any, are a master's).
    const NODE: ServerRole = ServerRole::Master;

    fn free_addr() -> String {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").to_string()
    }

    fn in_a_second() -> Time {
        TokioRuntime.now() + Duration::from_secs(5)
    }

    /// A node that answers each call with `answer(request)`.
    async fn node(answer: impl Fn(Bytes) -> Option<Parts> + Send + 'static) -> String {
        node_on(&GrpcTransport::new(), answer).await
    }

    /// A node served by `t`, answering each call with `answer(request)`.
    async fn node_on(
        t: &GrpcTransport,
        answer: impl Fn(Bytes) -> Option<Parts> + Send + 'static,
    ) -> String {
        let addr = free_addr();
        let mut rx = t.listen(&addr).await.expect("listen");
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Some(call) = rx.next().await {
                match answer(call.body.concat()) {
                    Some(reply) => {
                        let _ = call.reply.send(reply);
                    }
                    None => held.push(call.reply), // never answered
                }
            }
        });
        addr
    }

    fn pattern(n: usize) -> Bytes {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[tokio::test]
    async fn a_reply_in_pieces_arrives_whole_with_its_bulk_data_in_one_piece() {
        let big = pattern(3 << 20);
        let sent = big.clone();
        let addr =
            node(move |req| Some(Parts(vec![req, sent.clone(), Bytes::from_static(b"end")]))).await;
        let t = GrpcTransport::new();
        let small = t
            .call(&addr, NODE, Bytes::from_static(b"hi").into(), in_a_second())
            .await
            .expect("call");
        assert_eq!(&small[..2], b"hi");
        assert_eq!(small.len(), 2 + big.len() + 3);
        let got = t
            .call_parts(
                &addr,
                NODE,
                Bytes::from_static(b"again").into(),
                in_a_second(),
            )
            .await
            .expect("call");
        assert!(
            got.0.iter().any(|p| p.len() == big.len()),
            "the data was cut up on the way: {:?}",
            got.0.iter().map(Bytes::len).collect::<Vec<_>>()
        );
        let mut want = BytesMut::new();
        want.put(&b"again"[..]);
        want.put(big.clone());
        want.put(&b"end"[..]);
        assert_eq!(got.concat(), want.freeze());
        // A large request arrives whole too, and an empty one.
        let echo = node(|req| Some(req.into())).await;
        for body in [big.clone(), Bytes::new()] {
            let got = t
                .call(&echo, NODE, body.clone().into(), in_a_second())
                .await
                .expect("call");
            assert_eq!(got, body);
        }
    }

    #[tokio::test]
    async fn a_message_over_the_limit_is_refused_before_it_is_sent() {
        // Nobody listens there: a refusal after sending would read as unreachable.
        let body = Bytes::from(vec![0u8; MAX_MESSAGE + 1]);
        let got = GrpcTransport::new()
            .call(&free_addr(), NODE, body.into(), in_a_second())
            .await;
        assert!(
            matches!(got, Err(RpcError::TooLarge(n)) if n == MAX_MESSAGE + 1),
            "{got:?}"
        );
    }

    #[tokio::test]
    async fn a_call_nobody_answers_ends_at_its_deadline() {
        let addr = node(|_| None).await;
        let t = GrpcTransport::new();
        let start = std::time::Instant::now();
        let got = t
            .call(
                &addr,
                NODE,
                Bytes::from_static(b"x").into(),
                TokioRuntime.now() + Duration::from_millis(300),
            )
            .await;
        assert!(matches!(got, Err(RpcError::Deadline(_))), "{got:?}");
        assert!(start.elapsed() < Duration::from_secs(5));
        // Nobody listening at all.
        let got = t
            .call(
                &free_addr(),
                NODE,
                Bytes::from_static(b"x").into(),
                in_a_second(),
            )
            .await;
        assert!(matches!(got, Err(RpcError::Unreachable(_))), "{got:?}");
    }

    /// Passes message bodies through, for tonic's own client and server.
    #[derive(Clone, Copy, Default)]
    struct BytesCodec;

    impl Codec for BytesCodec {
        type Encode = Bytes;
        type Decode = Bytes;
        type Encoder = BytesCodec;
        type Decoder = BytesCodec;
        fn encoder(&mut self) -> BytesCodec {
            BytesCodec
        }
        fn decoder(&mut self) -> BytesCodec {
            BytesCodec
        }
    }

    impl Encoder for BytesCodec {
        type Item = Bytes;
        type Error = Status;
        fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
            dst.put(item);
            Ok(())
        }
    }

    impl Decoder for BytesCodec {
        type Item = Bytes;
        type Error = Status;
        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
            let n = src.remaining();
            Ok(Some(src.copy_to_bytes(n)))
        }
    }

    #[tokio::test]
    async fn tonic_s_own_client_calls_a_node() {
        let big = pattern(2 << 20);
        let sent = big.clone();
        let addr = node(move |req| Some(Parts(vec![req, sent.clone()]))).await;
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .expect("address")
            .connect()
            .await
            .expect("connect");
        let mut grpc = tonic::client::Grpc::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        grpc.ready().await.expect("ready");
        let reply = grpc
            .unary(
                tonic::Request::new(Bytes::from_static(b"hello")),
                http::uri::PathAndQuery::from_static(PATH),
                BytesCodec,
            )
            .await
            .expect("call")
            .into_inner();
        assert_eq!(&reply[..5], b"hello");
        assert_eq!(reply.slice(5..), big);
        // A method it does not serve.
        grpc.ready().await.expect("ready");
        let err = grpc
            .unary(
                tonic::Request::new(Bytes::from_static(b"hello")),
                http::uri::PathAndQuery::from_static("/tessera.Node/Other"),
                BytesCodec,
            )
            .await
            .expect_err("no such method");
        assert_eq!(err.code(), Code::Unimplemented);
    }

    /// tonic's own server for `tessera.Node/Call`: echoes, or fails as asked.
    #[derive(Clone)]
    struct TonicNode;

    impl NamedService for TonicNode {
        const NAME: &'static str = SERVICE;
    }

    struct Echo;

    impl tonic::server::UnaryService<Bytes> for Echo {
        type Response = Bytes;
        type Future = futures::future::Ready<Result<tonic::Response<Bytes>, Status>>;
        fn call(&mut self, req: tonic::Request<Bytes>) -> Self::Future {
            let body = req.into_inner();
            futures::future::ready(match &body[..] {
                b"fail" => Err(Status::not_found("no such file: /a b%c ü")),
                _ => Ok(tonic::Response::new(body)),
            })
        }
    }

    impl Service<Request<Body>> for TonicNode {
        type Response = Response<Body>;
        type Error = Infallible;
        type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;
        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, req: Request<Body>) -> Self::Future {
            Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(BytesCodec)
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE);
                Ok(grpc.unary(Echo, req).await)
            })
        }
    }

    #[tokio::test]
    async fn a_node_calls_tonic_s_own_server() {
        let addr = free_addr();
        let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
        tokio::spawn(
            Server::builder()
                .add_service(TonicNode)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        let t = GrpcTransport::new();
        let big = pattern(5 << 20);
        let got = t
            .call(&addr, NODE, big.clone().into(), in_a_second())
            .await
            .expect("call");
        assert_eq!(got, big);
        let got = t
            .call(&addr, NODE, Bytes::new().into(), in_a_second())
            .await
            .expect("call");
        assert!(got.is_empty());
        let err = t
            .call(
                &addr,
                NODE,
                Bytes::from_static(b"fail").into(),
                in_a_second(),
            )
            .await
            .expect_err("fails");
        assert!(
            matches!(&err, RpcError::Unreachable(m) if m.ends_with("no such file: /a b%c ü")),
            "{err:?}"
        );
    }

    /// Sends `data` as the body of a call to `path`, and returns the `grpc-status` it
    /// gets back and whether a message came with it.
    async fn raw(addr: &str, path: &'static str, data: Vec<Bytes>) -> (Code, bool) {
        let mut channel = Endpoint::from_shared(format!("http://{addr}"))
            .expect("address")
            .connect()
            .await
            .expect("connect");
        let mut req = Request::new(Body::new(Pieces {
            pieces: data.into(),
            trailers: None,
        }));
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = http::Uri::from_static(path);
        req.headers_mut().insert(header::CONTENT_TYPE, GRPC);
        poll_fn(|cx| channel.poll_ready(cx)).await.expect("ready");
        let resp = channel.call(req).await.expect("an HTTP answer");
        assert_eq!(resp.status(), StatusCode::OK);
        let (head, mut body) = resp.into_parts();
        if let Some(s) = status_in(&head.headers) {
            return (s.code(), false);
        }
        let (msg, trailers) = match read_message(&mut body, MAX_MESSAGE, None)
            .await
            .expect("body")
        {
            Next::Message(_) => (true, read_trailers(&mut body).await.expect("trailers")),
            Next::End(t) => (false, t),
        };
        let status = trailers
            .as_ref()
            .and_then(status_in)
            .expect("a grpc-status");
        (status.code(), msg)
    }

    fn prefix(compressed: u8, len: u32) -> Bytes {
        let mut b = BytesMut::new();
        b.put_u8(compressed);
        b.put_u32(len);
        b.freeze()
    }

    #[tokio::test]
    async fn malformed_calls_get_an_error_status_and_the_node_keeps_serving() {
        let addr = node(|req| Some(req.into())).await;
        let hello = Bytes::from_static(b"hello");
        let cases: Vec<(&str, &'static str, Vec<Bytes>, Code)> = vec![
            (
                "a proper call",
                PATH,
                vec![prefix(0, 5), hello.clone()],
                Code::Ok,
            ),
            (
                "the prefix in pieces",
                PATH,
                vec![
                    prefix(0, 5).slice(..2),
                    prefix(0, 5).slice(2..),
                    hello.clone(),
                ],
                Code::Ok,
            ),
            (
                "another method",
                "/tessera.Node/Other",
                vec![prefix(0, 5), hello.clone()],
                Code::Unimplemented,
            ),
            (
                "a compressed message",
                PATH,
                vec![prefix(1, 5), hello.clone()],
                Code::Unimplemented,
            ),
            (
                "an oversized message",
                PATH,
                vec![prefix(0, u32::MAX)],
                Code::ResourceExhausted,
            ),
            (
                "a message cut short",
                PATH,
                vec![prefix(0, 100), hello.clone()],
                Code::Internal,
            ),
            (
                "a prefix cut short",
                PATH,
                vec![prefix(0, 5).slice(..3)],
                Code::Internal,
            ),
            (
                "two messages",
                PATH,
                vec![prefix(0, 5), hello.clone(), prefix(0, 0)],
                Code::Unimplemented,
            ),
            ("no message", PATH, vec![], Code::Internal),
        ];
        for (what, path, data, want) in cases {
            let (code, msg) = raw(&addr, path, data).await;
            assert_eq!(code, want, "{what}");
            assert_eq!(msg, want == Code::Ok, "{what}: a message came back");
        }
        let t = GrpcTransport::new();
        let got = t
            .call(&addr, NODE, hello.clone().into(), in_a_second())
            .await
            .expect("call");
        assert_eq!(got, hello);
    }

    /// A request body that sends its pieces and then neither more nor its end: a sender
    /// that stalls.
    struct Stall(VecDeque<Bytes>);

    impl http_body::Body for Stall {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            match self.0.pop_front() {
                Some(p) => Poll::Ready(Some(Ok(Frame::data(p)))),
                None => Poll::Pending,
            }
        }
    }

    async fn connect(addr: &str) -> Channel {
        Endpoint::from_shared(format!("http://{addr}"))
            .expect("address")
            .connect()
            .await
            .expect("connect")
    }

    /// A call on `channel` that sends `data` and stalls; returns the `grpc-status` the
    /// server ends it with.
    async fn stalled_call(mut channel: Channel, data: Vec<Bytes>) -> Code {
        let mut req = Request::new(Body::new(Stall(data.into())));
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = http::Uri::from_static(PATH);
        req.headers_mut().insert(header::CONTENT_TYPE, GRPC);
        poll_fn(|cx| channel.poll_ready(cx)).await.expect("ready");
        let resp = match channel.call(req).await {
            Ok(resp) => resp,
            // A call over the connection's limit of streams, sent before the client
            // learned the limit, is refused by HTTP/2 itself.
            Err(e) if format!("{e:?}").contains("REFUSED_STREAM") => return Code::Unavailable,
            Err(e) => panic!("no HTTP answer: {e:?}"),
        };
        let (head, mut body) = resp.into_parts();
        if let Some(s) = status_in(&head.headers) {
            return s.code();
        }
        let trailers = read_trailers(&mut body).await.expect("trailers");
        trailers
            .as_ref()
            .and_then(status_in)
            .expect("a grpc-status")
            .code()
    }

    /// Waits for `cond`, for at most `limit`.
    async fn eventually(limit: Duration, what: &str, cond: impl Fn() -> bool) {
        let start = std::time::Instant::now();
        while !cond() {
            assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A call that is retried while the node says it is busy, for at most `limit`.
    async fn call_until_served(t: &GrpcTransport, addr: &str, body: Bytes, limit: Duration) {
        let start = std::time::Instant::now();
        loop {
            match t.call(addr, NODE, body.clone().into(), in_a_second()).await {
                Ok(got) => {
                    assert_eq!(got, body);
                    return;
                }
                Err(e) => assert!(
                    start.elapsed() < limit,
                    "not served within {limit:?}: {e:?}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_of_stalled_and_oversized_calls_stays_within_the_limits() {
        let limits = ServerLimits {
            max_connections: 8,
            max_streams: 8,
            request_bytes: MAX_MESSAGE,
            receive_timeout: Duration::from_secs(2),
            ..ServerLimits::default()
        };
        let server = GrpcTransport::with_limits(limits.clone());
        let addr = node_on(&server, |req| Some(req.into())).await;
        // A normal client, connected before the flood.
        let client = GrpcTransport::new();
        let hello = Bytes::from_static(b"hello");
        call_until_served(&client, &addr, hello.clone(), Duration::from_secs(5)).await;
        // Stalled senders: 4 connections of 16 calls, each declaring a message of the
        // largest size and sending 3 MiB of it, 192 MiB in all (three times the budget);
        // and on each connection a call declaring a message over the limit.
        let piece = pattern(3 << 20);
        let mut stalled = Vec::new();
        let mut oversized = Vec::new();
        let mut attackers = Vec::new();
        for _ in 0..4 {
            let channel = connect(&addr).await;
            for _ in 0..16 {
                let data = vec![prefix(0, MAX_MESSAGE as u32), piece.clone()];
                stalled.push(tokio::spawn(stalled_call(channel.clone(), data)));
            }
            let data = vec![prefix(0, MAX_MESSAGE as u32 + 1)];
            oversized.push(tokio::spawn(stalled_call(channel.clone(), data)));
            attackers.push(channel);
        }
        // Connections that never speak, beyond the limit.
        let mut idle = Vec::new();
        for _ in 0..10 {
            idle.push(tokio::net::TcpStream::connect(&addr).await.expect("tcp"));
        }
        let held = || server.request_bytes_held();
        eventually(Duration::from_secs(20), "the flood arrives", || {
            held().0 >= 48 << 20
        })
        .await;
        // The normal client is served while the flood goes on (or is cut off).
        for body in [hello.clone(), pattern(1 << 20)] {
            call_until_served(&client, &addr, body, Duration::from_secs(20)).await;
        }
        let peak_below_budget = || {
            let (_, peak) = held();
            // A reply is counted whatever the limit, so the 1 MiB echo may pass it.
            assert!(
                peak <= limits.request_bytes + (1 << 20),
                "held {peak} bytes at once, over the limit of {} and one reply",
                limits.request_bytes
            );
        };
        peak_below_budget();
        assert!(
            server.connections() <= limits.max_connections,
            "{} connections served",
            server.connections()
        );
        // Every stalled call is cut off (or refused) and the bytes it sent are freed,
        // though its sender is still connected.
        for call in oversized {
            let code = tokio::time::timeout(Duration::from_secs(30), call)
                .await
                .expect("an oversized call is refused")
                .expect("task");
            // Refused as too large, or as one stream too many on its connection.
            assert!(
                matches!(code, Code::ResourceExhausted | Code::Unavailable),
                "{code:?}"
            );
        }
        for call in stalled {
            let code = tokio::time::timeout(Duration::from_secs(30), call)
                .await
                .expect("a stalled call is cut off")
                .expect("task");
            assert!(
                matches!(code, Code::Unavailable | Code::DeadlineExceeded),
                "{code:?}"
            );
        }
        eventually(Duration::from_secs(10), "the held bytes are freed", || {
            held().0 == 0
        })
        .await;
        peak_below_budget();
        drop((attackers, idle));
        call_until_served(&client, &addr, hello, Duration::from_secs(5)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn silent_connections_are_closed_and_live_idle_ones_kept() {
        let limits = ServerLimits {
            max_connections: 4,
            max_streams: 8,
            request_bytes: MAX_MESSAGE,
            receive_timeout: Duration::from_secs(1),
            ..ServerLimits::default()
        };
        let server = GrpcTransport::with_limits(limits.clone());
        let addr = node_on(&server, |req| Some(req.into())).await;
        // Connections that never send a byte, as many as the server serves.
        let mut silent = Vec::new();
        for _ in 0..limits.max_connections {
            silent.push(tokio::net::TcpStream::connect(&addr).await.expect("tcp"));
        }
        eventually(Duration::from_secs(5), "every slot is taken", || {
            server.connections() == limits.max_connections
        })
        .await;
        // The server closes each of them once it has been silent too long.
        for mut conn in silent {
            use tokio::io::AsyncReadExt;
            let mut buf = vec![0; 1024];
            let closed = tokio::time::timeout(Duration::from_secs(5), async {
                // The server's own preface may come first; then the end.
                loop {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            })
            .await;
            assert!(closed.is_ok(), "a silent connection was kept");
        }
        // A new client is served in the freed slots.
        let client = GrpcTransport::new();
        let hello = Bytes::from_static(b"hello");
        call_until_served(&client, &addr, hello.clone(), Duration::from_secs(5)).await;
        // Live clients that make no calls for several times the allowed silence keep
        // their connections: they answer the server's pings.
        let idle = connect(&addr).await;
        // The client's and the idle one's; any other attempt is closed or gone by now.
        eventually(Duration::from_secs(5), "two live connections", || {
            server.connections() == 2
        })
        .await;
        tokio::time::sleep(4 * limits.receive_timeout).await;
        assert_eq!(server.connections(), 2, "an idle client was cut off");
        let got = client
            .call(&addr, NODE, hello.clone().into(), in_a_second())
            .await
            .expect("call");
        assert_eq!(got, hello);
        drop(idle);
    }

    /// Credentials in `dir` from one authority: `who` for each label.
    fn issued(dir: &std::path::Path, who: &[Caller]) -> Vec<Credentials> {
        let ca = dir.join("ca");
        crate::tls::init_ca(&ca, "test").expect("authority");
        who.iter()
            .enumerate()
            .map(|(i, c)| {
                let out = dir.join(format!("c{i}"));
                crate::tls::issue(&ca, c, 1, &out).expect("issue");
                Credentials::load(&out).expect("load")
            })
            .collect()
    }

    fn user(name: &str) -> Caller {
        Caller::Client {
            user: name.into(),
            groups: vec![],
        }
    }

    /// One caller holds at most `max_per_caller` connections on a secured server, so
    /// it cannot take the slots every other caller needs; a connection it gives up is
    /// its own to make again. A connection that carries no call for `idle_timeout` is
    /// closed though it answers pings, and one in use is kept.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_caller_holds_few_connections_and_an_idle_one_is_closed() {
        let d = tempfile::tempdir().unwrap();
        let creds = issued(
            d.path(),
            &[Caller::Master { replica: 1 }, user("alice"), user("bob")],
        );
        let limits = ServerLimits {
            max_connections: 16,
            max_per_caller: 2,
            receive_timeout: Duration::from_millis(600),
            idle_timeout: Duration::from_secs(2),
            ..ServerLimits::default()
        };
        let server = GrpcTransport::secured(limits, &creds[0]).unwrap();
        let addr = node_on(&server, |req| Some(req.into())).await;
        let hello = Bytes::from_static(b"hello");
        let alice = GrpcTransport::secured(Default::default(), &creds[1]).unwrap();
        let bob = GrpcTransport::secured(Default::default(), &creds[2]).unwrap();
        // Each fresh transport is a connection of its own, as a process of its own.
        let alices: Vec<GrpcTransport> = (0..3).map(|_| alice.fresh()).collect();
        for a in &alices[..2] {
            let got = a
                .call(&addr, NODE, hello.clone().into(), in_a_second())
                .await;
            assert_eq!(got.expect("alice's first two"), hello);
        }
        let third = alices[2]
            .call(&addr, NODE, hello.clone().into(), in_a_second())
            .await;
        assert!(third.is_err(), "a third connection of alice's was served");
        eventually(Duration::from_secs(2), "alice's two connections", || {
            server.connections() == 2
        })
        .await;
        let got = bob
            .call(&addr, NODE, hello.clone().into(), in_a_second())
            .await;
        assert_eq!(got.expect("bob is served beside alice"), hello);
        // Alice's first two carry no more calls: closed after the idle timeout, while
        // bob's, in use, is kept.
        let busy = async {
            for _ in 0..16 {
                tokio::time::sleep(Duration::from_millis(250)).await;
                bob.call(&addr, NODE, hello.clone().into(), in_a_second())
                    .await
                    .expect("bob's calls go on");
            }
        };
        busy.await;
        assert_eq!(server.connections(), 1, "only bob's connection is left");
        // With alice's two gone, her third is served.
        call_until_served(&alices[2], &addr, hello.clone(), Duration::from_secs(5)).await;
    }

    /// A caller reaches only the kind of server it means: a chunkserver's certificate
    /// cannot answer a call meant for a master (a heartbeat's reply carries orders),
    /// nor a master's one meant for a chunkserver; a user's certificate serves neither.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_must_hold_the_certificate_of_the_role_it_is_called_as() {
        let d = tempfile::tempdir().unwrap();
        let creds = issued(
            d.path(),
            &[
                Caller::Master { replica: 1 },
                Caller::Chunkserver { name: "cs1".into() },
                user("alice"),
            ],
        );
        let hello = Bytes::from_static(b"hello");
        let alice = GrpcTransport::secured(Default::default(), &creds[2]).unwrap();
        for (i, serves) in [(0, ServerRole::Master), (1, ServerRole::Chunkserver)] {
            let server = GrpcTransport::secured(Default::default(), &creds[i]).unwrap();
            let addr = node_on(&server, |req| Some(req.into())).await;
            let got = alice
                .call(&addr, serves, hello.clone().into(), in_a_second())
                .await;
            assert_eq!(got.expect("called as what it is"), hello);
            let other = match serves {
                ServerRole::Master => ServerRole::Chunkserver,
                ServerRole::Chunkserver => ServerRole::Master,
            };
            let got = alice
                .call(&addr, other, hello.clone().into(), in_a_second())
                .await;
            assert!(got.is_err(), "a {serves:?} answered as a {other:?}");
        }
        // A user's certificate names no server at all: served, it is refused as either.
        let server = GrpcTransport::secured(Default::default(), &creds[2]).unwrap();
        let addr = node_on(&server, |req| Some(req.into())).await;
        for role in [ServerRole::Master, ServerRole::Chunkserver] {
            let got = alice
                .call(&addr, role, hello.clone().into(), in_a_second())
                .await;
            assert!(got.is_err(), "a user's certificate answered as a {role:?}");
        }
    }

    /// A peer that opens connections and never starts its TLS handshake (it needs no
    /// certificate to do so) holds at most `MAX_HANDSHAKES_PER_ADDRESS` slots, each for
    /// no longer than a connection may stay silent; the rest of its connections are
    /// closed at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stalled_handshakes_hold_few_slots_and_not_for_long() {
        let d = tempfile::tempdir().unwrap();
        let creds = issued(d.path(), &[Caller::Master { replica: 1 }, user("alice")]);
        let limits = ServerLimits {
            // Past twice the handshakes one address may have, which are half the slots.
            max_connections: 2 * MAX_HANDSHAKES_PER_ADDRESS + 32,
            receive_timeout: Duration::from_secs(2),
            ..ServerLimits::default()
        };
        let server = GrpcTransport::secured(limits, &creds[0]).unwrap();
        let addr = node_on(&server, |req| Some(req.into())).await;
        let mut stalled = Vec::new();
        for _ in 0..MAX_HANDSHAKES_PER_ADDRESS + 16 {
            stalled.push(tokio::net::TcpStream::connect(&addr).await.expect("tcp"));
        }
        eventually(
            Duration::from_secs(2),
            "the stalled handshakes are counted",
            || server.connections() == MAX_HANDSHAKES_PER_ADDRESS,
        )
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            server.connections(),
            MAX_HANDSHAKES_PER_ADDRESS,
            "more handshakes from one address were kept"
        );
        // Past the handshake's time every one is closed, and a real caller is served.
        eventually(
            Duration::from_secs(5),
            "the stalled handshakes are closed",
            || server.connections() == 0,
        )
        .await;
        let alice = GrpcTransport::secured(Default::default(), &creds[1]).unwrap();
        let hello = Bytes::from_static(b"hello");
        call_until_served(&alice, &addr, hello, Duration::from_secs(5)).await;
        drop(stalled);
    }

    /// Peers stalling in handshakes from many addresses, each within its own bound, hold
    /// no more than half the connection slots between them (a new handshake ends the
    /// oldest): a real caller is served while they stall. And an IPv6 host's handshakes
    /// count as its /64's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stalled_handshakes_from_many_addresses_leave_slots_for_callers() {
        let d = tempfile::tempdir().unwrap();
        let creds = issued(d.path(), &[Caller::Master { replica: 1 }, user("alice")]);
        let limits = ServerLimits {
            max_connections: 40,
            receive_timeout: Duration::from_secs(20),
            ..ServerLimits::default()
        };
        let server = GrpcTransport::secured(limits, &creds[0]).unwrap();
        let addr = node_on(&server, |req| Some(req.into())).await;
        let to: std::net::SocketAddr = addr.parse().unwrap();
        let mut stalled = Vec::new();
        for from in 2..8u8 {
            for _ in 0..8 {
                let sock = tokio::net::TcpSocket::new_v4().unwrap();
                sock.bind(std::net::SocketAddr::from(([127, 0, 0, from], 0)))
                    .unwrap();
                stalled.push(sock.connect(to).await.expect("tcp"));
            }
        }
        eventually(
            Duration::from_secs(2),
            "the stalled handshakes are counted",
            || server.connections() == 20,
        )
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(server.connections(), 20, "more handshakes were kept");
        // Well before any stalled handshake times out.
        let alice = GrpcTransport::secured(Default::default(), &creds[1]).unwrap();
        let hello = Bytes::from_static(b"hello");
        call_until_served(&alice, &addr, hello, Duration::from_secs(5)).await;
        drop(stalled);
        let v6 = |s: &str| handshake_key(s.parse().unwrap());
        assert_eq!(v6("2001:db8:1:2::1"), v6("2001:db8:1:2:ffff::9"));
        assert_ne!(v6("2001:db8:1:2::1"), v6("2001:db8:1:3::1"));
        assert_eq!(v6("::ffff:10.0.0.1"), v6("10.0.0.1"));
        assert_ne!(v6("10.0.0.1"), v6("10.0.0.2"));
    }

    /// A call on `channel` whose reply's headers are awaited and its body left unread.
    async fn unread_reply(mut channel: Channel) -> Option<http::Response<Body>> {
        let msg = Parts::from(Bytes::from_static(b"read"));
        let mut req = Request::new(Body::new(Pieces::message(msg, None)));
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = http::Uri::from_static(PATH);
        req.headers_mut().insert(header::CONTENT_TYPE, GRPC);
        poll_fn(|cx| channel.poll_ready(cx)).await.expect("ready");
        let resp = channel.call(req).await.ok()?;
        // Refused at once: the status is in the headers.
        if status_in(resp.headers()).is_some() {
            return None;
        }
        Some(resp)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replies_nobody_reads_hold_the_budget_until_they_go() {
        let limits = ServerLimits {
            max_connections: 8,
            max_streams: 32,
            request_bytes: MAX_MESSAGE,
            receive_timeout: Duration::from_secs(10),
            ..ServerLimits::default()
        };
        let server = GrpcTransport::with_limits(limits.clone());
        let reply = pattern(8 << 20);
        let answer = reply.clone();
        let addr = node_on(&server, move |_| Some(answer.clone().into())).await;
        let client = GrpcTransport::new();
        let hello = Bytes::from_static(b"hello");
        let got = client
            .call(&addr, NODE, hello.clone().into(), in_a_second())
            .await
            .expect("call");
        assert_eq!(got, reply);
        // A reader that asks for 12 replies of 8 MiB (one and a half budgets) and reads
        // none: its window lets a little of each out, and the rest waits in the server.
        let reader = connect(&addr).await;
        let mut unread = Vec::new();
        for _ in 0..12 {
            unread.extend(unread_reply(reader.clone()).await);
        }
        let held = || server.request_bytes_held();
        eventually(
            Duration::from_secs(10),
            "the unread replies are counted",
            || held().0 >= limits.request_bytes - (8 << 20),
        )
        .await;
        assert!(
            unread.len() < 12,
            "every call was taken while unread replies held the budget"
        );
        // While they are held, new requests are refused rather than buffered.
        let refused = client
            .call(&addr, NODE, pattern(16 << 20).into(), in_a_second())
            .await;
        assert!(refused.is_err(), "a request passed the budget");
        assert!(
            held().1 <= limits.request_bytes + (8 << 20),
            "held {} bytes, more than the budget and one reply",
            held().1
        );
        // The reader goes away: what its replies held is freed, and others are served.
        drop((unread, reader));
        eventually(
            Duration::from_secs(10),
            "the unread replies are freed",
            || held().0 == 0,
        )
        .await;
        let got = client
            .call(&addr, NODE, hello.into(), in_a_second())
            .await
            .expect("served again");
        assert_eq!(got, reply);
    }

    #[test]
    fn grpc_timeouts_and_messages_are_spelled_as_the_protocol_says() {
        assert_eq!(grpc_timeout(Duration::from_millis(1500)), "1500000u");
        assert_eq!(grpc_timeout(Duration::from_secs(200)), "200000m");
        assert_eq!(grpc_timeout(Duration::from_secs(200_000)), "200000S");
        assert_eq!(grpc_timeout(Duration::from_secs(u64::MAX)), "99999999H");
        assert_eq!(percent_decode(b"a%20b%C3%BC%zz%2"), "a bü%zz%2");
    }
}
