//! Tests of the master state machine through its public input/effect interface.

use crate::auth::Caller;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::pb::{chunk_request::Req as CReq, master_request::Req as MReq};

struct H {
    m: Master,
    now: Time,
    next_id: RequestId,
    /// Every record logged, as the driver would have stored it.
    log: Vec<(LogSeq, pb::LogRecord)>,
    calls: Vec<Call>,
    /// The step the chunkservers stamp on the answers `answer_calls` gives.
    answer_step: u64,
}

fn cfg() -> MasterConfig {
    MasterConfig {
        chunk_size: 1024,
        lease_duration: Duration::from_secs(10),
        max_clock_skew: Duration::from_secs(1),
        heartbeat_timeout: Duration::from_secs(5),
        gc_delay: Duration::from_secs(100),
        // No call in flight outlives its master here, but in the test written for it
        // (`a_grant_in_flight_at_a_crash_is_waited_out_after_the_restart`).
        call_timeout: Duration::ZERO,
        late_delivery: Duration::ZERO,
        ..MasterConfig::default()
    }
}

impl H {
    fn new() -> H {
        H::with(cfg())
    }

    /// A master on a fresh log, whose first record (the cluster's id) is durable.
    fn with(cfg: MasterConfig) -> H {
        let mut h = H {
            m: Master::new(cfg, Time(0)),
            now: Time(0),
            next_id: 1,
            log: Vec::new(),
            calls: Vec::new(),
            answer_step: 0,
        };
        h.sync();
        h
    }

    fn step(&mut self, input: Input) -> Effects {
        let e = self.m.handle(self.now, input);
        self.log.extend(e.log.iter().cloned());
        self.calls.extend(e.calls.iter().cloned());
        e
    }

    /// Sends a request; returns its id and the effects of that step alone.
    fn send(&mut self, req: MReq) -> (RequestId, Effects) {
        self.send_as(req, 0)
    }

    /// Sends a request carrying `token` (see `retries.rs`).
    fn send_as(&mut self, req: MReq, token: u64) -> (RequestId, Effects) {
        self.send_from(req, token, Caller::Insecure)
    }

    /// Sends a request from `from`, as its transport authenticated it.
    fn send_from(&mut self, req: MReq, token: u64, from: Caller) -> (RequestId, Effects) {
        let id = self.next_id;
        self.next_id += 1;
        let e = self.step(Input::Request {
            id,
            req: pb::MasterRequest {
                stale_ok: false,
                req: Some(req),
                token,
            },
            from,
        });
        (id, e)
    }

    /// A request from `from`, answered (syncing as needed).
    fn call_from(&mut self, req: MReq, from: Caller) -> pb::MasterResponse {
        let (id, mut e) = self.send_from(req, 0, from);
        e.replies.extend(self.sync().replies);
        reply_for(&e, id).unwrap_or_else(|| panic!("no reply to request {id}"))
    }

    /// A request carrying `token`, answered (syncing as needed).
    fn call_as(&mut self, req: MReq, token: u64) -> pb::MasterResponse {
        let (id, mut e) = self.send_as(req, token);
        e.replies.extend(self.sync().replies);
        reply_for(&e, id).unwrap_or_else(|| panic!("no reply to request {id}"))
    }

    /// One `LogSynced` step, through the last record.
    fn sync_once(&mut self) -> Effects {
        let through = self.m.last_seq();
        self.step(Input::LogSynced { through })
    }

    /// Syncs the log, again while syncing makes more records (a grant's reservation
    /// follows its chunk's allocation).
    fn sync(&mut self) -> Effects {
        let mut all = Effects::default();
        loop {
            let through = self.m.last_seq();
            let e = self.step(Input::LogSynced { through });
            all.log.extend(e.log);
            all.replies.extend(e.replies);
            all.calls.extend(e.calls);
            all.checkpoint_due = e.checkpoint_due.or(all.checkpoint_due);
            if self.m.last_seq() == through {
                return all;
            }
        }
    }

    /// Sends a request, syncs the log, and returns the reply.
    fn call(&mut self, req: MReq) -> pb::MasterResponse {
        let (id, mut e) = self.send(req);
        e.replies.extend(self.sync().replies);
        reply_for(&e, id).unwrap_or_else(|| panic!("no reply to request {id}"))
    }

    fn advance(&mut self, d: Duration) {
        self.now = self.now + d;
    }

    /// A heartbeat from a member of the cluster, whose server id follows from its
    /// address.
    fn heartbeat(
        &mut self,
        addr: &str,
        rack: &str,
        chunks: &[(u64, u64)],
    ) -> pb::HeartbeatResponse {
        let cluster = self.m.cluster_id();
        let r = self.heartbeat_as(addr, server_id(addr), cluster, rack, chunks);
        match r.resp {
            Some(Resp::Heartbeat(h)) => h,
            other => panic!("heartbeat reply {other:?}"),
        }
    }

    /// A heartbeat of run `boot` of a server, composed at its step `step`.
    fn heartbeat_at_step(
        &mut self,
        addr: &str,
        boot: u64,
        step: u64,
        chunks: &[(u64, u64)],
    ) -> pb::HeartbeatResponse {
        let r = self.call(MReq::Heartbeat(pb::HeartbeatRequest {
            address: addr.into(),
            rack: "r".into(),
            capacity_bytes: 1 << 30,
            server_id: server_id(addr),
            cluster_id: self.m.cluster_id(),
            chunks: reports(chunks),
            boot,
            report_seq: step,
            ..Default::default()
        }));
        match r.resp {
            Some(Resp::Heartbeat(h)) => h,
            other => panic!("heartbeat reply {other:?}"),
        }
    }

    /// A heartbeat naming any server and cluster id; the master's whole answer.
    fn heartbeat_as(
        &mut self,
        addr: &str,
        server_id: u64,
        cluster_id: u64,
        rack: &str,
        chunks: &[(u64, u64)],
    ) -> pb::MasterResponse {
        self.heartbeat_changing(addr, server_id, cluster_id, rack, chunks, &[])
    }

    /// A heartbeat that also names chunks whose versions are on their way to the disk.
    fn heartbeat_changing(
        &mut self,
        addr: &str,
        server_id: u64,
        cluster_id: u64,
        rack: &str,
        chunks: &[(u64, u64)],
        changing: &[u64],
    ) -> pb::MasterResponse {
        self.call(MReq::Heartbeat(pb::HeartbeatRequest {
            boot: 0,
            capability_keys: vec![],
            copy: false,
            address: addr.into(),
            rack: rack.into(),
            capacity_bytes: 1 << 30,
            used_bytes: 0,
            chunks: chunks
                .iter()
                .map(|&(handle, version)| pb::ChunkReport {
                    handle,
                    version,
                    length: 0,
                })
                .collect(),
            lease_extensions: vec![],
            server_id,
            cluster_id,
            changing: changing.to_vec(),
            epoch: 0,
            ..Default::default()
        }))
    }

    /// A member's heartbeat from a server that has stored master term `epoch`.
    fn heartbeat_in_term(
        &mut self,
        addr: &str,
        epoch: u64,
        chunks: &[(u64, u64)],
    ) -> pb::MasterResponse {
        self.call(MReq::Heartbeat(pb::HeartbeatRequest {
            address: addr.into(),
            rack: addr.into(),
            capacity_bytes: 1 << 30,
            server_id: server_id(addr),
            cluster_id: self.m.cluster_id(),
            epoch,
            chunks: reports(chunks),
            ..Default::default()
        }))
    }

    /// Answers every outstanding call with success (or failure for the `fail` servers).
    /// The log is synced first: a grant's calls go out once its reservation is durable.
    fn answer_calls(&mut self, fail: &[&str]) -> Effects {
        let mut all = Effects::default();
        all.replies.extend(self.sync().replies);
        let calls = std::mem::take(&mut self.calls);
        for c in calls {
            let result = if fail.contains(&c.to.as_str()) {
                Err(RpcError::Unreachable(c.to.clone()))
            } else {
                Ok(pb::ChunkResponse {
                    error: None,
                    resp: Some(pb::chunk_response::Resp::Empty(pb::Empty {})),
                    report_seq: self.answer_step,
                })
            };
            let e = self.step(Input::CallResult { id: c.id, result });
            all.replies.extend(e.replies);
        }
        all.replies.extend(self.sync().replies);
        all
    }

    /// A server an outstanding grant's `SetVersion` goes to: its primary, or a secondary.
    fn grant_target(&self, primary: bool) -> Option<String> {
        self.calls.iter().find_map(|c| match &c.req.req {
            Some(CReq::SetVersion(s)) if (s.lease_ms > 0) == primary => Some(c.to.clone()),
            _ => None,
        })
    }

    fn write_target(&mut self, path: &str, idx: u64) -> Result<pb::WriteTarget, FsError> {
        self.target(path, idx, false)
    }

    fn target(&mut self, path: &str, idx: u64, append: bool) -> Result<pb::WriteTarget, FsError> {
        let (id, mut e) = self.send(MReq::GetWriteTarget(pb::GetWriteTargetRequest {
            path: path.into(),
            chunk_index: idx,
            append,
        }));
        e.replies.extend(self.sync().replies);
        if reply_for(&e, id).is_none() {
            e.replies.extend(self.answer_calls(&[]).replies);
        }
        match reply_for(&e, id).expect("write target reply") {
            pb::MasterResponse {
                error: Some(err), ..
            } => Err(FsError::from_pb(&err)),
            pb::MasterResponse {
                resp: Some(Resp::WriteTarget(t)),
                ..
            } => Ok(t),
            other => panic!("{other:?}"),
        }
    }
}

/// The server id the test servers at `addr` have: any fixed non-zero number per address.
fn server_id(addr: &str) -> u64 {
    addr.bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
        .max(1)
}

fn reply_for(e: &Effects, id: RequestId) -> Option<pb::MasterResponse> {
    e.replies
        .iter()
        .find(|(i, _)| *i == id)
        .map(|(_, r)| r.clone())
}

fn is_ok(r: &pb::MasterResponse) -> bool {
    r.error.is_none()
}

fn err_of(r: &pb::MasterResponse) -> Option<FsError> {
    r.error.as_ref().map(FsError::from_pb)
}

fn mkdir(p: &str) -> MReq {
    MReq::Mkdir(pb::MkdirRequest {
        mode: None,
        path: p.into(),
        parents: false,
    })
}
fn create(p: &str) -> MReq {
    MReq::Create(pb::CreateRequest {
        mode: None,
        path: p.into(),
        replication: 0,
    })
}
fn delete(p: &str) -> MReq {
    MReq::Delete(pb::DeleteRequest {
        path: p.into(),
        recursive: false,
    })
}
fn rename(a: &str, b: &str) -> MReq {
    MReq::Rename(pb::RenameRequest {
        src: a.into(),
        dst: b.into(),
    })
}
fn stat(p: &str) -> MReq {
    MReq::Stat(pb::StatRequest { path: p.into() })
}
fn listing(h: &mut H, p: &str, include_deleted: bool) -> Vec<String> {
    match h
        .call(MReq::List(pb::ListRequest {
            path: p.into(),
            include_deleted,
            ..Default::default()
        }))
        .resp
    {
        Some(Resp::List(l)) => l.entries.into_iter().map(|e| e.path).collect(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn mutation_reply_waits_for_durability() {
    let mut h = H::new();
    let (id, e) = h.send(create("/f"));
    assert_eq!(e.log.len(), 1, "the create is logged at once");
    assert!(
        reply_for(&e, id).is_none(),
        "reply left before its record was durable"
    );
    // A stat of the same file waits too: nobody sees what is not durable.
    let (sid, e) = h.send(stat("/f"));
    assert!(reply_for(&e, sid).is_none());
    let e = h.sync();
    assert!(is_ok(&reply_for(&e, id).unwrap()));
    assert!(
        is_ok(&reply_for(&e, sid).unwrap()),
        "queued stat ran after the lock was released"
    );
    assert!(h.m.is_quiescent());
}

#[test]
fn siblings_proceed_while_directory_waits() {
    let mut h = H::new();
    assert!(is_ok(&h.call(mkdir("/d"))));
    let (a, e1) = h.send(create("/d/a"));
    let (b, e2) = h.send(create("/d/b"));
    assert_eq!(
        e1.log.len() + e2.log.len(),
        2,
        "two creates in one directory run together"
    );
    // Renaming the directory needs its write lock: it waits for both.
    let (r, e3) = h.send(rename("/d", "/e"));
    assert!(e3.log.is_empty());
    let e = h.sync_once();
    assert!(is_ok(&reply_for(&e, a).unwrap()) && is_ok(&reply_for(&e, b).unwrap()));
    assert_eq!(
        e.log.len(),
        1,
        "the rename ran once the creates were durable"
    );
    let e = h.sync_once();
    assert!(is_ok(&reply_for(&e, r).unwrap()));
    assert_eq!(listing(&mut h, "/e", false), vec!["/e/a", "/e/b"]);
}

#[test]
fn malformed_requests_get_errors() {
    let mut h = H::new();
    let (id, e) = h.send(MReq::Create(pb::CreateRequest {
        mode: None,
        path: "relative".into(),
        replication: 0,
    }));
    assert_eq!(
        reply_for(&e, id).unwrap().error.unwrap().code,
        pb::ErrorCode::InvalidArgument as i32
    );
    let e = h.step(Input::Request {
        id: 99,
        req: pb::MasterRequest {
            req: None,
            ..Default::default()
        },
        from: crate::auth::Caller::Insecure,
    });
    assert!(reply_for(&e, 99).unwrap().error.is_some());
    let r = h.call(MReq::Create(pb::CreateRequest {
        mode: None,
        path: "/x".into(),
        replication: 1000,
    }));
    assert!(r.error.is_some());
    let r = h.call(MReq::GetWriteTarget(pb::GetWriteTargetRequest {
        path: "/nope".into(),
        chunk_index: 0,
        append: false,
    }));
    assert_eq!(r.error.unwrap().code, pb::ErrorCode::NotFound as i32);
}

/// A write far past a file's end allocates every chunk up to it, so one small request
/// could make the master log and hold millions of chunks (the `decode` fuzzer's input
/// `found-write-target-far-past-the-end`: chunk 211 million, past 2 GB). A request for more
/// than `max_new_chunks` new chunks is refused before anything is logged.
#[test]
fn a_write_far_past_the_end_is_refused_not_allocated() {
    let limit = 16;
    let mut h = H::with(MasterConfig {
        max_new_chunks: limit,
        ..cfg()
    });
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let chunks = |h: &H| h.m.meta.ns.file("/f").unwrap().chunks.len() as u64;
    let logged = h.log.len();
    for (idx, append) in [(100_000, false), (211_103_766, true), (u64::MAX, false)] {
        match h.target("/f", idx, append) {
            Err(FsError::InvalidArgument(_)) => {}
            other => panic!("chunk {idx}: {other:?}"),
        }
        assert_eq!(h.log.len(), logged, "nothing logged for a refused request");
    }
    // Up to the limit it is an ordinary write past the end; the limit counts from the
    // file's end, not from zero.
    assert_eq!(
        h.write_target("/f", limit - 1).unwrap().chunk_index,
        limit - 1
    );
    assert_eq!(chunks(&h), limit);
    assert_eq!(
        h.target("/f", 2 * limit - 1, true).unwrap().chunk_index,
        2 * limit - 1
    );
    assert_eq!(chunks(&h), 2 * limit);
    assert!(
        h.write_target("/f", 3 * limit).is_err(),
        "one past the limit"
    );
    assert_eq!(chunks(&h), 2 * limit);
}

#[test]
fn a_listing_shows_nothing_that_is_not_durable() {
    let mut h = H::new();
    h.call(mkdir("/d"));
    h.call(create("/d/old"));
    // A create and a delete in the directory, their records not yet durable.
    let (c, _) = h.send(create("/d/new"));
    let (d, _) = h.send(delete("/d/old"));
    let list = MReq::List(pb::ListRequest {
        path: "/d".into(),
        ..Default::default()
    });
    let (l, e) = h.send(list);
    let (f, fe) = h.send(MReq::Fsck(pb::FsckRequest {
        path: "/d".into(),
        ..Default::default()
    }));
    assert!(
        reply_for(&e, l).is_none() && reply_for(&fe, f).is_none(),
        "a listing answered before what it shows was durable"
    );
    let e = h.sync_once();
    for id in [c, d, f] {
        assert!(reply_for(&e, id).is_some_and(|r| is_ok(&r)));
    }
    match reply_for(&e, l).and_then(|r| r.resp) {
        Some(Resp::List(r)) => {
            let names: Vec<&str> = r.entries.iter().map(|e| e.path.as_str()).collect();
            assert_eq!(names, vec!["/d/new"]);
        }
        other => panic!("{other:?}"),
    }
}

/// A master holding `/d/keep` refuses each of `reqs`, a request for a new name, as an
/// invalid argument saying `why`, and makes nothing; returned for more.
fn refuses_new_names(why: &str, reqs: Vec<MReq>) -> H {
    let mut h = H::new();
    h.call(mkdir("/d"));
    h.call(create("/d/keep"));
    for req in reqs {
        let what = format!("{req:?}");
        let refused = matches!(
            h.call(req).error.map(|e| FsError::from_pb(&e)),
            Some(FsError::InvalidArgument(m)) if m.contains(why)
        );
        assert!(refused, "{what} was not refused");
    }
    assert_eq!(listing(&mut h, "/d", true), vec!["/d/keep"]);
    assert_eq!(listing(&mut h, "/", true), vec!["/d"]);
    h
}

#[test]
fn names_kept_for_deleted_entries_are_refused() {
    let mut h = refuses_new_names(
        "reserved",
        vec![
            rename("/d/keep", "/d/.tessera-deleted-1-keep"),
            rename("/d/keep", "/d/.tessera-deleted-/x"),
            create("/d/.tessera-deleted-1-f"),
            mkdir("/.tessera-deleted-1-d"),
            MReq::Mkdir(pb::MkdirRequest {
                mode: None,
                path: "/a/.tessera-deleted-9/b".into(),
                parents: true,
            }),
        ],
    );
    // Names that merely contain the prefix, or start with a part of it, are the user's.
    assert!(is_ok(&h.call(create("/d/x.tessera-deleted-1"))));
    assert!(is_ok(&h.call(create("/d/.tessera-del"))));
    // Undelete still works: renaming from a deleted name.
    assert!(is_ok(&h.call(delete("/d/keep"))));
    let hidden = listing(&mut h, "/d", true)
        .into_iter()
        .find(|p| p.contains(DELETED_PREFIX))
        .unwrap();
    assert!(is_ok(&h.call(rename(&hidden, "/d/keep"))));
}

#[test]
fn new_names_with_control_characters_are_refused() {
    let mut h = refuses_new_names(
        "control characters",
        vec![
            create("/d/a\nb"),
            create("/d/tab\there"),
            mkdir("/d/esc\u{1b}[2J"),
            rename("/d/keep", "/d/del\u{7f}"),
            MReq::Mkdir(pb::MkdirRequest {
                mode: None,
                path: "/x\r/y".into(),
                parents: true,
            }),
        ],
    );
    // Spaces and other scripts are names like any other.
    assert!(is_ok(&h.call(create("/d/a name é 日本"))));
}

#[test]
fn requests_waiting_for_locks_are_bounded() {
    let mut h = H::with(MasterConfig {
        max_queued: 2,
        ..cfg()
    });
    // The create holds the path's write lock until its record is durable.
    let (c, _) = h.send(create("/f"));
    let (a, _) = h.send(stat("/f"));
    let (b, _) = h.send(stat("/f"));
    let (refused, e) = h.send(stat("/f"));
    match reply_for(&e, refused).and_then(|r| r.error) {
        Some(e) => {
            assert!(matches!(FsError::from_pb(&e), FsError::Unavailable(m) if m.contains("busy")))
        }
        None => panic!("a third waiting request was queued"),
    }
    let e = h.sync();
    for id in [c, a, b] {
        assert!(reply_for(&e, id).is_some_and(|r| is_ok(&r)), "request {id}");
    }
    assert!(h.m.is_quiescent());
}

#[test]
fn mkdir_parents() {
    let mut h = H::new();
    assert!(is_ok(&h.call(MReq::Mkdir(pb::MkdirRequest {
        mode: None,
        path: "/a/b/c".into(),
        parents: true
    }))));
    assert!(is_ok(&h.call(MReq::Mkdir(pb::MkdirRequest {
        mode: None,
        path: "/a/b".into(),
        parents: true
    }))));
    assert_eq!(listing(&mut h, "/a/b", false), vec!["/a/b/c"]);
    assert!(h.m.is_quiescent());
}

fn reserve(p: &str, length: u64) -> MReq {
    MReq::ReserveAppend(pb::ReserveAppendRequest {
        path: p.into(),
        length,
    })
}

/// A reservation asked for again with its token (its reply was lost) gets the region it
/// was given, from the live master, one recovered from its log, and one recovered from
/// a checkpoint; the file does not grow. Without this a retried append left a hole of
/// zeros of its length.
#[test]
fn a_reservation_asked_for_again_gets_the_same_region() {
    let mut h = H::new();
    assert!(is_ok(&h.call(create("/f"))));
    assert_eq!(reserved_at(&h.call_as(reserve("/f", 100), 7)), Ok(0));
    assert_eq!(reserved_at(&h.call_as(reserve("/f", 50), 9)), Ok(100));
    // Asked again before its record is durable: the answer waits, and logs nothing.
    let (id, e) = h.send_as(reserve("/f", 100), 7);
    assert!(e.log.is_empty(), "a second reservation was logged");
    assert_eq!(reserved_at(&reply_for(&e, id).unwrap()), Ok(0));
    assert_eq!(length_of(&mut h, "/f"), 150);
    // The same token for another region is an error, not a second region.
    assert!(matches!(
        reserved_at(&h.call_as(reserve("/f", 99), 7)),
        Err(FsError::InvalidArgument(_))
    ));
    assert_eq!(length_of(&mut h, "/f"), 150);

    let m = Master::recover(cfg(), Time(0), None, h.log.clone()).unwrap();
    let mut r = recovered(m, Time(0));
    assert_eq!(reserved_at(&r.call_as(reserve("/f", 50), 9)), Ok(100));
    assert_eq!(reserved_at(&r.call_as(reserve("/f", 100), 7)), Ok(0));
    assert_eq!(length_of(&mut r, "/f"), 150);

    let cp = h.m.meta().checkpoint(h.m.last_seq());
    let m = Master::recover(cfg(), Time(0), Some(&cp), vec![]).unwrap();
    assert_eq!(m.meta().fingerprint(), h.m.meta().fingerprint());
    let mut r = recovered(m, Time(0));
    assert_eq!(reserved_at(&r.call_as(reserve("/f", 100), 7)), Ok(0));
    assert_eq!(reserved_at(&r.call_as(reserve("/f", 10), 11)), Ok(150));
    assert_eq!(length_of(&mut r, "/f"), 160);

    // The file made again at the path: the old region is not there; a new one is given.
    assert!(is_ok(&h.call(delete("/f"))));
    assert!(is_ok(&h.call(create("/f"))));
    assert_eq!(reserved_at(&h.call_as(reserve("/f", 100), 7)), Ok(0));
    assert_eq!(reserved_at(&h.call_as(reserve("/f", 100), 7)), Ok(0));
    assert_eq!(length_of(&mut h, "/f"), 100);
    assert!(h.m.is_quiescent());
}

/// A reservation asked for again after its file's name moved away (the file renamed,
/// its directory renamed, or deleted) and a new file took the name is not answered with
/// the old region: in the new file that region may be another appender's.
#[test]
fn a_retried_append_never_gets_a_region_of_another_file_at_its_path() {
    for how in ["rename the directory", "delete the file"] {
        let mut h = H::new();
        assert!(is_ok(&h.call(mkdir("/d"))));
        assert!(is_ok(&h.call(create("/d/log"))));
        // A's reply is lost; B appends after it.
        assert_eq!(reserved_at(&h.call_as(reserve("/d/log", 10), 7)), Ok(0));
        assert_eq!(reserved_at(&h.call_as(reserve("/d/log", 100), 8)), Ok(10));
        match how {
            "rename the directory" => {
                assert!(is_ok(&h.call(rename("/d", "/old"))));
                assert!(is_ok(&h.call(mkdir("/d"))));
            }
            _ => assert!(is_ok(&h.call(delete("/d/log")))),
        }
        assert!(is_ok(&h.call(create("/d/log"))));
        // C appends to the new file; A asks again.
        assert_eq!(reserved_at(&h.call_as(reserve("/d/log", 200), 9)), Ok(0));
        assert_eq!(
            reserved_at(&h.call_as(reserve("/d/log", 10), 7)),
            Ok(200),
            "{how}: a retried append was given a region of another file"
        );
        // C's own repeat still gets its region; replay and checkpoint agree.
        assert_eq!(reserved_at(&h.call_as(reserve("/d/log", 200), 9)), Ok(0));
        let m = Master::recover(cfg(), Time(0), None, h.log.clone()).unwrap();
        assert_eq!(m.meta().fingerprint(), h.m.meta().fingerprint());
        let cp = h.m.meta().checkpoint(h.m.last_seq());
        let m = Master::recover(cfg(), Time(0), Some(&cp), vec![]).unwrap();
        assert_eq!(m.meta().fingerprint(), h.m.meta().fingerprint());
    }
}

/// The master remembers a bounded number of completed requests, oldest forgotten first.
#[test]
fn completed_requests_kept_are_bounded() {
    use crate::master::retries::{Completed, KEPT, Retries};
    let mut r = Retries::default();
    let at = |offset| Completed {
        path: "/f".into(),
        append: Some((offset, 1)),
    };
    for t in 1..=(KEPT as u64 + 2) {
        r.insert(t, at(t));
    }
    assert!(r.get(1).is_none() && r.get(2).is_none());
    assert_eq!(r.get(3), Some(&at(3)));
    assert_eq!(r.iter().count(), KEPT);
    assert_eq!(r.iter().next().map(|(t, _)| t), Some(3));
}

/// Creates, deletes, renames and mkdirs asked again with their token (the reply was
/// lost) are answered as the first time, from the live master and after recovery from
/// the log or a checkpoint; nothing is done twice. Without the retry cache each repeat
/// fails because of its own first attempt (AlreadyExists, NotFound).
#[test]
fn a_mutation_asked_for_again_is_answered_as_before() {
    let mut h = H::new();
    let done = |h: &mut H, req: MReq, token: u64| is_ok(&h.call_as(req, token));
    assert!(done(&mut h, mkdir("/d"), 1));
    assert!(done(&mut h, create("/d/a"), 2));
    assert!(done(&mut h, rename("/d/a", "/d/b"), 3));
    assert!(done(&mut h, create("/d/c"), 4));
    assert!(done(&mut h, delete("/d/c"), 5));
    let records = h.log.len();
    // Asked again: the same answers, no record.
    for (req, token) in [
        (mkdir("/d"), 1),
        (create("/d/a"), 2),
        (rename("/d/a", "/d/b"), 3),
        (create("/d/c"), 4),
        (delete("/d/c"), 5),
    ] {
        assert!(done(&mut h, req.clone(), token), "{req:?} asked again");
    }
    assert_eq!(h.log.len(), records, "a repeat was logged");
    // With a new token they are done again, and fail.
    assert!(matches!(
        err_of(&h.call_as(create("/d/b"), 6)),
        Some(FsError::AlreadyExists(_))
    ));
    assert!(matches!(
        err_of(&h.call_as(delete("/d/c"), 7)),
        Some(FsError::NotFound(_))
    ));
    // A token used for another request is refused.
    assert!(matches!(
        err_of(&h.call_as(create("/d/x"), 2)),
        Some(FsError::InvalidArgument(_))
    ));
    // A refused request is refused again when asked again, though the namespace has
    // changed since: a late copy of it is not done after its caller was told it was not.
    assert!(done(&mut h, create("/d/c"), 8));
    assert!(matches!(
        err_of(&h.call_as(delete("/d/c"), 7)),
        Some(FsError::NotFound(_))
    ));
    assert!(matches!(
        err_of(&h.call_as(create("/d/b"), 6)),
        Some(FsError::AlreadyExists(_))
    ));
    assert_eq!(listing(&mut h, "/d", false), vec!["/d/b", "/d/c"]);
    assert_eq!(
        h.m.refusals.len(),
        2,
        "the two lasting refusals (tokens 6, 7)"
    );
    // Not a refusal that passes: a request refused for want of space or a server is
    // done when asked again.
    let e = FsError::Unavailable("no servers".into());
    h.m.refusals.insert(9, &create("/d/e"), "/d/e", &e);
    assert!(done(&mut h, create("/d/e"), 9));
    assert!(done(&mut h, delete("/d/e"), 10));

    for from_checkpoint in [false, true] {
        let m = if from_checkpoint {
            let cp = h.m.meta().checkpoint(h.m.last_seq());
            Master::recover(cfg(), Time(0), Some(&cp), vec![]).unwrap()
        } else {
            Master::recover(cfg(), Time(0), None, h.log.clone()).unwrap()
        };
        assert_eq!(m.meta().fingerprint(), h.m.meta().fingerprint());
        let mut r = recovered(m, Time(0));
        let records = r.log.len();
        assert!(done(&mut r, create("/d/a"), 2));
        assert!(done(&mut r, rename("/d/a", "/d/b"), 3));
        assert!(done(&mut r, delete("/d/c"), 5));
        assert_eq!(r.log.len(), records);
        assert_eq!(listing(&mut r, "/d", false), vec!["/d/b", "/d/c"]);
    }
}

/// The offset a reservation's reply gives, or its error.
fn reserved_at(r: &pb::MasterResponse) -> Result<u64, FsError> {
    match r {
        pb::MasterResponse { error: Some(e), .. } => Err(FsError::from_pb(e)),
        pb::MasterResponse {
            resp: Some(Resp::ReserveAppend(a)),
            ..
        } => Ok(a.offset),
        other => panic!("reservation reply {other:?}"),
    }
}

fn length_of(h: &mut H, p: &str) -> u64 {
    match h.call(stat(p)).resp {
        Some(Resp::Stat(s)) => s.length,
        other => panic!("{other:?}"),
    }
}

#[test]
fn appends_at_once_get_disjoint_regions_each_held_until_durable() {
    let mut h = H::new();
    assert!(is_ok(&h.call(create("/f"))));
    // Two appenders ask at once, before anything is durable.
    let (a, ea) = h.send(reserve("/f", 100));
    let (b, eb) = h.send(reserve("/f", 5000));
    assert_eq!(ea.log.len(), 1, "the first reservation logs the new length");
    assert!(
        reply_for(&ea, a).is_none(),
        "a reservation was answered before its record was durable"
    );
    assert!(
        eb.log.is_empty() && reply_for(&eb, b).is_none(),
        "the second reservation must wait for the first's lock"
    );
    // The first record becomes durable: the first answer leaves, and the second
    // reservation runs, logging its own record, whose answer waits in turn.
    let e = h.sync_once();
    assert_eq!(reserved_at(&reply_for(&e, a).unwrap()), Ok(0));
    assert_eq!(e.log.len(), 1, "the second reservation logs its length");
    assert!(reply_for(&e, b).is_none());
    let e = h.sync_once();
    assert_eq!(reserved_at(&reply_for(&e, b).unwrap()), Ok(100));
    assert_eq!(length_of(&mut h, "/f"), 5100);
    // The regions survive a restart: the next append starts after both.
    let m = Master::recover(cfg(), Time(0), None, h.log.clone()).unwrap();
    assert_eq!(m.meta().ns.file("/f").unwrap().length, 5100);
    assert_eq!(reserved_at(&h.call(reserve("/f", 1))), Ok(5100));
    // An empty append reserves nothing and logs nothing; it answers the length.
    let (id, e) = h.send(reserve("/f", 0));
    assert!(e.log.is_empty());
    assert_eq!(reserved_at(&reply_for(&e, id).unwrap()), Ok(5101));
    assert!(h.m.is_quiescent());
}

#[test]
fn a_reservation_needs_a_file_and_room() {
    let mut h = H::new();
    assert!(is_ok(&h.call(mkdir("/d"))));
    assert!(is_ok(&h.call(create("/f"))));
    assert!(matches!(
        reserved_at(&h.call(reserve("/nope", 1))),
        Err(FsError::NotFound(_))
    ));
    assert!(matches!(
        reserved_at(&h.call(reserve("/d", 1))),
        Err(FsError::IsADirectory(_))
    ));
    assert!(matches!(
        reserved_at(&h.call(reserve("relative", 1))),
        Err(FsError::InvalidArgument(_))
    ));
    // The largest file the chunk size allows (chunk indexes stay below
    // u64::MAX / chunk_size), exactly; a byte more is refused, as is a sum past u64.
    let most = (u64::MAX / 1024) * 1024;
    assert!(matches!(
        reserved_at(&h.call(reserve("/f", most + 1))),
        Err(FsError::InvalidArgument(_))
    ));
    assert_eq!(reserved_at(&h.call(reserve("/f", 10))), Ok(0));
    assert!(matches!(
        reserved_at(&h.call(reserve("/f", u64::MAX))),
        Err(FsError::InvalidArgument(_))
    ));
    assert!(matches!(
        reserved_at(&h.call(reserve("/f", most - 9))),
        Err(FsError::InvalidArgument(_))
    ));
    assert_eq!(reserved_at(&h.call(reserve("/f", most - 10))), Ok(10));
    assert_eq!(length_of(&mut h, "/f"), most);
    // Refusals log nothing and keep no lock.
    let before = h.m.last_seq();
    assert!(reserved_at(&h.call(reserve("/f", 1))).is_err());
    assert_eq!(h.m.last_seq(), before);
    assert!(h.m.is_quiescent());
}

fn cluster(h: &mut H, n: usize, racks: usize) {
    for i in 0..n {
        h.heartbeat(&format!("cs{i}"), &format!("rack{}", i % racks), &[]);
    }
}

#[test]
fn lease_grant_bumps_version_on_replicas_before_reply() {
    let mut h = H::new();
    cluster(&mut h, 4, 2);
    assert!(is_ok(&h.call(create("/f"))));
    let (id, mut e) = h.send(MReq::GetWriteTarget(pb::GetWriteTargetRequest {
        path: "/f".into(),
        chunk_index: 0,
        append: false,
    }));
    e.replies.extend(h.sync().replies);
    assert!(
        reply_for(&e, id).is_none(),
        "told the client before replicas had the version"
    );
    let sv: Vec<_> = h
        .calls
        .iter()
        .filter_map(|c| match &c.req.req {
            Some(CReq::SetVersion(s)) => Some((c.to.clone(), s.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(sv.len(), 3);
    assert!(sv.iter().all(|(_, s)| s.version == 1 && s.create));
    assert_eq!(
        sv.iter().filter(|(_, s)| s.lease_ms > 0).count(),
        1,
        "exactly one primary"
    );
    let e = h.answer_calls(&[]);
    let t = match reply_for(&e, id).unwrap().resp {
        Some(Resp::WriteTarget(t)) => t,
        other => panic!("{other:?}"),
    };
    assert_eq!(t.version, 1);
    assert_eq!(t.secondaries.len(), 2);
    // The version was logged before the reply was released.
    assert!(
        h.log
            .iter()
            .any(|(_, r)| matches!(&r.op, Some(Op::SetVersion(o)) if o.version == 1))
    );
    let racks: std::collections::HashSet<_> = std::iter::once(&t.primary)
        .chain(&t.secondaries)
        .map(|a| {
            let i: usize = a[2..].parse().unwrap();
            i % 2
        })
        .collect();
    assert_eq!(racks.len(), 2, "replicas spread across both racks");
    // While the lease is valid the same primary is returned with no new grant.
    let again = h.write_target("/f", 0).unwrap();
    assert_eq!((again.primary, again.version), (t.primary, 1));
}

/// A grant that one replica did not answer retires that replica's copy in the log. Until
/// that record is durable no client may hear of the lease: a master that crashed before it
/// would count the copy current again, and writes made under the lease would be missing
/// from it (found by the `mutation_protocol` fuzzer).
#[test]
fn no_write_target_before_the_grants_retirements_are_durable() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    assert!(is_ok(&h.call(create("/f"))));
    let target = |path: &str| {
        MReq::GetWriteTarget(pb::GetWriteTargetRequest {
            path: path.into(),
            chunk_index: 0,
            append: false,
        })
    };
    let (first, mut e) = h.send(target("/f"));
    e.replies.extend(h.sync().replies);
    let lagging = h.grant_target(false).expect("a secondary");
    // Every SetVersion answered, one of them failed, the log not yet synced.
    let calls = std::mem::take(&mut h.calls);
    for c in calls {
        let result = if c.to == lagging {
            Err(RpcError::Unreachable(c.to.clone()))
        } else {
            Ok(pb::ChunkResponse {
                error: None,
                resp: Some(pb::chunk_response::Resp::Empty(pb::Empty {})),
                ..Default::default()
            })
        };
        e.replies
            .extend(h.step(Input::CallResult { id: c.id, result }).replies);
    }
    let retire = h
        .log
        .iter()
        .find(|(_, r)| matches!(&r.op, Some(Op::RetireReplica(o)) if o.address == lagging))
        .map(|(seq, _)| *seq)
        .expect("the lagging copy is retired");
    // A second writer asks while the lease is held.
    let (second, e2) = h.send(target("/f"));
    e.replies.extend(e2.replies);
    // Durable up to just before the retirement: still nobody may hear of the lease.
    e.replies.extend(
        h.step(Input::LogSynced {
            through: retire - 1,
        })
        .replies,
    );
    assert!(
        reply_for(&e, first).is_none() && reply_for(&e, second).is_none(),
        "a write target was given before the grant's retirement of {lagging} was durable"
    );
    e.replies.extend(h.sync().replies);
    for id in [first, second] {
        let Some(Resp::WriteTarget(t)) = reply_for(&e, id).expect("answered").resp else {
            panic!("no write target for request {id}")
        };
        assert!(t.primary != lagging && !t.secondaries.contains(&lagging));
    }
}

#[test]
fn append_targets_the_last_chunk_or_the_next_one_asked_for() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    // An empty file: the first chunk is allocated.
    let t0 = h.target("/f", 0, true).unwrap();
    assert_eq!(t0.chunk_index, 0);
    // A writer made chunk 2 (a hole at 1): appends go to the last chunk.
    let t2 = h.write_target("/f", 2).unwrap();
    assert_eq!(t2.chunk_index, 2);
    let t = h.target("/f", 0, true).unwrap();
    assert_eq!((t.chunk_index, t.handle), (2, t2.handle));
    // An appender that found chunk 2 full asks for 3; two of them get the same chunk.
    let a = h.target("/f", 3, true).unwrap();
    let b = h.target("/f", 3, true).unwrap();
    assert_eq!((a.chunk_index, a.handle), (3, b.handle));
    assert_eq!(h.target("/f", 1, true).unwrap().chunk_index, 3);
    assert!(h.target("/nope", 0, true).is_err());
}

#[test]
fn no_new_lease_while_old_may_be_valid() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    // The primary dies; its lease may still be valid on its own clock.
    h.advance(Duration::from_secs(6));
    for i in 0..3 {
        let a = format!("cs{i}");
        if a != t.primary {
            h.heartbeat(&a, "r", &[(t.handle, 1)]);
        }
    }
    h.step(Input::Tick);
    assert!(
        !h.m.servers()
            .is_alive(h.m.servers().find(&t.primary).unwrap())
    );
    let e = h.write_target("/f", 0).unwrap_err();
    // The answer names what the writer waits for: the missing primary, and how long (the
    // 10 s lease and 1 s of skew, 6 s on).
    let stopped = format!("its primary {} stopped reporting", t.primary);
    assert!(
        matches!(&e, FsError::Unavailable(m) if m.contains(&stopped) && m.contains("may still be valid for 5000 ms")),
        "{e:?}"
    );
    // Past expiry but within the skew bound: still refused.
    h.advance(Duration::from_millis(4500));
    for i in 0..3 {
        let a = format!("cs{i}");
        if a != t.primary {
            h.heartbeat(&a, "r", &[(t.handle, 1)]);
        }
    }
    assert!(matches!(
        h.write_target("/f", 0),
        Err(FsError::Unavailable(_))
    ));
    // Past expiry plus skew: a new primary at a new version.
    h.advance(Duration::from_millis(600));
    let t2 = h.write_target("/f", 0).unwrap();
    assert_ne!(t2.primary, t.primary);
    assert_eq!(t2.version, 2);
}

#[test]
fn leases_extend_through_heartbeats_and_expire() {
    let mut h = H::new();
    cluster(&mut h, 3, 1);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    h.advance(Duration::from_secs(8));
    let r = h.call(MReq::Heartbeat(pb::HeartbeatRequest {
        address: t.primary.clone(),
        rack: "rack0".into(),
        capacity_bytes: 1 << 30,
        chunks: vec![pb::ChunkReport {
            handle: t.handle,
            version: 1,
            length: 0,
        }],
        lease_extensions: vec![t.handle],
        ..Default::default()
    }));
    let Some(Resp::Heartbeat(hb)) = r.resp else {
        panic!()
    };
    assert_eq!(hb.extended_leases, vec![t.handle]);
    // A server that is not the primary gets no extension.
    let other = if t.primary == "cs0" { "cs1" } else { "cs0" };
    let r = h.call(MReq::Heartbeat(pb::HeartbeatRequest {
        address: other.into(),
        lease_extensions: vec![t.handle],
        chunks: vec![pb::ChunkReport {
            handle: t.handle,
            version: 1,
            length: 0,
        }],
        ..Default::default()
    }));
    let Some(Resp::Heartbeat(hb)) = r.resp else {
        panic!()
    };
    assert!(hb.extended_leases.is_empty());
    let l = h.m.leases().get(t.handle).unwrap();
    assert_eq!(l.expires, Time(18_000));
    assert_eq!(h.m.leases().valid(Time(17_999)).count(), 1);
    assert_eq!(h.m.leases().valid(Time(18_000)).count(), 0);
    // Once past expiry plus skew, a tick forgets the lease.
    h.now = Time(18_999);
    h.step(Input::Tick);
    assert_eq!(h.m.leases().held_count(), 1);
    h.now = Time(19_000);
    h.step(Input::Tick);
    assert_eq!(h.m.leases().held_count(), 0);
}

#[test]
fn failed_replica_is_stale_after_grant() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    let h0 = t.handle;
    // Lease expires; the next grant cannot reach one secondary.
    h.advance(Duration::from_secs(12));
    cluster_report(&mut h, &[("cs0", h0, 1), ("cs1", h0, 1), ("cs2", h0, 1)]);
    let lagging = t.secondaries[0].clone();
    let (id, _) = h.send(MReq::GetWriteTarget(pb::GetWriteTargetRequest {
        path: "/f".into(),
        chunk_index: 0,
        append: false,
    }));
    let e = h.answer_calls(&[&lagging]);
    let Some(Resp::WriteTarget(t2)) = reply_for(&e, id).unwrap().resp else {
        panic!()
    };
    assert_eq!(t2.version, 2);
    assert!(!t2.secondaries.contains(&lagging) && t2.primary != lagging);
    // When the lagging server reports version 1, it is not a location, but kept while
    // the chunk is below its goal (`fallback.rs`).
    let hb = h.heartbeat(&lagging, "r", &[(h0, 1)]);
    assert!(hb.delete_chunks.is_empty(), "{hb:?}");
    let locs = chunk_replicas(&mut h, "/f");
    assert!(
        !locs.contains(&lagging),
        "stale replica listed as a location"
    );
    // Once the chunk is back at its goal (a new server took a copy), it is told to
    // delete it.
    h.heartbeat("cs3", "r", &[(h0, 2)]);
    let hb = h.heartbeat(&lagging, "r", &[(h0, 1)]);
    assert_eq!(
        hb.delete_chunks
            .iter()
            .map(|d| d.handle)
            .collect::<Vec<_>>(),
        vec![h0]
    );
    assert!(!chunk_replicas(&mut h, "/f").contains(&lagging));
}

#[test]
fn a_report_composed_before_a_copy_was_made_does_not_unlist_it() {
    let mut h = H::new();
    for i in 0..3 {
        h.heartbeat_at_step(&format!("cs{i}"), 7, 1, &[]);
    }
    h.call(create("/f"));
    // Every server answers the chunk's creation at its step 10.
    h.answer_step = 10;
    let t = h.write_target("/f", 0).unwrap();
    let c = t.handle;
    assert_eq!(chunk_replicas(&mut h, "/f").len(), 3);
    // cs0's report composed at step 9, before it answered, arrives after: it lacks the
    // copy only because it is older.
    h.heartbeat_at_step("cs0", 7, 9, &[]);
    assert!(
        chunk_replicas(&mut h, "/f").contains(&"cs0".to_string()),
        "a copy unlisted on a report older than the answer that listed it"
    );
    // One composed after the answer that lacks it: the copy is gone.
    h.heartbeat_at_step("cs0", 7, 11, &[]);
    assert!(!chunk_replicas(&mut h, "/f").contains(&"cs0".to_string()));
    // A report of a later run, whatever its step, shows everything that run holds.
    h.heartbeat_at_step("cs1", 8, 2, &[]);
    assert!(!chunk_replicas(&mut h, "/f").contains(&"cs1".to_string()));
    // And a report that shows it keeps it, as ever.
    h.heartbeat_at_step("cs2", 7, 12, &[(c, 1)]);
    assert_eq!(chunk_replicas(&mut h, "/f"), vec!["cs2".to_string()]);
}

fn cluster_report(h: &mut H, reports: &[(&str, u64, u64)]) {
    for (a, hd, v) in reports {
        h.heartbeat(a, "r", &[(*hd, *v)]);
    }
}

fn chunk_replicas(h: &mut H, path: &str) -> Vec<String> {
    match h
        .call(MReq::GetChunks(pb::GetChunksRequest {
            path: path.into(),
            first_index: 0,
            count: 0,
        }))
        .resp
    {
        Some(Resp::GetChunks(c)) => c.chunks[0].replicas.clone(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn newer_version_reported_is_adopted() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    // A second grant reserves version 2 and sends it out; the master crashes before any
    // answer, so only the reservation is in its log.
    h.advance(Duration::from_secs(12));
    let (_, _) = h.send(MReq::GetWriteTarget(pb::GetWriteTargetRequest {
        path: "/f".into(),
        chunk_index: 0,
        append: false,
    }));
    h.sync();
    assert!(
        h.calls
            .iter()
            .any(|c| matches!(&c.req.req, Some(CReq::SetVersion(s)) if s.version == 2)),
        "the second grant went out"
    );
    let m = Master::recover(cfg(), Time(100_000), None, h.log.clone()).unwrap();
    let mut h = H {
        m,
        now: Time(100_000),
        next_id: 1,
        log: vec![],
        calls: vec![],
        answer_step: 0,
    };
    let hb = h.heartbeat(&t.primary, "r", &[(t.handle, 2)]);
    assert!(hb.delete_chunks.is_empty());
    h.sync();
    assert_eq!(h.m.meta().chunks.get(t.handle).unwrap().version, 2);
    assert_eq!(chunk_replicas(&mut h, "/f"), vec![t.primary.clone()]);
}

#[test]
fn a_version_never_granted_is_refused() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    let holders: Vec<String> = t.secondaries.iter().chain([&t.primary]).cloned().collect();
    for a in &holders {
        h.heartbeat(a, "r", &[(t.handle, 1)]);
    }
    // A forged report (or one from a corrupt or foreign server) of a version far above
    // any the master reserved: neither adopted nor a reason to drop the real copies.
    let hb = h.heartbeat("rogue:1", "r", &[(t.handle, 1001)]);
    assert!(
        hb.delete_chunks.iter().any(|d| d.handle == t.handle),
        "the copy at a never-granted version is not ordered deleted"
    );
    h.sync();
    assert_eq!(h.m.meta().chunks.get(t.handle).unwrap().version, 1);
    let mut listed = chunk_replicas(&mut h, "/f");
    listed.sort();
    let mut want = holders.clone();
    want.sort();
    assert_eq!(listed, want, "the real copies are still the replicas");
    assert_eq!(fsck(&mut h, "/f", false).unwrap().missing, 0);
    // One of the real holders itself claims it (its metadata went bad): the same.
    let hb = h.heartbeat(&t.primary, "r", &[(t.handle, 7)]);
    assert!(hb.delete_chunks.iter().any(|d| d.handle == t.handle));
    assert_eq!(h.m.meta().chunks.get(t.handle).unwrap().version, 1);
    assert_eq!(chunk_replicas(&mut h, "/f").len(), 2);
}

#[test]
fn restarted_master_waits_a_lease_period() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    let log = h.log.clone();
    let mut m = Master::recover(cfg(), Time(1000), None, log).unwrap();
    let mut h2 = H {
        m,
        now: Time(1000),
        next_id: 1,
        log: vec![],
        calls: vec![],
        answer_step: 0,
    };
    cluster_report(
        &mut h2,
        &[
            ("cs0", t.handle, 1),
            ("cs1", t.handle, 1),
            ("cs2", t.handle, 1),
        ],
    );
    assert!(matches!(
        h2.write_target("/f", 0),
        Err(FsError::Unavailable(_))
    ));
    h2.advance(Duration::from_secs(11));
    cluster_report(
        &mut h2,
        &[
            ("cs0", t.handle, 1),
            ("cs1", t.handle, 1),
            ("cs2", t.handle, 1),
        ],
    );
    assert_eq!(h2.write_target("/f", 0).unwrap().version, 2);
    m = h2.m;
    assert_eq!(m.meta().chunks.get(t.handle).unwrap().version, 2);
}

/// A grant the master sent just before it crashed can reach its primary up to a call
/// timeout later, and that lease runs a period from then: the restarted master grants
/// none on the chunk until both have passed, skew included (found by the
/// `mutation_protocol` fuzzer: two primaries, the late one from before the crash).
#[test]
fn a_grant_in_flight_at_a_crash_is_waited_out_after_the_restart() {
    let mut c = cfg();
    c.call_timeout = Duration::from_secs(8);
    c.late_delivery = Duration::from_secs(3);
    let mut h = H::with(c.clone());
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    // The master crashes and restarts at once, at 1 s.
    let restart = Time(1000);
    let m = Master::recover(c.clone(), restart, None, h.log.clone()).unwrap();
    let mut h2 = recovered(m, restart);
    let report = |h2: &mut H| {
        cluster_report(
            h2,
            &[
                ("cs0", t.handle, 1),
                ("cs1", t.handle, 1),
                ("cs2", t.handle, 1),
            ],
        )
    };
    // A grant sent just before the crash may arrive at restart + 8 s, or 3 s later still
    // (a late delivery), and hold its lease until restart + 21 s on the primary's clock.
    let held_until =
        restart + c.call_timeout + c.late_delivery + c.lease_duration + c.max_clock_skew;
    h2.advance(held_until.saturating_sub(h2.now) - Duration::from_millis(1));
    report(&mut h2);
    let r = h2.write_target("/f", 0);
    assert!(
        matches!(&r, Err(FsError::Unavailable(m)) if m.contains("master restarted")),
        "a lease granted while one from before the crash may be held: {r:?}"
    );
    h2.advance(Duration::from_millis(2));
    report(&mut h2);
    assert!(h2.write_target("/f", 0).is_ok());
}

#[test]
fn rereplication_fewest_replicas_first_and_throttled() {
    let mut c = cfg();
    c.clones_cluster = 1;
    let mut h = H::with(c);
    cluster(&mut h, 5, 5);
    h.call(create("/a"));
    h.call(create("/b"));
    let ta = h.write_target("/a", 0).unwrap();
    let tb = h.write_target("/b", 0).unwrap();
    let holders = |t: &pb::WriteTarget| {
        let mut v = t.secondaries.clone();
        v.push(t.primary.clone());
        v
    };
    // Every server stays up, but /a is reported by one holder only and /b by two: /a is
    // further from its goal and goes first, one clone at a time.
    let (ha, hb) = (holders(&ta), holders(&tb));
    let report = |h: &mut H| {
        for i in 0..5 {
            let a = format!("cs{i}");
            let mut rep = vec![];
            if ha[0] == a {
                rep.push((ta.handle, 1));
            }
            if hb[..2].contains(&a) {
                rep.push((tb.handle, 1));
            }
            h.heartbeat(&a, "r", &rep);
        }
    };
    // While their leases may be valid, the chunks are not cloned.
    report(&mut h);
    h.calls.clear();
    h.step(Input::Tick);
    assert!(h.calls.is_empty(), "cloned a chunk under a lease");
    h.advance(Duration::from_millis(11_000));
    report(&mut h);
    h.calls.clear();
    h.step(Input::Tick);
    let q = h.m.replication_queue();
    assert_eq!(q[0].handle, ta.handle, "{q:?}");
    let clones: Vec<_> = h
        .calls
        .iter()
        .filter(|c| matches!(c.req.req, Some(CReq::Clone(_))))
        .cloned()
        .collect();
    assert_eq!(clones.len(), 1, "cluster-wide clone limit");
    let Some(CReq::Clone(cl)) = &clones[0].req.req else {
        unreachable!()
    };
    assert_eq!(cl.handle, ta.handle);
    assert_ne!(ha[0], clones[0].to, "cloned onto the server it copies from");
    h.answer_calls(&[]);
    assert_eq!(h.m.meta().chunks.get(ta.handle).unwrap().replicas.len(), 2);
}

#[test]
fn delete_undelete_and_reclaim() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(mkdir("/d"));
    h.call(create("/d/f"));
    let t = h.write_target("/d/f", 0).unwrap();
    assert!(is_ok(&h.call(delete("/d/f"))));
    assert!(listing(&mut h, "/d", false).is_empty());
    let hidden = listing(&mut h, "/d", true);
    assert_eq!(hidden.len(), 1);
    assert!(hidden[0].starts_with("/d/.tessera-deleted-"));
    // Undelete by renaming back.
    assert!(is_ok(&h.call(rename(&hidden[0], "/d/f"))));
    assert!(is_ok(&h.call(delete("/d/f"))));
    let hidden = listing(&mut h, "/d", true);
    // Not yet due.
    h.advance(Duration::from_secs(50));
    h.step(Input::Tick);
    h.sync();
    assert_eq!(listing(&mut h, "/d", true).len(), 1);
    h.advance(Duration::from_secs(60));
    for i in 0..3 {
        h.heartbeat(&format!("cs{i}"), "r", &[(t.handle, 1)]);
    }
    h.step(Input::Tick);
    h.sync();
    assert!(
        listing(&mut h, "/d", true).is_empty(),
        "{hidden:?} not reclaimed"
    );
    assert!(h.m.meta().chunks.get(t.handle).is_none());
    // The replicas are orphans now.
    let hb = h.heartbeat("cs0", "r", &[(t.handle, 1)]);
    assert_eq!(
        hb.delete_chunks
            .iter()
            .map(|d| d.handle)
            .collect::<Vec<_>>(),
        vec![t.handle]
    );
}

/// Any file that could be made can be deleted: the longest name, in a path of the
/// longest length, still gets a hidden name within both limits (its name cut short),
/// twice in the same millisecond too.
#[test]
fn files_with_the_longest_names_and_paths_can_be_deleted() {
    let mut h = H::new();
    h.call(mkdir("/d"));
    let long = format!("/d/{}", "n".repeat(crate::path::MAX_NAME));
    let mut deep = String::from("/d");
    while deep.len() + 1 + crate::path::MAX_NAME < crate::path::MAX_PATH {
        deep.push_str(&format!("/{}", "x".repeat(crate::path::MAX_NAME)));
        assert!(is_ok(&h.call(mkdir(&deep))));
    }
    let room = crate::path::MAX_PATH - deep.len() - 1;
    let deepest = format!("{deep}/{}", "y".repeat(room));
    for p in [&long, &deepest] {
        for _ in 0..2 {
            assert!(is_ok(&h.call(create(p))), "create {}", p.len());
            let r = h.call(delete(p));
            assert!(is_ok(&r), "delete of a {}-byte path: {r:?}", p.len());
            assert!(matches!(
                h.call(stat(p)).error.map(|e| e.code),
                Some(c) if c == pb::ErrorCode::NotFound as i32
            ));
        }
    }
    assert_eq!(listing(&mut h, "/d", true).len(), 3, "two deleted, one dir");
    // A short name under a parent so long that no hidden name fits: reclaimed at once.
    let mut tall = String::from("/t");
    h.call(mkdir(&tall));
    while tall.len() + 1 + 200 + 12 < crate::path::MAX_PATH {
        tall.push_str(&format!("/{}", "z".repeat(200)));
        assert!(is_ok(&h.call(mkdir(&tall))));
    }
    let pad = crate::path::MAX_PATH - tall.len() - 12;
    tall.push_str(&format!("/{}", "w".repeat(pad)));
    assert!(is_ok(&h.call(mkdir(&tall))));
    let tiny = format!("{tall}/f");
    assert!(tiny.len() + 30 > crate::path::MAX_PATH);
    assert!(is_ok(&h.call(create(&tiny))));
    assert!(
        is_ok(&h.call(delete(&tiny))),
        "delete under the tallest parent"
    );
    assert!(listing(&mut h, &tall, true).is_empty());
}

#[test]
fn deleting_a_deleted_file_reclaims_at_once() {
    let mut h = H::new();
    h.call(create("/f"));
    h.call(delete("/f"));
    let hidden = listing(&mut h, "/", true);
    assert!(is_ok(&h.call(delete(&hidden[0]))));
    assert!(listing(&mut h, "/", true).is_empty());
}

#[test]
fn directory_delete_needs_recursive() {
    let mut h = H::new();
    h.call(mkdir("/d"));
    h.call(create("/d/f"));
    assert_eq!(
        h.call(delete("/d")).error.unwrap().code,
        pb::ErrorCode::NotEmpty as i32
    );
    assert!(is_ok(&h.call(MReq::Delete(pb::DeleteRequest {
        path: "/d".into(),
        recursive: true
    }))));
    assert!(listing(&mut h, "/", false).is_empty());
}

#[test]
fn checkpoint_falls_due_and_restores() {
    let mut c = cfg();
    c.checkpoint_every = 5;
    let mut h = H::with(c.clone());
    let mut cp = None;
    for i in 0..7 {
        let (id, e) = h.send(create(&format!("/f{i}")));
        if let Some(due) = e.checkpoint_due {
            assert_eq!(due, h.m.last_seq());
            cp = Some(h.m.meta().checkpoint(due));
        }
        let e = h.sync();
        assert!(reply_for(&e, id).is_some());
    }
    let cp = cp.expect("a checkpoint after 5 records");
    assert_eq!(cp.through_seq, 5);
    let tail: Vec<_> = h.log.iter().filter(|(s, _)| *s > 5).cloned().collect();
    let m = Master::recover(c, Time(0), Some(&cp), tail).unwrap();
    assert_eq!(m.meta().fingerprint(), h.m.meta().fingerprint());
}

/// A write target for chunk `idx` of `path`, and the chunk sizes the lease grants it
/// took told their primaries (none if a lease was already out).
fn target_and_grants(h: &mut H, path: &str, idx: u64) -> (pb::WriteTarget, Vec<u64>) {
    let (id, mut e) = h.send(MReq::GetWriteTarget(pb::GetWriteTargetRequest {
        path: path.into(),
        chunk_index: idx,
        append: false,
    }));
    e.replies.extend(h.sync().replies);
    let grants = h
        .calls
        .iter()
        .filter_map(|c| match &c.req.req {
            Some(CReq::SetVersion(s)) if s.lease_ms > 0 => Some(s.chunk_size),
            _ => None,
        })
        .collect();
    e.replies.extend(h.answer_calls(&[]).replies);
    match reply_for(&e, id).expect("write target reply").resp {
        Some(Resp::WriteTarget(t)) => (t, grants),
        other => panic!("{other:?}"),
    }
}

/// The chunk size the master answers `path`'s locations with.
fn located_chunk_size(h: &mut H, path: &str) -> u64 {
    match h
        .call(MReq::GetChunks(pb::GetChunksRequest {
            path: path.into(),
            first_index: 0,
            count: 0,
        }))
        .resp
    {
        Some(Resp::GetChunks(c)) => c.chunk_size,
        other => panic!("{other:?}"),
    }
}

fn recovered(m: Master, now: Time) -> H {
    H {
        m,
        now,
        next_id: 1,
        log: vec![],
        calls: vec![],
        answer_step: 0,
    }
}

/// A file's chunk size is part of its metadata: a master restarted with another default
/// (from its log, or from a checkpoint) still answers with the size the file was written
/// with, in locations, write targets and lease grants alike; new files get the new one.
#[test]
fn a_file_keeps_its_chunk_size_when_the_default_changes() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/a"));
    let (t, grants) = target_and_grants(&mut h, "/a", 0);
    assert_eq!((t.chunk_size, grants), (1024, vec![1024]));

    // Recovered from the log, with chunks of 4096 for new files.
    let mut c = cfg();
    c.chunk_size = 4096;
    let m = Master::recover(c.clone(), Time(1000), None, h.log.clone()).unwrap();
    let mut h = recovered(m, Time(1000));
    cluster(&mut h, 3, 3);
    assert_eq!(located_chunk_size(&mut h, "/a"), 1024);
    // A new chunk of the old file (no quiet period: it did not exist before the restart).
    let (t, grants) = target_and_grants(&mut h, "/a", 1);
    assert_eq!((t.chunk_size, grants), (1024, vec![1024]));
    h.call(create("/b"));
    assert_eq!(located_chunk_size(&mut h, "/b"), 4096);
    let (t, grants) = target_and_grants(&mut h, "/b", 0);
    assert_eq!((t.chunk_size, grants), (4096, vec![4096]));
    // A target under a lease already out says the same.
    let (t, grants) = target_and_grants(&mut h, "/a", 1);
    assert_eq!((t.chunk_size, grants), (1024, vec![]));

    // Recovered from a checkpoint alone, with yet another default.
    let cp = h.m.meta().checkpoint(h.m.last_seq());
    c.chunk_size = 8192;
    let m = Master::recover(c, Time(2000), Some(&cp), vec![]).unwrap();
    assert_eq!(m.meta().fingerprint(), h.m.meta().fingerprint());
    let mut h = recovered(m, Time(2000));
    assert_eq!(located_chunk_size(&mut h, "/a"), 1024);
    assert_eq!(located_chunk_size(&mut h, "/b"), 4096);
    h.call(create("/c"));
    assert_eq!(located_chunk_size(&mut h, "/c"), 8192);
}

/// A create record from before files kept their chunk size names none: such a file takes
/// the configured default at recovery.
#[test]
fn a_create_record_without_a_chunk_size_takes_the_default() {
    let log = vec![(
        1,
        pb::LogRecord {
            time_ms: 0,
            token: 0,
            op: Some(Op::Create(pb::CreateOp {
                perms: None,
                path: "/old".into(),
                replication: 3,
                chunk_size: 0,
            })),
        },
    )];
    let mut c = cfg();
    c.chunk_size = 2048;
    let m = Master::recover(c, Time(0), None, log).unwrap();
    let mut h = recovered(m, Time(0));
    assert_eq!(located_chunk_size(&mut h, "/old"), 2048);
}

#[test]
fn recovery_rejects_gaps_and_bad_records() {
    let mut h = H::new();
    h.call(create("/a"));
    h.call(create("/b"));
    let mut log = h.log.clone();
    log.remove(0);
    assert!(Master::recover(cfg(), Time(0), None, log).is_err());
    let bad = vec![(
        1,
        pb::LogRecord {
            time_ms: 0,
            token: 0,
            op: Some(Op::Remove(pb::RemoveOp {
                path: "/nope".into(),
            })),
        },
    )];
    assert!(Master::recover(cfg(), Time(0), None, bad).is_err());
    let cp = pb::Checkpoint {
        through_seq: 1,
        next_handle: 1,
        entries: vec![pb::CheckpointEntry {
            path: "/x".into(),
            chunks: vec![9],
            replication: 3,
            ..Default::default()
        }],
        chunks: vec![],
        retired: vec![],
        reserved: vec![],
        cluster_id: 1,
        completed: vec![],
        fallbacks: vec![],
        ..Default::default()
    };
    assert!(Master::recover(cfg(), Time(0), Some(&cp), vec![]).is_err());
    // A completed request without a token, or an append region past the largest offset.
    for (token, offset) in [(0, 1), (5, u64::MAX)] {
        let cp = pb::Checkpoint {
            through_seq: 1,
            next_handle: 1,
            cluster_id: 1,
            completed: vec![pb::Completed {
                token,
                path: "/x".into(),
                offset,
                length: 2,
                append: true,
            }],
            ..Default::default()
        };
        assert!(Master::recover(cfg(), Time(0), Some(&cp), vec![]).is_err());
    }
}

// ---- property tests -------------------------------------------------------------------

#[derive(Clone, Debug)]
enum NsOp {
    Mkdir(usize),
    Create(usize),
    Delete(usize),
    Rename(usize, usize),
    AddChunk(usize),
    Extend(usize, u64),
}

const PATHS: [&str; 8] = ["/a", "/b", "/a/x", "/a/y", "/b/x", "/a/x/z", "/c", "/b/q"];

fn op_strategy() -> impl Strategy<Value = NsOp> {
    let p = 0..PATHS.len();
    prop_oneof![
        p.clone().prop_map(NsOp::Mkdir),
        p.clone().prop_map(NsOp::Create),
        p.clone().prop_map(NsOp::Delete),
        (p.clone(), p.clone()).prop_map(|(a, b)| NsOp::Rename(a, b)),
        p.clone().prop_map(NsOp::AddChunk),
        (p, 0u64..5000).prop_map(|(a, l)| NsOp::Extend(a, l)),
    ]
}

/// The reference model: a map from full path to (is_dir, length), and the files that
/// have a chunk (a file is extended no further than its chunks reach).
#[derive(Default, Debug)]
struct Model(BTreeMap<String, (bool, u64)>, BTreeSet<String>);

impl Model {
    fn parent_ok(&self, p: &str) -> bool {
        let (parent, _) = crate::path::split_last(p).unwrap();
        parent == "/" || self.0.get(&parent).is_some_and(|e| e.0)
    }

    fn apply(&mut self, op: &NsOp) -> bool {
        match *op {
            NsOp::Mkdir(i) | NsOp::Create(i) => {
                let p = PATHS[i];
                if self.0.contains_key(p) || !self.parent_ok(p) {
                    return false;
                }
                self.0.insert(p.into(), (matches!(op, NsOp::Mkdir(_)), 0));
                true
            }
            NsOp::Delete(i) => {
                // Deletion (with recursive) hides the subtree; the model drops it.
                let p = PATHS[i];
                if !self.0.contains_key(p) {
                    return false;
                }
                self.0.retain(|k, _| !crate::path::is_within(k, p));
                self.1.retain(|k| !crate::path::is_within(k, p));
                true
            }
            NsOp::Rename(a, b) => {
                let (a, b) = (PATHS[a], PATHS[b]);
                if !self.0.contains_key(a)
                    || self.0.contains_key(b)
                    || !self.parent_ok(b)
                    || crate::path::is_within(b, a)
                {
                    return false;
                }
                let moved: Vec<_> = self
                    .0
                    .iter()
                    .filter(|(k, _)| crate::path::is_within(k, a))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                for (k, v) in moved {
                    self.0.remove(&k);
                    let to = format!("{b}{}", &k[a.len()..]);
                    if self.1.remove(&k) {
                        self.1.insert(to.clone());
                    }
                    self.0.insert(to, v);
                }
                true
            }
            NsOp::AddChunk(i) => {
                let file = self.0.get(PATHS[i]).is_some_and(|e| !e.0);
                if file {
                    self.1.insert(PATHS[i].into());
                }
                file
            }
            NsOp::Extend(i, l) => match self.0.get_mut(PATHS[i]) {
                Some(e) if !e.0 && l <= u64::from(self.1.contains(PATHS[i])) * cfg().chunk_size => {
                    e.1 = e.1.max(l);
                    true
                }
                _ => false,
            },
        }
    }
}

fn request(op: &NsOp) -> MReq {
    match *op {
        NsOp::Mkdir(i) => mkdir(PATHS[i]),
        NsOp::Create(i) => create(PATHS[i]),
        NsOp::Delete(i) => MReq::Delete(pb::DeleteRequest {
            path: PATHS[i].into(),
            recursive: true,
        }),
        NsOp::Rename(a, b) => rename(PATHS[a], PATHS[b]),
        NsOp::AddChunk(i) => MReq::GetWriteTarget(pb::GetWriteTargetRequest {
            path: PATHS[i].into(),
            chunk_index: 0,
            append: false,
        }),
        NsOp::Extend(i, l) => MReq::ExtendFile(pb::ExtendFileRequest {
            path: PATHS[i].into(),
            length: l,
            ..Default::default()
        }),
    }
}

/// Every visible path and its (is_dir, length), walked through list requests.
fn visible(h: &mut H) -> BTreeMap<String, (bool, u64)> {
    let mut out = BTreeMap::new();
    let mut stack = vec!["/".to_string()];
    while let Some(d) = stack.pop() {
        let r = h.call(MReq::List(pb::ListRequest {
            path: d,
            include_deleted: false,
            ..Default::default()
        }));
        let Some(Resp::List(l)) = r.resp else {
            panic!("{r:?}")
        };
        for e in l.entries {
            if e.is_dir {
                stack.push(e.path.clone());
            }
            out.insert(e.path, (e.is_dir, e.length));
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// The namespace against a BTreeMap model: same successes, same final tree.
    #[test]
    fn namespace_matches_model(ops in proptest::collection::vec(op_strategy(), 1..40)) {
        let mut h = H::new();
        cluster(&mut h, 3, 3);
        let mut model = Model::default();
        for op in &ops {
            let want = model.apply(op);
            let (id, mut e) = h.send(request(op));
            e.replies.extend(h.sync().replies);
            if reply_for(&e, id).is_none() {
                e.replies.extend(h.answer_calls(&[]).replies);
            }
            let got = reply_for(&e, id).expect("a reply");
            prop_assert_eq!(got.error.is_none(), want, "{:?} -> {:?}", op, got);
            h.advance(Duration::from_millis(7));
        }
        prop_assert_eq!(visible(&mut h), model.0);
        prop_assert!(h.m.is_quiescent());
    }

    /// Replaying the op log reaches the live master's state; so does checkpoint + tail,
    /// wherever the checkpoint is cut.
    #[test]
    fn replay_and_checkpoint_match_live(ops in proptest::collection::vec(op_strategy(), 1..40), cut in 0usize..40) {
        let mut h = H::new();
        cluster(&mut h, 3, 3);
        let mut checkpoint = None;
        for (i, op) in ops.iter().enumerate() {
            h.send(request(op));
            h.sync();
            h.answer_calls(&[]);
            h.advance(Duration::from_millis(3));
            if i == cut {
                checkpoint = Some(h.m.checkpoint_now());
            }
        }
        let live = h.m.meta().fingerprint();
        let replayed = Master::recover(cfg(), Time(0), None, h.log.clone()).unwrap();
        prop_assert_eq!(&replayed.meta().fingerprint(), &live);
        if let Some(cp) = checkpoint {
            let tail: Vec<_> = h.log.iter().filter(|(s, _)| *s > cp.through_seq).cloned().collect();
            let restored = Master::recover(cfg(), Time(0), Some(&cp), tail).unwrap();
            prop_assert_eq!(&restored.meta().fingerprint(), &live);
        }
    }
}

#[test]
fn lease_is_renewed_when_a_replica_leaves() {
    let mut h = H::new();
    // Past the start-up quiet period, so a re-grant is possible while the lease is valid.
    h.advance(Duration::from_secs(12));
    cluster(&mut h, 4, 4);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    // One secondary dies; the others keep reporting.
    let gone = t.secondaries[0].clone();
    h.advance(Duration::from_secs(6));
    for i in 0..4 {
        let a = format!("cs{i}");
        if a != gone {
            let rep: Vec<(u64, u64)> = if a == t.primary || t.secondaries.contains(&a) {
                vec![(t.handle, 1)]
            } else {
                vec![]
            };
            h.heartbeat(&a, "r", &rep);
        }
    }
    h.step(Input::Tick);
    // The lease is still valid, but writes under it would leave `gone` stale at version 1.
    h.calls.clear();
    let e = h.write_target("/f", 0).unwrap_err();
    assert!(matches!(e, FsError::Unavailable(_)), "{e:?}");
    let revoke = h
        .calls
        .iter()
        .find(|c| matches!(c.req.req, Some(CReq::RevokeLease(_))))
        .expect("lease revoked");
    assert_eq!(revoke.to, t.primary);
    h.answer_calls(&[]);
    // Before a new lease, the chunk gets its third replica back.
    let e = h.write_target("/f", 0).unwrap_err();
    assert!(matches!(e, FsError::Unavailable(_)), "{e:?}");
    assert!(
        h.calls
            .iter()
            .any(|c| matches!(c.req.req, Some(CReq::Clone(_)))),
        "no repair started"
    );
    h.answer_calls(&[]);
    let t2 = h.write_target("/f", 0).unwrap();
    assert_eq!(
        t2.secondaries.len(),
        2,
        "granted before the replica count was restored"
    );
    assert_eq!(
        t2.version, 2,
        "a new version, so the departed replica is stale"
    );
    assert!(t2.primary != gone && !t2.secondaries.contains(&gone));
}

#[test]
fn a_grant_taken_too_late_is_not_trusted() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    // The create grant cannot reach cs2 in time, but cs2 applies version 1 anyway.
    let (id, _) = h.send(MReq::GetWriteTarget(pb::GetWriteTargetRequest {
        path: "/f".into(),
        chunk_index: 0,
        append: false,
    }));
    assert!(
        h.calls.is_empty(),
        "a chunkserver heard of a handle before its allocation was durable"
    );
    h.sync();
    assert!(!h.calls.is_empty());
    let e = h.answer_calls(&["cs2"]);
    let Some(Resp::WriteTarget(t)) = reply_for(&e, id).unwrap().resp else {
        panic!()
    };
    if t.primary == "cs2" {
        return; // the primary failed: no lease, nothing to check here
    }
    assert!(!t.secondaries.contains(&"cs2".to_string()));
    let hb = h.heartbeat("cs2", "r", &[(t.handle, 1)]);
    assert_eq!(
        hb.delete_chunks
            .iter()
            .map(|d| d.handle)
            .collect::<Vec<_>>(),
        vec![t.handle],
        "a copy that missed the grant's writes was kept"
    );
    assert!(!chunk_replicas(&mut h, "/f").contains(&"cs2".to_string()));
    // A restarted master remembers: the order is in the log.
    h.sync();
    let m = Master::recover(cfg(), Time(0), None, h.log.clone()).unwrap();
    let mut h2 = H {
        m,
        now: Time(0),
        next_id: 1,
        log: vec![],
        calls: vec![],
        answer_step: 0,
    };
    let hb = h2.heartbeat("cs2", "r", &[(t.handle, 1)]);
    assert_eq!(
        hb.delete_chunks
            .iter()
            .map(|d| d.handle)
            .collect::<Vec<_>>(),
        vec![t.handle],
        "a restarted master took the copy back"
    );
    // Once cs2 shows it has deleted it, two lease periods later, the order is lifted.
    h2.heartbeat("cs2", "r", &[]);
    h2.advance(Duration::from_secs(21));
    h2.heartbeat("cs2", "r", &[]);
    h2.sync();
    assert!(h2.m.meta().retired.is_empty(), "the order was never lifted");
}

/// A create order that reached cs2 in time but sits on its stuck disk: cs2 reports the
/// chunk as changing, not held, for longer than the order could be valid. When the write
/// lands, the empty copy at the current version must still be refused.
#[test]
fn a_grant_stuck_on_a_disk_is_refused_when_it_lands() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let (id, _) = h.send(MReq::GetWriteTarget(pb::GetWriteTargetRequest {
        path: "/f".into(),
        chunk_index: 0,
        append: false,
    }));
    h.sync();
    // A secondary's disk sticks (the primary's would leave no lease to protect).
    let stuck = h.grant_target(false).expect("a secondary");
    let e = h.answer_calls(&[&stuck]);
    let Some(Resp::WriteTarget(t)) = reply_for(&e, id).unwrap().resp else {
        panic!()
    };
    assert_ne!(t.primary, stuck);
    let cluster_id = h.m.cluster_id();
    let changing = |h: &mut H| {
        h.heartbeat_changing(&stuck, server_id(&stuck), cluster_id, "r", &[], &[t.handle]);
    };
    changing(&mut h);
    for _ in 0..10 {
        h.advance(Duration::from_secs(5));
        changing(&mut h);
    }
    h.sync();
    assert!(
        !h.m.meta().retired.is_empty(),
        "lifted while the copy was still on its way"
    );
    // The write lands: the copy is empty, at the version the others took writes under.
    let hb = h.heartbeat(&stuck, "r", &[(t.handle, 1)]);
    assert_eq!(
        hb.delete_chunks
            .iter()
            .map(|d| d.handle)
            .collect::<Vec<_>>(),
        vec![t.handle],
        "a copy that missed the grant's writes was kept"
    );
    assert!(!chunk_replicas(&mut h, "/f").contains(&stuck));
}

#[test]
fn recovered_master_repairs_chunks_reported_short() {
    let mut h = H::new();
    cluster(&mut h, 4, 4);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    let log = h.log.clone();
    let m = Master::recover(cfg(), Time(100_000), None, log).unwrap();
    let mut h2 = H {
        m,
        now: Time(100_000),
        next_id: 1,
        log: vec![],
        calls: vec![],
        answer_step: 0,
    };
    // Only two of the three holders come back.
    let report = |h2: &mut H| {
        h2.heartbeat(&t.primary, "r1", &[(t.handle, 1)]);
        h2.heartbeat(&t.secondaries[0], "r2", &[(t.handle, 1)]);
        let spare = (0..4)
            .map(|i| format!("cs{i}"))
            .find(|a| *a != t.primary && !t.secondaries.contains(a))
            .unwrap();
        h2.heartbeat(&spare, "r3", &[]);
    };
    let cloned = |h2: &H| {
        h2.calls
            .iter()
            .any(|c| matches!(&c.req.req, Some(CReq::Clone(cl)) if cl.handle == t.handle))
    };
    report(&mut h2);
    h2.step(Input::Tick);
    assert!(
        !cloned(&h2),
        "cloned before every server had time to report"
    );
    // Every server has had time to report, but a lease granted before the restart may
    // still be valid (10 s lease + 1 s skew): its primary would forward writes to the two
    // holders and not to a new copy at the same version.
    h2.advance(Duration::from_secs(6));
    report(&mut h2);
    h2.step(Input::Tick);
    assert!(
        !cloned(&h2),
        "cloned while a lease from before the restart may be out"
    );
    h2.advance(Duration::from_secs(5));
    report(&mut h2);
    h2.step(Input::Tick);
    assert!(cloned(&h2), "never repaired");
}

#[test]
fn no_copy_is_trimmed_while_a_lease_from_before_a_restart_may_be_out() {
    let mut h = H::new();
    cluster(&mut h, 4, 2);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    let m = Master::recover(cfg(), Time(100_000), None, h.log.clone()).unwrap();
    let mut h2 = H {
        m,
        now: Time(100_000),
        next_id: 1,
        log: vec![],
        calls: vec![],
        answer_step: 0,
    };
    // All four servers report the chunk at the current version: one copy too many.
    let all = |h2: &mut H| {
        for i in 0..4 {
            h2.heartbeat(
                &format!("cs{i}"),
                &format!("rack{}", i % 2),
                &[(t.handle, 1)],
            );
        }
    };
    all(&mut h2);
    // Past the heartbeat timeout, inside the quiet period: the lease holder may still be
    // forwarding to a copy that trimming would pick.
    h2.advance(Duration::from_secs(6));
    all(&mut h2);
    h2.step(Input::Tick);
    assert_eq!(
        chunk_replicas(&mut h2, "/f").len(),
        4,
        "trimmed under a lease"
    );
    h2.advance(Duration::from_secs(5));
    all(&mut h2);
    h2.step(Input::Tick);
    assert_eq!(chunk_replicas(&mut h2, "/f").len(), 3, "never trimmed");
}

/// Asks for a write target on chunk 0 of `path` and fails every call of the grant that
/// follows (the request fails); returns the servers the grant went to.
fn grant_nobody_takes(h: &mut H, path: &str) -> Vec<String> {
    let (id, _) = h.send(MReq::GetWriteTarget(pb::GetWriteTargetRequest {
        path: path.into(),
        chunk_index: 0,
        append: false,
    }));
    h.sync();
    let all: Vec<String> = h.calls.iter().map(|c| c.to.clone()).collect();
    let e = h.answer_calls(&all.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(reply_for(&e, id).unwrap().error.is_some());
    all
}

#[test]
fn a_void_lease_is_counted_until_a_late_grant_would_end() {
    let mut c = cfg();
    c.call_timeout = Duration::from_secs(2);
    c.late_delivery = Duration::from_secs(3);
    let mut h = H::with(c.clone());
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    // Nobody answers the grant: its primary may still take it, up to the order's
    // deadline and a late delivery after, and hold the lease for a period from then.
    let gave_up = h.now;
    grant_nobody_takes(&mut h, "/f");
    let (_, lease) = h.m.leases().held().next().expect("a void lease is kept");
    assert!(lease.void);
    assert_eq!(
        lease.expires,
        gave_up + c.call_timeout + c.late_delivery + c.lease_duration,
        "a void lease counted short of a late grant's lease"
    );
}

#[test]
fn a_version_number_is_never_used_twice() {
    let mut h = H::new();
    cluster(&mut h, 6, 6);
    h.call(create("/f"));
    // The first create grant reaches nobody in time (all may apply it later).
    let first = grant_nobody_takes(&mut h, "/f");
    // Once that void lease has run out, the next grant succeeds, at a fresh number.
    h.advance(Duration::from_secs(12));
    cluster(&mut h, 6, 6);
    let t = h.write_target("/f", 0).unwrap();
    assert_eq!(t.version, 2, "a version number used again");
    // A participant of the failed grant that applied it late holds an older version.
    let late = first
        .iter()
        .find(|a| **a != t.primary && !t.secondaries.contains(a));
    if let Some(late) = late {
        let hb = h.heartbeat(late, "r", &[(t.handle, 1)]);
        assert_eq!(
            hb.delete_chunks
                .iter()
                .map(|d| d.handle)
                .collect::<Vec<_>>(),
            vec![t.handle],
            "a copy from a failed grant passed for current"
        );
    }
}

#[test]
fn a_failed_regrant_keeps_the_good_copies() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    // After the lease, a new grant (v2) reaches nobody.
    h.advance(Duration::from_secs(12));
    cluster_report(
        &mut h,
        &[
            ("cs0", t.handle, 1),
            ("cs1", t.handle, 1),
            ("cs2", t.handle, 1),
        ],
    );
    let (id, _) = h.send(MReq::GetWriteTarget(pb::GetWriteTargetRequest {
        path: "/f".into(),
        chunk_index: 0,
        append: false,
    }));
    h.sync();
    let e = h.answer_calls(&["cs0", "cs1", "cs2"]);
    assert!(reply_for(&e, id).unwrap().error.is_some());
    // Their version-1 copies are the chunk: none may be refused.
    for a in ["cs0", "cs1", "cs2"] {
        let hb = h.heartbeat(a, "r", &[(t.handle, 1)]);
        assert!(hb.delete_chunks.is_empty(), "{a}'s good copy was deleted");
    }
    assert_eq!(chunk_replicas(&mut h, "/f").len(), 3);
    // A copy that applied version 2 late is as good (no one wrote under 2): adopted.
    let hb = h.heartbeat("cs0", "r", &[(t.handle, 2)]);
    assert!(hb.delete_chunks.is_empty());
    h.sync();
    assert_eq!(h.m.meta().chunks.get(t.handle).unwrap().version, 2);
}

#[test]
fn a_first_grant_lost_in_a_crash_still_waits_out_the_quiet_period() {
    let mut h = H::new();
    h.advance(Duration::from_secs(12));
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    // The chunk is allocated and its first grant sent, then the master dies before any
    // answer: the log has the chunk at version 0, a primary may hold a lease on it.
    h.send(MReq::GetWriteTarget(pb::GetWriteTargetRequest {
        path: "/f".into(),
        chunk_index: 0,
        append: false,
    }));
    h.sync();
    assert!(!h.calls.is_empty());
    let m = Master::recover(cfg(), Time(20_000), None, h.log.clone()).unwrap();
    let mut h2 = H {
        m,
        now: Time(20_000),
        next_id: 1,
        log: vec![],
        calls: vec![],
        answer_step: 0,
    };
    cluster(&mut h2, 3, 3);
    assert!(
        matches!(h2.write_target("/f", 0), Err(FsError::Unavailable(_))),
        "granted during the quiet period"
    );
    h2.advance(Duration::from_secs(12));
    cluster(&mut h2, 3, 3);
    assert!(h2.write_target("/f", 0).is_ok());
}

/// A group's new leader grants leases on existing chunks as soon as every server logged
/// as a lease holder in an older term has sent a heartbeat of its term (such a server
/// gave up its older leases), not a lease period later; a heartbeat of an older term, or
/// from another server at a holder's address, proves nothing. Fencing needs a log in
/// which some leader's quiet period has ended: before that, holders may be unnamed.
#[test]
fn a_new_leader_grants_once_every_older_lease_holder_shows_its_term() {
    let holders = |log: &[(LogSeq, pb::LogRecord)]| -> Vec<(String, u64, u64)> {
        log.iter()
            .filter_map(|(_, r)| match &r.op {
                Some(Op::LeaseHolder(o)) => Some((o.address.clone(), o.term, o.forget_before)),
                _ => None,
            })
            .collect()
    };
    let meta_of = |logs: &[&[(LogSeq, pb::LogRecord)]]| {
        let mut meta = crate::master::Meta::new(cfg().chunk_size);
        let mut seq = 0;
        for log in logs {
            for (s, r) in log.iter() {
                meta.apply(r).unwrap();
                seq = *s;
            }
        }
        // Through a checkpoint, as a follower's snapshot would carry it.
        let meta = crate::master::Meta::restore(&meta.checkpoint(seq), cfg().chunk_size).unwrap();
        (meta, seq)
    };
    let take_over = |meta, seq, at: Time, epoch| H {
        m: Master::take_over(cfg(), at, meta, seq, epoch),
        now: at,
        next_id: 1,
        log: vec![],
        calls: vec![],
        answer_step: 0,
    };
    // A log from before holders were named, with a lease out.
    let mut h0 = H::new();
    h0.advance(Duration::from_secs(12));
    cluster(&mut h0, 3, 3);
    h0.call(create("/old"));
    h0.write_target("/old", 0).unwrap();
    h0.log
        .retain(|(_, r)| !matches!(r.op, Some(Op::LeaseHolder(_))));
    // The group's first leader on it: no holder is named, so it waits the period out (11 s
    // here), and then logs that it is over.
    let (meta, seq) = meta_of(&[&h0.log]);
    let mut h1 = take_over(meta, seq, Time(1_000), 1);
    assert!(!h1.m.leases().quiet_ended_early());
    for i in 0..3 {
        h1.heartbeat_in_term(&format!("cs{i}"), 1, &[]);
    }
    h1.step(Input::Tick);
    assert!(
        holders(&h1.log).is_empty(),
        "settled before the period was over"
    );
    h1.advance(Duration::from_secs(12));
    h1.step(Input::Tick);
    assert_eq!(holders(&h1.log), vec![(String::new(), 1, 1)]);
    for i in 0..3 {
        h1.heartbeat_in_term(&format!("cs{i}"), 1, &[]);
    }
    h1.call(create("/f"));
    h1.call(create("/g"));
    let f = h1.write_target("/f", 0).unwrap();
    let g = h1.write_target("/g", 0).unwrap();
    // Each primary was named, once, before its grant went out.
    let mut named: Vec<String> = holders(&h1.log)[1..]
        .iter()
        .map(|(a, _, _)| a.clone())
        .collect();
    let mut primaries = vec![f.primary.clone(), g.primary.clone()];
    primaries.dedup();
    named.sort();
    primaries.sort();
    assert_eq!(named, primaries, "{:?}", holders(&h1.log));
    assert!(
        holders(&h1.log)[1..]
            .iter()
            .all(|&(_, t, fb)| t == 1 && fb == 0)
    );
    // Term 2 takes over.
    let (meta, seq) = meta_of(&[&h0.log, &h1.log]);
    assert_eq!(meta.lease_holders.len(), primaries.len());
    let mut h2 = take_over(meta, seq, Time(20_000), 2);
    for i in 0..3 {
        h2.heartbeat_in_term(&format!("cs{i}"), 1, &[]);
    }
    let quiet = |h: &mut H| matches!(h.write_target("/f", 0), Err(FsError::Unavailable(m)) if m.contains("no leases"));
    assert!(quiet(&mut h2), "granted on heartbeats of an older term");
    // Every holder but one shows the new term: still quiet.
    let (last, rest) = primaries.split_last().unwrap();
    for p in rest {
        h2.heartbeat_in_term(p, 2, &[]);
    }
    assert!(
        quiet(&mut h2),
        "granted before every older holder showed the new term"
    );
    // Another server at the last holder's address proves nothing of it.
    let r = h2.call(MReq::Heartbeat(pb::HeartbeatRequest {
        address: last.clone(),
        server_id: 999,
        cluster_id: h2.m.cluster_id(),
        epoch: 2,
        ..Default::default()
    }));
    assert!(r.error.is_some());
    assert!(quiet(&mut h2), "granted on a heartbeat of another server");
    // The last one itself: no lease of an older term is left anywhere.
    h2.advance(Duration::from_secs(1));
    h2.heartbeat_in_term(last, 2, &[]);
    assert!(h2.m.leases().quiet_ended_early());
    // A replica still storing term 2 would refuse the version: not yet.
    let lagging = f.secondaries[0].clone();
    for r in std::iter::once(&f.primary).chain(&f.secondaries) {
        let term = if *r == lagging { 1 } else { 2 };
        h2.heartbeat_in_term(r, term, &[(f.handle, f.version)]);
    }
    assert!(
        matches!(h2.write_target("/f", 0), Err(FsError::Unavailable(m)) if m.contains("has not yet taken master term 2")),
        "a grant sent to a replica still storing the term"
    );
    // Not for ever: once the period would have ended by time, a replica that never says
    // it took the term (a failing disk, an older binary) no longer holds writes back.
    h2.advance(Duration::from_secs(12));
    for r in std::iter::once(&f.primary).chain(&f.secondaries) {
        let term = if *r == lagging { 1 } else { 2 };
        h2.heartbeat_in_term(r, term, &[(f.handle, f.version)]);
    }
    let t = h2.write_target("/f", 0).unwrap();
    assert!(t.version > f.version);
    // The period's end is logged on the next tick; term 1's holders are forgotten, this
    // leader's stay.
    h2.step(Input::Tick);
    h2.sync();
    let settled = holders(&h2.log);
    assert!(settled.contains(&(String::new(), 2, 2)), "{settled:?}");
    let (replay, _) = meta_of(&[&h0.log, &h1.log, &h2.log]);
    assert_eq!(replay.leases_settled_in, 2);
    assert_eq!(
        replay
            .lease_holders
            .into_keys()
            .map(|(a, _)| a)
            .collect::<Vec<_>>(),
        vec![t.primary.clone()]
    );
}

/// A master restarted in a term that already had one (its holders named in that very
/// term) does not fence: a term change ends nobody's lease.
#[test]
fn a_second_master_of_one_term_waits_the_quiet_period_out() {
    let mut h = H::new();
    h.advance(Duration::from_secs(12));
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    h.write_target("/f", 0).unwrap();
    let mut meta = crate::master::Meta::new(cfg().chunk_size);
    for (_, r) in &h.log {
        meta.apply(r).unwrap();
    }
    let seq = h.log.last().unwrap().0;
    // As if term 3's leader had settled its period, then granted (a holder of term 3).
    for op in [
        pb::LeaseHolderOp {
            address: String::new(),
            term: 3,
            forget_before: 3,
            server_id: 0,
        },
        pb::LeaseHolderOp {
            address: "cs0".into(),
            term: 3,
            forget_before: 0,
            server_id: server_id("cs0"),
        },
    ] {
        meta.apply(&pb::LogRecord {
            time_ms: 0,
            token: 0,
            op: Some(Op::LeaseHolder(op)),
        })
        .unwrap();
    }
    let m = Master::take_over(cfg(), Time(20_000), meta, seq, 3);
    let mut h2 = H {
        m,
        now: Time(20_000),
        next_id: 1,
        log: vec![],
        calls: vec![],
        answer_step: 0,
    };
    for i in 0..3 {
        h2.heartbeat_in_term(&format!("cs{i}"), 3, &[]);
    }
    assert!(!h2.m.leases().quiet_ended_early());
    assert!(matches!(
        h2.write_target("/f", 0),
        Err(FsError::Unavailable(_))
    ));
}

/// A master that runs alone has no term to fence with: it waits the whole period out.
#[test]
fn a_lone_master_restarted_waits_out_the_quiet_period_whatever_heartbeats_say() {
    let mut h = H::new();
    h.advance(Duration::from_secs(12));
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    h.write_target("/f", 0).unwrap();
    let m = Master::recover(cfg(), Time(20_000), None, h.log.clone()).unwrap();
    let mut h2 = H {
        m,
        now: Time(20_000),
        next_id: 1,
        log: vec![],
        calls: vec![],
        answer_step: 0,
    };
    for i in 0..3 {
        h2.heartbeat_in_term(&format!("cs{i}"), 0, &[]);
        h2.heartbeat_in_term(&format!("cs{i}"), 7, &[]);
    }
    assert!(matches!(
        h2.write_target("/f", 0),
        Err(FsError::Unavailable(_))
    ));
    assert!(!h2.m.leases().quiet_ended_early());
}

#[test]
fn a_version_handed_out_before_a_crash_is_never_handed_out_again() {
    let mut h = H::new();
    h.advance(Duration::from_secs(12));
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let t1 = h.write_target("/f", 0).unwrap();
    assert_eq!(t1.version, 1);
    // The lease runs out; a second grant goes out (its version reserved and durable)...
    h.advance(Duration::from_secs(12));
    for i in 0..3 {
        h.heartbeat(&format!("cs{i}"), "r", &[(t1.handle, 1)]);
    }
    h.send(MReq::GetWriteTarget(pb::GetWriteTargetRequest {
        path: "/f".into(),
        chunk_index: 0,
        append: false,
    }));
    h.sync();
    let sv: Vec<(String, u64)> = h
        .calls
        .iter()
        .filter_map(|c| match &c.req.req {
            Some(CReq::SetVersion(s)) => Some((c.to.clone(), s.version)),
            _ => None,
        })
        .collect();
    assert!(sv.iter().all(|(_, v)| *v == 2) && !sv.is_empty());
    // ...one replica takes version 2, and the master dies before logging it as current.
    let m = Master::recover(cfg(), Time(40_000), None, h.log.clone()).unwrap();
    let mut h2 = H {
        m,
        now: Time(40_000),
        next_id: 1,
        log: vec![],
        calls: vec![],
        answer_step: 0,
    };
    // The replica that took version 2 stays away; the others report version 1.
    let (away, _) = sv[0].clone();
    for i in 0..3 {
        let a = format!("cs{i}");
        if a != away {
            h2.heartbeat(&a, "r", &[(t1.handle, 1)]);
        }
    }
    h2.advance(Duration::from_secs(12));
    for i in 0..3 {
        let a = format!("cs{i}");
        if a != away {
            h2.heartbeat(&a, "r", &[(t1.handle, 1)]);
        }
    }
    let t = h2.write_target("/f", 0).unwrap();
    assert_eq!(t.version, 3, "version 2 handed out twice");
    // The copy at version 2 comes back: it missed the writes under version 3. It is no
    // location (kept as a fallback while the chunk has two copies of three), and is
    // told to delete it once the chunk is back at its goal.
    h2.heartbeat(&away, "r", &[(t1.handle, 2)]);
    assert!(
        !chunk_replicas(&mut h2, "/f").contains(&away),
        "a copy from the lost grant passed for current"
    );
    h2.heartbeat("cs3", "r", &[(t1.handle, 3)]);
    let hb = h2.heartbeat(&away, "r", &[(t1.handle, 2)]);
    assert_eq!(
        hb.delete_chunks
            .iter()
            .map(|d| d.handle)
            .collect::<Vec<_>>(),
        vec![t1.handle],
        "a copy from the lost grant passed for current"
    );
}

fn report(h: &mut H) -> pb::ClusterReport {
    match h.call(MReq::Report(pb::ReportRequest {})).resp {
        Some(Resp::Report(r)) => r,
        other => panic!("{other:?}"),
    }
}

fn fsck(h: &mut H, path: &str, list_chunks: bool) -> Result<pb::FsckResponse, FsError> {
    let r = h.call(MReq::Fsck(pb::FsckRequest {
        path: path.into(),
        list_chunks,
        ..Default::default()
    }));
    match r {
        pb::MasterResponse { error: Some(e), .. } => Err(FsError::from_pb(&e)),
        pb::MasterResponse {
            resp: Some(Resp::Fsck(f)),
            ..
        } => Ok(f),
        other => panic!("{other:?}"),
    }
}

#[test]
fn report_and_fsck_show_servers_and_chunk_health() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    assert!(is_ok(&h.call(mkdir("/d"))));
    h.call(create("/d/f"));
    h.call(create("/d/g"));
    h.call(create("/top"));
    let f = h.write_target("/d/f", 0).unwrap();
    let g = h.write_target("/d/g", 0).unwrap();
    assert_eq!((f.version, g.version), (1, 1));
    let all = |h: &mut H, servers: &[&str]| {
        for s in servers {
            h.heartbeat(
                s,
                &format!("rack{}", &s[2..]),
                &[(f.handle, 1), (g.handle, 1)],
            );
        }
    };
    all(&mut h, &["cs0", "cs1", "cs2"]);

    let r = report(&mut h);
    assert_eq!((r.files, r.chunks), (3, 2));
    assert_eq!(
        (r.under_replicated, r.missing, r.over_replicated),
        (0, 0, 0)
    );
    assert_eq!(r.servers.len(), 3);
    assert!(r.servers.iter().all(|s| s.alive && s.chunks == 2));
    assert_eq!(r.servers[2].rack, "rack2");
    assert_eq!(r.chunk_size, 1024);

    // Healthy: only the totals, unless every chunk is asked for.
    let quiet = fsck(&mut h, "/", false).unwrap();
    assert!(quiet.files.is_empty(), "{quiet:?}");
    assert_eq!(
        (quiet.dirs, quiet.total_files, quiet.total_chunks),
        (1, 3, 2)
    );
    assert_eq!(quiet.healthy, 2);
    assert_eq!((quiet.beyond_servers, quiet.live_servers), (0, 3));
    let full = fsck(&mut h, "/d", true).unwrap();
    let paths: Vec<_> = full.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, vec!["/d/f", "/d/g"]);
    let c = &full.files[0].chunks[0];
    assert_eq!((c.handle, c.version, c.goal), (f.handle, 1, 3));
    assert_eq!(c.health(), pb::ChunkHealth::Healthy);
    assert_eq!(c.replicas.len(), 3);
    let one = fsck(&mut h, "/d/g", true).unwrap();
    assert_eq!(one.files.len(), 1);
    assert_eq!(one.dirs, 0);

    // cs2 goes silent and is declared dead: both chunks are short a replica.
    h.advance(Duration::from_secs(3));
    all(&mut h, &["cs0", "cs1"]);
    h.advance(Duration::from_secs(3));
    all(&mut h, &["cs0", "cs1"]);
    h.step(Input::Tick);
    let r = report(&mut h);
    assert_eq!((r.under_replicated, r.missing), (2, 0));
    let dead: Vec<_> = r.servers.iter().filter(|s| !s.alive).collect();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].address, "cs2");
    assert!(dead[0].last_heartbeat_ms_ago >= 6000);
    let mut troubled = r.troubled.clone();
    troubled.sort();
    assert_eq!(troubled, vec![f.handle, g.handle]);
    let bad = fsck(&mut h, "/d", false).unwrap();
    assert_eq!(bad.files.len(), 2, "files with problems are listed");
    assert_eq!(bad.under_replicated, 2);
    // Two live servers cannot hold three copies: no repair will, until one comes.
    assert_eq!((bad.beyond_servers, bad.live_servers), (2, 2));
    let c = &bad.files[0].chunks[0];
    assert_eq!(c.health(), pb::ChunkHealth::UnderReplicated);
    let mut held: Vec<_> = c.replicas.iter().map(|r| r.address.as_str()).collect();
    held.sort();
    assert_eq!(held, vec!["cs0", "cs1"]);

    // /d/f is back at its goal (cs3 took a copy), so an old copy of it is no longer
    // worth keeping (`fallback.rs`): cs2 returns with one and is told to delete it, and
    // fsck says so.
    h.heartbeat("cs3", "rack3", &[(f.handle, 1)]);
    let hb = h.heartbeat("cs2", "rack2", &[(f.handle, 0)]);
    assert_eq!(hb.delete_chunks.len(), 1);
    let after = fsck(&mut h, "/d/f", false).unwrap();
    assert_eq!(after.files[0].chunks[0].deleting, vec!["cs2".to_string()]);
    let r = report(&mut h);
    assert_eq!((r.under_replicated, r.deleting), (1, 1));
    // /d/g is short a copy, and four servers live could hold it.
    let d = fsck(&mut h, "/d", false).unwrap();
    assert_eq!(
        (d.under_replicated, d.beyond_servers, d.live_servers),
        (1, 0, 4)
    );
    // Once cs2 no longer reports it, it is gone from the view.
    h.heartbeat("cs2", "rack2", &[(g.handle, 1)]);
    assert!(
        fsck(&mut h, "/d/f", true).unwrap().files[0].chunks[0]
            .deleting
            .is_empty()
    );
    assert_eq!(report(&mut h).deleting, 0);

    // Everyone gone: the chunks are missing.
    h.advance(Duration::from_secs(10));
    h.step(Input::Tick);
    let r = report(&mut h);
    assert_eq!((r.under_replicated, r.missing), (0, 2));
    assert!(r.servers.iter().all(|s| !s.alive));

    assert!(matches!(
        fsck(&mut h, "/nope", false),
        Err(FsError::NotFound(_))
    ));
}

#[test]
fn listings_come_in_pages_that_add_up_to_the_whole() {
    let mut h = H::new();
    assert!(is_ok(&h.call(mkdir("/d"))));
    for name in ["a", "b", "c", "d", "e", "f", "g"] {
        h.call(create(&format!("/d/{name}")));
    }
    h.call(delete("/d/c"));
    let page = |h: &mut H, after: &str, limit: u32, include_deleted: bool| {
        let r = h.call(MReq::List(pb::ListRequest {
            path: "/d".into(),
            include_deleted,
            start_after: after.into(),
            limit,
        }));
        let Some(Resp::List(l)) = r.resp else {
            panic!("{r:?}")
        };
        let names: Vec<String> = l
            .entries
            .iter()
            .map(|e| e.path.rsplit('/').next().unwrap().to_string())
            .collect();
        (names, l.more)
    };
    assert_eq!(
        page(&mut h, "", 3, false),
        (vec!["a".into(), "b".into(), "d".into()], true)
    );
    assert_eq!(
        page(&mut h, "d", 3, false),
        (vec!["e".into(), "f".into(), "g".into()], false)
    );
    // A name that is not there: the page starts where it would be.
    assert_eq!(page(&mut h, "dd", 1, false), (vec!["e".into()], true));
    // Hidden entries are skipped without shortening a page, and shown when asked for.
    let (hidden, _) = page(&mut h, "", 2, true);
    assert!(hidden[0].starts_with(DELETED_PREFIX), "{hidden:?}");
    // Nothing asked or too much asked: the master's page size.
    assert_eq!(page(&mut h, "", 0, false).0.len(), 6);
    assert_eq!(page(&mut h, "", u32::MAX, false).0.len(), 6);
    assert_eq!(listing(&mut h, "/d", false).len(), 6);
}

#[test]
fn a_file_with_more_chunks_than_a_page_goes_on_in_the_next() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    assert!(is_ok(&h.call(mkdir("/d"))));
    for (f, n) in [("/d/a", 2), ("/d/big", 7), ("/d/z", 1)] {
        h.call(create(f));
        for i in 0..n {
            h.write_target(f, i).unwrap();
        }
    }
    // Every page listed, and how many chunks each one listed.
    let pages = |h: &mut H, path: &str, list: bool, limit: usize, budget: usize| {
        let mut all = pb::FsckResponse::default();
        let mut sizes = Vec::new();
        let mut after = (String::new(), 0);
        loop {
            let page =
                h.m.fsck(path, list, (&after.0, after.1), limit, budget)
                    .unwrap();
            sizes.push(page.files.iter().map(|f| f.chunks.len()).sum::<usize>());
            after = crate::client::merge_fsck(&mut all, page);
            if after.0.is_empty() {
                return (all, sizes);
            }
            assert!(sizes.len() < 100, "fsck pages never end: {sizes:?}");
        }
    };
    for path in ["/", "/d/big"] {
        let (whole, sizes) = pages(&mut h, path, true, 100, usize::MAX);
        assert_eq!(sizes.len(), 1);
        for budget in 1..=10 {
            for limit in 1..=4 {
                let (all, sizes) = pages(&mut h, path, true, limit, budget);
                assert_eq!(
                    all, whole,
                    "{path}: pages of {limit} entries, {budget} chunks"
                );
                assert!(
                    sizes.iter().all(|&n| n <= budget),
                    "{path}: pages of {budget} chunks listed {sizes:?}"
                );
            }
        }
        // Files with no problems list no chunks; the totals still add up.
        let (quiet, _) = pages(&mut h, path, false, 100, usize::MAX);
        let (paged, _) = pages(&mut h, path, false, 1, 1);
        assert_eq!(paged, quiet, "{path}");
    }
    let (whole, _) = pages(&mut h, "/", true, 100, usize::MAX);
    let big = &whole.files[1];
    assert_eq!((big.path.as_str(), big.chunks.len()), ("/d/big", 7));
    assert!(!big.continued);
    let index: Vec<u64> = big.chunks.iter().map(|c| c.index).collect();
    assert_eq!(index, [0, 1, 2, 3, 4, 5, 6]);
    // A page that ends inside a file says where; the next carries on from there.
    let first = h.m.fsck("/d/big", true, ("", 0), 100, 3).unwrap();
    assert_eq!((first.next.as_str(), first.next_chunk), ("/d/big", 3));
    let second = h.m.fsck("/d/big", true, ("/d/big", 3), 100, 3).unwrap();
    assert!(second.files[0].continued);
    assert_eq!(second.files[0].chunks[0].index, 3);
    assert_eq!((second.total_files, second.total_chunks), (0, 3));
    // A chunk index without a file to go on in is no cursor: the page starts at the top.
    let top = h.m.fsck("/d/big", true, ("", 3), 100, 100).unwrap();
    assert!(!top.files[0].continued);
    assert_eq!((top.total_files, top.total_chunks), (1, 7));
    // The file went away between two pages: the page starts after where it was.
    assert!(is_ok(&h.call(delete("/d/big"))));
    let gone = h.m.fsck("/", true, ("/d/big", 3), 100, 100).unwrap();
    assert!(gone.files.iter().all(|f| !f.continued), "{gone:?}");
    assert_eq!(gone.files.last().unwrap().path, "/d/z");
}

#[test]
fn fsck_pages_add_up_to_one_fsck_of_the_whole_tree() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    for d in ["/a", "/a/b", "/a-c", "/z"] {
        assert!(is_ok(&h.call(mkdir(d))));
    }
    for f in ["/a/b/f", "/a/b/g", "/a/x", "/a-c/y", "/top"] {
        h.call(create(f));
        h.write_target(f, 0).unwrap();
    }
    let whole = fsck(&mut h, "/", true).unwrap();
    assert!(whole.next.is_empty());
    assert_eq!(
        (whole.dirs, whole.total_files, whole.total_chunks),
        (4, 5, 5)
    );
    for limit in 1..=10 {
        let mut all = pb::FsckResponse::default();
        let mut after = String::new();
        let mut pages = 0;
        loop {
            let r = h.call(MReq::Fsck(pb::FsckRequest {
                path: "/".into(),
                list_chunks: true,
                start_after: after.clone(),
                limit,
                start_chunk: 0,
            }));
            let Some(Resp::Fsck(page)) = r.resp else {
                panic!("{r:?}")
            };
            pages += 1;
            let (next, next_chunk) = crate::client::merge_fsck(&mut all, page);
            assert_eq!(next_chunk, 0, "no file has more chunks than a page");
            after = next;
            if after.is_empty() {
                break;
            }
        }
        assert_eq!(all, whole, "pages of {limit}");
        assert_eq!(pages, 9_u32.div_ceil(limit).max(1), "pages of {limit}");
    }
    let paths: Vec<_> = whole.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["/a/b/f", "/a/b/g", "/a/x", "/a-c/y", "/top"]);
    // A page also ends once it lists enough chunks, after the file that got there.
    let small = h.m.fsck("/", true, ("", 0), 100, 2).unwrap();
    let paths: Vec<_> = small.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["/a/b/f", "/a/b/g"]);
    assert_eq!(small.next, "/a/b/g");
    // A file is one page of itself; a cursor that is not below the path is refused.
    let file = |h: &mut H, after: &str| {
        h.call(MReq::Fsck(pb::FsckRequest {
            path: "/a/x".into(),
            start_after: after.into(),
            ..Default::default()
        }))
    };
    assert!(is_ok(&file(&mut h, "")));
    assert!(!is_ok(&file(&mut h, "/a/x/y")));
    assert!(matches!(
        h.m.fsck("/a", false, ("/z", 0), 10, 10),
        Err(FsError::InvalidArgument(_))
    ));
}

#[test]
fn copies_beyond_the_goal_are_removed_keeping_racks() {
    let mut h = H::new();
    cluster(&mut h, 4, 2);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    let all = |h: &mut H| -> Vec<(String, pb::HeartbeatResponse)> {
        (0..4)
            .map(|i| {
                let a = format!("cs{i}");
                let r = h.heartbeat(&a, &format!("rack{}", i % 2), &[(t.handle, 1)]);
                (a, r)
            })
            .collect()
    };
    // The fourth server turns out to hold the chunk at the current version too.
    all(&mut h);
    assert_eq!(chunk_replicas(&mut h, "/f").len(), 4);
    assert_eq!(report(&mut h).over_replicated, 1);
    // Not while the lease may be valid: the primary forwards to the copies it was given.
    h.step(Input::Tick);
    assert_eq!(chunk_replicas(&mut h, "/f").len(), 4);

    h.advance(Duration::from_secs(12));
    all(&mut h);
    h.step(Input::Tick);
    let kept = chunk_replicas(&mut h, "/f");
    assert_eq!(kept.len(), 3, "{kept:?}");
    let racks: std::collections::HashSet<usize> = kept
        .iter()
        .map(|a| a[2..].parse::<usize>().unwrap() % 2)
        .collect();
    assert_eq!(racks.len(), 2, "both racks keep a copy: {kept:?}");
    // The removed copy is deleted at its server's next heartbeat; nothing else is.
    let told: Vec<String> = all(&mut h)
        .into_iter()
        .filter(|(_, r)| r.delete_chunks.iter().any(|d| d.handle == t.handle))
        .map(|(a, _)| a)
        .collect();
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(!kept.contains(&told[0]));
    let r = report(&mut h);
    assert_eq!((r.over_replicated, r.under_replicated), (0, 0));
    assert_eq!(chunk_replicas(&mut h, "/f"), kept);
}

// ---- cluster and server identity ---------------------------------------------------------

fn cluster_id_records(log: &[(LogSeq, pb::LogRecord)]) -> Vec<u64> {
    log.iter()
        .filter_map(|(_, r)| match &r.op {
            Some(Op::ClusterId(o)) => Some(o.cluster_id),
            _ => None,
        })
        .collect()
}

/// A fresh log starts with the cluster's id; recovery, from the log or a checkpoint,
/// keeps it and makes no other; a log from before clusters had ids gets one, once.
#[test]
fn the_cluster_id_is_made_once_and_survives_recovery() {
    let mut h = H::new();
    let id = h.m.cluster_id();
    assert_ne!(id, 0);
    assert_eq!(h.log[0].0, 1);
    assert_eq!(
        cluster_id_records(&h.log),
        vec![id],
        "the first record, alone"
    );
    h.call(create("/a"));
    assert_eq!(report(&mut h).cluster_id, id);

    // From the log: the same id, and no new record.
    let m = Master::recover(cfg(), Time(1000), None, h.log.clone()).unwrap();
    let mut r = recovered(m, Time(1000));
    assert_eq!(r.m.cluster_id(), id);
    r.call(create("/b"));
    assert!(cluster_id_records(&r.log).is_empty(), "{:?}", r.log);

    // From a checkpoint alone.
    let cp = r.m.checkpoint_now();
    assert_eq!(cp.cluster_id, id);
    let m = Master::recover(cfg(), Time(2000), Some(&cp), vec![]).unwrap();
    let mut r = recovered(m, Time(2000));
    assert_eq!(r.m.cluster_id(), id);
    r.call(create("/c"));
    assert!(cluster_id_records(&r.log).is_empty());

    // Another seed, another cluster.
    let mut c = cfg();
    c.rng_seed = 1;
    assert_ne!(H::with(c).m.cluster_id(), id);

    // A log from before ids: the recovering master makes one and logs it, after the rest;
    // recovering that log again keeps it.
    let old: Vec<_> = h.log.iter().skip(1).cloned().collect();
    let old: Vec<_> = old
        .into_iter()
        .enumerate()
        .map(|(i, (_, r))| (i as u64 + 1, r))
        .collect();
    let m = Master::recover(cfg(), Time(3000), None, old.clone()).unwrap();
    let mut r = recovered(m, Time(3000));
    r.sync();
    let made = r.m.cluster_id();
    assert_ne!(made, 0);
    assert_eq!(cluster_id_records(&r.log), vec![made]);
    assert_eq!(r.log[0].0, old.len() as u64 + 1);
    let mut again = old;
    again.extend(r.log.iter().cloned());
    let m = Master::recover(cfg(), Time(4000), None, again).unwrap();
    let mut r = recovered(m, Time(4000));
    r.sync();
    assert_eq!(r.m.cluster_id(), made);
    assert!(cluster_id_records(&r.log).is_empty());

    // A second id in a log is corruption.
    let mut twice = h.log.clone();
    let next = twice.len() as u64 + 1;
    twice.push((
        next,
        pb::LogRecord {
            time_ms: 0,
            token: 0,
            op: Some(Op::ClusterId(pb::ClusterIdOp {
                root: None,
                cluster_id: 5,
            })),
        },
    ));
    assert!(Master::recover(cfg(), Time(0), None, twice).is_err());
}

/// No heartbeat reply names the id before its record is durable: a chunkserver keeps the
/// id for good, and a master that crashed before the record was would make another.
#[test]
fn no_heartbeat_reply_before_the_cluster_id_is_durable() {
    let mut h = recovered(Master::new(cfg(), Time(0)), Time(0));
    let (id, e) = h.send(MReq::Heartbeat(pb::HeartbeatRequest {
        address: "cs0".into(),
        server_id: 7,
        ..Default::default()
    }));
    assert_eq!(cluster_id_records(&e.log).len(), 1);
    assert!(reply_for(&e, id).is_none());
    let e = h.sync();
    match reply_for(&e, id).expect("released").resp {
        Some(Resp::Heartbeat(hb)) => assert_eq!(hb.cluster_id, h.m.cluster_id()),
        other => panic!("{other:?}"),
    }
}

/// A chunkserver of another cluster pointed at this master: refused with a clear error,
/// not registered, and nothing it reports is believed (its versions above ours are not
/// adopted, the real copies stay, it is told to delete nothing).
#[test]
fn a_heartbeat_from_another_cluster_is_refused_and_registers_nothing() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    let holders: Vec<String> = t.secondaries.iter().chain([&t.primary]).cloned().collect();
    for a in &holders {
        h.heartbeat(a, "r", &[(t.handle, 1)]);
    }
    let ours = h.m.cluster_id();
    let before = h.m.meta().fingerprint();
    let log_len = h.log.len();
    let servers = h.m.servers().iter().count();
    // A foreign server at a new address, and one at a member's address, each claiming the
    // chunk at the next version (which the master would adopt from a member).
    for (addr, v) in [("other:1", 2), (t.primary.as_str(), 2), ("other:2", 0)] {
        let r = h.heartbeat_as(addr, 99, ours ^ 1, "r", &[(t.handle, v), (4242, 1)]);
        let e = r.error.expect("refused");
        assert!(e.message.contains("wrong cluster"), "{e:?}");
        assert!(r.resp.is_none());
    }
    assert_eq!(h.m.servers().iter().count(), servers, "registered nothing");
    assert!(h.m.servers().find("other:1").is_none());
    assert_eq!(
        h.m.servers()
            .get(h.m.servers().find(&t.primary).unwrap())
            .id,
        server_id(&t.primary)
    );
    assert_eq!(h.log.len(), log_len, "logged nothing");
    assert_eq!(h.m.meta().fingerprint(), before);
    let mut listed = chunk_replicas(&mut h, "/f");
    listed.sort();
    let mut want = holders.clone();
    want.sort();
    assert_eq!(listed, want);
    // A server that has joined no cluster yet (0) is taken in, and told the id.
    let hb = h.heartbeat_as("new:1", 5, 0, "r", &[]);
    match hb.resp {
        Some(Resp::Heartbeat(hb)) => assert_eq!(hb.cluster_id, ours),
        other => panic!("{other:?}"),
    }
}

/// An address belongs to one server at a time: another id there is refused while the
/// registered server is alive; once it is dead the disk was replaced, and what the master
/// knew of the old one's copies is forgotten.
#[test]
fn another_server_at_a_live_servers_address_is_refused_until_it_is_dead() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    for a in t.secondaries.iter().chain([&t.primary]) {
        h.heartbeat(a, "r", &[(t.handle, 1)]);
    }
    let addr = t.primary.clone();
    let ours = h.m.cluster_id();
    let idx = h.m.servers().find(&addr).unwrap();
    let r = h.heartbeat_as(&addr, 12345, ours, "r", &[]);
    let e = r.error.expect("refused while the registered one is alive");
    assert!(
        e.message.contains("address in use by another server"),
        "{e:?}"
    );
    assert_eq!(h.m.servers().get(idx).id, server_id(&addr));
    assert!(
        chunk_replicas(&mut h, "/f").contains(&addr),
        "nothing of it believed"
    );

    // The registered server falls silent and is declared dead; the others go on.
    h.advance(Duration::from_secs(6));
    for a in &t.secondaries {
        h.heartbeat(a, "r", &[(t.handle, 1)]);
    }
    h.step(Input::Tick);
    assert!(!h.m.servers().is_alive(idx));
    let r = h.heartbeat_as(&addr, 12345, ours, "r", &[]);
    assert!(r.error.is_none(), "{r:?}");
    assert_eq!(h.m.servers().find(&addr), Some(idx));
    assert_eq!(h.m.servers().get(idx).id, 12345);
    assert!(h.m.servers().is_alive(idx));
    assert_eq!(h.m.servers().get(idx).replicas, 0);
    assert!(!chunk_replicas(&mut h, "/f").contains(&addr));
    let listed: Vec<_> = report(&mut h)
        .servers
        .into_iter()
        .map(|s| (s.address, s.server_id))
        .collect();
    assert!(listed.contains(&(addr.clone(), 12345)), "{listed:?}");
    // The old one, back, is now the stranger while the new one lives.
    let r = h.heartbeat_as(&addr, server_id(&addr), ours, "r", &[(t.handle, 1)]);
    assert!(r.error.is_some());
    assert!(!chunk_replicas(&mut h, "/f").contains(&addr));
}

/// Orders given against a dead server's copies do not carry over to the disk that
/// replaced it: a copy it holds of the same chunk at the same version is a replica.
#[test]
fn a_replaced_disk_is_not_held_to_the_old_ones_delete_orders() {
    let mut h = H::new();
    cluster(&mut h, 4, 4);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    for a in t.secondaries.iter().chain([&t.primary]) {
        h.heartbeat(a, "r", &[(t.handle, 1)]);
    }
    let addr = t.secondaries[0].clone();
    let ours = h.m.cluster_id();
    h.call(MReq::ReportCorrupt(pb::ReportCorruptRequest {
        address: addr.clone(),
        handle: t.handle,
        ..Default::default()
    }));
    // The old disk dies within the order's settling time (a lease period); a new one at
    // its address holds the chunk at its current version (a clone made it).
    h.advance(Duration::from_secs(6));
    for a in ["cs0", "cs1", "cs2", "cs3"].iter().filter(|a| **a != addr) {
        let chunks: &[(u64, u64)] = if t.primary == *a || t.secondaries.contains(&a.to_string()) {
            &[(t.handle, 1)]
        } else {
            &[]
        };
        h.heartbeat(a, "r", chunks);
    }
    h.step(Input::Tick);
    let r = h.heartbeat_as(&addr, 777, ours, "r", &[(t.handle, 1)]);
    match r.resp {
        Some(Resp::Heartbeat(hb)) => assert!(hb.delete_chunks.is_empty(), "{hb:?}"),
        other => panic!("{other:?}"),
    }
    assert!(chunk_replicas(&mut h, "/f").contains(&addr));
}

/// The invariant check holds through ordinary work, and fails on state that breaks a
/// promise (so it can: a check that never fails checks nothing).
#[test]
fn invariants_hold_and_their_check_catches_a_broken_promise() {
    let mut h = H::new();
    let (id, _) = h.send(create("/f"));
    h.m.check_invariants().expect("while a reply is held");
    let e = h.sync();
    assert!(is_ok(&reply_for(&e, id).unwrap()));
    h.m.check_invariants().expect("after the sync");
    // More requests waiting than the bound allows.
    let mut broken = H::new();
    for i in 0..=broken.m.cfg.max_queued as u64 {
        broken.m.queued.push_back((
            i,
            pb::MasterRequest {
                req: None,
                ..Default::default()
            },
            crate::auth::Caller::Insecure,
        ));
    }
    let e = broken.m.check_invariants().expect_err("an overfull queue");
    assert!(e.contains("queued"), "{e}");
    // The log synced past its end.
    let mut broken = H::new();
    broken.m.synced_seq = broken.m.last_seq + 1;
    assert!(broken.m.check_invariants().is_err());
}

/// A grant whose primary did not answer gives no lease, so nothing is written under its
/// version: a participant that takes that version late holds a copy as good as those
/// that answered, and is kept rather than refused.
#[test]
fn a_copy_late_for_a_grant_without_a_lease_is_kept() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    // The lease runs out; the next grant's primary answers too late.
    h.advance(Duration::from_secs(61));
    let (id, _) = h.send(MReq::GetWriteTarget(pb::GetWriteTargetRequest {
        path: "/f".into(),
        chunk_index: 0,
        append: false,
    }));
    h.sync();
    let primary = h.grant_target(true).expect("a grant");
    let e = h.answer_calls(&[&primary]);
    let err = reply_for(&e, id)
        .unwrap()
        .error
        .expect("no primary, no target");
    assert_eq!(err.code, pb::ErrorCode::Unavailable as i32);
    // It took version 2 all the same, and says so.
    let hb = h.heartbeat(&primary, "r", &[(t.handle, 2)]);
    assert!(
        hb.delete_chunks.is_empty(),
        "a good copy was refused: {:?}",
        hb.delete_chunks
    );
    assert!(chunk_replicas(&mut h, "/f").contains(&primary));
}

/// A write whose file was renamed away and its name given to a new file while it wrote
/// must not lengthen the new file over bytes it lacks: its bytes are in the old file's
/// chunk, beyond that file's length, and the write must fail rather than be
/// acknowledged with its bytes in neither file.
#[test]
fn a_write_whose_file_was_replaced_meanwhile_extends_nothing() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    let extend = |path: &str, length: u64, handles: Vec<u64>| {
        MReq::ExtendFile(pb::ExtendFileRequest {
            path: path.into(),
            length,
            first_index: 0,
            handles,
        })
    };
    assert!(is_ok(&h.call(create("/log"))));
    let written = h.write_target("/log", 0).expect("a target").handle;
    // Rotated while the write was on its way: the old file moved, a new one made.
    assert!(is_ok(&h.call(rename("/log", "/log.1"))));
    assert!(is_ok(&h.call(create("/log"))));
    let r = h.call(extend("/log", 16, vec![written]));
    assert!(
        matches!(err_of(&r), Some(FsError::NotFound(_))),
        "extended another file: {r:?}"
    );
    assert_eq!(length_of(&mut h, "/log"), 0);
    assert_eq!(length_of(&mut h, "/log.1"), 0);
    // The file written, under its new name, is extended; so is one whose chunks match.
    assert!(is_ok(&h.call(extend("/log.1", 16, vec![written]))));
    assert_eq!(length_of(&mut h, "/log.1"), 16);
    let fresh = h.write_target("/log", 0).expect("a target").handle;
    assert!(is_ok(&h.call(extend("/log", 16, vec![fresh]))));
    assert_eq!(length_of(&mut h, "/log"), 16);
    // A chunk index past any file's end is refused, not trusted.
    let r = h.call(MReq::ExtendFile(pb::ExtendFileRequest {
        path: "/log".into(),
        length: 32,
        first_index: u64::MAX,
        handles: vec![fresh, fresh],
    }));
    assert!(matches!(err_of(&r), Some(FsError::NotFound(_))));
    assert_eq!(length_of(&mut h, "/log"), 16);
}

/// A heartbeat naming an address or a rack longer than any host's is refused, and the
/// server is not registered: the master keeps both for as long as it knows the server.
#[test]
fn a_heartbeat_with_an_overlong_address_or_rack_is_refused() {
    let mut h = H::new();
    let cluster = h.m.cluster_id();
    let long = format!("{}:7000", "h".repeat(super::heartbeat::MAX_ADDRESS_BYTES));
    let r = h.heartbeat_as(&long, 77, cluster, "r", &[]);
    assert!(
        matches!(err_of(&r), Some(FsError::InvalidArgument(_))),
        "{r:?}"
    );
    let r = h.heartbeat_as("cs1:7000", 78, cluster, &"r".repeat(1 << 20), &[]);
    assert!(
        matches!(err_of(&r), Some(FsError::InvalidArgument(_))),
        "{r:?}"
    );
    let servers = report(&mut h).servers;
    assert!(servers.is_empty(), "{servers:?}");
    // At the bound, it is taken.
    let most = "h".repeat(super::heartbeat::MAX_ADDRESS_BYTES);
    assert!(is_ok(&h.heartbeat_as(&most, 79, cluster, "r", &[])));
}

/// The registry holds at most `max_servers`, dead ones among them: a new address past
/// it is refused, saying why, while the servers registered (a dead one coming back
/// included) are still heard.
#[test]
fn the_registry_holds_no_more_servers_than_its_bound() {
    let mut h = H::with(MasterConfig {
        max_servers: 3,
        ..cfg()
    });
    let cluster = h.m.cluster_id();
    for i in 1..=3u64 {
        assert!(is_ok(&h.heartbeat_as(
            &format!("cs{i}:7000"),
            i,
            cluster,
            "r",
            &[]
        )));
    }
    let r = h.heartbeat_as("cs4:7000", 4, cluster, "r", &[]);
    match err_of(&r) {
        Some(FsError::InvalidArgument(m)) => assert!(m.contains("--max-servers"), "{m}"),
        other => panic!("a fourth server was taken: {other:?}"),
    }
    assert_eq!(report(&mut h).servers.len(), 3);
    // Dead, the three still count; back, one is heard as before.
    h.advance(cfg().heartbeat_timeout * 2);
    assert!(
        h.heartbeat_as("cs4:7000", 4, cluster, "r", &[])
            .error
            .is_some()
    );
    assert!(is_ok(&h.heartbeat_as("cs2:7000", 2, cluster, "r", &[])));
    assert_eq!(report(&mut h).servers.len(), 3);
}

/// A length past what a file's chunks can hold is refused, however the request names
/// them: a forged extension to 2^64 - 1 would have the file read as zeros for ever,
/// appends refused, and the length never shrinks.
#[test]
fn a_file_is_extended_no_further_than_its_chunks_reach() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    let size = cfg().chunk_size;
    assert!(is_ok(&h.call(create("/f"))));
    let extend = |length: u64, first_index: u64, handles: Vec<u64>| {
        MReq::ExtendFile(pb::ExtendFileRequest {
            path: "/f".into(),
            length,
            first_index,
            handles,
        })
    };
    // No chunk yet: nothing to extend over.
    let r = h.call(extend(1, 0, vec![]));
    assert!(
        matches!(err_of(&r), Some(FsError::InvalidArgument(_))),
        "{r:?}"
    );
    let c0 = h.write_target("/f", 0).expect("a target").handle;
    let c1 = h.write_target("/f", 1).expect("a target").handle;
    for (length, first, handles) in [
        (u64::MAX, 0, vec![]),
        (u64::MAX, 0, vec![c0, c1]),
        (2 * size + 1, 0, vec![c0, c1]),
        (size + 1, 0, vec![c0]),
        (2 * size + 1, 1, vec![c1]),
    ] {
        let r = h.call(extend(length, first, handles.clone()));
        assert!(
            matches!(err_of(&r), Some(FsError::InvalidArgument(_))),
            "{length} over {handles:?}: {r:?}"
        );
        assert_eq!(length_of(&mut h, "/f"), 0);
    }
    assert!(is_ok(&h.call(extend(size, 0, vec![c0]))));
    assert_eq!(length_of(&mut h, "/f"), size);
    assert!(is_ok(&h.call(extend(2 * size, 1, vec![c1]))));
    assert!(is_ok(&h.call(extend(2 * size, 0, vec![]))));
    assert_eq!(length_of(&mut h, "/f"), 2 * size);
}

/// A grant whose `SetVersion` reached only one copy in time made the other two stale,
/// though nothing was written under the new version; that one copy was then found
/// corrupt. The stale copies hold every acknowledged write: they are kept while the
/// chunk is below its goal, and revived once the only current copy is known destroyed
/// and no lease can be out (the `mutation_protocol` fuzzer's
/// `void-version-bump-strands-a-corrupt-copy`, and the simulator's all-faults seed
/// 5615257, lost the chunk here).
#[test]
fn stale_copies_are_revived_when_every_current_copy_is_destroyed() {
    let (mut h, handle, primary, missed) = one_current_copy();
    let beat = |h: &mut H, a: &str, chunks: &[(u64, u64)]| {
        let r = format!("rack{}", &a[2..]);
        h.heartbeat(a, &r, chunks)
    };
    // The only current copy is found corrupt.
    h.call(MReq::ReportCorrupt(pb::ReportCorruptRequest {
        address: primary.clone(),
        handle,
        by_scrubber: true,
        ..Default::default()
    }));
    // It is ordered mended from the two older copies first; here no block of theirs
    // matches (the rot was in bytes only it held), so the mend fails, and the copy is
    // handled as any corrupt one.
    let (call, sources) = mend_order(&mut h, &primary, handle);
    assert_eq!(
        sources,
        missed
            .iter()
            .map(|a| (a.to_string(), 1))
            .collect::<Vec<_>>()
    );
    let failed = pb::ChunkResponse {
        error: Some(FsError::Corrupt("block 0 matches no other copy".into()).to_pb()),
        resp: None,
        ..Default::default()
    };
    h.step(Input::CallResult {
        id: call,
        result: Ok(failed),
    });
    // Not while its lease may still be valid.
    h.calls.clear();
    h.step(Input::Tick);
    h.sync();
    assert!(h.calls.is_empty(), "revived under a lease: {:?}", h.calls);
    h.advance(Duration::from_secs(12));
    for a in &missed {
        let hb = beat(&mut h, a, &[(handle, 1)]);
        assert!(hb.delete_chunks.is_empty(), "{hb:?}");
    }
    beat(&mut h, &primary, &[]);
    h.step(Input::Tick);
    h.sync();
    let mut revived: Vec<(String, u64, u64)> = h
        .calls
        .iter()
        .filter_map(|c| match &c.req.req {
            Some(CReq::SetVersion(s)) => Some((c.to.clone(), s.version, s.lease_ms)),
            _ => None,
        })
        .collect();
    revived.sort();
    let want: Vec<(String, u64, u64)> = missed.iter().map(|a| (a.to_string(), 3, 0)).collect();
    assert_eq!(
        revived, want,
        "the stale copies revived at a new version, no lease"
    );
    // A writer meanwhile is told to come back: a revival carries no lease to wait for.
    let (id, e) = h.send(MReq::GetWriteTarget(pb::GetWriteTargetRequest {
        path: "/f".into(),
        chunk_index: 0,
        append: false,
    }));
    let err = reply_for(&e, id).and_then(|r| r.error).expect("refused");
    assert_eq!(err.code, pb::ErrorCode::Unavailable as i32, "{err:?}");
    h.answer_calls(&[]);
    let mut now = chunk_replicas(&mut h, "/f");
    now.sort();
    assert_eq!(now, missed);
    // Current again, they are not stale: their heartbeats at version 3 keep them.
    for a in &missed {
        let hb = beat(&mut h, a, &[(handle, 3)]);
        assert!(hb.delete_chunks.is_empty(), "{hb:?}");
    }
    h.m.check_invariants().unwrap();
    // The check catches a replica also kept as a demoted copy.
    h.m.meta
        .fallbacks
        .entry(handle)
        .or_default()
        .demoted
        .insert(missed[0].to_string(), 1);
    let e =
        h.m.check_invariants()
            .expect_err("a replica kept as demoted");
    assert!(e.contains("not as a holder"), "{e}");
}

/// A chunk whose one current copy (version 2) is on `primary`, its two other copies
/// (`missed`, sorted) left at version 1 by a grant that reached only it.
fn one_current_copy() -> (H, u64, String, Vec<String>) {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    let rack = |a: &str| format!("rack{}", &a[2..]);
    let beat = |h: &mut H, a: &str, chunks: &[(u64, u64)]| {
        let r = rack(a);
        h.heartbeat(a, &r, chunks)
    };
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    let handle = t.handle;
    let all: Vec<String> = ["cs0", "cs1", "cs2"].map(String::from).to_vec();
    for a in &all {
        beat(&mut h, a, &[(handle, 1)]);
    }
    // The lease runs out; the next grant reaches one copy only.
    h.advance(Duration::from_secs(12));
    for a in &all {
        beat(&mut h, a, &[(handle, 1)]);
    }
    let (id, mut e) = h.send(MReq::GetWriteTarget(pb::GetWriteTargetRequest {
        path: "/f".into(),
        chunk_index: 0,
        append: false,
    }));
    e.replies.extend(h.sync().replies);
    let primary = h.grant_target(true).expect("a grant");
    let missed: Vec<&str> = all
        .iter()
        .map(String::as_str)
        .filter(|a| **a != primary)
        .collect();
    e.replies.extend(h.answer_calls(&missed).replies);
    let target = match reply_for(&e, id).expect("a write target").resp {
        Some(Resp::WriteTarget(t)) => t,
        other => panic!("{other:?}"),
    };
    assert_eq!((target.version, target.secondaries.len()), (2, 0));
    // The two that missed it report version 1: kept, not ordered deleted.
    for a in &missed {
        let hb = beat(&mut h, a, &[(handle, 1)]);
        assert!(
            hb.delete_chunks.is_empty(),
            "{a} told to delete its copy: {hb:?}"
        );
    }
    beat(&mut h, &primary, &[(handle, 2)]);
    assert_eq!(chunk_replicas(&mut h, "/f"), vec![primary.clone()]);
    let mut missed: Vec<String> = missed.iter().map(|a| a.to_string()).collect();
    missed.sort();
    (h, handle, primary, missed)
}

/// The master's outstanding order to mend `handle`, which must go to `to`: its call id,
/// and its sources (address, version), sorted.
fn mend_order(h: &mut H, to: &str, handle: u64) -> (u64, Vec<(String, u64)>) {
    let (id, dest, m) = h
        .calls
        .iter()
        .find_map(|c| match &c.req.req {
            Some(CReq::Mend(m)) => Some((c.id, c.to.clone(), m.clone())),
            _ => None,
        })
        .expect("a mend ordered");
    h.calls.retain(|c| c.id != id);
    assert_eq!((dest.as_str(), m.handle, m.version), (to, handle, 2));
    let mut sources: Vec<(String, u64)> = m
        .sources
        .into_iter()
        .map(|s| (s.address, s.version))
        .collect();
    sources.sort();
    (id, sources)
}

/// The one current copy is found corrupt while older copies survive: instead of being
/// deleted (which would fall the chunk back to version 1 and lose what was written at
/// 2), it is ordered mended from them, and stays listed meanwhile. No lease is granted
/// and no clone made from it until the mend ends; its reports at version 0 (corrupt)
/// meanwhile do not get it deleted. Once mended it serves as before.
#[test]
fn the_last_corrupt_copy_of_a_version_is_mended_not_deleted() {
    let (mut h, handle, primary, missed) = one_current_copy();
    let beat = |h: &mut H, a: &str, chunks: &[(u64, u64)]| {
        let r = format!("rack{}", &a[2..]);
        h.heartbeat(a, &r, chunks)
    };
    h.call(MReq::ReportCorrupt(pb::ReportCorruptRequest {
        address: primary.clone(),
        handle,
        by_scrubber: false,
        ..Default::default()
    }));
    let (call, sources) = mend_order(&mut h, &primary, handle);
    assert_eq!(sources.len(), 2);
    assert_eq!(chunk_replicas(&mut h, "/f"), vec![primary.clone()]);
    h.advance(Duration::from_secs(12));
    let hb = beat(&mut h, &primary, &[(handle, 0)]);
    assert!(
        hb.delete_chunks.is_empty(),
        "the copy being mended ordered deleted: {hb:?}"
    );
    for a in &missed {
        beat(&mut h, a, &[(handle, 1)]);
    }
    h.calls.clear();
    h.step(Input::Tick);
    h.sync();
    assert!(
        h.calls
            .iter()
            .all(|c| !matches!(&c.req.req, Some(CReq::SetVersion(_) | CReq::Clone(_)))),
        "a grant, revival or clone while mending: {:?}",
        h.calls
    );
    let err = h.write_target("/f", 0).expect_err("no lease while mending");
    assert!(
        matches!(&err, FsError::Unavailable(m) if m.contains("mending")),
        "{err:?}"
    );
    // Reported again meanwhile: no second order.
    h.call(MReq::ReportCorrupt(pb::ReportCorruptRequest {
        address: primary.clone(),
        handle,
        by_scrubber: true,
        ..Default::default()
    }));
    assert!(
        h.calls
            .iter()
            .all(|c| !matches!(&c.req.req, Some(CReq::Mend(_))))
    );
    h.step(Input::CallResult {
        id: call,
        result: Ok(pb::ChunkResponse {
            error: None,
            resp: Some(pb::chunk_response::Resp::Empty(pb::Empty {})),
            ..Default::default()
        }),
    });
    assert_eq!(h.m.mends(), (1, 0));
    let hb = beat(&mut h, &primary, &[(handle, 2)]);
    assert!(hb.delete_chunks.is_empty(), "{hb:?}");
    assert_eq!(chunk_replicas(&mut h, "/f"), vec![primary.clone()]);
    // It is the source the chunk's goal is restored from (a clone to a server with an
    // older copy goes once its holder record is durable: the next tick).
    h.calls.clear();
    for _ in 0..2 {
        h.step(Input::Tick);
        h.sync();
    }
    let clones: Vec<(String, u64)> = h
        .calls
        .iter()
        .filter_map(|c| match &c.req.req {
            Some(CReq::Clone(r)) => Some((r.source.clone(), r.version)),
            _ => None,
        })
        .collect();
    assert!(
        !clones.is_empty() && clones.iter().all(|c| *c == (primary.clone(), 2)),
        "{clones:?}"
    );
    h.m.check_invariants().unwrap();
}

/// A mend order that goes unanswered (or is refused) leaves the copy listed; the
/// copy's next heartbeat (at version 0: corrupt) orders it again, with no report needed
/// (the report may have been lost), until `MEND_TRIES` orders came to nothing: then it
/// is handled as destroyed, and the older copies are revived.
#[test]
fn an_unanswered_mend_is_ordered_again_from_heartbeats_then_given_up() {
    let (mut h, handle, primary, missed) = one_current_copy();
    let beat = |h: &mut H, a: &str, chunks: &[(u64, u64)]| {
        let r = format!("rack{}", &a[2..]);
        h.heartbeat(a, &r, chunks)
    };
    h.calls.clear();
    // No report arrives: the heartbeat shows the copy corrupt.
    let hb = beat(&mut h, &primary, &[(handle, 0)]);
    assert!(hb.delete_chunks.is_empty(), "{hb:?}");
    for i in 0..super::mend::MEND_TRIES {
        let (call, _) = mend_order(&mut h, &primary, handle);
        let result = if i == 0 {
            Err(RpcError::Unreachable(primary.clone()))
        } else {
            Ok(pb::ChunkResponse {
                error: Some(FsError::Unavailable("busy".into()).to_pb()),
                resp: None,
                ..Default::default()
            })
        };
        h.step(Input::CallResult { id: call, result });
        let last = i + 1 == super::mend::MEND_TRIES;
        let listed = chunk_replicas(&mut h, "/f") == vec![primary.clone()];
        assert_eq!(listed, !last, "try {i}");
        let hb = beat(&mut h, &primary, &[(handle, 0)]);
        assert_eq!(!hb.delete_chunks.is_empty(), last, "try {i}: {hb:?}");
    }
    assert!(
        h.calls
            .iter()
            .all(|c| !matches!(&c.req.req, Some(CReq::Mend(_))))
    );
    assert!(chunk_replicas(&mut h, "/f").is_empty());
    let _ = missed;
    h.m.check_invariants().unwrap();
}

/// A corruption report that arrives after the chunk moved on (delayed, or sent twice)
/// names the version of the copy it is about: the server's copy listed now, of a later
/// version, is not the one found corrupt, and is neither dropped nor ordered mended.
#[test]
fn a_late_corruption_report_of_an_older_copy_leaves_the_current_one() {
    let (mut h, handle, primary, _) = one_current_copy();
    h.calls.clear();
    h.call(MReq::ReportCorrupt(pb::ReportCorruptRequest {
        address: primary.clone(),
        handle,
        version: 1,
        ..Default::default()
    }));
    assert!(h.calls.is_empty(), "{:?}", h.calls);
    assert_eq!(chunk_replicas(&mut h, "/f"), vec![primary.clone()]);
    let hb = h.heartbeat(&primary, &format!("rack{}", &primary[2..]), &[(handle, 2)]);
    assert!(hb.delete_chunks.is_empty(), "{hb:?}");
    // About the copy it holds now: ordered mended.
    h.call(MReq::ReportCorrupt(pb::ReportCorruptRequest {
        address: primary.clone(),
        handle,
        version: 2,
        ..Default::default()
    }));
    mend_order(&mut h, &primary, handle);
}

/// A chunk whose current copies are gone, one destroyed but one on a server that is
/// merely down, is not revived from older copies: that server may come back with
/// writes made under the current version.
#[test]
fn no_revival_while_a_current_copy_may_come_back() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    let rack = |a: &str| format!("rack{}", &a[2..]);
    let beat = |h: &mut H, a: &str, chunks: &[(u64, u64)]| {
        let r = rack(a);
        h.heartbeat(a, &r, chunks)
    };
    h.call(create("/f"));
    let handle = h.write_target("/f", 0).unwrap().handle;
    let all: Vec<String> = ["cs0", "cs1", "cs2"].map(String::from).to_vec();
    h.advance(Duration::from_secs(12));
    for a in &all {
        beat(&mut h, a, &[(handle, 1)]);
    }
    let (_, _) = h.send(MReq::GetWriteTarget(pb::GetWriteTargetRequest {
        path: "/f".into(),
        chunk_index: 0,
        append: false,
    }));
    h.sync();
    // Version 2 reaches the primary and one other; the third keeps version 1.
    let primary = h.grant_target(true).expect("a grant");
    let other = h.grant_target(false).expect("a secondary");
    let missed = all
        .iter()
        .find(|a| **a != primary && **a != other)
        .unwrap()
        .clone();
    h.answer_calls(&[&missed]);
    beat(&mut h, &other, &[(handle, 2)]);
    // The secondary's copy is found corrupt; the primary falls silent and is declared
    // dead. The copy at version 1 is kept, but not revived.
    h.call(MReq::ReportCorrupt(pb::ReportCorruptRequest {
        address: other.clone(),
        handle,
        by_scrubber: true,
        ..Default::default()
    }));
    for _ in 0..8 {
        h.advance(Duration::from_secs(4));
        for a in [&missed, &other] {
            let chunks: &[(u64, u64)] = if *a == missed { &[(handle, 1)] } else { &[] };
            let hb = beat(&mut h, a, chunks);
            assert!(*a == other || hb.delete_chunks.is_empty(), "{hb:?}");
        }
        h.calls.clear();
        h.step(Input::Tick);
        h.sync();
        let grants = h
            .calls
            .iter()
            .filter(|c| matches!(c.req.req, Some(CReq::SetVersion(_))))
            .count();
        assert_eq!(
            grants, 0,
            "revived while a current copy's server may come back"
        );
    }
    assert!(chunk_replicas(&mut h, "/f").is_empty());
    // It comes back with its copy, current again.
    beat(&mut h, &primary, &[(handle, 2)]);
    assert_eq!(chunk_replicas(&mut h, "/f"), vec![primary.clone()]);
    h.m.check_invariants().unwrap();
}

/// Demoted copies and the holders of the current version are in the log: a restarted
/// master keeps the demoted copies, revives nothing while the one holder has not been
/// heard from (it may come back with the current version), and revives them once that
/// holder reports its copy corrupt.
#[test]
fn a_restarted_master_keeps_and_revives_from_the_log() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    let handle = h
        .write_target("/f", 0)
        .map(|t| t.handle)
        .unwrap_or_else(|_| {
            h.call(create("/f"));
            h.write_target("/f", 0).unwrap().handle
        });
    let all: Vec<String> = ["cs0", "cs1", "cs2"].map(String::from).to_vec();
    h.advance(Duration::from_secs(12));
    for a in &all {
        beat(&mut h, a, &[(handle, 1)]);
    }
    let primary = regrant(&mut h, None);
    let missed: Vec<&str> = all
        .iter()
        .map(String::as_str)
        .filter(|a| **a != primary)
        .collect();
    h.answer_calls(&missed);
    // The master restarts; the primary never reports again.
    let now = h.now;
    h.m = Master::recover(cfg(), now, None, h.log.clone()).unwrap();
    h.calls.clear();
    for _ in 0..20 {
        h.advance(Duration::from_secs(4));
        for a in &missed {
            let hb = beat(&mut h, a, &[(handle, 1)]);
            assert!(
                hb.delete_chunks.is_empty(),
                "a demoted copy deleted: {hb:?}"
            );
        }
        h.step(Input::Tick);
        h.sync();
    }
    assert!(
        set_versions(&h).is_empty(),
        "revived while the holder may come back"
    );
    assert!(chunk_replicas(&mut h, "/f").is_empty());
    // The holder comes back, and its copy is found corrupt: both demoted copies revive.
    beat(&mut h, &primary, &[(handle, 2)]);
    corrupt(&mut h, &primary, handle);
    h.advance(Duration::from_secs(4));
    for a in &missed {
        beat(&mut h, a, &[(handle, 1)]);
    }
    beat(&mut h, &primary, &[]);
    h.calls.clear();
    h.step(Input::Tick);
    h.sync();
    let mut want: Vec<(String, u64)> = missed.iter().map(|a| (a.to_string(), 3)).collect();
    want.sort();
    assert_eq!(set_versions(&h), want);
}

/// A heartbeat from `a` (rack from its number) reporting `chunks`.
fn beat(h: &mut H, a: &str, chunks: &[(u64, u64)]) -> pb::HeartbeatResponse {
    let rack = format!("rack{}", &a[2..]);
    h.heartbeat(a, &rack, chunks)
}

/// Asks for a write target on `/f`'s chunk 0 so a new grant goes out; returns its
/// primary. `secondary` is set to one of its secondaries when asked for.
fn regrant(h: &mut H, secondary: Option<&mut String>) -> String {
    h.send(MReq::GetWriteTarget(pb::GetWriteTargetRequest {
        path: "/f".into(),
        chunk_index: 0,
        append: false,
    }));
    h.sync();
    if let Some(s) = secondary {
        *s = h.grant_target(false).expect("a secondary");
    }
    h.grant_target(true).expect("a grant")
}

/// Reports `server`'s copy of `handle` corrupt beyond mending: an order to mend it (it
/// was the last copy of its version) fails, as when the rot is in bytes no other copy
/// holds.
fn corrupt(h: &mut H, server: &str, handle: u64) {
    h.call(MReq::ReportCorrupt(pb::ReportCorruptRequest {
        address: server.to_string(),
        handle,
        by_scrubber: true,
        ..Default::default()
    }));
    let mends: Vec<u64> = h
        .calls
        .iter()
        .filter(|c| matches!(&c.req.req, Some(CReq::Mend(m)) if m.handle == handle))
        .map(|c| c.id)
        .collect();
    h.calls.retain(|c| !mends.contains(&c.id));
    for id in mends {
        let failed = pb::ChunkResponse {
            error: Some(FsError::Corrupt("a block matches no other copy".into()).to_pb()),
            resp: None,
            ..Default::default()
        };
        h.step(Input::CallResult {
            id,
            result: Ok(failed),
        });
    }
}

/// The `SetVersion` calls out: (server, version), sorted.
fn set_versions(h: &H) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = h
        .calls
        .iter()
        .filter_map(|c| match &c.req.req {
            Some(CReq::SetVersion(s)) => Some((c.to.clone(), s.version)),
            _ => None,
        })
        .collect();
    v.sort();
    v
}

/// A copy retired at a grant it took late missed that lease's writes; once the next
/// grant moves the chunk on, its version looks like that of a copy demoted at it, holding
/// the writes. It holds those of the version before (at which it was demoted), and is
/// kept at that level; the revival goes to the newest demoted copy alone.
#[test]
fn a_copy_that_took_a_version_late_is_not_revived() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let handle = h.write_target("/f", 0).unwrap().handle;
    // v2: the primary and one secondary take it; the third (late) is retired.
    h.advance(Duration::from_secs(12));
    for a in ["cs0", "cs1", "cs2"] {
        beat(&mut h, a, &[(handle, 1)]);
    }
    let mut good = String::new();
    let primary = regrant(&mut h, Some(&mut good));
    let late = ["cs0", "cs1", "cs2"]
        .into_iter()
        .find(|a| *a != primary && *a != good)
        .unwrap()
        .to_string();
    h.answer_calls(&[&late]);
    // v3: only the primary takes it; the good secondary is demoted at v2. (The late
    // server is down meanwhile, or the master would clone to it first.)
    h.advance(Duration::from_secs(12));
    beat(&mut h, &primary, &[(handle, 2)]);
    beat(&mut h, &good, &[(handle, 2)]);
    h.step(Input::Tick);
    let p3 = regrant(&mut h, None);
    let good = if p3 == primary { good } else { primary };
    let primary = p3;
    h.answer_calls(&[&good]);
    // The late copy took v2 after all (no v2 writes, but all of v1's, where it is
    // demoted); the good one holds v2's. Both are kept.
    let hb = beat(&mut h, &late, &[(handle, 2)]);
    assert!(hb.delete_chunks.is_empty(), "{hb:?}");
    let hb = beat(&mut h, &good, &[(handle, 2)]);
    assert!(hb.delete_chunks.is_empty(), "{hb:?}");
    let f = &h.m.meta.fallbacks[&handle];
    assert_eq!(
        (f.demoted.get(&late), f.demoted.get(&good)),
        (Some(&1), Some(&2)),
        "{f:?}"
    );
    // The only current copy is found corrupt; once no lease can be out, the good copy
    // alone is revived.
    corrupt(&mut h, &primary, handle);
    h.advance(Duration::from_secs(12));
    beat(&mut h, &good, &[(handle, 2)]);
    beat(&mut h, &late, &[]);
    beat(&mut h, &primary, &[]);
    h.calls.clear();
    h.step(Input::Tick);
    h.sync();
    assert_eq!(set_versions(&h), vec![(good.clone(), 4)]);
}

/// A clone of the current version whose outcome is unknown (no answer) may have left a
/// current copy on its target: no revival while that may be so.
#[test]
fn no_revival_while_a_clone_may_have_made_a_current_copy() {
    let mut h = H::new();
    cluster(&mut h, 4, 4);
    h.call(create("/f"));
    let handle = h.write_target("/f", 0).unwrap().handle;
    h.advance(Duration::from_secs(12));
    for a in ["cs0", "cs1", "cs2", "cs3"] {
        let chunks: &[(u64, u64)] = if a == "cs3" { &[] } else { &[(handle, 1)] };
        beat(&mut h, a, chunks);
    }
    // v2 reaches only the primary.
    let primary = regrant(&mut h, None);
    let missed: Vec<String> = chunk_replicas(&mut h, "/f")
        .into_iter()
        .filter(|a| *a != primary)
        .collect();
    let missed_refs: Vec<&str> = missed.iter().map(String::as_str).collect();
    h.answer_calls(&missed_refs);
    // Once the lease is over a clone from the primary starts, and times out.
    h.advance(Duration::from_secs(12));
    for a in ["cs0", "cs1", "cs2", "cs3"] {
        let v = if a == primary {
            vec![(handle, 2)]
        } else if missed_refs.contains(&a) {
            vec![(handle, 1)]
        } else {
            vec![]
        };
        beat(&mut h, a, &v);
    }
    h.calls.clear();
    // The clone's target is logged as a holder first; the clone starts once that record
    // is durable.
    h.step(Input::Tick);
    let clone = |h: &H| {
        h.calls
            .iter()
            .filter(|c| matches!(c.req.req, Some(CReq::Clone(_))))
            .map(|c| c.id)
            .collect::<Vec<_>>()
    };
    assert!(clone(&h).is_empty(), "a clone before its holder record");
    h.sync();
    h.step(Input::Tick);
    let clones = clone(&h);
    assert!(!clones.is_empty(), "a clone starts");
    for id in clones {
        h.step(Input::CallResult {
            id,
            result: Err(RpcError::Deadline("cs".into())),
        });
    }
    corrupt(&mut h, &primary, handle);
    for _ in 0..5 {
        h.advance(Duration::from_secs(3));
        for a in ["cs0", "cs1", "cs2", "cs3"] {
            let v = if missed_refs.contains(&a) {
                vec![(handle, 1)]
            } else {
                vec![]
            };
            beat(&mut h, a, &v);
        }
        h.calls.clear();
        h.step(Input::Tick);
        h.sync();
        assert!(
            set_versions(&h).is_empty(),
            "revived while a clone's copy may exist"
        );
    }
}

/// A revival nobody takes is tried again a lease period later, not at every tick.
#[test]
fn a_revival_nobody_takes_waits_before_the_next() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let handle = h.write_target("/f", 0).unwrap().handle;
    h.advance(Duration::from_secs(12));
    for a in ["cs0", "cs1", "cs2"] {
        beat(&mut h, a, &[(handle, 1)]);
    }
    let primary = regrant(&mut h, None);
    let missed: Vec<String> = ["cs0", "cs1", "cs2"]
        .into_iter()
        .filter(|a| *a != primary)
        .map(String::from)
        .collect();
    let missed_refs: Vec<&str> = missed.iter().map(String::as_str).collect();
    h.answer_calls(&missed_refs);
    corrupt(&mut h, &primary, handle);
    let mut tries = 0;
    for _ in 0..10 {
        h.advance(Duration::from_secs(3));
        for a in &missed_refs {
            beat(&mut h, a, &[(handle, 1)]);
        }
        beat(&mut h, &primary, &[]);
        h.calls.clear();
        h.step(Input::Tick);
        h.sync();
        if !set_versions(&h).is_empty() {
            tries += 1;
            h.answer_calls(&missed_refs);
        }
    }
    // 30 s: the lease (10 s + 1 s skew) runs out, then one try; the next a lease
    // period (10 s) after it fails.
    assert!((1..=2).contains(&tries), "{tries} revivals in 30 s");
}

/// Only a corruption report counts as a current copy destroyed. One that merely goes
/// missing from its server's report (a report built before a clone committed can
/// arrive after it) is no such evidence: no revival.
#[test]
fn a_current_copy_missing_from_a_report_is_no_reason_to_revive() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let handle = h.write_target("/f", 0).unwrap().handle;
    h.advance(Duration::from_secs(12));
    for a in ["cs0", "cs1", "cs2"] {
        beat(&mut h, a, &[(handle, 1)]);
    }
    let primary = regrant(&mut h, None);
    let missed: Vec<String> = ["cs0", "cs1", "cs2"]
        .into_iter()
        .filter(|a| *a != primary)
        .map(String::from)
        .collect();
    let missed_refs: Vec<&str> = missed.iter().map(String::as_str).collect();
    h.answer_calls(&missed_refs);
    for _ in 0..10 {
        h.advance(Duration::from_secs(3));
        for a in &missed_refs {
            beat(&mut h, a, &[(handle, 1)]);
        }
        beat(&mut h, &primary, &[]);
        h.calls.clear();
        h.step(Input::Tick);
        h.sync();
        assert!(set_versions(&h).is_empty(), "revived on a missing report");
    }
}

/// A server declared dead while listed at the old version holds every write
/// acknowledged up to it, like a copy the grant reached too late: it is demoted when
/// the grant moves the chunk on while it is down, kept when it comes back below the
/// goal, and revived if the new version's copies are reported corrupt.
#[test]
fn a_copy_on_a_server_down_during_a_grant_is_demoted() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let handle = h.write_target("/f", 0).unwrap().handle;
    for a in ["cs0", "cs1", "cs2"] {
        beat(&mut h, a, &[(handle, 1)]);
    }
    // cs2 falls silent and is declared dead; the lease runs out meanwhile.
    for _ in 0..4 {
        h.advance(Duration::from_secs(3));
        for a in ["cs0", "cs1"] {
            beat(&mut h, a, &[(handle, 1)]);
        }
        h.step(Input::Tick);
    }
    assert!(!chunk_replicas(&mut h, "/f").contains(&"cs2".to_string()));
    // v2 reaches one of the two live copies.
    let primary = regrant(&mut h, None);
    let other = if primary == "cs0" { "cs1" } else { "cs0" };
    h.answer_calls(&[other]);
    // cs2 comes back with version 1: kept, not deleted.
    let hb = beat(&mut h, "cs2", &[(handle, 1)]);
    assert!(hb.delete_chunks.is_empty(), "{hb:?}");
    // The v2 copy is found corrupt; once no lease can be out, both v1 copies revive.
    corrupt(&mut h, &primary, handle);
    h.advance(Duration::from_secs(12));
    for a in ["cs2", other] {
        beat(&mut h, a, &[(handle, 1)]);
    }
    beat(&mut h, &primary, &[]);
    h.calls.clear();
    h.step(Input::Tick);
    h.sync();
    let mut want = vec![("cs2".to_string(), 3), (other.to_string(), 3)];
    want.sort();
    assert_eq!(set_versions(&h), want);
}

/// Three servers, `/f`'s chunk 0 on all of them at v1, its first lease run out, every
/// server heard from since: `(harness, handle, servers)`.
fn one_chunk_past_its_first_lease() -> (H, u64, Vec<String>) {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let handle = h.write_target("/f", 0).unwrap().handle;
    let all: Vec<String> = ["cs0", "cs1", "cs2"].map(String::from).to_vec();
    h.advance(Duration::from_secs(12));
    for a in &all {
        beat(&mut h, a, &[(handle, 1)]);
    }
    (h, handle, all)
}

/// The master crashes with a grant out: one server took the new version, the others
/// still hold the old one, and nothing was written under the new one. The restarted
/// master hears the new version first and adopts it, before the others have reported:
/// every copy at the old version is demoted as its server reports it (logged), kept,
/// and revived when the one new copy is found corrupt.
/// (Found by the mutation_protocol fuzzer: `demotions-forgotten-at-a-master-crash`.)
#[test]
fn copies_left_by_an_adopted_version_are_demoted() {
    let (mut h, handle, all) = one_chunk_past_its_first_lease();
    let took = regrant(&mut h, None);
    let others: Vec<&str> = all
        .iter()
        .map(String::as_str)
        .filter(|a| **a != took)
        .collect();
    // The master crashes before any answer; `took` applied version 2.
    let now = h.now;
    h.m = Master::recover(cfg(), now, None, h.log.clone()).unwrap();
    h.calls.clear();
    for _ in 0..25 {
        h.advance(Duration::from_secs(3));
        beat(&mut h, &took, &[(handle, 2)]);
        for a in &others {
            let hb = beat(&mut h, a, &[(handle, 1)]);
            assert!(hb.delete_chunks.is_empty(), "{a}'s copy deleted: {hb:?}");
        }
        h.step(Input::Tick);
        h.sync();
    }
    assert_eq!(chunk_replicas(&mut h, "/f"), vec![took.clone()]);
    let f = h.m.meta.fallbacks.get(&handle).expect("fallbacks logged");
    assert_eq!(
        f.demoted.keys().map(String::as_str).collect::<Vec<_>>(),
        others
    );
    // Clones to restore the goal were tried, onto the demoted copies' servers (logged as
    // holders first); they fail, saying so.
    let clones: Vec<_> = h
        .calls
        .iter()
        .filter(|c| matches!(c.req.req, Some(CReq::Clone(_))))
        .map(|c| c.id)
        .collect();
    assert!(!clones.is_empty(), "no clone tried");
    for id in clones {
        h.step(Input::CallResult {
            id,
            result: Ok(pb::ChunkResponse {
                error: Some(pb::Error {
                    code: pb::ErrorCode::Io as i32,
                    message: "no".into(),
                    ..Default::default()
                }),
                resp: None,
                ..Default::default()
            }),
        });
    }
    // The new copy is found corrupt: the old ones revive.
    h.calls.clear();
    corrupt(&mut h, &took, handle);
    h.advance(Duration::from_secs(3));
    for a in &others {
        beat(&mut h, a, &[(handle, 1)]);
    }
    beat(&mut h, &took, &[]);
    h.step(Input::Tick);
    h.sync();
    let want: Vec<(String, u64)> = others.iter().map(|a| (a.to_string(), 3)).collect();
    assert_eq!(set_versions(&h), want);
}

/// A clone of the current version is logged (its target a holder) before it is sent: a
/// master that crashed with the clone out, restarted, and then heard the one other
/// current copy reported corrupt does not revive older copies while the clone's target,
/// which may hold the current version with its writes, has not been heard from.
#[test]
fn no_revival_after_a_restart_while_a_clone_target_may_hold_the_version() {
    let mut h = H::new();
    cluster(&mut h, 4, 4);
    h.call(create("/f"));
    let handle = h.write_target("/f", 0).unwrap().handle;
    h.advance(Duration::from_secs(12));
    let all = ["cs0", "cs1", "cs2", "cs3"];
    for a in all {
        let chunks: &[(u64, u64)] = if a == "cs3" { &[] } else { &[(handle, 1)] };
        beat(&mut h, a, chunks);
    }
    // v2 reaches only the primary.
    let primary = regrant(&mut h, None);
    let missed: Vec<String> = chunk_replicas(&mut h, "/f")
        .into_iter()
        .filter(|a| *a != primary)
        .collect();
    let missed_refs: Vec<&str> = missed.iter().map(String::as_str).collect();
    h.answer_calls(&missed_refs);
    // Once the lease is over a clone from the primary goes out (after its record).
    h.advance(Duration::from_secs(12));
    let report = |a: &str| -> Vec<(u64, u64)> {
        if a == primary {
            vec![(handle, 2)]
        } else if missed_refs.contains(&a) {
            vec![(handle, 1)]
        } else {
            vec![]
        }
    };
    let mut target = None;
    for _ in 0..3 {
        for a in all {
            beat(&mut h, a, &report(a));
        }
        h.step(Input::Tick);
        h.sync();
        target = target.or_else(|| {
            h.calls.iter().find_map(|c| match &c.req.req {
                Some(CReq::Clone(_)) => Some(c.to.clone()),
                _ => None,
            })
        });
    }
    let target = target.expect("a clone goes out");
    // The master crashes with the clone out; the clone's target never reports again.
    let now = h.now;
    h.m = Master::recover(cfg(), now, None, h.log.clone()).unwrap();
    h.calls.clear();
    for a in all.iter().filter(|a| **a != target) {
        beat(&mut h, a, &report(a));
    }
    corrupt(&mut h, &primary, handle);
    for _ in 0..30 {
        h.advance(Duration::from_secs(3));
        for a in all.iter().filter(|a| **a != target) {
            let v = if *a == primary { vec![] } else { report(a) };
            beat(&mut h, a, &v);
        }
        h.step(Input::Tick);
        h.sync();
    }
    assert!(
        set_versions(&h).is_empty(),
        "revived while the clone's target ({target}) may hold version 2"
    );
}

/// v2 reaches only the primary of a chunk on four servers; once the lease is over, a
/// clone to the empty server is logged (its target a holder) but not sent yet. Returns
/// (primary, the demoted copies' servers, the clone's target).
fn clone_logged_not_sent(h: &mut H, handle: u64) -> (String, Vec<String>, String) {
    let all = ["cs0", "cs1", "cs2", "cs3"];
    for a in all {
        let chunks: &[(u64, u64)] = if a == "cs3" { &[] } else { &[(handle, 1)] };
        beat(h, a, chunks);
    }
    let primary = regrant(h, None);
    let missed: Vec<String> = chunk_replicas(h, "/f")
        .into_iter()
        .filter(|a| *a != primary)
        .collect();
    let missed_refs: Vec<&str> = missed.iter().map(String::as_str).collect();
    h.answer_calls(&missed_refs);
    h.advance(Duration::from_secs(12));
    for a in all {
        let v = if a == primary {
            vec![(handle, 2)]
        } else if missed_refs.contains(&a) {
            vec![(handle, 1)]
        } else {
            vec![]
        };
        beat(h, a, &v);
    }
    h.calls.clear();
    h.step(Input::Tick);
    let f = h.m.meta.fallbacks.get(&handle).expect("fallbacks");
    let target = f
        .holders
        .iter()
        .find(|a| **a != primary)
        .expect("a clone's target logged as a holder")
        .clone();
    assert!(h.calls.is_empty(), "{:?}", h.calls);
    (primary, missed, target)
}

/// A clone logged but never sent (its one source found corrupt first) made no copy: its
/// target stops counting as a holder, and the demoted copies revive.
#[test]
fn a_clone_never_sent_holds_up_no_revival() {
    let mut h = H::new();
    cluster(&mut h, 4, 4);
    h.call(create("/f"));
    let handle = h.write_target("/f", 0).unwrap().handle;
    h.advance(Duration::from_secs(12));
    let (primary, missed, _) = clone_logged_not_sent(&mut h, handle);
    corrupt(&mut h, &primary, handle);
    h.sync();
    h.advance(Duration::from_secs(3));
    for a in &missed {
        beat(&mut h, a, &[(handle, 1)]);
    }
    h.calls.clear();
    h.step(Input::Tick);
    h.sync();
    let mut want: Vec<(String, u64)> = missed.iter().map(|a| (a.clone(), 3)).collect();
    want.sort();
    assert_eq!(set_versions(&h), want);
}

/// The master crashed after logging a clone's target as a holder, before sending the
/// clone. Once no clone of the master before can still be running, the target's reports
/// without the chunk show it holds none, and the demoted copies revive.
#[test]
fn a_restarted_master_learns_a_logged_clone_made_no_copy() {
    let mut h = H::new();
    cluster(&mut h, 4, 4);
    h.call(create("/f"));
    let handle = h.write_target("/f", 0).unwrap().handle;
    h.advance(Duration::from_secs(12));
    let (primary, missed, target) = clone_logged_not_sent(&mut h, handle);
    h.sync();
    let now = h.now;
    h.m = Master::recover(cfg(), now, None, h.log.clone()).unwrap();
    beat(&mut h, &primary, &[(handle, 2)]);
    corrupt(&mut h, &primary, handle);
    h.calls.clear();
    // (A clone of the master before may run for the clone timeout, 300 s.)
    for _ in 0..110 {
        h.advance(Duration::from_secs(3));
        for a in &missed {
            beat(&mut h, a, &[(handle, 1)]);
        }
        beat(&mut h, &target, &[]);
        beat(&mut h, &primary, &[]);
        h.step(Input::Tick);
        h.sync();
    }
    let mut want: Vec<(String, u64)> = missed.iter().map(|a| (a.clone(), 3)).collect();
    want.sort();
    assert_eq!(
        set_versions(&h),
        want,
        "{:?}",
        h.m.meta.fallbacks.get(&handle)
    );
}

/// v2 of a chunk on three servers reaches the primary and one secondary; the third takes
/// it late (retired at v2, demoted at v1: it holds every write before v2) and reports
/// it. Returns the master, the chunk, and [primary, good secondary, late].
fn a_demoted_copy_takes_a_grant_late() -> (H, u64, [String; 3]) {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let handle = h.write_target("/f", 0).unwrap().handle;
    h.advance(Duration::from_secs(12));
    for a in ["cs0", "cs1", "cs2"] {
        beat(&mut h, a, &[(handle, 1)]);
    }
    let mut good = String::new();
    let primary = regrant(&mut h, Some(&mut good));
    let late = ["cs0", "cs1", "cs2"]
        .into_iter()
        .find(|a| *a != primary && *a != good)
        .unwrap()
        .to_string();
    h.answer_calls(&[&late]);
    let hb = beat(&mut h, &late, &[(handle, 2)]);
    assert!(
        hb.delete_chunks.is_empty(),
        "the late copy, demoted at v1, was deleted: {hb:?}"
    );
    assert!(!chunk_replicas(&mut h, "/f").contains(&late));
    (h, handle, [primary, good, late])
}

/// The lease runs out and `servers` report the chunk at v2; two ticks: the first logs a
/// clone's target as a holder, the second sends the clone once that is durable. The
/// calls out are left in `h.calls`.
fn clone_after_the_lease(h: &mut H, handle: u64, servers: [&String; 3]) {
    h.advance(Duration::from_secs(12));
    for a in servers {
        beat(h, a, &[(handle, 2)]);
    }
    h.calls.clear();
    h.step(Input::Tick);
    h.sync();
    h.step(Input::Tick);
    h.sync();
}

/// A demoted copy that took a grant late is kept while the chunk is below its goal, and
/// its server is still a clone target: the clone replaces the copy and lifts its
/// retirement. (Found by the `mutation_protocol` fuzzer: the copy was deleted, then the
/// one current copy found corrupt.)
#[test]
fn a_demoted_copy_that_took_a_grant_late_is_kept_and_cloned_over() {
    let (mut h, handle, [primary, good, late]) = a_demoted_copy_takes_a_grant_late();
    // The lease runs out; the one server left to clone to is the late one.
    clone_after_the_lease(&mut h, handle, [&primary, &good, &late]);
    let clones: Vec<&str> = h
        .calls
        .iter()
        .filter(|c| matches!(c.req.req, Some(CReq::Clone(_))))
        .map(|c| c.to.as_str())
        .collect();
    assert_eq!(clones, vec![late.as_str()], "{:?}", h.calls);
    h.answer_calls(&[]);
    h.step(Input::Tick);
    h.sync();
    assert!(h.m.meta.retired.is_empty(), "{:?}", h.m.meta.retired);
    let hb = beat(&mut h, &late, &[(handle, 2)]);
    assert!(hb.delete_chunks.is_empty(), "{hb:?}");
    assert!(chunk_replicas(&mut h, "/f").contains(&late));
    assert!(!h.m.meta.fallbacks.contains_key(&handle));
}

/// The same copy is revived once every current copy is destroyed.
#[test]
fn a_demoted_copy_that_took_a_grant_late_is_revived() {
    let (mut h, handle, [primary, good, late]) = a_demoted_copy_takes_a_grant_late();
    corrupt(&mut h, &primary, handle);
    corrupt(&mut h, &good, handle);
    h.advance(Duration::from_secs(12));
    beat(&mut h, &primary, &[]);
    beat(&mut h, &good, &[]);
    let hb = beat(&mut h, &late, &[(handle, 2)]);
    assert!(hb.delete_chunks.is_empty(), "{hb:?}");
    h.calls.clear();
    h.step(Input::Tick);
    h.sync();
    assert_eq!(set_versions(&h), vec![(late, 3)]);
}

/// A holder's copy counts as absent only from reports a call timeout apart with no clone
/// to it in between: a report that lacks it from before a clone says nothing of what the
/// clone made, nor one sent while the clone ran (heartbeats lost meanwhile).
#[test]
fn a_clone_to_a_holder_starts_its_absence_afresh() {
    let mut h = H::with(MasterConfig {
        call_timeout: Duration::from_secs(8),
        clone_timeout: Duration::from_secs(20),
        ..cfg()
    });
    cluster(&mut h, 4, 4);
    h.call(create("/f"));
    let handle = h.write_target("/f", 0).unwrap().handle;
    h.advance(Duration::from_secs(40));
    let (primary, missed, target) = clone_logged_not_sent(&mut h, handle);
    let unanswered = |h: &mut H| {
        let calls = std::mem::take(&mut h.calls);
        let mut n = 0;
        for c in calls {
            if matches!(c.req.req, Some(CReq::Clone(_))) {
                n += 1;
                let result = Err(RpcError::Deadline(c.to.clone()));
                h.step(Input::CallResult { id: c.id, result });
            }
        }
        n
    };
    // The first clone gets no answer: it may have made a copy.
    h.sync();
    h.step(Input::Tick);
    h.sync();
    assert_eq!(unanswered(&mut h), 1);
    // The target's report lacks the chunk; a second clone to it starts at once.
    beat(&mut h, &target, &[]);
    h.step(Input::Tick);
    h.sync();
    // No report from the target while it runs; it gets no answer either.
    h.advance(Duration::from_secs(9));
    beat(&mut h, &primary, &[(handle, 2)]);
    for a in &missed {
        beat(&mut h, a, &[(handle, 1)]);
    }
    assert_eq!(unanswered(&mut h), 1, "a second clone");
    // A report a call timeout after the first, but perhaps sent before the clone landed.
    beat(&mut h, &target, &[]);
    h.sync();
    let f = &h.m.meta.fallbacks[&handle];
    assert!(f.holders.contains(&target), "{f:?}");
    // Two reports a call timeout apart after the clone: it holds none.
    h.advance(Duration::from_secs(9));
    beat(&mut h, &target, &[]);
    h.sync();
    let f = &h.m.meta.fallbacks[&handle];
    assert!(!f.holders.contains(&target), "{f:?}");
}

/// A late copy's server taken as a clone target is a holder until the clone is known to
/// have run; a grant that moves on without it must not demote it at the version its copy
/// took late (it holds none of that version's writes), or a revival would bring that
/// copy back as if it held them. (Found by a review.)
#[test]
fn a_late_copy_whose_clone_may_not_have_run_keeps_its_demoted_level() {
    let (mut h, handle, [primary, good, late]) = a_demoted_copy_takes_a_grant_late();
    // A clone to the late server is logged, sent, and never answered.
    clone_after_the_lease(&mut h, handle, [&primary, &good, &late]);
    let calls = std::mem::take(&mut h.calls);
    let clone = calls
        .iter()
        .find(|c| matches!(c.req.req, Some(CReq::Clone(_))))
        .expect("a clone");
    assert_eq!(clone.to, late);
    h.step(Input::CallResult {
        id: clone.id,
        result: Err(RpcError::Deadline(late.clone())),
    });
    assert!(h.m.meta.fallbacks[&handle].holders.contains(&late));
    // The late server goes silent; a writer's grant moves the chunk to v3 without it.
    h.advance(Duration::from_secs(6));
    beat(&mut h, &primary, &[(handle, 2)]);
    beat(&mut h, &good, &[(handle, 2)]);
    h.step(Input::Tick);
    h.sync();
    h.write_target("/f", 0).unwrap();
    let f = &h.m.meta.fallbacks[&handle];
    assert_eq!(h.m.meta.chunks.get(handle).unwrap().version, 3);
    assert_eq!(f.demoted.get(&late), Some(&1), "{f:?}");
}

/// The master crashes with a grant of v2 out, taken by one server alone; restarted, it
/// hears one other server (at v1) before the rest and grants v3 to it alone. The copy at
/// v2 holds every write acknowledged up to v1, and none came under v2 (never logged as
/// current, so no client had its lease): it is a copy of v1 as far as writes go, and is
/// kept like one while the chunk is below its goal, then revived with the third
/// server's copy at v1 (neither outranks the other) when the v3 copy is found corrupt.
/// (Found by the mutation_protocol fuzzer in CI: `copy-of-a-lost-grant-deleted`.)
#[test]
fn a_copy_at_a_version_lost_in_a_crash_is_kept_as_one_of_the_version_before() {
    let (mut h, handle, all) = one_chunk_past_its_first_lease();
    // v2 goes out; `away` applies it, and the master crashes before any answer.
    regrant(&mut h, None);
    let away = h.grant_target(false).expect("a secondary");
    let first = all
        .iter()
        .find(|a| **a != away)
        .expect("another server")
        .clone();
    let now = h.now;
    h.m = Master::recover(cfg(), now, None, h.log.clone()).unwrap();
    h.calls.clear();
    // Only `first` is heard from, at v1, until the quiet period is over: v3 goes to it.
    for _ in 0..5 {
        h.advance(Duration::from_secs(3));
        beat(&mut h, &first, &[(handle, 1)]);
        h.step(Input::Tick);
        h.sync();
    }
    let primary = regrant(&mut h, None);
    assert_eq!(primary, first);
    h.answer_calls(&[]);
    assert_eq!(h.m.meta.chunks.get(handle).unwrap().version, 3);
    // `away` reports its copy at v2, the third server its copy at v1: both kept.
    let third = all
        .iter()
        .find(|a| **a != away && **a != first)
        .expect("a third server")
        .clone();
    let hb = beat(&mut h, &away, &[(handle, 2)]);
    assert!(
        hb.delete_chunks.is_empty(),
        "the v2 copy was deleted: {hb:?}"
    );
    let hb = beat(&mut h, &third, &[(handle, 1)]);
    assert!(
        hb.delete_chunks.is_empty(),
        "the v1 copy was deleted: {hb:?}"
    );
    // The one v3 copy is found corrupt: both are revived, as copies of v1.
    h.calls.clear();
    corrupt(&mut h, &first, handle);
    h.advance(Duration::from_secs(12));
    beat(&mut h, &away, &[(handle, 2)]);
    beat(&mut h, &third, &[(handle, 1)]);
    beat(&mut h, &first, &[]);
    h.step(Input::Tick);
    h.sync();
    let mut want = vec![(away.clone(), 4), (third.clone(), 4)];
    want.sort();
    assert_eq!(set_versions(&h), want);
}

/// A grant whose primary refused gives no lease, but a copy of the order delivered later
/// (up to its call's deadline) may still start one there: the chunk is granted again only
/// once such a lease would have run out. (Seen in the master-failover scenario, seed 359:
/// a primary refused while it stored a new leader's term, then took a duplicated copy.)
#[test]
fn a_refused_grant_is_waited_out_to_its_calls_deadline() {
    let mut c = cfg();
    c.call_timeout = Duration::from_secs(5);
    let mut h = H::with(c);
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    let report = |h: &mut H, v: u64| {
        for i in 0..3 {
            h.heartbeat(&format!("cs{i}"), &format!("rack{i}"), &[(t.handle, v)]);
        }
    };
    // That lease runs out; the next grant's primary refuses.
    h.advance(Duration::from_secs(12));
    report(&mut h, t.version);
    let (id, _) = h.send(MReq::GetWriteTarget(pb::GetWriteTargetRequest {
        path: "/f".into(),
        chunk_index: 0,
        append: false,
    }));
    h.sync();
    let primary = h.grant_target(true).expect("a grant");
    let e = h.answer_calls(&[primary.as_str()]);
    assert!(reply_for(&e, id).unwrap().error.is_some());
    // A lease and the skew later, a copy delivered at the deadline may still run.
    h.advance(Duration::from_secs(12));
    report(&mut h, t.version + 1);
    assert!(
        h.write_target("/f", 0).is_err(),
        "granted while a late copy's lease may still run"
    );
    h.advance(Duration::from_secs(5));
    report(&mut h, t.version + 1);
    assert!(h.write_target("/f", 0).is_ok());
}

/// The first clone among the calls made.
fn clone_call(h: &H) -> Option<Call> {
    h.calls
        .iter()
        .find(|c| matches!(c.req.req, Some(CReq::Clone(_))))
        .cloned()
}

/// Answers call `id` with success.
fn answer_ok(h: &mut H, id: CallId) {
    let ok = pb::ChunkResponse {
        error: None,
        resp: Some(pb::chunk_response::Resp::Empty(pb::Empty {})),
        ..Default::default()
    };
    h.step(Input::CallResult { id, result: Ok(ok) });
}

/// A clone that finishes while the master counts its target dead made a good copy of the
/// current version (no lease was out): it is kept, and listed once the server reports it,
/// not ordered deleted. Deleting it threw away the one copy a later mend could have read
/// (the fuzzer's `found-good-clone-deleted-while-its-server-counted-dead`).
#[test]
fn a_clone_finished_while_its_target_was_counted_dead_is_kept() {
    let mut h = H::new();
    cluster(&mut h, 4, 4);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    let mut holders = t.secondaries.clone();
    holders.push(t.primary.clone());
    let spare = (0..4)
        .map(|i| format!("cs{i}"))
        .find(|a| !holders.contains(a))
        .unwrap();
    // One holder stays silent past its timeout and the lease: the chunk is cloned to the
    // spare server.
    h.advance(Duration::from_secs(11));
    for a in &holders[..2] {
        h.heartbeat(a, "r", &[(t.handle, t.version)]);
    }
    h.heartbeat(&spare, "r", &[]);
    h.calls.clear();
    h.step(Input::Tick);
    h.sync();
    let clone = clone_call(&h).expect("a clone to the spare server");
    assert_eq!(clone.to, spare);
    // The spare falls silent too while the clone runs, and is counted dead.
    h.advance(Duration::from_secs(6));
    for a in &holders[..2] {
        h.heartbeat(a, "r", &[(t.handle, t.version)]);
    }
    h.step(Input::Tick);
    h.sync();
    assert!(
        !h.m.servers.is_alive(h.m.servers.find(&spare).unwrap()),
        "the spare should be counted dead"
    );
    answer_ok(&mut h, clone.id);
    h.sync();
    // Back, the spare reports its copy: it is kept and listed.
    let r = h.heartbeat(&spare, "r", &[(t.handle, t.version)]);
    assert!(r.delete_chunks.is_empty(), "{:?}", r.delete_chunks);
    let replicas = chunk_replicas(&mut h, "/f");
    assert!(replicas.contains(&spare), "{replicas:?}");
}

/// A clone to a server ends what the master held against that server's copy before:
/// here a corruption report of the old copy that arrives while the clone runs. Left
/// standing, its delete order removed the fresh copy on the server's next report, though
/// the master listed it (the fuzzer's `found-late-report-deletes-a-clone-over-its-copy`).
#[test]
fn a_clone_ends_a_delete_order_made_while_it_ran() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    h.advance(Duration::from_secs(11));
    for i in 0..2 {
        beat(&mut h, &format!("cs{i}"), &[(t.handle, t.version)]);
    }
    // cs2's copy rots: it says so in its heartbeat (version 0), and is told to delete it.
    let r = beat(&mut h, "cs2", &[(t.handle, 0)]);
    assert_eq!(r.delete_chunks.len(), 1, "{:?}", r.delete_chunks);
    // The chunk is below its goal; cs2 is the one server it can be cloned to.
    h.calls.clear();
    h.step(Input::Tick);
    h.sync();
    let clone = clone_call(&h).expect("a clone to cs2");
    assert_eq!(clone.to, "cs2");
    // The scrubber's report of the old copy arrives late, while the clone runs.
    h.call(MReq::ReportCorrupt(pb::ReportCorruptRequest {
        address: "cs2".into(),
        handle: t.handle,
        by_scrubber: true,
        version: t.version,
        ..Default::default()
    }));
    answer_ok(&mut h, clone.id);
    h.sync();
    assert!(chunk_replicas(&mut h, "/f").contains(&"cs2".to_string()));
    // cs2 reports the clone's copy: it is kept.
    let r = beat(&mut h, "cs2", &[(t.handle, t.version)]);
    assert!(r.delete_chunks.is_empty(), "{:?}", r.delete_chunks);
    assert!(chunk_replicas(&mut h, "/f").contains(&"cs2".to_string()));
}

/// Delete orders are given only from durable (in a group, committed) state: a chunk
/// dropped by a record not yet durable may come back if the master crashes (or its
/// leadership ends) first, and its copies must still be there. The heartbeat's reply
/// waits for the log.
#[test]
fn a_delete_order_waits_for_the_record_that_makes_the_copy_an_orphan() {
    let mut h = H::new();
    cluster(&mut h, 3, 3);
    h.call(create("/f"));
    let t = h.write_target("/f", 0).unwrap();
    assert!(is_ok(&h.call(delete("/f"))));
    let hidden = listing(&mut h, "/", true);
    assert_eq!(hidden.len(), 1, "{hidden:?}");
    // Deleting the hidden name removes it at once: its record is not durable yet.
    h.send(delete(&hidden[0]));
    assert!(h.m.meta().chunks.get(t.handle).is_none());
    let (id, e) = h.send(MReq::Heartbeat(pb::HeartbeatRequest {
        address: "cs0".into(),
        rack: "rack0".into(),
        capacity_bytes: 1 << 30,
        chunks: vec![pb::ChunkReport {
            handle: t.handle,
            version: t.version,
            length: 0,
        }],
        server_id: server_id("cs0"),
        cluster_id: h.m.cluster_id(),
        ..Default::default()
    }));
    assert!(
        reply_for(&e, id).is_none(),
        "a delete order before the record that drops the chunk is durable"
    );
    // Durable: the order goes out.
    let e = h.sync();
    let Some(Resp::Heartbeat(hb)) = reply_for(&e, id).and_then(|r| r.resp) else {
        panic!("no heartbeat reply once the log is durable");
    };
    let deleted: Vec<u64> = hb.delete_chunks.iter().map(|d| d.handle).collect();
    assert_eq!(deleted, vec![t.handle]);
}

/// A master that runs alone takes a new epoch at each start, one past every epoch its
/// log names, and fences as a group's new leader does: once every server named as a
/// lease holder has reported the new epoch (it gave up the leases of earlier runs), it
/// grants on existing chunks at once, not a lease period later. A heartbeat of an older
/// epoch proves nothing. A chunkserver that knows a newer epoch than the log (a log
/// restored from an older copy) makes it take a newer one still.
#[test]
fn a_restarted_master_alone_fences_with_a_new_epoch_instead_of_waiting() {
    let epochs = |log: &[(LogSeq, pb::LogRecord)]| -> Vec<u64> {
        log.iter()
            .filter_map(|(_, r)| match &r.op {
                Some(Op::MasterStart(o)) => Some(o.epoch),
                _ => None,
            })
            .collect()
    };
    let restart = |log: &[(LogSeq, pb::LogRecord)], at: Time| {
        let mut m = Master::recover(cfg(), at, None, log.to_vec()).unwrap();
        m.start_alone();
        let mut h = H {
            m,
            now: at,
            next_id: 1,
            log: log.to_vec(),
            calls: vec![],
            answer_step: 0,
        };
        h.sync();
        h
    };
    // The first run, on a fresh log: no chunk, so nothing to wait for.
    let mut h = H::new();
    h.m.start_alone();
    h.sync();
    assert_eq!(h.m.epoch(), 1);
    assert!(h.m.leases().quiet_ended_early());
    h.step(Input::Tick);
    // Each server hears the epoch in the answer to its first heartbeat.
    for e in [0, 1] {
        for i in 0..3 {
            h.heartbeat_in_term(&format!("cs{i}"), e, &[]);
        }
    }
    h.call(create("/f"));
    let f = h.write_target("/f", 0).unwrap();
    assert_eq!(epochs(&h.log), vec![1]);

    // The second run: epoch 2, quiet while any holder has not reported it.
    let mut h2 = restart(&h.log, Time(20_000));
    assert_eq!(h2.m.epoch(), 2);
    assert_eq!(epochs(&h2.log), vec![1, 2]);
    let quiet = |h: &mut H| matches!(h.write_target("/f", 0), Err(FsError::Unavailable(m)) if m.contains("no leases"));
    for r in std::iter::once(&f.primary).chain(&f.secondaries) {
        h2.heartbeat_in_term(r, 1, &[(f.handle, f.version)]);
    }
    assert!(
        quiet(&mut h2),
        "granted on heartbeats of the earlier run's epoch"
    );
    // Its calls carry the new epoch: a server that stores it gives up older leases.
    let r = h2.heartbeat_in_term(&f.primary, 1, &[(f.handle, f.version)]);
    match r.resp {
        Some(Resp::Heartbeat(hb)) => assert_eq!(hb.epoch, 2),
        other => panic!("heartbeat reply {other:?}"),
    }
    for r in std::iter::once(&f.primary).chain(&f.secondaries) {
        h2.heartbeat_in_term(r, 2, &[(f.handle, f.version)]);
    }
    assert!(h2.m.leases().quiet_ended_early());
    let t = h2.write_target("/f", 0).unwrap();
    assert!(t.version > f.version);
    // A server back at another address (its disk and id the same) reports the epoch
    // this run gave it at the old one: no lost run.
    let moved = h2.call(MReq::Heartbeat(pb::HeartbeatRequest {
        address: "cs-moved".into(),
        rack: "r".into(),
        capacity_bytes: 1 << 30,
        server_id: server_id(&f.secondaries[0]),
        cluster_id: h2.m.cluster_id(),
        epoch: 2,
        ..Default::default()
    }));
    assert!(moved.error.is_none(), "{moved:?}");
    assert_eq!(
        h2.m.epoch(),
        2,
        "a server that moved taken for a lost run's"
    );
    assert!(
        h2.calls.iter().all(|c| match &c.req.req {
            Some(crate::pb::chunk_request::Req::SetVersion(s)) =>
                s.epoch == 2 || s.version <= f.version,
            _ => true,
        }),
        "a grant without the new epoch"
    );

    // A log restored from an older copy (run 2 lost): run 3 takes epoch 2 again. A
    // server reports epoch 2 before this run answered it, so a lost run gave it: the
    // master takes epoch 3, and waits the period out, as the lost run's lease holders
    // are not named in its log (the primary holds run 2's lease on /f, unfenced).
    let mut h3 = restart(&h.log, Time(40_000));
    assert_eq!(h3.m.epoch(), 2);
    let lost_runs_holder = &t.primary;
    for r in std::iter::once(&f.primary).chain(&f.secondaries) {
        h3.heartbeat_in_term(r, if r == lost_runs_holder { 2 } else { 1 }, &[]);
    }
    assert_eq!(h3.m.epoch(), 3);
    for r in std::iter::once(&f.primary).chain(&f.secondaries) {
        h3.heartbeat_in_term(r, 3, &[(f.handle, f.version)]);
    }
    assert!(
        quiet(&mut h3),
        "fenced on a log that lost the run which granted the last lease"
    );
    // A new chunk needs no quiet period: its primary is named in epoch 3.
    h3.call(create("/g"));
    let g = h3.write_target("/g", 0).unwrap();
    // A server reporting a newer epoch still (a forgery, or a copy older again) moves
    // it on, within reason.
    h3.heartbeat_in_term(&f.primary, 5, &[(f.handle, f.version)]);
    assert_eq!(h3.m.epoch(), 6);
    h3.heartbeat_in_term(&f.primary, 6 + MAX_EPOCH_JUMP + 1, &[(f.handle, f.version)]);
    assert_eq!(h3.m.epoch(), 6, "an epoch far past the log's taken");
    // Within the log's reach, but past what the others (at 3) could follow: refused too.
    h3.heartbeat_in_term(&f.primary, 6 + MAX_EPOCH_JUMP - 1, &[(f.handle, f.version)]);
    assert_eq!(
        h3.m.epoch(),
        6,
        "an epoch the other servers would refuse taken"
    );
    assert_eq!(epochs(&h3.log), vec![1, 2, 3, 6]);
    // By time, the period ends; the holders named in the run's first epoch are kept
    // (they may hold its leases), older ones forgotten.
    h3.advance(Duration::from_secs(12));
    for r in std::iter::once(&f.primary).chain(&f.secondaries) {
        h3.heartbeat_in_term(r, 6, &[(f.handle, f.version)]);
    }
    let t3 = h3.write_target("/f", 0).unwrap();
    h3.step(Input::Tick);
    h3.sync();
    let mut meta = crate::master::Meta::new(cfg().chunk_size);
    for (_, r) in &h3.log {
        meta.apply(r).unwrap();
    }
    assert_eq!(
        meta.leases_settled_in, 2,
        "the period of the run's first epoch"
    );
    for (holder, epoch) in [(&g.primary, 3), (&t3.primary, 6)] {
        assert!(
            meta.lease_holders
                .iter()
                .any(|((a, _), &e)| a == holder && e >= epoch),
            "{holder} of epoch {epoch} forgotten: {:?}",
            meta.lease_holders
        );
    }
    // An epoch taken once the period is over: no grant goes to a server that has not
    // reported it yet (it would refuse the grant, its copy then taken for stale).
    h3.advance(Duration::from_secs(11));
    for r in std::iter::once(&t3.primary).chain(&t3.secondaries) {
        h3.heartbeat_in_term(r, 6, &[(f.handle, t3.version)]);
    }
    h3.heartbeat_in_term(&t3.primary, 7, &[(f.handle, t3.version)]);
    assert_eq!(h3.m.epoch(), 8);
    let e = h3.write_target("/f", 0).unwrap_err();
    assert!(
        e.to_string().contains("has not yet taken master term 8"),
        "{e}"
    );
    // And a restart goes on from there.
    let h4 = restart(&h3.log, Time(60_000));
    assert_eq!(h4.m.epoch(), 9);
}

/// A new chunk with nowhere to go: while no server takes this master's orders yet, or
/// the master may not have heard from all, the client is told to wait; once every
/// server it knows is full, it is told so at once
/// (`NoSpace`, not asked to retry for its whole patience); a server with room takes it.
#[test]
fn a_full_cluster_says_so_and_an_empty_one_says_wait() {
    let mut h = H::new();
    assert!(is_ok(&h.call(create("/f"))));
    let e = h.write_target("/f", 0).unwrap_err();
    assert!(matches!(e, FsError::Unavailable(_)), "{e:?}");
    let beat = |h: &mut H, addr: &str, used: u64| {
        let cluster_id = h.m.cluster_id();
        let r = h.call(MReq::Heartbeat(pb::HeartbeatRequest {
            address: addr.into(),
            rack: addr.into(),
            capacity_bytes: 1000,
            used_bytes: used,
            server_id: server_id(addr),
            cluster_id,
            ..Default::default()
        }));
        assert!(is_ok(&r), "{r:?}");
    };
    beat(&mut h, "cs1", 1000);
    beat(&mut h, "cs2", 1200);
    // Within its first heartbeat timeout the master may not know every server yet.
    let e = h.write_target("/f", 0).unwrap_err();
    assert!(matches!(e, FsError::Unavailable(_)), "{e:?}");
    h.advance(Duration::from_secs(5));
    beat(&mut h, "cs1", 1000);
    beat(&mut h, "cs2", 1200);
    let e = h.write_target("/f", 0).unwrap_err();
    assert!(
        matches!(&e, FsError::NoSpace(m) if m.contains("every chunkserver is full")),
        "{e:?}"
    );
    assert!(!e.is_retryable());
    beat(&mut h, "cs3", 10);
    let t = h.write_target("/f", 0).expect("a server with room");
    assert_eq!(t.primary, "cs3", "{t:?}");
}

// ---- who may send what (`crate::auth`) ----------------------------------------------

fn hb(addr: &str, id: u64, cluster: u64, chunks: &[(u64, u64)]) -> MReq {
    MReq::Heartbeat(pb::HeartbeatRequest {
        address: addr.into(),
        rack: "r".into(),
        capacity_bytes: 1 << 30,
        server_id: id,
        cluster_id: cluster,
        chunks: reports(chunks),
        ..Default::default()
    })
}

/// A heartbeat's report of `chunks`, (handle, version) each, all empty.
fn reports(chunks: &[(u64, u64)]) -> Vec<pb::ChunkReport> {
    chunks
        .iter()
        .map(|&(handle, version)| pb::ChunkReport {
            handle,
            version,
            length: 0,
        })
        .collect()
}

fn chunkserver(name: &str) -> Caller {
    Caller::Chunkserver { name: name.into() }
}

#[test]
fn only_chunkservers_heartbeat_and_only_admins_ask_for_reports() {
    let mut h = H::new();
    let cluster = h.m.cluster_id();
    let client = Caller::Client {
        user: "mallory".into(),
        groups: vec![],
    };
    let r = h.call_from(hb("cs1", 11, cluster, &[]), client.clone());
    assert!(
        matches!(err_of(&r), Some(FsError::PermissionDenied(m)) if m.contains("heartbeats")),
        "{r:?}"
    );
    assert_eq!(
        h.m.servers().live().count(),
        0,
        "a client's heartbeat registered a server"
    );
    assert_eq!(h.m.refused(), 1);
    let r = h.call_from(MReq::Fsck(pb::FsckRequest::default()), client.clone());
    assert!(
        matches!(err_of(&r), Some(FsError::PermissionDenied(_))),
        "{r:?}"
    );
    let r = h.call_from(MReq::Report(pb::ReportRequest {}), client.clone());
    assert!(
        matches!(err_of(&r), Some(FsError::PermissionDenied(_))),
        "{r:?}"
    );
    // A client's namespace calls go through (where the root lets anyone make entries);
    // a chunkserver's do not.
    assert!(is_ok(&h.call(MReq::SetPermissions(
        pb::SetPermissionsRequest {
            path: "/".into(),
            mode: Some(0o777),
            ..Default::default()
        }
    ))));
    assert!(is_ok(&h.call_from(
        MReq::Mkdir(pb::MkdirRequest {
            path: "/d".into(),
            ..Default::default()
        }),
        client
    )));
    let r = h.call_from(
        MReq::Mkdir(pb::MkdirRequest {
            path: "/e".into(),
            ..Default::default()
        }),
        chunkserver("cs1"),
    );
    assert!(
        matches!(err_of(&r), Some(FsError::PermissionDenied(_))),
        "{r:?}"
    );
    let admin = Caller::Admin {
        name: "root".into(),
    };
    assert!(is_ok(
        &h.call_from(MReq::Report(pb::ReportRequest {}), admin)
    ));
    assert!(is_ok(
        &h.call_from(hb("cs1", 11, cluster, &[]), chunkserver("cs1"))
    ));
}

/// A valid chunkserver certificate speaks for one server: not for another server's id,
/// not for made-up servers at other addresses beside its own, and reports corruption
/// only of its own copies.
#[test]
fn a_chunkserver_certificate_speaks_for_its_own_server_only() {
    let mut h = H::new();
    let cluster = h.m.cluster_id();
    for (i, addr) in ["a:1", "b:1", "c:1"].iter().enumerate() {
        let r = h.call_from(
            hb(addr, 100 + i as u64, cluster, &[]),
            chunkserver(&format!("cs{i}")),
        );
        assert!(is_ok(&r), "{r:?}");
    }
    assert!(is_ok(&h.call(create("/f"))));
    let t = h.write_target("/f", 0).unwrap();
    // Every holder reports its copy at the granted version.
    for (i, addr) in ["a:1", "b:1", "c:1"].iter().enumerate() {
        let r = h.call_from(
            hb(addr, 100 + i as u64, cluster, &[(t.handle, t.version)]),
            chunkserver(&format!("cs{i}")),
        );
        assert!(is_ok(&r), "{r:?}");
    }
    let listed = |h: &H| h.m.meta().chunks.get(t.handle).unwrap().replicas.len();
    assert_eq!(listed(&h), 3);
    // cs0's certificate claims cs1's server id at cs1's address (cs1 alive), and at an
    // address of its own: both refused.
    for addr in ["b:1", "phantom:1"] {
        let r = h.call_from(
            hb(addr, 101, cluster, &[(t.handle, t.version)]),
            chunkserver("cs0"),
        );
        assert!(
            matches!(err_of(&r), Some(FsError::PermissionDenied(_))),
            "{addr}: {r:?}"
        );
    }
    // Phantoms with new ids beside cs0's own live server: refused.
    for n in 0..3u64 {
        let r = h.call_from(
            hb(
                &format!("phantom{n}:1"),
                900 + n,
                cluster,
                &[(t.handle, t.version)],
            ),
            chunkserver("cs0"),
        );
        assert!(
            matches!(err_of(&r), Some(FsError::PermissionDenied(m)) if m.contains("one certificate, one server")),
            "{r:?}"
        );
    }
    assert_eq!(
        listed(&h),
        3,
        "a refused heartbeat changed the chunk's replicas"
    );
    assert_eq!(
        h.m.servers().iter().count(),
        3,
        "a refused heartbeat registered a server"
    );
    // cs0 reports corrupt the copies of cs1 and cs2: not believed.
    for (addr, id) in [("b:1", 101), ("c:1", 102)] {
        let r = h.call_from(
            MReq::ReportCorrupt(pb::ReportCorruptRequest {
                handle: t.handle,
                address: addr.into(),
                version: t.version,
                server_id: id,
                cluster_id: cluster,
                by_scrubber: false,
            }),
            chunkserver("cs0"),
        );
        assert!(is_ok(&r));
    }
    assert_eq!(listed(&h), 3, "another server's report dropped a copy");
    // Its own copy, it may report.
    let r = h.call_from(
        MReq::ReportCorrupt(pb::ReportCorruptRequest {
            handle: t.handle,
            address: "a:1".into(),
            version: t.version,
            server_id: 100,
            cluster_id: cluster,
            by_scrubber: false,
        }),
        chunkserver("cs0"),
    );
    assert!(is_ok(&r));
    assert_eq!(
        listed(&h),
        2,
        "a server's report of its own copy was not believed"
    );
    // Once cs1 is dead, its id is still its certificate's: cs0 cannot take it over.
    h.advance(Duration::from_secs(600));
    h.step(Input::Tick);
    let r = h.call_from(hb("b:1", 101, cluster, &[]), chunkserver("cs0"));
    assert!(
        matches!(err_of(&r), Some(FsError::PermissionDenied(_))),
        "{r:?}"
    );
    // cs1 itself comes back, at a new address: taken.
    let r = h.call_from(hb("b:2", 101, cluster, &[]), chunkserver("cs1"));
    assert!(is_ok(&r), "{r:?}");
}

fn user(name: &str, groups: &[&str]) -> Caller {
    Caller::Client {
        user: name.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    }
}

fn set_perms(p: &str, owner: &str, group: &str, mode: Option<u32>) -> MReq {
    MReq::SetPermissions(pb::SetPermissionsRequest {
        path: p.into(),
        owner: owner.into(),
        group: group.into(),
        mode,
    })
}

fn with_mode(req: MReq, m: u32) -> MReq {
    match req {
        MReq::Mkdir(r) => MReq::Mkdir(pb::MkdirRequest { mode: Some(m), ..r }),
        MReq::Create(r) => MReq::Create(pb::CreateRequest { mode: Some(m), ..r }),
        other => other,
    }
}

/// Refused for its permissions, with the refusal naming `what`.
fn denied(r: &pb::MasterResponse, what: &str) -> bool {
    matches!(err_of(r), Some(FsError::PermissionDenied(m)) if m.contains(what))
}

fn perms_of(h: &mut H, p: &str) -> (String, String, u32) {
    match h.call(stat(p)).resp {
        Some(Resp::Stat(s)) => (s.owner, s.group, s.mode),
        other => panic!("stat {p}: {other:?}"),
    }
}

#[test]
fn owners_groups_and_modes_decide_every_namespace_call() {
    let mut h = H::new();
    let admin = Caller::Admin {
        name: "operator".into(),
    };
    let alice = user("alice", &["staff"]);
    let bob = user("bob", &["staff"]);
    let carol = user("carol", &[]);
    // A cluster formatted without a root owner: the superuser's, 0755.
    assert_eq!(perms_of(&mut h, "/"), ("root".into(), "root".into(), 0o755));
    assert!(denied(
        &h.call_from(mkdir("/x"), alice.clone()),
        "add entries"
    ));
    for (req, who) in [
        (with_mode(mkdir("/home"), 0o755), &admin),
        (with_mode(mkdir("/home/alice"), 0o755), &admin),
        (set_perms("/home/alice", "alice", "staff", None), &admin),
        (with_mode(mkdir("/tmp"), 0o1777), &admin),
    ] {
        let r = h.call_from(req, who.clone());
        assert!(is_ok(&r), "{r:?}");
    }
    assert_eq!(
        perms_of(&mut h, "/home"),
        ("operator".into(), "root".into(), 0o755)
    );
    // A new file is its maker's, in its directory's group, with the bits asked for.
    let f = "/home/alice/f";
    assert!(is_ok(
        &h.call_from(with_mode(create(f), 0o640), alice.clone())
    ));
    assert_eq!(perms_of(&mut h, f), ("alice".into(), "staff".into(), 0o640));
    // Reading takes r (bob is in the group, carol is not); writing, extending and
    // appending take w; chunk locations come only with r.
    let get_chunks = |p: &str| {
        MReq::GetChunks(pb::GetChunksRequest {
            path: p.into(),
            ..Default::default()
        })
    };
    let write_target = MReq::GetWriteTarget(pb::GetWriteTargetRequest {
        path: f.into(),
        chunk_index: 0,
        append: false,
    });
    let extend = MReq::ExtendFile(pb::ExtendFileRequest {
        path: f.into(),
        length: 0,
        ..Default::default()
    });
    assert!(is_ok(&h.call_from(get_chunks(f), bob.clone())));
    assert!(denied(
        &h.call_from(get_chunks(f), carol.clone()),
        "read this file"
    ));
    for who in [&bob, &carol] {
        for req in [write_target.clone(), extend.clone(), reserve(f, 10)] {
            let r = h.call_from(req, who.clone());
            assert!(denied(&r, "write this file"), "{r:?}");
        }
    }
    assert!(is_ok(&h.call_from(reserve(f, 10), alice.clone())));
    // Deleting and renaming take w on the directory, which only alice has.
    for who in [&bob, &carol] {
        assert!(denied(
            &h.call_from(delete(f), who.clone()),
            "delete entries"
        ));
        assert!(denied(
            &h.call_from(rename(f, "/tmp/stolen"), who.clone()),
            "move entries out"
        ));
        assert!(denied(
            &h.call_from(create("/home/alice/g"), who.clone()),
            "add entries"
        ));
    }
    // Only the owner changes bits or group (to one it is in); only an admin the owner.
    assert!(denied(
        &h.call_from(set_perms(f, "", "", Some(0o666)), bob.clone()),
        "not its owner"
    ));
    assert!(denied(
        &h.call_from(set_perms(f, "bob", "", None), alice.clone()),
        "only an admin"
    ));
    assert!(denied(
        &h.call_from(set_perms(f, "", "wheel", None), alice.clone()),
        "not in it"
    ));
    assert!(is_ok(
        &h.call_from(set_perms(f, "", "", Some(0o600)), alice.clone())
    ));
    assert!(denied(
        &h.call_from(get_chunks(f), bob.clone()),
        "read this file"
    ));
    assert!(matches!(
        err_of(&h.call_from(set_perms(f, "", "", Some(0o4755)), alice.clone())),
        Some(FsError::InvalidArgument(_))
    ));
    // Without x on a directory nothing below it is reached, not even to stat.
    assert!(is_ok(&h.call_from(
        set_perms("/home/alice", "", "", Some(0o700)),
        alice.clone()
    )));
    assert!(denied(
        &h.call_from(stat(f), bob.clone()),
        "search this directory"
    ));
    assert!(denied(
        &h.call_from(stat("/home/alice/missing"), bob.clone()),
        "search this directory"
    ));
    let list = |p: &str| {
        MReq::List(pb::ListRequest {
            path: p.into(),
            ..Default::default()
        })
    };
    assert!(denied(
        &h.call_from(list("/home/alice"), bob.clone()),
        "list"
    ));
    assert!(is_ok(&h.call_from(list("/home/alice"), alice.clone())));
    // In a sticky directory, only an entry's owner takes it out.
    assert!(is_ok(&h.call_from(create("/tmp/a"), alice.clone())));
    assert!(is_ok(&h.call_from(create("/tmp/b"), bob.clone())));
    assert!(denied(
        &h.call_from(delete("/tmp/a"), bob.clone()),
        "sticky"
    ));
    assert!(denied(
        &h.call_from(rename("/tmp/a", "/tmp/c"), bob.clone()),
        "sticky"
    ));
    assert!(is_ok(&h.call_from(rename("/tmp/b", "/tmp/c"), bob.clone())));
    assert!(is_ok(&h.call_from(delete("/tmp/a"), alice.clone())));
    // Deleting a tree takes rwx on every directory in it.
    let tree = [mkdir("/tmp/t"), mkdir("/tmp/t/sub"), create("/tmp/t/sub/x")];
    for req in tree {
        assert!(is_ok(&h.call_from(req, alice.clone())));
    }
    assert!(is_ok(&h.call_from(
        set_perms("/tmp/t/sub", "", "", Some(0o555)),
        alice.clone()
    )));
    let rm_tree = MReq::Delete(pb::DeleteRequest {
        path: "/tmp/t".into(),
        recursive: true,
    });
    assert!(denied(
        &h.call_from(rm_tree.clone(), alice.clone()),
        "delete what is in this directory"
    ));
    // The superuser may do all of it.
    assert!(is_ok(&h.call_from(rm_tree, admin.clone())));
    assert!(is_ok(&h.call_from(get_chunks(f), admin.clone())));
    assert!(is_ok(
        &h.call_from(set_perms(f, "carol", "", None), admin.clone())
    ));
    assert_eq!(perms_of(&mut h, f), ("carol".into(), "staff".into(), 0o600));
    // Owners, groups and bits outlive a restart, from the log and from a checkpoint.
    let m = Master::recover(cfg(), Time(0), None, h.log.clone()).unwrap();
    assert_eq!(m.meta().fingerprint(), h.m.meta().fingerprint());
    let cp = h.m.meta().checkpoint(h.m.last_seq());
    let m = Master::recover(cfg(), Time(0), Some(&cp), vec![]).unwrap();
    assert_eq!(m.meta().fingerprint(), h.m.meta().fingerprint());
    let mut r = recovered(m, Time(0));
    assert_eq!(perms_of(&mut r, f), ("carol".into(), "staff".into(), 0o600));
    assert_eq!(
        perms_of(&mut r, "/tmp"),
        ("operator".into(), "root".into(), 0o1777)
    );
    assert!(denied(
        &r.call_from(stat(f), bob.clone()),
        "search this directory"
    ));
}

#[test]
fn a_cluster_is_formatted_with_the_root_its_operator_named() {
    let config = MasterConfig {
        root: pb::Permissions {
            owner: "root".into(),
            group: "users".into(),
            mode: 0o775,
        },
        ..cfg()
    };
    let mut h = H::with(config);
    assert_eq!(
        perms_of(&mut h, "/"),
        ("root".into(), "users".into(), 0o775)
    );
    let alice = user("alice", &["users"]);
    assert!(is_ok(&h.call_from(mkdir("/a"), alice.clone())));
    assert!(denied(
        &h.call_from(mkdir("/b"), user("eve", &[])),
        "add entries"
    ));
    // mkdir -p makes each directory on the way its maker's, searchable and writable by
    // it whatever the bits asked for the last.
    let deep = MReq::Mkdir(pb::MkdirRequest {
        path: "/a/b/c".into(),
        parents: true,
        mode: Some(0o500),
    });
    assert!(is_ok(&h.call_from(deep, alice)));
    assert_eq!(
        perms_of(&mut h, "/a/b"),
        ("alice".into(), "users".into(), 0o700)
    );
    assert_eq!(
        perms_of(&mut h, "/a/b/c"),
        ("alice".into(), "users".into(), 0o500)
    );
}
