//! `Transport` on tonic gRPC over HTTP/2.
//!
//! Every node serves one method, `tessera.Node/Call`, carrying the prost-encoded request
//! and reply envelopes as they are. Channels to each address are made once and reused
//! (HTTP/2 multiplexes calls over one connection); every call carries its deadline to
//! the server (`grpc-timeout`) and is abandoned locally when it passes. Message sizes are
//! bounded both ways: bulk data moves in pieces (pushes, piecewise reads and clones), so
//! no message needs to be large.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::SinkExt;
use futures::channel::{mpsc, oneshot};
use tessera_core::error::RpcError;
use tessera_core::runtime::{Incoming, Parts, Runtime, Transport};
use tessera_core::types::Time;
use tonic::transport::{Channel, Endpoint, Server};

use crate::rt::TokioRuntime;

#[allow(clippy::all, missing_docs, unreachable_pub)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/tessera.Node.rs"));
}

use generated::node_client::NodeClient;
use generated::node_server::{Node, NodeServer};

/// The largest message either way. Pieces of data are at most a few MiB.
pub const MAX_MESSAGE: usize = 64 << 20;

/// HTTP/2 flow control: how much a stream, and a whole connection, may have in flight
/// before the receiver must grant more. hyper's defaults (1-2 MiB per stream) make an
/// 8 MiB read wait for several window updates; on loopback and in a rack the
/// round trip is short but the wake-ups are not. A stream may carry a whole piece.
const STREAM_WINDOW: u32 = 16 << 20;
const CONNECTION_WINDOW: u32 = 64 << 20;
/// Larger DATA frames, both ways: fewer frame headers and wake-ups per MiB (the
/// protocol's limit is 16 MiB - 1; the default is 16 KiB).
const MAX_FRAME: u32 = 1 << 20;

#[derive(Clone)]
pub struct GrpcTransport {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    connect_timeout: Duration,
}

impl Default for GrpcTransport {
    fn default() -> Self {
        GrpcTransport::new()
    }
}

impl GrpcTransport {
    pub fn new() -> GrpcTransport {
        GrpcTransport {
            channels: Arc::default(),
            connect_timeout: Duration::from_secs(3),
        }
    }

    fn channel(&self, to: &str) -> Result<Channel, RpcError> {
        let mut channels = self.channels.lock().expect("channel cache");
        if let Some(c) = channels.get(to) {
            return Ok(c.clone());
        }
        let endpoint = Endpoint::from_shared(format!("http://{to}"))
            .map_err(|e| RpcError::Unreachable(format!("{to}: bad address: {e}")))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_frame_size(MAX_FRAME)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(20));
        // Connects on first use, and reconnects after a failure, by itself.
        let channel = endpoint.connect_lazy();
        channels.insert(to.to_string(), channel.clone());
        Ok(channel)
    }
}

impl Transport for GrpcTransport {
    fn call(
        &self,
        to: &str,
        body: Bytes,
        deadline: Time,
    ) -> impl Future<Output = Result<Bytes, RpcError>> + Send {
        let to = to.to_string();
        let channel = self.channel(&to);
        async move {
            let left = deadline.saturating_sub(TokioRuntime.now());
            if left.is_zero() {
                return Err(RpcError::Deadline(to));
            }
            let mut client = NodeClient::new(channel?)
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE);
            let mut req = tonic::Request::new(Parts::from(body));
            req.set_timeout(left);
            match tokio::time::timeout(left, client.call(req)).await {
                Err(_) => Err(RpcError::Deadline(to)),
                Ok(Ok(resp)) => Ok(resp.into_inner().concat()),
                Ok(Err(status)) => Err(match status.code() {
                    tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                        RpcError::Deadline(to)
                    }
                    tonic::Code::ResourceExhausted | tonic::Code::OutOfRange => {
                        RpcError::TooLarge(0)
                    }
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
        async move {
            let sock: SocketAddr = tokio::net::lookup_host(&addr)
                .await
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| RpcError::Unreachable(format!("cannot resolve {addr}")))?;
            // Bind here, so a port in use is an error now rather than in a background task.
            let listener = tokio::net::TcpListener::bind(sock)
                .await
                .map_err(|e| RpcError::Unreachable(format!("cannot listen on {addr}: {e}")))?;
            let incoming =
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            let (tx, rx) = mpsc::channel(1024);
            let svc = NodeServer::new(Serve { tx })
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE);
            tokio::spawn(async move {
                if let Err(e) = Server::builder()
                    .initial_stream_window_size(STREAM_WINDOW)
                    .initial_connection_window_size(CONNECTION_WINDOW)
                    .max_frame_size(MAX_FRAME)
                    .add_service(svc)
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

/// Hands each call to the node's driver and waits for its reply.
struct Serve {
    tx: mpsc::Sender<Incoming>,
}

#[tonic::async_trait]
impl Node for Serve {
    async fn call(
        &self,
        request: tonic::Request<Parts>,
    ) -> Result<tonic::Response<Parts>, tonic::Status> {
        let (reply, answer) = oneshot::channel();
        let mut tx = self.tx.clone();
        tx.send(Incoming {
            body: request.into_inner().concat(),
            reply,
        })
        .await
        .map_err(|_| tonic::Status::unavailable("node stopping"))?;
        match answer.await {
            Ok(b) => Ok(tonic::Response::new(b)),
            Err(_) => Err(tonic::Status::unavailable("node dropped the request")),
        }
    }
}
