//! `Transport` over madsim's simulated network. A call binds an ephemeral endpoint,
//! sends (reply tag, body) to the server's address and waits for the reply tag until the
//! deadline; madsim supplies latency, loss, clogging (partitions) and node death. Bodies
//! stay prost-encoded bytes, exactly as on the wire.

use std::future::Future;
use std::net::SocketAddr;

use futures::SinkExt;
use futures::channel::{mpsc, oneshot};
use madsim::net::Endpoint;
use tessera_core::error::RpcError;
use tessera_core::runtime::{Incoming, Parts, Runtime, Transport};
use tessera_core::types::Time;

use crate::runtime::SimRuntime;

const REQUEST_TAG: u64 = 0x7e55_e2a0;
/// Largest message either side accepts, as a real transport would bound it.
pub const MAX_MESSAGE: usize = 80 << 20;

#[derive(Clone)]
pub struct SimNet {
    rt: SimRuntime,
}

impl SimNet {
    pub fn new(rt: SimRuntime) -> SimNet {
        SimNet { rt }
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
        body: Parts,
        deadline: Time,
    ) -> impl Future<Output = Result<Parts, RpcError>> + Send {
        let rt = self.rt.clone();
        let to = to.to_string();
        async move {
            if body.len() > MAX_MESSAGE {
                return Err(RpcError::TooLarge(body.len()));
            }
            let dst = parse(&to)?;
            let timeout = deadline.saturating_sub(rt.now());
            let attempt = async {
                let ep = Endpoint::bind("0.0.0.0:0")
                    .await
                    .map_err(|e| RpcError::Unreachable(format!("{to}: {e}")))?;
                let tag: u64 = madsim::rand::random();
                ep.send_to_raw(dst, REQUEST_TAG, Box::new((tag, body)))
                    .await
                    .map_err(|e| RpcError::Unreachable(format!("{to}: {e}")))?;
                let (payload, _) = ep
                    .recv_from_raw(tag)
                    .await
                    .map_err(|e| RpcError::Unreachable(format!("{to}: {e}")))?;
                payload
                    .downcast::<Parts>()
                    .map(|b| *b)
                    .map_err(|_| RpcError::Decode(format!("reply from {to} is not a message")))
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
                    let Ok(msg) = payload.downcast::<(u64, Parts)>() else {
                        continue;
                    };
                    let (tag, body) = *msg;
                    let (reply, reply_rx) = oneshot::channel();
                    let arrived = rt.now();
                    if tx
                        .send(Incoming {
                            body,
                            arrived,
                            reply,
                        })
                        .await
                        .is_err()
                    {
                        return;
                    }
                    let ep = ep.clone();
                    madsim::task::spawn(async move {
                        if let Ok(parts) = reply_rx.await {
                            // A lost reply is the caller's deadline to find.
                            let _ = ep.send_to_raw(from, tag, Box::new(parts)).await;
                        }
                    });
                }
            });
            Ok(rx)
        }
    }
}
