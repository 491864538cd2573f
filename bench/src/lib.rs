//! Shared helpers for Tessera's benchmarks: a harness that drives the pure master state
//! machine the way its driver would, answering its calls to chunkservers at once.

use std::time::Duration;

use tessera_core::master::{Input, Master, MasterConfig, RequestId};
use tessera_core::pb::{self, master_request::Req, master_response::Resp};
use tessera_core::types::Time;

pub struct MasterHarness {
    pub master: Master,
    now: Time,
    next: RequestId,
}

impl MasterHarness {
    /// A master with `servers` live chunkservers on `racks` racks, past its start-up
    /// lease quiet period.
    pub fn new(servers: usize, racks: usize) -> MasterHarness {
        // Servers never time out here: the harness sends no heartbeats after the first.
        let cfg = MasterConfig {
            checkpoint_every: u64::MAX,
            creation_limit: u32::MAX,
            heartbeat_timeout: Duration::from_secs(u64::MAX / 4000),
            ..MasterConfig::default()
        };
        let mut h = MasterHarness {
            master: Master::new(cfg, Time(0)),
            now: Time(0),
            next: 1,
        };
        h.now = Time(0) + Duration::from_secs(120);
        for i in 0..servers {
            h.request(Req::Heartbeat(pb::HeartbeatRequest {
                address: format!("cs{i}"),
                rack: format!("rack{}", i % racks),
                capacity_bytes: 1 << 50,
                ..Default::default()
            }));
        }
        h
    }

    /// Sends a request, reports the log durable, answers every call with success, and
    /// returns the reply.
    pub fn request(&mut self, req: Req) -> pb::MasterResponse {
        let id = self.next;
        self.next += 1;
        let mut replies = Vec::new();
        let mut e = self.master.handle(
            self.now,
            Input::Request {
                id,
                req: pb::MasterRequest {
                    req: Some(req),
                    ..Default::default()
                },
                from: tessera_core::auth::Caller::Insecure,
            },
        );
        loop {
            replies.append(&mut e.replies);
            let calls = std::mem::take(&mut e.calls);
            if !e.log.is_empty() || !calls.is_empty() {
                for c in calls {
                    let ok = pb::ChunkResponse {
                        error: None,
                        resp: Some(pb::chunk_response::Resp::Empty(pb::Empty {})),
                    };
                    let mut more = self.master.handle(
                        self.now,
                        Input::CallResult {
                            id: c.id,
                            result: Ok(ok),
                        },
                    );
                    replies.append(&mut more.replies);
                    e.calls.append(&mut more.calls);
                    e.log.append(&mut more.log);
                }
                let through = self.master.last_seq();
                let mut synced = self.master.handle(self.now, Input::LogSynced { through });
                replies.append(&mut synced.replies);
                e = synced;
                if e.calls.is_empty() && e.log.is_empty() {
                    replies.append(&mut e.replies);
                    break;
                }
            } else {
                break;
            }
        }
        replies
            .into_iter()
            .find(|(i, _)| *i == id)
            .map(|(_, r)| r)
            .expect("a reply")
    }

    /// Lets `d` pass and ticks once: expired leases go, repair queues settle.
    pub fn tick(&mut self, d: Duration) {
        self.now = self.now + d;
        let e = self.master.handle(self.now, Input::Tick);
        assert!(
            e.calls.is_empty() && e.log.is_empty(),
            "unexpected work on tick: {e:?}"
        );
    }

    pub fn mkdir(&mut self, path: &str) {
        let r = self.request(Req::Mkdir(pb::MkdirRequest {
            mode: None,
            path: path.into(),
            parents: true,
        }));
        assert!(r.error.is_none(), "{r:?}");
    }

    pub fn create(&mut self, path: &str) {
        let r = self.request(Req::Create(pb::CreateRequest {
            mode: None,
            path: path.into(),
            replication: 3,
        }));
        assert!(r.error.is_none(), "{r:?}");
    }

    /// Allocates chunk `index` of `path` with a lease: the whole write-target path.
    pub fn allocate(&mut self, path: &str, index: u64) -> pb::WriteTarget {
        match self.request(Req::GetWriteTarget(pb::GetWriteTargetRequest {
            path: path.into(),
            chunk_index: index,
            append: false,
        })) {
            pb::MasterResponse {
                resp: Some(Resp::WriteTarget(t)),
                ..
            } => t,
            other => panic!("{other:?}"),
        }
    }

    pub fn locations(&mut self, path: &str) -> pb::GetChunksResponse {
        match self.request(Req::GetChunks(pb::GetChunksRequest {
            path: path.into(),
            first_index: 0,
            count: 0,
        })) {
            pb::MasterResponse {
                resp: Some(Resp::GetChunks(c)),
                ..
            } => c,
            other => panic!("{other:?}"),
        }
    }
}
