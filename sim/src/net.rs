//! `Transport` over madsim's simulated network. A call binds an ephemeral endpoint,
//! sends (reply tag, body) to the server's address and waits for the reply tag until the
//! deadline; madsim supplies latency, loss, clogging (partitions) and node death. Bodies
//! stay prost-encoded bytes, exactly as on the wire.
//!
//! Above madsim, [`NetFaults`] adds what it lacks: a request delivered twice (the second
//! copy later, as a retransmission that crossed the first's reply), and a link that holds
//! a request, or a reply, for up to seconds and then delivers it (a clogged link that
//! delivers late rather than dropping). Replies matter as much as requests: a master
//! replica's answers carry its raft messages back to the caller, and a heartbeat's reply
//! carries the master's orders. Everything held arrives before the caller's deadline, but
//! for requests to chunkservers, some of which arrive after their caller gave up: a
//! client's write or append that lands after its writer moved on (`late_request`), a
//! master's order (a grant, a clone) that lands after the master counted it failed
//! (`late_order`), a chunkserver's forwarded mutation or read that lands after its
//! sender gave up (`late_forward`), up to [`MAX_LATE`] late, the bound the master is
//! configured with.
//! (A reply sent twice would be no fault: the caller takes the first with its tag.)

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::SinkExt;
use futures::channel::{mpsc, oneshot};
use madsim::net::Endpoint;
use tessera_core::auth::{Caller, ServerRole};
use tessera_core::error::RpcError;
use tessera_core::runtime::{Incoming, Parts, Runtime, Transport};
use tessera_core::types::Time;

use crate::check::Shared;
use crate::runtime::SimRuntime;

const REQUEST_TAG: u64 = 0x7e55_e2a0;
/// Largest message either side accepts: the real transport's bound.
pub use tessera_core::wire::MAX_MESSAGE;

/// The longest a clogged link holds a request or a reply before it delivers it, within
/// its caller's deadline.
pub const MAX_DELAY: Duration = Duration::from_secs(4);

/// How long past its caller's deadline a request to a chunkserver may arrive (a
/// retransmission after its caller gave up, on a link that healed): the data path must
/// survive a write or an append that lands after its writer moved on, and the master
/// an order it gave up on (its `MasterConfig::late_delivery` is set to this bound).
pub const MAX_LATE: Duration = Duration::from_secs(3);

/// Whether `to` is a chunkserver: a call to one may arrive after its caller's deadline.
fn to_chunkserver(to: &SocketAddr) -> bool {
    matches!(to.ip(), std::net::IpAddr::V4(ip) if ip.octets()[2] == crate::cluster::CHUNKSERVER_NET)
}

/// The network faults madsim does not have, set by the fault scheduler and shared by every
/// node's transport. Each counts in the run's summary when it happens: `duplicate` when a
/// second copy is sent, `long_delay` when a request held for at least half a second is
/// delivered, `late_reply` when a caller takes a reply held that long (one it no longer
/// waits for changed nothing).
#[derive(Clone, Default)]
pub struct NetFaults(Arc<Mutex<NetFaultState>>);

#[derive(Default)]
struct NetFaultState {
    /// Of every thousand requests, how many are delivered twice.
    duplicate_permille: u64,
    /// Of every thousand requests, and of every thousand replies, how many a clogged link
    /// holds for up to [`MAX_DELAY`] (and at most until shortly before the caller's
    /// deadline).
    delay_permille: u64,
    checks: Option<Shared>,
}

impl NetFaults {
    pub fn new(checks: Shared) -> NetFaults {
        NetFaults(Arc::new(Mutex::new(NetFaultState {
            checks: Some(checks),
            ..NetFaultState::default()
        })))
    }

    /// Sets how many requests in a thousand are duplicated, and how many requests and
    /// replies in a thousand are held back (0, 0: none).
    pub fn set(&self, duplicate_permille: u64, delay_permille: u64) {
        let mut s = self.0.lock().expect("net faults");
        s.duplicate_permille = duplicate_permille;
        s.delay_permille = delay_permille;
    }

    /// For one request with `within` left before its caller's deadline: how long to hold
    /// it, and whether (and how much later than that) to send it again. Both copies
    /// arrive with time to spare before the deadline (madsim's own latency comes on top),
    /// except that with `late`, a third of the requests held are held past it, by up to
    /// [`MAX_LATE`].
    fn draw(&self, within: Duration, late: bool) -> (Duration, Option<Duration>) {
        let s = self.0.lock().expect("net faults");
        if s.duplicate_permille == 0 && s.delay_permille == 0 {
            return (Duration::ZERO, None);
        }
        let room = room(within);
        let mut hold = held(s.delay_permille, room);
        if late && !hold.is_zero() && random(3) == 0 {
            hold = within + Duration::from_millis(random(MAX_LATE.as_millis() as u64 + 1));
            return (hold, None);
        }
        let left = room.saturating_sub(hold);
        let again = (random(1000) < s.duplicate_permille)
            .then(|| Duration::from_millis(random(left.as_millis() as u64 + 1)));
        (hold, again)
    }

    /// How long to hold one reply, with `within` left before its caller's deadline: it
    /// arrives with time to spare, as a held request does.
    fn draw_reply(&self, within: Duration) -> Duration {
        let permille = self.0.lock().expect("net faults").delay_permille;
        if permille == 0 {
            return Duration::ZERO;
        }
        held(permille, room(within))
    }

    fn violation(&self, true_ms: i64, what: String) {
        let checks = self.0.lock().expect("net faults").checks.clone();
        if let Some(c) = checks {
            c.lock().expect("checks").violation(true_ms, what);
        }
    }

    fn count(&self, kind: &'static str) {
        let checks = self.0.lock().expect("net faults").checks.clone();
        if let Some(c) = checks {
            c.lock().expect("checks").fault(kind, 1);
        }
    }
}

fn random(n: u64) -> u64 {
    madsim::rand::random::<u64>() % n
}

/// How long a message with `within` left before its caller's deadline may be held: it
/// arrives with time to spare (madsim's own latency comes on top).
fn room(within: Duration) -> Duration {
    (within.saturating_sub(Duration::from_millis(200)) * 3 / 4).min(MAX_DELAY)
}

/// A draw of how long to hold one message, `permille` of them for up to `room`.
fn held(permille: u64, room: Duration) -> Duration {
    if random(1000) < permille {
        Duration::from_millis(random(room.as_millis() as u64 + 1))
    } else {
        Duration::ZERO
    }
}

#[derive(Clone)]
pub struct SimNet {
    rt: SimRuntime,
    faults: NetFaults,
    /// Whether this node's calls to chunkservers may arrive after it gave up on them,
    /// counted under this name.
    late: Option<&'static str>,
    /// Who this node's certificate says it is: every request it sends arrives named so,
    /// as a secured transport names it (`tessera_core::auth`).
    me: Caller,
}

impl SimNet {
    pub fn new(rt: SimRuntime, faults: NetFaults, me: Caller) -> SimNet {
        SimNet {
            rt,
            faults,
            late: None,
            me,
        }
    }

    /// The transport of a node whose calls to chunkservers may arrive after it gave up
    /// on them, counted as `kind`: a client's writes and appends (`late_request`), a
    /// master's orders (`late_order`), a chunkserver's forwarded mutations and clone or
    /// mend reads (`late_forward`).
    pub fn late_to_chunkservers(
        rt: SimRuntime,
        faults: NetFaults,
        kind: &'static str,
        me: Caller,
    ) -> SimNet {
        SimNet {
            rt,
            faults,
            late: Some(kind),
            me,
        }
    }
}

fn parse(addr: &str) -> Result<SocketAddr, RpcError> {
    addr.parse()
        .map_err(|_| RpcError::Unreachable(format!("{addr} (not an address)")))
}

impl Transport for SimNet {
    /// Messages cross the simulated wire in the pieces they were sent in, so the
    /// receivers decode them from pieces, as over gRPC.
    fn call_parts(
        &self,
        to: &str,
        server: ServerRole,
        body: Parts,
        deadline: Time,
    ) -> impl Future<Output = Result<Parts, RpcError>> + Send {
        let rt = self.rt.clone();
        let faults = self.faults.clone();
        let to = to.to_string();
        let late = self.late;
        let me = self.me.clone();
        async move {
            if body.len() > MAX_MESSAGE {
                return Err(RpcError::TooLarge(body.len()));
            }
            let dst = parse(&to)?;
            // The real transport checks the server's certificate names the role the
            // caller means to reach: a caller that means the wrong kind fails the same.
            // No node means to call a server of another kind: one that did is a bug
            // the real transport would turn into a cluster that never works.
            if to_chunkserver(&dst) != (server == ServerRole::Chunkserver) {
                let what = format!(
                    "{me:?} called {to} as a {}, which it is not",
                    server.role().name()
                );
                faults.violation(rt.true_ms(), what);
                return Err(RpcError::Unreachable(format!(
                    "{to}: its certificate is not a {}'s",
                    server.role().name()
                )));
            }
            let timeout = deadline.saturating_sub(rt.now());
            // When the caller gives up, in true time (a server's clock may be skewed).
            let expires = madsim::time::Instant::now() + timeout;
            let attempt = async {
                let ep = Endpoint::bind("0.0.0.0:0")
                    .await
                    .map_err(|e| RpcError::Unreachable(format!("{to}: {e}")))?;
                let tag: u64 = madsim::rand::random();
                let late = late.filter(|_| to_chunkserver(&dst));
                let (hold, again) = faults.draw(timeout, late.is_some());
                if let Some(later) = again {
                    // The copy goes from a task of its own: it is sent even if the
                    // caller has its answer (or gave up) by then.
                    let (ep, body, faults, me) =
                        (ep.clone(), body.clone(), faults.clone(), me.clone());
                    madsim::task::spawn(async move {
                        madsim::time::sleep(hold + later).await;
                        faults.count("duplicate");
                        let _ = ep
                            .send_to_raw(dst, REQUEST_TAG, Box::new((tag, expires, body, me)))
                            .await;
                    });
                }
                if hold.is_zero() {
                    ep.send_to_raw(dst, REQUEST_TAG, Box::new((tag, expires, body, me)))
                        .await
                        .map_err(|e| RpcError::Unreachable(format!("{to}: {e}")))?;
                } else {
                    // Held on a clogged link: delivered late, whether or not the caller
                    // is still waiting.
                    let (ep, faults) = (ep.clone(), faults.clone());
                    madsim::task::spawn(async move {
                        madsim::time::sleep(hold).await;
                        if let Some(kind) = late.filter(|_| hold >= timeout) {
                            faults.count(kind);
                        } else if hold >= Duration::from_millis(500) {
                            faults.count("long_delay");
                        }
                        let _ = ep
                            .send_to_raw(dst, REQUEST_TAG, Box::new((tag, expires, body, me)))
                            .await;
                    });
                }
                let (payload, _) = ep
                    .recv_from_raw(tag)
                    .await
                    .map_err(|e| RpcError::Unreachable(format!("{to}: {e}")))?;
                let (parts, held) = *payload
                    .downcast::<(Parts, bool)>()
                    .map_err(|_| RpcError::Decode(format!("reply from {to} is not a message")))?;
                if held {
                    faults.count("late_reply");
                }
                Ok(parts)
            };
            match madsim::time::timeout(timeout, attempt).await {
                Ok(r) => r,
                Err(_) => Err(RpcError::Deadline(to)),
            }
        }
    }

    fn listen(
        &self,
        addr: &str,
    ) -> impl Future<Output = Result<mpsc::Receiver<Incoming>, RpcError>> + Send {
        let addr = addr.to_string();
        let rt = self.rt.clone();
        let faults = self.faults.clone();
        async move {
            let ep = Endpoint::bind(parse(&addr)?)
                .await
                .map_err(|e| RpcError::Unreachable(format!("bind {addr}: {e}")))?;
            let (mut tx, rx) = mpsc::channel(1024);
            madsim::task::spawn(async move {
                loop {
                    let Ok((payload, from)) = ep.recv_from_raw(REQUEST_TAG).await else {
                        return;
                    };
                    let Ok(msg) = payload.downcast::<(u64, madsim::time::Instant, Parts, Caller)>()
                    else {
                        continue;
                    };
                    let (tag, expires, body, from_cert) = *msg;
                    let (reply, reply_rx) = oneshot::channel();
                    let arrived = rt.now();
                    if tx
                        .send(Incoming {
                            body,
                            arrived,
                            peer: from.to_string(),
                            from: from_cert,
                            reply,
                        })
                        .await
                        .is_err()
                    {
                        return;
                    }
                    let (ep, faults) = (ep.clone(), faults.clone());
                    madsim::task::spawn(async move {
                        if let Ok(parts) = reply_rx.await {
                            let left =
                                expires.saturating_duration_since(madsim::time::Instant::now());
                            let hold = faults.draw_reply(left);
                            if !hold.is_zero() {
                                madsim::time::sleep(hold).await;
                            }
                            // Counted by the caller, if it still waits for it.
                            let held = hold >= Duration::from_millis(500);
                            // A lost reply is the caller's deadline to find.
                            let _ = ep.send_to_raw(from, tag, Box::new((parts, held))).await;
                        }
                    });
                }
            });
            Ok(rx)
        }
    }
}
