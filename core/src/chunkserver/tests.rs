//! Tests of the chunkserver state machine, with storage carried out at once on a map.

use std::collections::HashMap;

use super::*;
use crate::error::RpcError;
use crate::pb::chunk_request::Req as R;

#[derive(Default)]
struct Disk {
    data: HashMap<ChunkHandle, Vec<u8>>,
    meta: HashMap<ChunkHandle, pb::ChunkMeta>,
    /// Every write intent stored.
    intents: Vec<pb::WriteIntent>,
    /// Read operations carried out.
    reads: usize,
    /// The next write fails (as a full disk), having stored its data or not.
    fail_write: Option<bool>,
}

impl Disk {
    fn exec(&mut self, op: StoreOp) -> Result<StoreOutput, StoreError> {
        if let (StoreOp::Write { .. }, Some(stored)) = (&op, self.fail_write) {
            self.fail_write = None;
            if stored {
                self.exec(op)?;
            }
            return Err(StoreError::NoSpace);
        }
        Ok(self.apply(op))
    }

    fn apply(&mut self, op: StoreOp) -> StoreOutput {
        match op {
            StoreOp::Read { handle, ranges } => {
                self.reads += 1;
                let d = self.data.get(&handle).cloned().unwrap_or_default();
                StoreOutput::Data(
                    ranges
                        .into_iter()
                        .map(|(o, l)| {
                            let s = (o as usize).min(d.len());
                            let e = ((o + l) as usize).min(d.len());
                            Bytes::copy_from_slice(&d[s..e])
                        })
                        .collect(),
                )
            }
            StoreOp::Write {
                handle,
                offset,
                data,
                meta,
                intent,
            } => {
                self.intents.extend(intent.and_then(|i| i.writing));
                let d = self.data.entry(handle).or_default();
                let end = offset as usize + data.len();
                if d.len() < end {
                    d.resize(end, 0);
                }
                d[offset as usize..end].copy_from_slice(&data);
                self.meta.insert(handle, meta);
                StoreOutput::Done
            }
            StoreOp::Replace { handle, data, meta } => {
                self.data.insert(handle, data.to_vec());
                self.meta.insert(handle, meta);
                StoreOutput::Done
            }
            StoreOp::WriteMeta { handle, meta } => {
                self.data.entry(handle).or_default();
                self.meta.insert(handle, meta);
                StoreOutput::Done
            }
            StoreOp::Delete { handle } => {
                self.data.remove(&handle);
                self.meta.remove(&handle);
                StoreOutput::Done
            }
        }
    }
}

/// The chunk size the tests' leases are granted with.
const CHUNK: u64 = 1 << 20;

struct H {
    cs: Chunkserver,
    disk: Disk,
    next: RequestId,
    calls: Vec<Call>,
    now: Time,
}

impl H {
    fn new() -> H {
        H::named("cs0")
    }

    fn named(address: &str) -> H {
        H::with(ChunkserverConfig {
            address: address.into(),
            ..Default::default()
        })
    }

    /// A server that reads everything from its disk.
    fn uncached() -> H {
        H::with(ChunkserverConfig {
            address: "cs0".into(),
            read_cache_bytes: 0,
            ..Default::default()
        })
    }

    fn with(cfg: ChunkserverConfig) -> H {
        H {
            cs: Chunkserver::recover(cfg, Time(0), vec![]),
            disk: Disk::default(),
            next: 1,
            calls: vec![],
            now: Time(1),
        }
    }

    /// Runs an input and every storage operation it leads to; returns all replies.
    fn run(&mut self, input: Input) -> Vec<(RequestId, pb::ChunkResponse)> {
        let mut replies = Vec::new();
        let mut inputs = vec![input];
        while let Some(i) = inputs.pop() {
            let e = self.cs.handle(self.now, i);
            replies.extend(e.replies);
            self.calls.extend(e.calls);
            for (id, op) in e.store {
                let result = self.disk.exec(op);
                inputs.push(Input::StoreDone { id, result });
            }
        }
        replies
    }

    fn req(&mut self, r: R) -> pb::ChunkResponse {
        self.req_from(r, crate::auth::Caller::Insecure)
    }

    /// A request from `from`, as its transport authenticated it.
    fn req_from(&mut self, r: R, from: crate::auth::Caller) -> pb::ChunkResponse {
        let id = self.next;
        self.next += 1;
        let replies = self.run(Input::Request {
            id,
            arrived: self.now,
            req: pb::ChunkRequest { req: Some(r) },
            from,
        });
        replies
            .into_iter()
            .find(|(i, _)| *i == id)
            .expect("a reply")
            .1
    }

    fn create(&mut self, h: u64) {
        let r = self.req(R::SetVersion(pb::SetVersionRequest {
            epoch: 0,
            handle: h,
            version: 1,
            create: true,
            lease_ms: 60_000,
            valid_ms: 0,
            chunk_size: CHUNK,
            ..Default::default()
        }));
        assert!(r.error.is_none(), "{r:?}");
    }

    /// Chunk `h` at version 1, with no lease: a secondary's copy.
    fn create_unleased(&mut self, h: u64) {
        let r = self.req(R::SetVersion(pb::SetVersionRequest {
            epoch: 0,
            handle: h,
            version: 1,
            create: true,
            ..Default::default()
        }));
        assert!(r.error.is_none(), "{r:?}");
    }

    fn write(&mut self, h: u64, off: u64, data: &[u8]) -> pb::ChunkResponse {
        // A new attempt each time, as a client numbers them.
        let client_seq = self.next;
        self.req(R::Write(pb::WriteChunkRequest {
            handle: h,
            version: 1,
            offset: off,
            data: Bytes::copy_from_slice(data),
            client_seq,
            ..Default::default()
        }))
    }

    fn read(&mut self, h: u64, off: u64, len: u64) -> Result<Bytes, FsError> {
        match self.req(R::Read(pb::ReadChunkRequest {
            capability: None,
            handle: h,
            version: 1,
            offset: off,
            length: len,
        })) {
            pb::ChunkResponse { error: Some(e), .. } => Err(FsError::from_pb(&e)),
            pb::ChunkResponse {
                resp: Some(Resp::Read(r)),
                ..
            } => Ok(r.data),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn requests_waiting_on_chunks_are_bounded() {
    let mut h = H::uncached();
    h.cs.cfg.max_queued_per_chunk = 3;
    h.cs.cfg.max_queued = 5;
    h.create(1);
    h.create(2);
    assert!(h.write(1, 0, &[7; 100]).error.is_none());
    assert!(h.write(2, 0, &[8; 100]).error.is_none());
    // Reads arrive while the disk holds on to every operation: the first of each chunk
    // runs, the rest wait, up to the bounds.
    let mut stuck = Vec::new();
    let mut send = |h: &mut H, handle: u64, id: RequestId| {
        let e = h.cs.handle(
            h.now,
            Input::Request {
                id,
                arrived: h.now,
                req: pb::ChunkRequest {
                    req: Some(R::Read(pb::ReadChunkRequest {
                        capability: None,
                        handle,
                        version: 1,
                        offset: 0,
                        length: 10,
                    })),
                },
                from: crate::auth::Caller::Insecure,
            },
        );
        stuck.extend(e.store);
        e.replies
    };
    let busy = |r: &[(RequestId, pb::ChunkResponse)]| {
        matches!(
            r.first().and_then(|(_, r)| r.error.as_ref()).map(FsError::from_pb),
            Some(FsError::Unavailable(m)) if m.contains("busy")
        )
    };
    for id in 100..104 {
        assert!(send(&mut h, 1, id).is_empty(), "request {id} answered");
    }
    assert!(
        busy(&send(&mut h, 1, 104)),
        "a fifth request on one chunk waited"
    );
    for id in 105..108 {
        assert!(send(&mut h, 2, id).is_empty(), "request {id} answered");
    }
    // Chunk 2 has room, but five requests wait in all.
    assert!(busy(&send(&mut h, 2, 108)), "past the server's bound");
    // The disk answers: everything that waited is served, and room is made.
    let mut replies = Vec::new();
    while let Some((id, op)) = stuck.pop() {
        let result = h.disk.exec(op);
        let e = h.cs.handle(h.now, Input::StoreDone { id, result });
        replies.extend(e.replies);
        stuck.extend(e.store);
    }
    assert_eq!(replies.len(), 7);
    assert!(replies.iter().all(|(_, r)| r.error.is_none()));
    assert_eq!(&h.read(1, 0, 3).unwrap()[..], &[7, 7, 7]);
}

#[test]
fn write_then_read_across_blocks() {
    let mut h = H::new();
    h.create(7);
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
    assert!(h.write(7, 0, &data).error.is_none());
    assert!(h.write(7, 70_000, b"hello").error.is_none());
    let mut want = data.clone();
    want[70_000..70_005].copy_from_slice(b"hello");
    assert_eq!(&h.read(7, 0, 300_000).unwrap()[..], &want[..]);
    assert_eq!(&h.read(7, 69_998, 9).unwrap()[..], &want[69_998..70_007]);
    // Durable metadata matches a recompute of the data on disk.
    let meta = &h.disk.meta[&7];
    assert_eq!(meta.checksums, checksum::blocks(&h.disk.data[&7]));
}

#[test]
fn write_past_end_zero_fills() {
    let mut h = H::new();
    h.create(1);
    h.write(1, 0, b"ab");
    h.write(1, 100_000, b"cd");
    let r = h.read(1, 0, 200_000).unwrap();
    assert_eq!(r.len(), 100_002);
    assert_eq!(&r[..2], b"ab");
    assert!(r[2..100_000].iter().all(|&b| b == 0));
}

#[test]
fn corrupt_block_never_leaves_and_is_reported() {
    let mut h = H::uncached();
    h.create(3);
    h.write(3, 0, &vec![5u8; 150_000]);
    h.disk.data.get_mut(&3).unwrap()[100_000] ^= 0x40;
    // A read of a clean block still works; the bad block is refused.
    assert_eq!(h.read(3, 0, 10).unwrap().len(), 10);
    assert!(matches!(h.read(3, 99_990, 20), Err(FsError::Corrupt(_))));
    let reported = h.calls.iter().any(|c| matches!(&c.req, Outgoing::Master(pb::MasterRequest { req: Some(MReq::ReportCorrupt(r)), .. }) if r.handle == 3));
    assert!(reported, "master not told");
    // Never served again, even the clean block, and not reported in heartbeats.
    assert!(matches!(h.read(3, 0, 10), Err(FsError::Corrupt(_))));
    h.run(Input::Tick);
    let Outgoing::Master(pb::MasterRequest {
        req: Some(MReq::Heartbeat(hb)),
        ..
    }) = &h.calls.last().unwrap().req
    else {
        panic!()
    };
    // Reported at version 0, so the master has it deleted.
    assert_eq!(
        hb.chunks
            .iter()
            .map(|c| (c.handle, c.version))
            .collect::<Vec<_>>(),
        vec![(3, 0)]
    );
}

/// Reads of recent writes come from memory, verified; whatever changes the bytes on disk
/// takes them out of memory first, so a read never returns what the disk no longer has.
#[test]
fn recent_writes_are_read_from_memory_until_changed() {
    let mut h = H::new();
    h.create(3);
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 13) as u8).collect();
    assert!(h.write(3, 0, &data).error.is_none());
    let mut want = data.clone();
    assert_eq!(&h.read(3, 0, 300_000).unwrap()[..], &want[..]);
    assert_eq!(
        &h.read(3, 65_000, 70_000).unwrap()[..],
        &want[65_000..135_000]
    );
    assert_eq!(h.disk.reads, 0, "served from disk");
    // An overwrite inside the cached range: the touched block is read from disk (its
    // old bytes verified, to checksum the block anew) and goes back to memory whole.
    let before = h.disk.reads;
    assert!(h.write(3, 70_000, b"hello").error.is_none());
    want[70_000..70_005].copy_from_slice(b"hello");
    assert_eq!(h.disk.reads, before + 1);
    assert_eq!(&h.read(3, 0, 300_000).unwrap()[..], &want[..]);
    assert_eq!(&h.read(3, 65_530, 10).unwrap()[..], &want[65_530..65_540]);
    assert_eq!(h.disk.reads, before + 1);
    // An append that starts inside a block: the block is whole in memory again (the
    // old bytes come from the edge read the write needs anyway).
    assert!(h.write(3, 200_000, &[9u8; 100_000]).error.is_none());
    want.extend_from_slice(&[9u8; 100_000]);
    let before = h.disk.reads;
    assert_eq!(&h.read(3, 150_000, 150_000).unwrap()[..], &want[150_000..]);
    assert_eq!(h.disk.reads, before);
    // So is one that ends inside a block, below the end of the data.
    assert!(h.write(3, 10, b"abc").error.is_none());
    want[10..13].copy_from_slice(b"abc");
    let before = h.disk.reads;
    assert_eq!(&h.read(3, 0, 300_000).unwrap()[..], &want[..]);
    assert_eq!(h.disk.reads, before);
    // The disk rots under a cached copy: reads still get the written bytes, and the
    // scrubber, which reads the disk, still finds the rot.
    h.disk.data.get_mut(&3).unwrap()[150_000] ^= 0x40;
    assert_eq!(
        &h.read(3, 131_072, 65_536).unwrap()[..],
        &want[131_072..196_608]
    );
    h.now = h.now + h.cs.cfg.scrub_idle + h.cs.cfg.scrub_interval;
    h.run(Input::Tick);
    assert!(h.cs.corrupt.contains(&3), "the scrubber missed the rot");
    assert!(matches!(h.read(3, 0, 10), Err(FsError::Corrupt(_))));
}

#[test]
fn a_failed_write_leaves_nothing_of_its_chunk_in_memory() {
    for stored in [false, true] {
        let mut h = H::new();
        h.create(5);
        assert!(h.write(5, 0, &[1u8; 150_000]).error.is_none());
        h.disk.fail_write = Some(stored);
        assert!(h.write(5, 0, &[2u8; 150_000]).error.is_some());
        // The disk holds one or the other; the metadata still describes the first, so a
        // read finds either the old bytes or a checksum mismatch, never the new bytes.
        let before = h.disk.reads;
        let got = h.read(5, 0, 150_000);
        assert_eq!(
            h.disk.reads,
            before + 1,
            "read from memory after a failed write"
        );
        match got {
            Ok(d) => assert!(!stored && d[..] == [1u8; 150_000][..]),
            Err(e) => assert!(stored && matches!(e, FsError::Corrupt(_)), "{e:?}"),
        }
    }
}

#[test]
fn the_read_cache_keeps_to_its_budget_dropping_the_oldest() {
    let mut h = H::with(ChunkserverConfig {
        address: "cs0".into(),
        read_cache_bytes: 3 * BLOCK_SIZE,
        ..Default::default()
    });
    for c in 1..=4 {
        h.create(c);
        assert!(
            h.write(c, 0, &vec![c as u8; BLOCK_SIZE as usize])
                .error
                .is_none()
        );
    }
    // Chunk 1 went to make room for chunk 4; 2 to 4 are in memory.
    assert_eq!(h.cs.cache.bytes(), 3 * BLOCK_SIZE);
    for c in 2..=4 {
        assert_eq!(h.read(c, 0, 10).unwrap()[..], [c as u8; 10]);
    }
    assert_eq!(h.disk.reads, 0);
    assert_eq!(h.read(1, 0, 10).unwrap()[..], [1u8; 10]);
    assert_eq!(h.disk.reads, 1);
    // Reading 2 again made 3 the oldest: a new write pushes 3 out, not 2.
    assert_eq!(h.read(2, 0, 10).unwrap()[..], [2u8; 10]);
    h.create(6);
    assert!(h.write(6, 0, &[6u8; BLOCK_SIZE as usize]).error.is_none());
    let before = h.disk.reads;
    h.read(2, 0, 10).unwrap();
    assert_eq!(h.disk.reads, before);
    h.read(3, 0, 10).unwrap();
    assert_eq!(h.disk.reads, before + 1);
}

#[test]
fn overwrite_of_a_corrupt_edge_block_is_refused() {
    let mut h = H::new();
    h.create(4);
    h.write(4, 0, &vec![1u8; 100_000]);
    h.disk.data.get_mut(&4).unwrap()[65_540] ^= 1;
    // A partial overwrite of the bad block must not re-checksum the corruption.
    let r = h.write(4, 65_600, b"xyz");
    assert_eq!(r.error.unwrap().code, pb::ErrorCode::Corrupt as i32);
}

#[test]
fn versions_are_checked() {
    let mut h = H::new();
    h.create(9);
    let r = h.req(R::Write(pb::WriteChunkRequest {
        handle: 9,
        version: 2,
        offset: 0,
        data: Bytes::from_static(b"x"),
        ..Default::default()
    }));
    assert_eq!(r.error.unwrap().code, pb::ErrorCode::StaleVersion as i32);
    let r = h.req(R::SetVersion(pb::SetVersionRequest {
        epoch: 0,
        handle: 9,
        version: 3,
        create: false,
        lease_ms: 5000,
        valid_ms: 0,
        chunk_size: CHUNK,
        ..Default::default()
    }));
    assert!(r.error.is_none());
    assert!(h.cs.is_primary(9, Time(4000)) && !h.cs.is_primary(9, Time(5001)));
    // A read naming an older version is served (the replica is newer, not stale).
    assert!(h.read(9, 0, 1).is_ok());
    let r = h.req(R::Read(pb::ReadChunkRequest {
        capability: None,
        handle: 9,
        version: 4,
        offset: 0,
        length: 1,
    }));
    assert_eq!(r.error.unwrap().code, pb::ErrorCode::StaleVersion as i32);
    // A mutation forwarded under an older version than the copy's is refused, whatever
    // its serial: its primary's lease ended before this version was granted, and its
    // writer may have been told it failed.
    let r = h.req(R::Apply(pb::ApplyMutationRequest {
        capability: None,
        handle: 9,
        version: 2,
        serial: 1,
        offset: 0,
        data: Bytes::from_static(b"y"),
        data_id: 0,
    }));
    assert_eq!(r.error.unwrap().code, pb::ErrorCode::StaleVersion as i32);
    let r = h.req(R::SetVersion(pb::SetVersionRequest {
        epoch: 0,
        handle: 9,
        version: 2,
        create: false,
        lease_ms: 0,
        valid_ms: 0,
        chunk_size: 0,
        ..Default::default()
    }));
    assert!(r.error.is_some(), "version went backwards");
    let r = h.req(R::Read(pb::ReadChunkRequest {
        capability: None,
        handle: 77,
        version: 1,
        offset: 0,
        length: 1,
    }));
    assert_eq!(r.error.unwrap().code, pb::ErrorCode::ChunkNotFound as i32);
}

#[test]
fn oversized_or_empty_requests_are_refused() {
    let mut h = H::new();
    h.create(2);
    let r = h.write(2, (1 << 20) - 1, b"ab");
    assert_eq!(r.error.unwrap().code, pb::ErrorCode::InvalidArgument as i32);
    let r = h.write(2, u64::MAX - 1, b"ab");
    assert!(r.error.is_some());
    let e = h.cs.handle(
        Time(1),
        Input::Request {
            id: 50,
            arrived: Time(1),
            req: pb::ChunkRequest { req: None },
            from: crate::auth::Caller::Insecure,
        },
    );
    assert!(e.replies[0].1.error.is_some());
}

/// Orders `dst` to clone version 1 of chunk `handle` from "cs0" (request 1000); the
/// replies of that step.
fn order_clone(dst: &mut H, handle: u64) -> Vec<(RequestId, pb::ChunkResponse)> {
    dst.run(Input::Request {
        id: 1000,
        arrived: dst.now,
        req: pb::ChunkRequest {
            req: Some(R::Clone(pb::CloneChunkRequest {
                epoch: 0,
                handle,
                version: 1,
                source: "cs0".into(),
                ..Default::default()
            })),
        },
        from: crate::auth::Caller::Insecure,
    })
}

/// Answers `dst`'s reads of the clone's source from `src` (passing over its other
/// calls) until the clone is answered; its replies, and how many reads it took.
fn serve_clone(
    dst: &mut H,
    src: &mut H,
    mut replies: Vec<(RequestId, pb::ChunkResponse)>,
) -> (Vec<(RequestId, pb::ChunkResponse)>, usize) {
    let mut reads = 0;
    while replies.is_empty() {
        let c = dst.calls.pop().expect("a read of the source");
        let Outgoing::Chunk(pb::ChunkRequest {
            req: Some(R::Read(r)),
        }) = c.req
        else {
            continue;
        };
        reads += 1;
        let resp = src.req(R::Read(r));
        replies = dst.run(Input::CallResult {
            id: c.id,
            result: Ok(Reply::Chunk(resp)),
        });
    }
    (replies, reads)
}

#[test]
fn clone_copies_in_pieces_and_verifies_length() {
    let mut src = H::new();
    src.create(5);
    let data: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
    src.write(5, 0, &data);
    let mut dst = H::new();
    dst.cs.cfg.clone_piece = 100_000;
    let replies = order_clone(&mut dst, 5);
    let (replies, reads) = serve_clone(&mut dst, &mut src, replies);
    assert!(replies[0].1.error.is_none(), "{replies:?}");
    assert_eq!(reads, 3);
    assert_eq!(dst.disk.data[&5], data);
    assert_eq!(&dst.read(5, 0, 300_000).unwrap()[..], &data[..]);
}

/// A clone reading from its source (its caller may have given up on it) names the chunk
/// as changing in heartbeats: the master must not take the copy's absence for good while
/// the clone may still land it.
#[test]
fn heartbeats_name_chunks_being_cloned() {
    let mut src = H::new();
    src.create(5);
    src.write(5, 0, &[7u8; 1000]);
    let mut dst = H::new();
    let replies = order_clone(&mut dst, 5);
    assert!(replies.is_empty());
    let hb = dst.heartbeat_with(pb::HeartbeatResponse::default());
    assert_eq!(hb.changing, vec![5], "a clone under way was not named");
    serve_clone(&mut dst, &mut src, replies);
    let hb = dst.heartbeat_with(pb::HeartbeatResponse::default());
    assert!(hb.changing.is_empty(), "{:?}", hb.changing);
    assert!(hb.chunks.iter().any(|c| c.handle == 5 && c.version == 1));
}

/// An order to clone that arrives after the copy moved to a newer version (the order
/// was delayed, or sent twice) must not take the copy back to the clone's version and
/// data: all-faults seed 4 found a copy acknowledged at version 2 back at 1.
#[test]
fn a_late_clone_never_takes_a_copy_back_to_an_older_version() {
    let mut src = H::new();
    src.create(5);
    src.write(5, 0, &[1u8; 1000]);
    let mut dst = H::new();
    dst.create(5);
    let r = dst.req(R::SetVersion(pb::SetVersionRequest {
        epoch: 0,
        handle: 5,
        version: 2,
        lease_ms: 60_000,
        valid_ms: 0,
        chunk_size: CHUNK,
        ..Default::default()
    }));
    assert!(r.error.is_none(), "{r:?}");
    let replies = order_clone(&mut dst, 5);
    let (replies, _) = serve_clone(&mut dst, &mut src, replies);
    assert!(replies[0].1.error.is_some(), "{replies:?}");
    assert_eq!(dst.cs.chunks().find(|c| c.0 == 5).map(|c| c.1), Some(2));
    // The empty copy at version 2 stays as it was: none of the clone's bytes landed.
    assert_eq!(dst.disk.data.get(&5).map_or(0, Vec::len), 0);
}

#[test]
fn heartbeat_reports_and_deletes_on_command() {
    let mut h = H::new();
    h.create(1);
    h.create(2);
    assert!(h.write(2, 0, &[2u8; 100_000]).error.is_none());
    assert_eq!(h.cs.cache.bytes(), 100_000);
    h.run(Input::Tick);
    let c = h.calls.pop().unwrap();
    let Outgoing::Master(pb::MasterRequest {
        req: Some(MReq::Heartbeat(hb)),
        ..
    }) = &c.req
    else {
        panic!()
    };
    assert_eq!(
        hb.chunks.iter().map(|c| c.handle).collect::<Vec<_>>(),
        vec![1, 2]
    );
    let resp = pb::MasterResponse {
        shadow: None,
        error: None,
        resp: Some(pb::master_response::Resp::Heartbeat(
            pb::HeartbeatResponse {
                epoch: 0,
                delete_chunks: vec![pb::ChunkVersion {
                    handle: 2,
                    version: u64::MAX,
                }],
                extended_leases: vec![],
                lease_duration_ms: 1000,
                ..Default::default()
            },
        )),
    };
    h.run(Input::CallResult {
        id: c.id,
        result: Ok(Reply::Master(resp)),
    });
    assert!(!h.disk.data.contains_key(&2));
    assert_eq!(h.cs.chunks().count(), 1);
    assert_eq!(
        h.cs.cache.bytes(),
        0,
        "a deleted chunk's data kept in memory"
    );
}

#[test]
fn recovery_flags_inconsistent_metadata() {
    let good = pb::ChunkMeta {
        handle: 1,
        version: 2,
        length: 10,
        checksums: vec![0],
        writing: None,
        ..Default::default()
    };
    let bad = pb::ChunkMeta {
        handle: 2,
        version: 2,
        length: 100_000,
        checksums: vec![0],
        writing: None,
        ..Default::default()
    };
    let cs = Chunkserver::recover(ChunkserverConfig::default(), Time(0), vec![good, bad]);
    assert_eq!(cs.chunks().map(|c| c.0).collect::<Vec<_>>(), vec![1]);
}

/// The next heartbeat the server sends.
fn next_heartbeat(h: &mut H) -> (u64, pb::HeartbeatRequest) {
    h.run(Input::Tick);
    let c = h.calls.pop().unwrap();
    let Outgoing::Master(pb::MasterRequest {
        req: Some(MReq::Heartbeat(hb)),
        ..
    }) = c.req
    else {
        panic!()
    };
    (c.id, hb)
}

/// The chunks the next heartbeat asks to have their leases extended.
fn extensions(h: &mut H) -> Vec<u64> {
    next_heartbeat(h).1.lease_extensions
}

/// A lease grant (a new chunk at version 1) from a master of term `epoch`.
fn grant_in_term(epoch: u64, handle: u64) -> R {
    R::SetVersion(pb::SetVersionRequest {
        epoch,
        handle,
        version: 1,
        create: true,
        lease_ms: 60_000,
        valid_ms: 0,
        chunk_size: CHUNK,
        ..Default::default()
    })
}

/// A master of term `epoch` answering a heartbeat, extending `extended`.
fn heartbeat_reply(epoch: u64, extended: &[u64]) -> Result<Reply, RpcError> {
    Ok(Reply::Master(pb::MasterResponse {
        resp: Some(pb::master_response::Resp::Heartbeat(
            pb::HeartbeatResponse {
                epoch,
                extended_leases: extended.to_vec(),
                lease_duration_ms: 60_000,
                ..Default::default()
            },
        )),
        ..Default::default()
    }))
}

/// A heartbeat reply extends only leases the server still holds. One revoked after the
/// heartbeat went out (its reply held on a slow link while the master voided the lease,
/// heard it dropped, and may grant it to another server) stays revoked: revived, this
/// server would act as a second primary.
#[test]
fn an_extension_arriving_after_a_revocation_does_not_revive_the_lease() {
    let mut h = H::new();
    assert!(h.req(grant_in_term(0, 1)).error.is_none());
    assert!(h.write(1, 0, b"x").error.is_none());
    let (call, hb) = next_heartbeat(&mut h);
    assert_eq!(
        hb.lease_extensions,
        vec![1],
        "a written chunk's lease is asked for"
    );
    let r = h.req(R::RevokeLease(pb::RevokeLeaseRequest {
        epoch: 0,
        handle: 1,
        cluster_id: 0,
        version: 1,
    }));
    assert!(r.error.is_none(), "{r:?}");
    assert_eq!(h.cs.leases().count(), 0, "the revocation ends the lease");
    h.run(Input::CallResult {
        id: call,
        result: heartbeat_reply(0, &[1]),
    });
    assert_eq!(
        h.cs.leases().count(),
        0,
        "an extension sent before the revocation revived the lease"
    );
    // A lease still held is extended by the same kind of reply: the reply is acted on.
    assert!(h.req(grant_in_term(0, 2)).error.is_none());
    assert!(h.write(2, 0, b"y").error.is_none());
    h.now = Time(h.now.0 + 10_000);
    let (call, _) = next_heartbeat(&mut h);
    let before: Vec<_> = h.cs.leases().collect();
    h.run(Input::CallResult {
        id: call,
        result: heartbeat_reply(0, &[1, 2]),
    });
    let after: Vec<_> = h.cs.leases().collect();
    assert_eq!(after.len(), 1, "only chunk 2 holds a lease: {after:?}");
    assert!(
        after[0].1 > before[0].1,
        "extended: {before:?} -> {after:?}"
    );
}

#[test]
fn leases_extend_only_while_written() {
    let mut h = H::new();
    let r = h.req(R::SetVersion(pb::SetVersionRequest {
        epoch: 0,
        handle: 1,
        version: 1,
        create: true,
        lease_ms: 60_000,
        valid_ms: 0,
        chunk_size: CHUNK,
        ..Default::default()
    }));
    assert!(r.error.is_none());
    assert!(
        extensions(&mut h).is_empty(),
        "idle chunk asked for an extension"
    );
    h.write(1, 0, b"x");
    assert_eq!(extensions(&mut h), vec![1]);
}

/// A server gives up every lease as it stores a newer master term, and its heartbeats
/// say which term it has stored: a new leader counts on both to end its quiet period
/// early (`master/leases.rs`).
#[test]
fn a_newer_term_ends_every_lease_and_heartbeats_carry_the_term() {
    let mut h = H::new();
    for handle in [1, 2] {
        // The first order of term 1 waits for the term to be stored; then it is taken.
        if h.req(grant_in_term(1, handle)).error.is_some() {
            let r = h.req(grant_in_term(1, handle));
            assert!(r.error.is_none(), "{r:?}");
        }
    }
    assert!(h.cs.is_primary(1, h.now) && h.cs.is_primary(2, h.now));
    let (id, hb) = next_heartbeat(&mut h);
    assert_eq!(hb.epoch, 1);
    // A reply of term 3 (a new leader): stored, and the leases of term 1 end with it.
    h.run(Input::CallResult {
        id,
        result: heartbeat_reply(3, &[1, 2]),
    });
    assert_eq!(h.cs.master_epoch(), 3);
    assert!(!h.cs.is_primary(1, h.now) && !h.cs.is_primary(2, h.now));
    let (id, hb) = next_heartbeat(&mut h);
    assert_eq!(hb.epoch, 3);
    assert!(hb.lease_extensions.is_empty());
    // The deposed leader can neither extend nor grant again.
    h.run(Input::CallResult {
        id,
        result: heartbeat_reply(1, &[1, 2]),
    });
    assert!(!h.cs.is_primary(1, h.now));
    let r = h.req(R::SetVersion(pb::SetVersionRequest {
        epoch: 1,
        handle: 1,
        version: 2,
        lease_ms: 60_000,
        valid_ms: 60_000,
        chunk_size: CHUNK,
        ..Default::default()
    }));
    assert!(r.error.is_some());
    assert!(!h.cs.is_primary(1, h.now));
}

/// A term far past the stored one is refused, by order and by heartbeat reply alike:
/// believed, it would fence the real master out for good. And a term has one leader:
/// once replica 2 has given an order of term 4, replica 3's orders of term 4 are
/// refused, while replica 2's, and a later term's from replica 3, are taken.
#[test]
fn a_term_far_ahead_or_from_a_second_leader_is_refused() {
    use crate::auth::Caller;
    use crate::master::MAX_EPOCH_JUMP;
    let mut h = H::new();
    let (id, _) = next_heartbeat(&mut h);
    h.run(Input::CallResult {
        id,
        result: heartbeat_reply(3, &[]),
    });
    assert_eq!(h.cs.master_epoch(), 3);
    let m = |replica| Caller::Master { replica };
    // Far ahead: refused as an order and ignored as a reply, and never stored.
    let far = 3 + MAX_EPOCH_JUMP + 1;
    let r = h.req_from(grant_in_term(far, 1), m(2));
    let e = r.error.expect("a term far ahead was taken");
    assert_eq!(e.code, pb::ErrorCode::InvalidArgument as i32, "{e:?}");
    assert!(e.message.contains("forged or damaged"), "{e:?}");
    let (id, _) = next_heartbeat(&mut h);
    h.run(Input::CallResult {
        id,
        result: heartbeat_reply(u64::MAX, &[]),
    });
    assert_eq!(h.cs.master_epoch(), 3, "a term far ahead was stored");
    assert_eq!(h.disk.meta[&IDENTITY_HANDLE].master_epoch, 3);
    // The furthest a term may move is taken.
    let near = 3 + MAX_EPOCH_JUMP;
    assert!(
        h.req_from(grant_in_term(near, 1), m(2)).error.is_some(),
        "stored first"
    );
    let r = h.req_from(grant_in_term(near, 1), m(2));
    assert!(r.error.is_none(), "{r:?}");
    assert_eq!(h.cs.master_epoch(), near);
    // Replica 2 leads term `near`: replica 3's order of it is refused, 2's taken.
    let r = h.req_from(grant_in_term(near, 2), m(3));
    let e = r.error.expect("a second leader's order was taken");
    assert_eq!(e.code, pb::ErrorCode::PermissionDenied as i32, "{e:?}");
    assert!(e.message.contains("led by replica 2"), "{e:?}");
    assert!(!h.cs.is_primary(2, h.now));
    let r = h.req_from(grant_in_term(near, 2), m(2));
    assert!(r.error.is_none(), "{r:?}");
    // A later term is replica 3's to lead.
    assert!(
        h.req_from(grant_in_term(near + 1, 3), m(3)).error.is_some(),
        "stored first"
    );
    let r = h.req_from(grant_in_term(near + 1, 3), m(3));
    assert!(r.error.is_none(), "{r:?}");
    let r = h.req_from(grant_in_term(near + 1, 4), m(2));
    assert!(r.error.is_some(), "replica 2 led term {} too", near + 1);
}

/// A grant of the old term that arrives while the new term is being stored is taken as a
/// version, yet its lease is not, when its write lands after the term's: the server
/// already says it holds no lease of an older term.
#[test]
fn a_deposed_leaders_grant_landing_after_the_new_term_takes_no_lease() {
    let mut h = H::new();
    // Term 1 stored.
    let (id, _) = next_heartbeat(&mut h);
    h.run(Input::CallResult {
        id,
        result: heartbeat_reply(1, &[]),
    });
    assert_eq!(h.cs.master_epoch(), 1);
    // Term 3 starts being stored; meanwhile the old leader's grant comes, and is taken.
    let (id, _) = next_heartbeat(&mut h);
    let now = h.now;
    let e = h.cs.handle(
        now,
        Input::CallResult {
            id,
            result: heartbeat_reply(3, &[]),
        },
    );
    let mut writes: Vec<_> = e.store;
    let e = h.cs.handle(
        now,
        Input::Request {
            id: 77,
            req: pb::ChunkRequest {
                req: Some(grant_in_term(1, 5)),
            },
            arrived: now,
            from: crate::auth::Caller::Insecure,
        },
    );
    writes.extend(e.store);
    assert_eq!(writes.len(), 2, "the term's write, then the version's");
    // The writes land in order: the term first.
    for (id, op) in writes {
        let result = h.disk.exec(op);
        h.cs.handle(now, Input::StoreDone { id, result });
    }
    assert_eq!(h.cs.master_epoch(), 3);
    assert!(
        !h.cs.is_primary(5, now),
        "a lease of term 1 taken after term 3 was stored"
    );
    let (_, hb) = next_heartbeat(&mut h);
    assert_eq!(hb.epoch, 3);
}

#[test]
fn lease_counts_from_arrival_not_from_processing() {
    // A grant that waited in the queue (here: 900 ms) must not outlive the master's view,
    // which starts no earlier than the request's arrival.
    let mut h = H::new();
    let req = pb::ChunkRequest {
        req: Some(R::SetVersion(pb::SetVersionRequest {
            epoch: 0,
            handle: 4,
            version: 1,
            create: true,
            lease_ms: 2_000,
            valid_ms: 0,
            chunk_size: CHUNK,
            ..Default::default()
        })),
    };
    let e = h.cs.handle(
        Time(1_000),
        Input::Request {
            id: 1,
            req,
            arrived: Time(100),
            from: crate::auth::Caller::Insecure,
        },
    );
    for (id, op) in e.store {
        let result = h.disk.exec(op);
        h.cs.handle(Time(1_000), Input::StoreDone { id, result });
    }
    assert!(h.cs.is_primary(4, Time(2_099)));
    assert!(
        !h.cs.is_primary(4, Time(2_100)),
        "lease ran from processing time"
    );
}

/// Sends a mutation to a secondary; returns whatever replies that step produced.
fn send_apply(
    h: &mut H,
    serial: u64,
    off: u64,
    data: &'static [u8],
) -> Vec<(RequestId, pb::ChunkResponse)> {
    let id = h.next;
    h.next += 1;
    h.run(Input::Request {
        id,
        arrived: h.now,
        req: pb::ChunkRequest {
            req: Some(R::Apply(pb::ApplyMutationRequest {
                capability: None,
                handle: 1,
                version: 1,
                serial,
                offset: off,
                data: Bytes::from_static(data),
                data_id: 0,
            })),
        },
        from: crate::auth::Caller::Insecure,
    })
}

#[test]
fn a_mutation_that_overtook_its_predecessor_waits_for_it() {
    let mut h = H::new();
    h.create_unleased(1);
    assert!(send_apply(&mut h, 3, 0, b"ccc").is_empty());
    assert!(send_apply(&mut h, 2, 0, b"bb").is_empty());
    // The first arrives: all three are applied, in serial order, and all answered.
    let r = send_apply(&mut h, 1, 0, b"a");
    assert_eq!(r.len(), 3, "{r:?}");
    assert!(r.iter().all(|(_, x)| x.error.is_none()));
    assert_eq!(&h.read(1, 0, 3).unwrap()[..], b"ccc");
    // A new version fails whatever still waits.
    assert!(send_apply(&mut h, 5, 0, b"e").is_empty());
    let r = h.run(Input::Request {
        id: 999,
        arrived: h.now,
        req: pb::ChunkRequest {
            req: Some(R::SetVersion(pb::SetVersionRequest {
                epoch: 0,
                handle: 1,
                version: 2,
                create: false,
                lease_ms: 0,
                valid_ms: 0,
                chunk_size: 0,
                ..Default::default()
            })),
        },
        from: crate::auth::Caller::Insecure,
    });
    assert_eq!(r.len(), 2);
    assert!(r.iter().any(|(id, x)| *id != 999 && x.error.is_some()));
}

#[test]
fn the_primary_starts_the_next_mutation_while_the_last_is_out() {
    let mut h = H::new();
    h.create(1);
    let write = |seq: u64, data: &'static [u8]| pb::ChunkRequest {
        req: Some(R::Write(pb::WriteChunkRequest {
            capability: None,
            secondary_capabilities: vec![],
            handle: 1,
            version: 1,
            offset: 0,
            data: Bytes::from_static(data),
            secondaries: vec!["cs1".into()],
            client_id: 1,
            client_seq: seq,
            data_id: 0,
            write_seq: 0,
        })),
    };
    assert!(
        h.run(Input::Request {
            id: 50,
            arrived: h.now,
            req: write(1, b"one"),
            from: crate::auth::Caller::Insecure
        })
        .is_empty()
    );
    assert!(
        h.run(Input::Request {
            id: 51,
            arrived: h.now,
            req: write(2, b"two"),
            from: crate::auth::Caller::Insecure
        })
        .is_empty()
    );
    let serials: Vec<u64> = h
        .calls
        .iter()
        .filter_map(|c| match &c.req {
            Outgoing::Chunk(pb::ChunkRequest {
                req: Some(R::Apply(a)),
            }) => Some(a.serial),
            _ => None,
        })
        .collect();
    assert_eq!(serials, vec![1, 2], "both out at once, in order");
    // Answers come back in any order; each write is answered when its own is in.
    let calls = std::mem::take(&mut h.calls);
    let r = h.run(Input::CallResult {
        id: calls[1].id,
        result: Ok(Reply::Chunk(empty())),
    });
    assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![51]);
    let r = h.run(Input::CallResult {
        id: calls[0].id,
        result: Ok(Reply::Chunk(empty())),
    });
    assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![50]);
}

fn apply(h: &mut H, serial: u64, off: u64, data: &'static [u8]) -> pb::ChunkResponse {
    h.req(R::Apply(pb::ApplyMutationRequest {
        capability: None,
        handle: 1,
        version: 1,
        serial,
        offset: off,
        data: Bytes::from_static(data),
        data_id: 0,
    }))
}

#[test]
fn secondary_never_applies_an_overtaken_mutation() {
    let mut h = H::new();
    h.create_unleased(1);
    // Mutation 2 arrives first: it waits for 1, which is lost; after the hold it is
    // applied anyway (a gap is a failed mutation).
    let early = send_apply(&mut h, 2, 0, b"new");
    assert!(early.is_empty(), "applied before its predecessor");
    h.now = h.now + h.cs.cfg.apply_hold;
    let r = h.run(Input::Tick);
    assert!(r.iter().any(|(_, resp)| resp.error.is_none()));
    // Mutation 1 was delayed in the network; applying it now would undo mutation 2.
    assert!(apply(&mut h, 1, 0, b"old").error.is_some());
    assert_eq!(&h.read(1, 0, 3).unwrap()[..], b"new");
    // A new version starts a new order.
    h.req(R::SetVersion(pb::SetVersionRequest {
        epoch: 0,
        handle: 1,
        version: 2,
        create: false,
        lease_ms: 0,
        valid_ms: 0,
        chunk_size: 0,
        ..Default::default()
    }));
    let r = h.req(R::Apply(pb::ApplyMutationRequest {
        capability: None,
        handle: 1,
        version: 2,
        serial: 1,
        offset: 0,
        data: Bytes::from_static(b"v2"),
        data_id: 0,
    }));
    assert!(r.error.is_none());
}

#[test]
fn a_restart_does_not_let_an_overtaken_mutation_land() {
    let mut h = H::new();
    h.create_unleased(1);
    assert!(apply(&mut h, 1, 0, b"one").error.is_none());
    assert!(apply(&mut h, 2, 0, b"two").error.is_none());
    // A crash and a restart at the same version; then a copy of mutation 1, held up on
    // the network, arrives. It waits for a predecessor that is not coming, and must
    // not then land over mutation 2.
    let metas: Vec<pb::ChunkMeta> = h.disk.meta.values().cloned().collect();
    h.cs = Chunkserver::recover(h.cs.cfg.clone(), h.now, metas);
    let late = send_apply(&mut h, 1, 0, b"old");
    h.now = h.now + h.cs.cfg.apply_hold;
    let mut r = late;
    r.extend(h.run(Input::Tick));
    assert!(
        r.iter().all(|(_, resp)| resp.error.is_some()),
        "an overtaken mutation was applied after a restart: {r:?}"
    );
    assert_eq!(&h.read(1, 0, 3).unwrap()[..], b"two");
    // The next mutation of the version still applies.
    assert!(apply(&mut h, 3, 0, b"new").error.is_none());
    assert_eq!(&h.read(1, 0, 3).unwrap()[..], b"new");
}

#[test]
fn a_late_revocation_leaves_a_later_lease() {
    let mut h = H::new();
    h.create(1);
    let grant = |h: &mut H, version| {
        h.req(R::SetVersion(pb::SetVersionRequest {
            handle: 1,
            version,
            lease_ms: 60_000,
            chunk_size: CHUNK,
            ..Default::default()
        }))
    };
    let revoke = |h: &mut H, version| {
        h.req(R::RevokeLease(pb::RevokeLeaseRequest {
            handle: 1,
            version,
            ..Default::default()
        }))
    };
    assert!(grant(&mut h, 2).error.is_none());
    // The revocation of the lease at version 1 arrives after the grant of version 2.
    assert!(revoke(&mut h, 1).error.is_none());
    assert_eq!(
        h.cs.leases().count(),
        1,
        "a late revocation ended a later lease"
    );
    assert!(revoke(&mut h, 2).error.is_none());
    assert_eq!(h.cs.leases().count(), 0, "a revocation left its lease");
}

#[test]
fn only_the_primary_takes_client_writes_and_refuses_overtaken_ones() {
    let mut h = H::new();
    h.create_unleased(1);
    let w = |version, seq| {
        R::Write(pb::WriteChunkRequest {
            handle: 1,
            version,
            offset: 0,
            data: Bytes::from_static(b"x"),
            client_id: 7,
            client_seq: seq,
            ..Default::default()
        })
    };
    assert_eq!(
        h.req(w(1, 1)).error.unwrap().code,
        pb::ErrorCode::Unavailable as i32,
        "no lease"
    );
    h.req(R::SetVersion(pb::SetVersionRequest {
        epoch: 0,
        handle: 1,
        version: 2,
        create: false,
        lease_ms: 60_000,
        valid_ms: 0,
        chunk_size: CHUNK,
        ..Default::default()
    }));
    assert!(h.req(w(2, 5)).error.is_none());
    assert!(h.req(w(2, 5)).error.is_none(), "a copy of the same attempt");
    let overtaken = h
        .req(w(2, 4))
        .error
        .expect("an overtaken attempt is refused");
    assert!(
        FsError::from_pb(&overtaken).is_retryable(),
        "an attempt overtaken by a concurrent one of the same client may go again: {overtaken:?}"
    );
}

/// A client gave up on a write attempt and retried it, and the retry was applied and
/// answered; then another write landed on the same bytes. The first attempt, late on the
/// network, must not land on top of that, and a second copy of an attempt is answered as
/// the first was without being applied again.
#[test]
fn a_late_attempt_never_lands_over_what_was_written_since() {
    let mut h = H::new();
    h.create(1);
    // As the client library sends them: the data pushed ahead, the write naming it.
    let write = |client_id, client_seq, data_id| pb::ChunkRequest {
        req: Some(R::Write(pb::WriteChunkRequest {
            capability: None,
            secondary_capabilities: vec![],
            handle: 1,
            version: 1,
            offset: 0,
            data: Bytes::new(),
            secondaries: vec!["cs1".into()],
            client_id,
            client_seq,
            data_id,
            write_seq: 0,
        })),
    };
    let send = |h: &mut H, id, req| {
        let replies = h.run(Input::Request {
            id,
            arrived: Time(1),
            req,
            from: crate::auth::Caller::Insecure,
        });
        let calls = std::mem::take(&mut h.calls);
        (replies, calls)
    };
    let settle = |h: &mut H, calls: Vec<Call>| {
        let mut replies = Vec::new();
        for c in calls {
            replies.extend(h.run(Input::CallResult {
                id: c.id,
                result: applied(),
            }));
        }
        replies
    };
    // Writer 7's first attempt pushed its data and was held up; its retry pushed again.
    for (data_id, data) in [(41, b"first"), (42, b"retry"), (43, b"other")] {
        assert!(push(&mut h, data_id, 0, 5, data, &[])[0].1.error.is_none());
    }
    // The retry (attempt 2) is applied, and a copy of it arrives meanwhile.
    let (r, calls) = send(&mut h, 900, write(7, 2, 42));
    assert!(r.is_empty() && calls.len() == 1, "{r:?}");
    let (r, copy_calls) = send(&mut h, 901, write(7, 2, 42));
    assert!(r.is_empty(), "a copy answered before its first copy: {r:?}");
    assert!(
        copy_calls.is_empty(),
        "a copy of an attempt was applied again"
    );
    let r = settle(&mut h, calls);
    let ids: Vec<RequestId> = r.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids.len(), 2, "{r:?}");
    assert!(ids.contains(&900) && ids.contains(&901));
    assert!(r.iter().all(|(_, resp)| resp.error.is_none()), "{r:?}");
    // Another writer's write lands on the same bytes.
    let (_, calls) = send(&mut h, 902, write(8, 1, 43));
    assert!(settle(&mut h, calls).iter().all(|(_, r)| r.error.is_none()));
    // A third copy of the retry, after it was answered: the same answer, not applied.
    let (r, calls) = send(&mut h, 903, write(7, 2, 42));
    assert!(
        calls.is_empty(),
        "a copy of an answered attempt was applied again"
    );
    assert!(r.len() == 1 && r[0].1.error.is_none(), "{r:?}");
    // The first attempt arrives at last: refused, and nothing is sent on.
    let (r, calls) = send(&mut h, 904, write(7, 1, 41));
    assert!(calls.is_empty(), "a late attempt was forwarded");
    assert!(r.len() == 1 && r[0].1.error.is_some(), "{r:?}");
    assert_eq!(&h.read(1, 0, 5).unwrap()[..], b"other");
}

#[test]
fn copies_of_a_write_waiting_for_its_answer_are_bounded() {
    let mut h = H::new();
    h.cs.cfg.max_queued_per_chunk = 3;
    h.create(1);
    let write = pb::ChunkRequest {
        req: Some(R::Write(pb::WriteChunkRequest {
            capability: None,
            secondary_capabilities: vec![],
            handle: 1,
            version: 1,
            offset: 0,
            data: Bytes::from_static(b"abc"),
            secondaries: vec!["cs1".into()],
            client_id: 7,
            client_seq: 1,
            data_id: 0,
            write_seq: 0,
        })),
    };
    let send = |h: &mut H, id| {
        h.run(Input::Request {
            id,
            arrived: Time(1),
            req: write.clone(),
            from: crate::auth::Caller::Insecure,
        })
    };
    assert!(send(&mut h, 900).is_empty());
    let calls = std::mem::take(&mut h.calls);
    // Copies wait for the first one's answer, up to the chunk's queue bound.
    for id in 901..904 {
        assert!(send(&mut h, id).is_empty(), "copy {id} answered early");
    }
    let r = send(&mut h, 904);
    assert!(
        matches!(&r[..], [(904, resp)] if resp.error.as_ref().is_some_and(|e| e.message.contains("busy"))),
        "a copy past the bound was kept waiting: {r:?}"
    );
    let mut answered = Vec::new();
    for c in calls {
        answered.extend(h.run(Input::CallResult {
            id: c.id,
            result: applied(),
        }));
    }
    let mut ids: Vec<RequestId> = answered.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![900, 901, 902, 903]);
}

#[test]
fn primary_answers_after_every_secondary_applied() {
    let mut h = H::new();
    h.create(1);
    let id = 900;
    let req = pb::ChunkRequest {
        req: Some(R::Write(pb::WriteChunkRequest {
            capability: None,
            secondary_capabilities: vec![],
            handle: 1,
            version: 1,
            offset: 0,
            data: Bytes::from_static(b"abc"),
            secondaries: vec!["cs1".into(), "cs2".into()],
            client_id: 1,
            client_seq: 1,
            data_id: 0,
            write_seq: 0,
        })),
    };
    let replies = h.run(Input::Request {
        id,
        arrived: Time(1),
        req,
        from: crate::auth::Caller::Insecure,
    });
    assert!(
        replies.is_empty(),
        "answered before the secondaries applied"
    );
    let forwards: Vec<Call> = std::mem::take(&mut h.calls);
    assert_eq!(forwards.len(), 2);
    for c in &forwards {
        let Outgoing::Chunk(pb::ChunkRequest {
            req: Some(R::Apply(a)),
        }) = &c.req
        else {
            panic!("{c:?}")
        };
        assert_eq!((a.serial, &a.data[..]), (1, &b"abc"[..]));
    }
    assert!(
        h.run(Input::CallResult {
            id: forwards[0].id,
            result: applied()
        })
        .is_empty()
    );
    let r = h.run(Input::CallResult {
        id: forwards[1].id,
        result: Err(RpcError::Deadline("cs2".into())),
    });
    assert_eq!(r[0].0, id);
    assert!(
        r[0].1.error.is_some(),
        "a secondary failed, yet the write was acknowledged"
    );
    // The chunk is free again: the next write gets the next serial.
    let req = pb::ChunkRequest {
        req: Some(R::Write(pb::WriteChunkRequest {
            capability: None,
            secondary_capabilities: vec![],
            handle: 1,
            version: 1,
            offset: 0,
            data: Bytes::from_static(b"x"),
            secondaries: vec!["cs1".into()],
            client_id: 1,
            client_seq: 2,
            data_id: 0,
            write_seq: 0,
        })),
    };
    h.run(Input::Request {
        id: 901,
        arrived: Time(1),
        req,
        from: crate::auth::Caller::Insecure,
    });
    let Outgoing::Chunk(pb::ChunkRequest {
        req: Some(R::Apply(a)),
    }) = &h.calls.last().unwrap().req
    else {
        panic!()
    };
    assert_eq!(a.serial, 2);
}

/// A secondary's answer: the mutation is applied.
fn applied() -> Result<Reply, RpcError> {
    Ok(Reply::Chunk(pb::ChunkResponse {
        error: None,
        resp: Some(Resp::Empty(pb::Empty {})),
        ..Default::default()
    }))
}

fn write_to(secondaries: &[&str], seq: u64) -> Input {
    Input::Request {
        id: 900 + seq,
        arrived: Time(1),
        req: pb::ChunkRequest {
            req: Some(R::Write(pb::WriteChunkRequest {
                capability: None,
                secondary_capabilities: vec![],
                handle: 1,
                version: 1,
                offset: 0,
                data: Bytes::from_static(b"abc"),
                secondaries: secondaries.iter().map(|s| s.to_string()).collect(),
                client_id: 1,
                client_seq: seq,
                data_id: 0,
                write_seq: 0,
            })),
        },
        from: crate::auth::Caller::Insecure,
    }
}

#[test]
fn the_secondaries_get_a_mutation_while_the_primary_writes_it() {
    let mut h = H::new();
    h.create(1);
    let e = h.cs.handle(h.now, write_to(&["cs1", "cs2"], 1));
    assert_eq!(e.calls.len(), 2, "sent to both secondaries at once");
    assert_eq!(e.store.len(), 1, "and written here at the same time");
    assert!(e.replies.is_empty());
}

#[test]
fn a_write_that_failed_on_the_primary_fails_once_the_secondaries_answer() {
    for stored in [false, true] {
        let mut h = H::new();
        h.create(1);
        h.disk.fail_write = Some(stored);
        assert!(h.run(write_to(&["cs1", "cs2"], 1)).is_empty());
        let forwards = std::mem::take(&mut h.calls);
        assert_eq!(forwards.len(), 2);
        assert!(
            h.run(Input::CallResult {
                id: forwards[0].id,
                result: applied()
            })
            .is_empty()
        );
        let r = h.run(Input::CallResult {
            id: forwards[1].id,
            result: applied(),
        });
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].0, 901);
        let e = r[0].1.error.as_ref().expect("the primary's write failed");
        assert_eq!(e.code(), pb::ErrorCode::NoSpace, "{e:?}");
        // The next mutation this server applies is another primary's: it is answered
        // here and now, not taken for the failed write.
        let r = send_apply(&mut h, 2, 0, b"zz");
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0].1.error.is_none(), "{r:?}");
        assert!(h.calls.is_empty(), "forwarded: {:?}", h.calls);
    }
}

/// A mutation the secondaries answer for only after the primary's lease ended fails,
/// though every replica applied it: by then the master may have copied a replica that
/// took it after the copy was read, or granted the next version, so its writer must
/// not be told it is in every copy.
#[test]
fn a_mutation_answered_for_after_the_lease_ended_fails() {
    let mut h = H::new();
    h.create(1);
    assert!(h.run(write_to(&["cs1", "cs2"], 1)).is_empty());
    let forwards = std::mem::take(&mut h.calls);
    assert_eq!(forwards.len(), 2);
    assert!(
        h.run(Input::CallResult {
            id: forwards[0].id,
            result: applied()
        })
        .is_empty()
    );
    h.now = Time(61_000);
    assert!(!h.cs.is_primary(1, h.now), "the lease is over");
    let r = h.run(Input::CallResult {
        id: forwards[1].id,
        result: applied(),
    });
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].0, 901);
    let e = r[0]
        .1
        .error
        .as_ref()
        .expect("answered Ok after the lease ended");
    assert_eq!(e.code(), pb::ErrorCode::Unavailable, "{e:?}");
}

#[test]
fn a_grant_applied_too_late_is_refused() {
    let mut h = H::new();
    let req = pb::ChunkRequest {
        req: Some(R::SetVersion(pb::SetVersionRequest {
            epoch: 0,
            handle: 4,
            version: 1,
            create: true,
            lease_ms: 0,
            valid_ms: 1_000,
            chunk_size: 0,
            ..Default::default()
        })),
    };
    let e = h.cs.handle(
        Time(5_000),
        Input::Request {
            id: 1,
            req,
            arrived: Time(100),
            from: crate::auth::Caller::Insecure,
        },
    );
    assert!(
        e.store.is_empty(),
        "applied a grant the master had given up on"
    );
    assert!(e.replies[0].1.error.is_some());
    assert_eq!(h.cs.chunks().count(), 0);
}

#[test]
fn a_delete_order_spares_a_copy_that_moved_on() {
    let mut h = H::new();
    h.create(1);
    // The master judged a report of version 1; meanwhile the copy took version 2.
    h.req(R::SetVersion(pb::SetVersionRequest {
        epoch: 0,
        handle: 1,
        version: 2,
        create: false,
        lease_ms: 0,
        valid_ms: 0,
        chunk_size: 0,
        ..Default::default()
    }));
    h.run(Input::Tick);
    let c = h.calls.pop().unwrap();
    let resp = pb::MasterResponse {
        shadow: None,
        error: None,
        resp: Some(pb::master_response::Resp::Heartbeat(
            pb::HeartbeatResponse {
                epoch: 0,
                delete_chunks: vec![pb::ChunkVersion {
                    handle: 1,
                    version: 1,
                }],
                extended_leases: vec![],
                lease_duration_ms: 1000,
                ..Default::default()
            },
        )),
    };
    h.run(Input::CallResult {
        id: c.id,
        result: Ok(Reply::Master(resp)),
    });
    assert_eq!(
        h.cs.chunks().map(|c| c.1).collect::<Vec<_>>(),
        vec![2],
        "a current copy was deleted"
    );
}

fn append(h: &mut H, data: &[u8]) -> Result<pb::AppendChunkResponse, FsError> {
    match h.req(R::Append(pb::AppendChunkRequest {
        capability: None,
        secondary_capabilities: vec![],
        handle: 1,
        version: 1,
        data: Bytes::copy_from_slice(data),
        secondaries: vec![],
        data_id: 0,
    })) {
        pb::ChunkResponse { error: Some(e), .. } => Err(FsError::from_pb(&e)),
        pb::ChunkResponse {
            resp: Some(Resp::Append(a)),
            ..
        } => Ok(a),
        other => panic!("{other:?}"),
    }
}

#[test]
fn record_append_goes_at_the_end_and_pads_a_full_chunk() {
    let mut h = H::new();
    h.create(1);
    let rec = vec![7u8; 200_000];
    for i in 0..5u64 {
        let a = append(&mut h, &rec).unwrap();
        assert_eq!((a.offset, a.chunk_full), (i * 200_000, false));
    }
    // 48,576 bytes of room left: the record does not fit, so the chunk is padded.
    let a = append(&mut h, &rec).unwrap();
    assert!(a.chunk_full);
    let all = h.read(1, 0, 2 << 20).unwrap();
    assert_eq!(all.len(), 1 << 20, "padded to the chunk's full size");
    assert!(all[1_000_000..].iter().all(|&b| b == 0));
    assert_eq!(
        h.disk.meta[&1].checksums,
        checksum::blocks(&h.disk.data[&1])
    );
    // Full stays full; and a small record does not sneak into the padding.
    assert!(append(&mut h, b"x").unwrap().chunk_full);
}

#[test]
fn record_append_refuses_big_records_and_non_primaries() {
    let mut h = H::new();
    h.create(1);
    let too_big = vec![1u8; (1 << 20) / 4 + 1];
    assert!(matches!(
        append(&mut h, &too_big),
        Err(FsError::InvalidArgument(_))
    ));
    assert!(matches!(
        append(&mut h, b""),
        Err(FsError::InvalidArgument(_))
    ));
    assert!(
        append(&mut h, &too_big[1..]).is_ok(),
        "a quarter chunk fits"
    );
    h.now = Time(120_000); // the lease is over
    assert!(matches!(
        append(&mut h, b"late"),
        Err(FsError::Unavailable(_))
    ));
}

/// A primary pads and bounds record appends by the chunk size its lease grant named (the
/// size of the chunk's file), whatever size other files have: a file keeps its layout
/// when the master's default for new files changes.
#[test]
fn record_append_pads_to_the_chunk_size_of_the_lease() {
    let mut h = H::new();
    let size: u64 = 256 << 10;
    let grant = |handle, chunk_size| {
        R::SetVersion(pb::SetVersionRequest {
            epoch: 0,
            handle,
            version: 1,
            create: true,
            lease_ms: 60_000,
            valid_ms: 0,
            chunk_size,
            ..Default::default()
        })
    };
    let r = h.req(grant(1, size));
    assert!(r.error.is_none(), "{r:?}");
    assert!(matches!(
        append(&mut h, &vec![1u8; size as usize / 4 + 1]),
        Err(FsError::InvalidArgument(_))
    ));
    let rec = vec![7u8; 60_000];
    for i in 0..4u64 {
        let a = append(&mut h, &rec).unwrap();
        assert_eq!((a.offset, a.chunk_full), (i * 60_000, false));
    }
    // 22,144 bytes of room left in a chunk of the file's size: padded.
    assert!(append(&mut h, &rec).unwrap().chunk_full);
    let all = h.read(1, 0, 2 << 20).unwrap();
    assert_eq!(all.len() as u64, size, "padded to the file's chunk size");
    assert!(all[240_000..].iter().all(|&b| b == 0));
    // A write past the file's chunk size is refused as well.
    assert!(matches!(
        h.write(1, size - 1, b"xy")
            .error
            .as_ref()
            .map(FsError::from_pb),
        Some(FsError::InvalidArgument(_))
    ));
    // A lease must say its chunk size.
    let r = h.req(grant(2, 0));
    assert!(
        matches!(
            r.error.as_ref().map(FsError::from_pb),
            Some(FsError::InvalidArgument(_))
        ),
        "{r:?}"
    );
}

#[test]
fn padding_reaches_the_secondaries() {
    let mut p = H::named("p");
    p.create(1);
    p.write(1, 0, &[3u8; 1000]);
    let req = pb::ChunkRequest {
        req: Some(R::Append(pb::AppendChunkRequest {
            capability: None,
            secondary_capabilities: vec![],
            handle: 1,
            version: 1,
            data: Bytes::from(vec![9u8; 262_144]),
            secondaries: vec!["s".into()],
            data_id: 0,
        })),
    };
    // Fill the chunk to within 100 bytes of its end, then append a record too big.
    p.write(1, 1000, &vec![4u8; (1 << 20) - 1000 - 100]);
    let replies = p.run(Input::Request {
        id: 501,
        arrived: p.now,
        req,
        from: crate::auth::Caller::Insecure,
    });
    assert!(replies.is_empty(), "answered before the secondary padded");
    let Outgoing::Chunk(pb::ChunkRequest {
        req: Some(R::Apply(pad)),
    }) = p.calls.last().unwrap().req.clone()
    else {
        panic!()
    };
    assert_eq!((pad.offset, pad.data.len()), (1 << 20, 0));
    let mut s = H::named("s");
    s.create(1);
    s.write(1, 0, b"short");
    // This replica's own order (one local write so far) goes on with the padding.
    let pad = pb::ApplyMutationRequest { serial: 2, ..pad };
    let r = s.req(R::Apply(pad));
    assert!(r.error.is_none(), "{r:?}");
    let got = s.read(1, 0, 2 << 20).unwrap();
    assert_eq!(got.len(), 1 << 20);
    assert!(got[5..].iter().all(|&b| b == 0));
}

#[test]
fn scrubber_finds_corruption_in_an_idle_chunk_before_any_read() {
    let mut h = H::new();
    for c in 1..=3 {
        h.create(c);
        h.write(c, 0, &vec![c as u8; 100_000]);
    }
    h.disk.data.get_mut(&2).unwrap()[70_000] ^= 0x01;
    let scrub = h.cs.cfg.scrub_interval;
    let idle = h.cs.cfg.scrub_idle;
    // Recently written: not idle, so not scrubbed.
    h.now = h.now + scrub;
    h.run(Input::Tick);
    assert!(!h.cs.corrupt.contains(&2));
    // Idle now: one chunk per interval, in handle order.
    h.now = h.now + idle;
    let mut reported = false;
    for _ in 0..3 {
        h.now = h.now + scrub;
        h.calls.clear();
        h.run(Input::Tick);
        reported |= h.calls.iter().any(|c| matches!(&c.req, Outgoing::Master(pb::MasterRequest { req: Some(MReq::ReportCorrupt(r)), .. }) if r.handle == 2));
    }
    assert!(reported, "the scrubber did not report chunk 2");
    assert!(h.cs.corrupt.contains(&2));
    assert!(!h.cs.corrupt.contains(&1) && !h.cs.corrupt.contains(&3));
    assert!(matches!(
        h.req(R::Read(pb::ReadChunkRequest {
            capability: None,
            handle: 2,
            version: 1,
            offset: 0,
            length: 10,
        })),
        pb::ChunkResponse { error: Some(_), .. }
    ));
}

mod serial_order {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Write(u64, Vec<u8>),
        Append(Vec<u8>),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..300_000, 1usize..90_000, any::<u8>())
                .prop_map(|(o, n, b)| Op::Write(o, vec![b; n])),
            (1usize..150_000, any::<u8>()).prop_map(|(n, b)| Op::Append(vec![b; n])),
        ]
    }

    /// Runs `ops` on a primary with one secondary that acknowledges everything; returns
    /// the mutations the primary sent, in serial order.
    fn primary_run(p: &mut H, ops: &[Op]) -> Vec<pb::ApplyMutationRequest> {
        let mut sent = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let req = match op {
                Op::Write(o, d) => R::Write(pb::WriteChunkRequest {
                    capability: None,
                    secondary_capabilities: vec![],
                    handle: 1,
                    version: 1,
                    offset: *o,
                    data: Bytes::from(d.clone()),
                    secondaries: vec!["s".into()],
                    client_id: 1,
                    client_seq: i as u64,
                    data_id: 0,
                    write_seq: 0,
                }),
                Op::Append(d) => R::Append(pb::AppendChunkRequest {
                    capability: None,
                    secondary_capabilities: vec![],
                    handle: 1,
                    version: 1,
                    data: Bytes::from(d.clone()),
                    secondaries: vec!["s".into()],
                    data_id: 0,
                }),
            };
            p.run(Input::Request {
                id: 10_000 + i as u64,
                arrived: p.now,
                req: pb::ChunkRequest { req: Some(req) },
                from: crate::auth::Caller::Insecure,
            });
            for c in std::mem::take(&mut p.calls) {
                if let Outgoing::Chunk(pb::ChunkRequest {
                    req: Some(R::Apply(a)),
                }) = c.req
                {
                    sent.push(a);
                    p.run(Input::CallResult {
                        id: c.id,
                        result: Ok(Reply::Chunk(empty())),
                    });
                }
            }
        }
        sent
    }

    /// Delivers `deliver` to a fresh secondary, then lets any held mutation go; returns
    /// it and the serials it applied, ascending.
    fn replica(deliver: &[pb::ApplyMutationRequest]) -> (H, Vec<u64>) {
        let mut s = H::named("s");
        s.create(1);
        let mut serial_of = HashMap::new();
        let mut replies = Vec::new();
        for m in deliver {
            let id = s.next;
            s.next += 1;
            serial_of.insert(id, m.serial);
            replies.extend(s.run(Input::Request {
                id,
                arrived: s.now,
                req: pb::ChunkRequest {
                    req: Some(R::Apply(m.clone())),
                },
                from: crate::auth::Caller::Insecure,
            }));
        }
        s.now = s.now + s.cs.cfg.apply_hold;
        replies.extend(s.run(Input::Tick));
        let mut applied: Vec<u64> = replies
            .iter()
            .filter(|(_, r)| r.error.is_none())
            .filter_map(|(id, _)| serial_of.get(id).copied())
            .collect();
        assert_eq!(replies.len(), deliver.len(), "every mutation answered");
        applied.sort_unstable();
        (s, applied)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Mutations applied in serial order leave every replica identical to the
        /// primary, bytes and checksums; delivered in any order, with repeats, a replica
        /// applies an increasing run of serials and holds exactly what they make.
        #[test]
        fn replicas_applying_the_serial_order_are_identical(
            ops in proptest::collection::vec(op(), 1..12),
            shuffle in proptest::collection::vec(any::<u16>(), 0..24),
        ) {
            let mut p = H::named("p");
            p.create(1);
            let sent = primary_run(&mut p, &ops);
            prop_assert_eq!(sent.len(), ops.len());
            let (s, applied) = replica(&sent);
            prop_assert_eq!(applied.len(), sent.len());
            prop_assert_eq!(&s.disk.data[&1], &p.disk.data[&1]);
            prop_assert_eq!(&s.disk.meta[&1], &p.disk.meta[&1]);

            // Out of order, with repeats.
            let mut order: Vec<pb::ApplyMutationRequest> = sent.clone();
            for (i, k) in shuffle.iter().enumerate() {
                let j = *k as usize % sent.len();
                if i % 3 == 0 {
                    order.push(sent[j].clone());
                } else {
                    let a = i % order.len();
                    let b = j % order.len();
                    order.swap(a, b);
                }
            }
            let (s2, applied) = replica(&order);
            prop_assert!(applied.windows(2).all(|w| w[0] < w[1]), "a serial applied twice");
            let subset: Vec<pb::ApplyMutationRequest> = applied
                .iter()
                .map(|&n| sent[(n - 1) as usize].clone())
                .collect();
            let (s3, _) = replica(&subset);
            prop_assert_eq!(&s2.disk.data[&1], &s3.disk.data[&1]);
            prop_assert_eq!(&s2.disk.meta[&1], &s3.disk.meta[&1]);
            prop_assert_eq!(&s2.disk.meta[&1].checksums, &checksum::blocks(&s2.disk.data[&1]));
        }
    }
}

#[test]
fn an_overwrite_cut_short_by_a_crash_is_repaired_not_lost() {
    let mut h = H::new();
    h.create(1);
    h.write(1, 0, &vec![b'a'; 200_000]);
    assert!(
        h.disk.intents.is_empty(),
        "a write to fresh space needs no intent"
    );
    h.write(1, 150_000, &[b'c'; 100]);
    assert_eq!(
        h.disk.intents,
        vec![pb::WriteIntent {
            offset: 150_000,
            length: 100
        }]
    );
    // A crash in the middle of an overwrite of 1,000 bytes at 70,000: its intent is on
    // disk, and only the first 500 bytes made it.
    let mut meta = h.disk.meta[&1].clone();
    meta.writing = Some(pb::WriteIntent {
        offset: 70_000,
        length: 1_000,
    });
    h.disk.data.get_mut(&1).unwrap()[70_000..70_500].fill(b'b');
    let disk = std::mem::take(&mut h.disk);
    let mut h2 = H::new();
    h2.disk = disk;
    h2.cs = Chunkserver::recover(h.cs.cfg.clone(), Time(0), vec![meta.clone()]);
    let all = h2.read(1, 0, 300_000).expect("repaired, not corrupt");
    assert_eq!(all.len(), 200_000);
    assert!(
        all[..70_000].iter().all(|&b| b == b'a'),
        "earlier writes kept"
    );
    assert!(all[70_000..70_500].iter().all(|&b| b == b'b'));
    assert!(all[70_500..150_000].iter().all(|&b| b == b'a'));
    assert!(h2.disk.meta[&1].writing.is_none(), "the mark is cleared");
    assert_eq!(
        h2.disk.meta[&1].checksums,
        checksum::blocks(&h2.disk.data[&1])
    );
    // Without the intent the same crash would cost the whole copy.
    let mut h3 = H::new();
    h3.disk = std::mem::take(&mut h2.disk);
    h3.disk.data.get_mut(&1).unwrap()[70_000..70_500].fill(b'd');
    meta.writing = None;
    h3.cs = Chunkserver::recover(h.cs.cfg.clone(), Time(0), vec![meta]);
    assert!(matches!(h3.read(1, 65_536, 10), Err(FsError::Corrupt(_))));
}

fn push(
    h: &mut H,
    id: u64,
    off: u64,
    total: u64,
    piece: &[u8],
    chain: &[&str],
) -> Vec<(RequestId, pb::ChunkResponse)> {
    let rid = h.next;
    h.next += 1;
    h.run(Input::Request {
        id: rid,
        arrived: h.now,
        req: pb::ChunkRequest {
            req: Some(R::Push(pb::PushDataRequest {
                capabilities: vec![],
                handle: 0,
                data_id: id,
                offset: off,
                total,
                piece: Bytes::copy_from_slice(piece),
                chain: chain.iter().map(|s| s.to_string()).collect(),
            })),
        },
        from: crate::auth::Caller::Insecure,
    })
}

fn write_pushed(h: &mut H, off: u64, id: u64) -> pb::ChunkResponse {
    h.req(R::Write(pb::WriteChunkRequest {
        handle: 1,
        version: 1,
        offset: off,
        data_id: id,
        client_id: 1,
        client_seq: h.next,
        ..Default::default()
    }))
}

#[test]
fn pushed_data_is_forwarded_down_the_chain_and_used_once() {
    let mut h = H::new();
    h.create(1);
    // The first piece goes on to cs1 (and cs2 after it); the answer waits for cs1's.
    let r = push(&mut h, 7, 0, 6, b"abc", &["cs1", "cs2"]);
    assert!(
        r.is_empty(),
        "answered before the rest of the chain had the piece"
    );
    let fwd = h.calls.pop().unwrap();
    assert_eq!(fwd.to, Dest::Peer("cs1".into()));
    let Outgoing::Chunk(pb::ChunkRequest {
        req: Some(R::Push(p)),
    }) = &fwd.req
    else {
        panic!("{fwd:?}")
    };
    assert_eq!(
        (p.chain.clone(), p.offset, &p.piece[..]),
        (vec!["cs2".to_string()], 0, &b"abc"[..])
    );
    let r = h.run(Input::CallResult {
        id: fwd.id,
        result: Ok(Reply::Chunk(empty())),
    });
    assert!(r[0].1.error.is_none());
    // Only half the data has come: a write naming it is refused.
    assert!(matches!(
        write_pushed(&mut h, 0, 7)
            .error
            .map(|e| FsError::from_pb(&e)),
        Some(FsError::Unavailable(_))
    ));
    // That write used the buffer up; push it all again, the last server in the chain.
    push(&mut h, 8, 3, 6, b"def", &[]);
    push(&mut h, 8, 0, 6, b"abc", &[]);
    assert!(write_pushed(&mut h, 10, 8).error.is_none());
    assert_eq!(&h.read(1, 10, 6).unwrap()[..], b"abcdef");
    assert!(
        write_pushed(&mut h, 20, 8).error.is_some(),
        "data used twice"
    );
    assert_eq!(h.cs.pushed_bytes, 0);
}

#[test]
fn pushed_pieces_sent_again_or_overlapping_assemble_once() {
    let mut h = H::new();
    h.create(1);
    // A retry sends a piece again, a different split overlaps: the bytes come out once.
    push(&mut h, 5, 4, 10, b"efghij", &[]);
    push(&mut h, 5, 0, 10, b"abcd", &[]);
    push(&mut h, 5, 2, 10, b"cdef", &[]);
    push(&mut h, 5, 0, 10, b"abcd", &[]);
    assert!(write_pushed(&mut h, 0, 5).error.is_none());
    assert_eq!(&h.read(1, 0, 10).unwrap()[..], b"abcdefghij");
    // One piece is used as it came.
    push(&mut h, 6, 0, 3, b"xyz", &[]);
    assert!(write_pushed(&mut h, 10, 6).error.is_none());
    assert_eq!(&h.read(1, 0, 13).unwrap()[..], b"abcdefghijxyz");
    assert_eq!(h.cs.pushed_bytes, 0);
}

#[test]
fn overlapping_pieces_hold_no_more_than_the_data() {
    let mut h = H::new();
    h.create(1);
    // Every suffix of 1000 bytes, each a piece of its own: kept whole, they would hold
    // half a megabyte for 1000 counted bytes.
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    for off in (0..1000).rev() {
        push(&mut h, 9, off, 1000, &data[off as usize..], &[]);
    }
    let held: usize = h.cs.pushed[&9].pieces.values().map(|p| p.len()).sum();
    assert_eq!(held, 1000);
    assert_eq!(h.cs.pushed_bytes, 1000);
    assert!(write_pushed(&mut h, 0, 9).error.is_none());
    assert_eq!(&h.read(1, 0, 1000).unwrap()[..], &data[..]);
}

#[test]
fn pushed_data_is_bounded_in_size_and_time() {
    let mut h = H::new();
    h.cs.cfg.push_buffer_bytes = 250_000;
    h.create(1);
    let bad = push(&mut h, 1, 90, 100, &[0; 20], &[]);
    assert!(bad[0].1.error.is_some(), "a piece past the data's end");
    let bad = push(&mut h, 2, 0, (1 << 20) + 1, &[0; 20], &[]);
    assert!(bad[0].1.error.is_some(), "data larger than a chunk");
    push(&mut h, 3, 0, 100_000, &[1; 100_000], &[]);
    h.now = Time(5);
    push(&mut h, 4, 0, 100_000, &[2; 100_000], &[]);
    h.now = Time(6);
    // No room for a third: the oldest goes.
    push(&mut h, 5, 0, 100_000, &[3; 100_000], &[]);
    assert!(!h.cs.pushed.contains_key(&3) && h.cs.pushed.contains_key(&4));
    // Data nobody uses expires.
    h.now = h.now + h.cs.cfg.push_buffer_ttl;
    h.run(Input::Tick);
    assert!(h.cs.pushed.is_empty() && h.cs.pushed_bytes == 0);
}

#[test]
fn heartbeat_capacity_is_capped_by_the_disk_free_space() {
    let mut h = H::new();
    h.create(1);
    let capacity = |h: &mut H, free: Option<u64>| {
        h.run(Input::DiskSpace { free });
        h.calls.clear();
        h.run(Input::Tick);
        let c = h.calls.pop().expect("a heartbeat");
        let Outgoing::Master(pb::MasterRequest {
            req: Some(MReq::Heartbeat(hb)),
            ..
        }) = &c.req
        else {
            panic!("{:?}", c.req)
        };
        (hb.capacity_bytes, hb.used_bytes)
    };
    let quota = h.cs.config().capacity_bytes;
    assert_eq!(capacity(&mut h, None), (quota, 0));
    // A disk with room to spare: the configured capacity stands.
    assert_eq!(capacity(&mut h, Some(u64::MAX)), (quota, 0));
    // A nearly full disk: what the chunks use plus what is left.
    assert_eq!(capacity(&mut h, Some(5000)), (5000, 0));
}

// ---- cluster identity --------------------------------------------------------------------

const OURS: u64 = 0xA11CE;
const THEIRS: u64 = 0xB0B;

/// A server whose store holds its identity: server id 42, and `cluster` (0: none yet).
fn with_identity(cluster: u64) -> H {
    let mut h = H::new();
    let identity = pb::ChunkMeta {
        handle: IDENTITY_HANDLE,
        server_id: 42,
        cluster_id: cluster,
        ..Default::default()
    };
    h.disk.meta.insert(IDENTITY_HANDLE, identity.clone());
    h.cs = Chunkserver::recover(h.cs.cfg.clone(), Time(0), vec![identity]);
    h
}

impl H {
    /// Sends a heartbeat and feeds it `reply`; returns the heartbeat.
    fn heartbeat_with(&mut self, reply: pb::HeartbeatResponse) -> pb::HeartbeatRequest {
        self.run(Input::Tick);
        let at = self
            .calls
            .iter()
            .position(|c| {
                matches!(
                    c.req,
                    Outgoing::Master(pb::MasterRequest {
                        req: Some(MReq::Heartbeat(_)),
                        ..
                    })
                )
            })
            .expect("a heartbeat");
        let c = self.calls.remove(at);
        let Outgoing::Master(pb::MasterRequest {
            req: Some(MReq::Heartbeat(hb)),
            ..
        }) = c.req
        else {
            unreachable!()
        };
        let resp = pb::MasterResponse {
            shadow: None,
            error: None,
            resp: Some(pb::master_response::Resp::Heartbeat(reply)),
        };
        self.run(Input::CallResult {
            id: c.id,
            result: Ok(Reply::Master(resp)),
        });
        hb
    }

    fn set_version(&mut self, cluster_id: u64, h: u64, version: u64) -> pb::ChunkResponse {
        self.req(R::SetVersion(pb::SetVersionRequest {
            epoch: 0,
            handle: h,
            version,
            create: true,
            lease_ms: 60_000,
            chunk_size: CHUNK,
            cluster_id,
            ..Default::default()
        }))
    }
}

fn delete_order(cluster_id: u64, h: u64) -> pb::HeartbeatResponse {
    pb::HeartbeatResponse {
        epoch: 0,
        delete_chunks: vec![pb::ChunkVersion {
            handle: h,
            version: u64::MAX,
        }],
        lease_duration_ms: 1000,
        cluster_id,
        ..Default::default()
    }
}

/// The first master's reply gives the server its cluster, stored durably before any of
/// that master's orders is acted on; a restart keeps it, and heartbeats carry both ids.
#[test]
fn first_contact_stores_the_cluster_id_durably() {
    let mut h = with_identity(0);
    assert!(h.set_version(0, 1, 1).error.is_none());
    let hb = h.heartbeat_with(delete_order(OURS, 1));
    assert_eq!((hb.server_id, hb.cluster_id), (42, 0));
    assert_eq!(h.cs.cluster_id(), OURS);
    let stored = &h.disk.meta[&IDENTITY_HANDLE];
    assert_eq!((stored.server_id, stored.cluster_id), (42, OURS));
    assert_eq!(
        h.cs.chunks().count(),
        1,
        "acted on an order before the id was stored"
    );
    // Once it is stored, the server asks for the master's orders again at once.
    assert_eq!(
        sent_heartbeats(&mut h),
        vec![(OURS, 0)],
        "no heartbeat right after joining"
    );

    // A restart finds it, and does not take the identity record for a chunk.
    let metas: Vec<pb::ChunkMeta> = h.disk.meta.values().cloned().collect();
    h.cs = Chunkserver::recover(h.cs.cfg.clone(), Time(0), metas);
    assert_eq!((h.cs.server_id(), h.cs.cluster_id()), (42, OURS));
    assert_eq!(h.cs.chunks().map(|c| c.0).collect::<Vec<_>>(), vec![1]);
    let hb = h.heartbeat_with(delete_order(OURS, 1));
    assert_eq!((hb.server_id, hb.cluster_id), (42, OURS));
    assert!(hb.chunks.iter().all(|c| c.handle != IDENTITY_HANDLE));
    assert_eq!(
        h.cs.chunks().count(),
        0,
        "its own master's order is carried out"
    );
}

/// The heartbeats the server has sent and not had answered, as (cluster id, term);
/// taken out of the calls.
fn sent_heartbeats(h: &mut H) -> Vec<(u64, u64)> {
    let mut sent = Vec::new();
    h.calls.retain(|c| match &c.req {
        Outgoing::Master(pb::MasterRequest {
            req: Some(MReq::Heartbeat(hb)),
            ..
        }) => {
            sent.push((hb.cluster_id, hb.epoch));
            false
        }
        _ => true,
    });
    sent
}

fn versioned(epoch: u64, h: u64, version: u64) -> R {
    R::SetVersion(pb::SetVersionRequest {
        epoch,
        handle: h,
        version,
        create: true,
        lease_ms: 60_000,
        chunk_size: CHUNK,
        cluster_id: OURS,
        ..Default::default()
    })
}

fn code(r: &pb::ChunkResponse) -> Option<pb::ErrorCode> {
    r.error
        .as_ref()
        .map(|e| pb::ErrorCode::try_from(e.code).unwrap())
}

/// A newer master term is stored before anything of it is acted on; from then on a
/// deposed leader's orders (an older term) are refused or ignored and change nothing;
/// a restart keeps the term.
#[test]
fn a_deposed_master_leader_is_refused_and_changes_nothing() {
    let mut h = with_identity(OURS);
    // A leader of term 3: its first order waits until the term is stored.
    let r = h.req(versioned(3, 1, 1));
    assert_eq!(code(&r), Some(pb::ErrorCode::Unavailable), "{r:?}");
    assert_eq!(h.cs.chunks().count(), 0, "acted before the term was stored");
    assert_eq!(h.cs.master_epoch(), 3);
    assert_eq!(h.disk.meta[&IDENTITY_HANDLE].master_epoch, 3);
    assert_eq!(h.disk.meta[&IDENTITY_HANDLE].server_id, 42);
    // And says so at once: the new leader waits for it to grant or to fence.
    assert_eq!(
        sent_heartbeats(&mut h),
        vec![(OURS, 3)],
        "no heartbeat right after storing the term"
    );
    assert!(h.req(versioned(3, 1, 1)).error.is_none());
    assert!(h.write(1, 0, &[7u8; 1000]).error.is_none());
    let disk_before = (h.disk.meta.clone(), h.disk.data.clone());
    let lease = h.cs.leases().collect::<Vec<_>>();

    // The leader of term 2, deposed but still running.
    for r in [
        versioned(2, 1, 1_000_000),
        versioned(2, 9, 1),
        R::Clone(pb::CloneChunkRequest {
            epoch: 2,
            handle: 1,
            version: 1_000_000,
            source: "elsewhere".into(),
            cluster_id: OURS,
            source_capability: None,
        }),
        R::RevokeLease(pb::RevokeLeaseRequest {
            epoch: 2,
            handle: 1,
            cluster_id: OURS,
            version: 0,
        }),
    ] {
        let r = h.req(r);
        assert_eq!(code(&r), Some(pb::ErrorCode::NotLeader), "{r:?}");
    }
    let mut order = delete_order(OURS, 1);
    order.epoch = 2;
    order.extended_leases = vec![1];
    order.lease_duration_ms = 1_000_000;
    h.heartbeat_with(order);
    assert!(h.calls.is_empty(), "no clone read went out: {:?}", h.calls);
    assert_eq!((h.disk.meta.clone(), h.disk.data.clone()), disk_before);
    assert_eq!(h.cs.leases().collect::<Vec<_>>(), lease);

    // A heartbeat reply of a newer term: stored first, its orders taken from the next.
    let mut order = delete_order(OURS, 1);
    order.epoch = 5;
    h.heartbeat_with(order.clone());
    assert_eq!(h.cs.chunks().count(), 1, "acted before the term was stored");
    assert_eq!(h.disk.meta[&IDENTITY_HANDLE].master_epoch, 5);
    assert_eq!(sent_heartbeats(&mut h), vec![(OURS, 5)]);
    let metas: Vec<pb::ChunkMeta> = h.disk.meta.values().cloned().collect();
    h.cs = Chunkserver::recover(h.cs.cfg.clone(), Time(0), metas);
    assert_eq!(h.cs.master_epoch(), 5, "a restart keeps the term");
    let r = h.req(versioned(3, 1, 7));
    assert_eq!(code(&r), Some(pb::ErrorCode::NotLeader), "{r:?}");
    h.heartbeat_with(order);
    assert_eq!(
        h.cs.chunks().count(),
        0,
        "the current leader's order is carried out"
    );
}

/// Once joined, the server acts on nothing from a master of another cluster (nor one
/// without an id): not a heartbeat reply's deletes or lease extensions, not a new
/// version, not a clone, not a revoke. Nothing on its disk changes.
#[test]
fn a_master_of_another_cluster_is_refused_and_changes_nothing() {
    let mut h = with_identity(OURS);
    assert!(h.set_version(OURS, 1, 1).error.is_none());
    assert!(h.write(1, 0, &[7u8; 1000]).error.is_none());
    let disk_before = (h.disk.meta.clone(), h.disk.data.clone());
    let lease = h.cs.leases().collect::<Vec<_>>();
    assert_eq!(lease.len(), 1);

    for theirs in [THEIRS, 0] {
        let r = h.set_version(theirs, 1, 1_000_000);
        assert!(r.error.is_some(), "{r:?}");
        let r = h.set_version(theirs, 9, 1_000_000);
        assert!(r.error.is_some(), "{r:?}");
        let r = h.req(R::Clone(pb::CloneChunkRequest {
            epoch: 0,
            handle: 1,
            version: 1_000_000,
            source: "elsewhere".into(),
            cluster_id: theirs,
            source_capability: None,
        }));
        assert!(r.error.is_some(), "{r:?}");
        let r = h.req(R::RevokeLease(pb::RevokeLeaseRequest {
            epoch: 0,
            handle: 1,
            cluster_id: theirs,
            version: 0,
        }));
        assert!(r.error.is_some(), "{r:?}");
        let mut order = delete_order(theirs, 1);
        order.extended_leases = vec![1];
        order.lease_duration_ms = 1_000_000;
        h.heartbeat_with(order);
    }
    assert!(h.calls.is_empty(), "no clone read went out: {:?}", h.calls);
    assert_eq!((h.disk.meta.clone(), h.disk.data.clone()), disk_before);
    assert_eq!(h.cs.chunks().collect::<Vec<_>>(), vec![(1, 1, 1000)]);
    assert_eq!(h.cs.leases().collect::<Vec<_>>(), lease);
    assert_eq!(h.cs.cluster_id(), OURS);
    // Its own master is still obeyed.
    assert!(h.set_version(OURS, 1, 2).error.is_none());
    h.heartbeat_with(delete_order(OURS, 1));
    assert_eq!(h.cs.chunks().count(), 0);
}

/// A server that has joined no cluster yet takes orders from nobody with an id: the
/// id comes with a heartbeat reply, durably, first.
#[test]
fn a_server_with_no_cluster_yet_takes_no_orders_from_a_master_with_one() {
    let mut h = with_identity(0);
    assert!(h.set_version(OURS, 1, 1).error.is_some());
    assert_eq!(h.cs.chunks().count(), 0);
    assert!(!h.disk.meta.contains_key(&1));
}

/// The invariant check holds through ordinary work, and fails on state that breaks a
/// promise (so it can).
#[test]
fn invariants_hold_and_their_check_catches_a_broken_promise() {
    let mut h = H::new();
    h.create(1);
    assert!(h.write(1, 0, &[7u8; 5000]).error.is_none());
    h.cs.check_invariants().expect("after a write");
    h.cs.pushed_bytes += 1;
    let e =
        h.cs.check_invariants()
            .expect_err("miscounted pushed bytes");
    assert!(e.contains("pushed"), "{e}");
    h.cs.pushed_bytes -= 1;
    h.cs.queued_requests += 1;
    let e =
        h.cs.check_invariants()
            .expect_err("miscounted queued requests");
    assert!(e.contains("queued"), "{e}");
}

/// A version order on its way to a stuck disk: the heartbeats meanwhile name the chunk as
/// changing (the master must not take its absence for good), and once the write lands
/// they report the copy instead.
#[test]
fn heartbeats_name_chunks_whose_versions_are_on_the_way_to_disk() {
    let mut h = H::new();
    let e = h.cs.handle(
        h.now,
        Input::Request {
            id: 1,
            arrived: h.now,
            req: pb::ChunkRequest {
                req: Some(R::SetVersion(pb::SetVersionRequest {
                    epoch: 0,
                    handle: 7,
                    version: 1,
                    create: true,
                    ..Default::default()
                })),
            },
            from: crate::auth::Caller::Insecure,
        },
    );
    assert_eq!(e.store.len(), 1, "the version goes to the disk");
    let stuck = e.store.into_iter().next().expect("one");
    let hb = h.heartbeat_with(pb::HeartbeatResponse::default());
    assert!(
        hb.chunks.iter().all(|c| c.handle != 7),
        "held before durable"
    );
    assert_eq!(hb.changing, vec![7], "the chunk on its way was not named");
    // The disk answers at last.
    let result = h.disk.exec(stuck.1);
    let replies = h.run(Input::StoreDone {
        id: stuck.0,
        result,
    });
    assert!(replies.iter().any(|(id, r)| *id == 1 && r.error.is_none()));
    let hb = h.heartbeat_with(pb::HeartbeatResponse::default());
    assert!(hb.chunks.iter().any(|c| c.handle == 7 && c.version == 1));
    assert!(hb.changing.is_empty(), "{:?}", hb.changing);
}

/// The network delivers a grant twice, the second copy well after the first: the lease
/// still runs from the first. A lease restarted by the copy would outlive the master's
/// view of it, and the master would grant the next lease while this one still holds.
#[test]
fn a_grant_delivered_twice_does_not_restart_its_lease() {
    let mut h = H::new();
    let grant = pb::SetVersionRequest {
        epoch: 0,
        handle: 4,
        version: 1,
        create: true,
        lease_ms: 2_000,
        valid_ms: 2_000,
        chunk_size: CHUNK,
        ..Default::default()
    };
    h.now = Time(100);
    assert!(h.req(R::SetVersion(grant.clone())).error.is_none());
    assert!(h.cs.is_primary(4, Time(2_099)));
    h.now = Time(1_600);
    let again = h.req(R::SetVersion(grant));
    assert!(again.error.is_none(), "{again:?}");
    assert!(
        !h.cs.is_primary(4, Time(2_100)),
        "the second copy restarted the lease"
    );
}

/// A primary whose chunk moves on to a newer version as a secondary holds no lease any
/// more: the master granted the new one elsewhere.
#[test]
fn a_new_version_ends_the_old_lease() {
    let mut h = H::new();
    h.now = Time(100);
    let r = h.req(R::SetVersion(pb::SetVersionRequest {
        epoch: 0,
        handle: 4,
        version: 1,
        create: true,
        lease_ms: 5_000,
        chunk_size: CHUNK,
        ..Default::default()
    }));
    assert!(r.error.is_none());
    h.now = Time(1_000);
    let r = h.req(R::SetVersion(pb::SetVersionRequest {
        epoch: 0,
        handle: 4,
        version: 2,
        ..Default::default()
    }));
    assert!(r.error.is_none());
    assert!(
        !h.cs.is_primary(4, Time(1_001)),
        "still primary of an older version"
    );
}

/// A mutation sent under the lease whose secondaries answer only after it ended is not
/// acknowledged: once the lease is over the master may copy a secondary's replica, which
/// may have taken the mutation after the copy was read.
#[test]
fn a_mutation_the_secondaries_finish_after_the_lease_is_not_acknowledged() {
    let mut h = H::new();
    h.create(1); // a lease of 60 s from Time(1)
    assert!(h.run(write_to(&["cs1"], 1)).is_empty());
    let forwards = std::mem::take(&mut h.calls);
    assert_eq!(forwards.len(), 1);
    h.now = Time(1) + Duration::from_millis(60_000);
    let r = h.run(Input::CallResult {
        id: forwards[0].id,
        result: applied(),
    });
    assert_eq!(r.len(), 1, "{r:?}");
    let e = r[0].1.error.as_ref().expect("acknowledged after the lease");
    assert_eq!(e.code(), pb::ErrorCode::Unavailable, "{e:?}");
}

/// A mutation out to a secondary when the chunk moves on to a new version, this server
/// primary again: the late answer neither acknowledges the old mutation (it was not
/// applied everywhere within its lease; a copy may have been made meanwhile) nor counts
/// for the new version's mutation of the same serial.
#[test]
fn answers_from_an_older_version_count_for_nothing() {
    let mut h = H::new();
    h.create(1);
    assert!(h.run(write_to(&["cs1"], 1)).is_empty());
    let old = std::mem::take(&mut h.calls);
    assert_eq!(old.len(), 1);
    // The master grants version 2, to this server again.
    let r = h.req(R::SetVersion(pb::SetVersionRequest {
        epoch: 0,
        handle: 1,
        version: 2,
        lease_ms: 60_000,
        chunk_size: CHUNK,
        ..Default::default()
    }));
    assert!(r.error.is_none(), "{r:?}");
    let new = Input::Request {
        id: 950,
        arrived: h.now,
        req: pb::ChunkRequest {
            req: Some(R::Write(pb::WriteChunkRequest {
                capability: None,
                secondary_capabilities: vec![],
                handle: 1,
                version: 2,
                offset: 0,
                data: Bytes::from_static(b"new"),
                secondaries: vec!["cs2".into()],
                client_id: 1,
                client_seq: 2,
                data_id: 0,
                write_seq: 0,
            })),
        },
        from: crate::auth::Caller::Insecure,
    };
    assert!(h.run(new).is_empty());
    // The old mutation's secondary answers at last.
    let r = h.run(Input::CallResult {
        id: old[0].id,
        result: applied(),
    });
    assert!(
        r.iter().all(|(id, _)| *id != 950),
        "the new mutation was answered on the old one's secondary's word: {r:?}"
    );
    let old_reply = r
        .iter()
        .find(|(id, _)| *id == 901)
        .expect("the old write answered");
    assert!(
        old_reply.1.error.is_some(),
        "the old mutation was acknowledged under the new lease: {r:?}"
    );
}

/// Runs a mend of chunk `h` at `version` on `dst`, answering its reads from `sources`
/// (by address); returns the mend's answer and how many blocks it asked for.
fn mend(dst: &mut H, sources: &mut [&mut H], h: u64, version: u64) -> (pb::ChunkResponse, usize) {
    let id = 7000;
    dst.calls.clear();
    let mut replies = dst.run(Input::Request {
        id,
        arrived: dst.now,
        req: pb::ChunkRequest {
            req: Some(R::Mend(pb::MendChunkRequest {
                handle: h,
                version,
                sources: sources
                    .iter()
                    .map(|s| pb::MendSource {
                        address: s.cs.cfg.address.clone(),
                        version: 1,
                        capability: None,
                    })
                    .collect(),
                ..Default::default()
            })),
        },
        from: crate::auth::Caller::Insecure,
    });
    let mut asked = 0;
    while replies.is_empty() {
        let c = dst.calls.pop().expect("a read of a source");
        let (
            Dest::Peer(to),
            Outgoing::Chunk(pb::ChunkRequest {
                req: Some(R::Read(r)),
            }),
        ) = (c.to, c.req)
        else {
            panic!("a mend asks sources for blocks")
        };
        asked += 1;
        let src = sources
            .iter_mut()
            .find(|s| s.cs.cfg.address == to)
            .expect("a source");
        let resp = src.req(R::Read(r));
        replies = dst.run(Input::CallResult {
            id: c.id,
            result: Ok(Reply::Chunk(resp)),
        });
    }
    assert_eq!(replies[0].0, id);
    (replies.remove(0).1, asked)
}

/// The last copy of version 2 rotted in two blocks that version 1's copy also holds,
/// one of them shared with bytes written at version 2: both are rebuilt (source bytes
/// where the source has them, the copy's own past them), checked against the copy's own
/// checksums, and the copy is served again, whole.
#[test]
fn the_last_copy_of_a_version_is_mended_from_an_older_copy() {
    let old_bytes: Vec<u8> = (0..100_000u32).map(|i| (i * 13) as u8).collect();
    let new_bytes: Vec<u8> = (0..60_000u32).map(|i| (i * 7 + 1) as u8).collect();
    let mut old = H::named("cs1");
    old.create(9);
    old.write(9, 0, &old_bytes);
    let mut other = H::named("cs2");
    other.create(9);
    other.write(9, 0, &vec![0u8; 1000]); // a copy that matches nothing
    let mut last = H::uncached();
    last.create(9);
    last.write(9, 0, &old_bytes);
    assert!(last.set_version(0, 9, 2).error.is_none());
    let w = last.req(R::Write(pb::WriteChunkRequest {
        handle: 9,
        version: 2,
        offset: 100_000,
        data: Bytes::copy_from_slice(&new_bytes),
        ..Default::default()
    }));
    assert!(w.error.is_none(), "{w:?}");
    let whole = [&old_bytes[..], &new_bytes[..]].concat();
    let d = last.disk.data.get_mut(&9).unwrap();
    d[1000] ^= 0x08;
    d[70_000] ^= 0x80;
    assert!(matches!(last.read(9, 0, 10), Err(FsError::Corrupt(_))));
    let (r, asked) = mend(&mut last, &mut [&mut other, &mut old], 9, 2);
    assert!(r.error.is_none(), "{r:?}");
    // Each bad block asked of the useless copy first, then of the good one.
    assert_eq!(asked, 4);
    assert_eq!(last.disk.data[&9], whole);
    assert_eq!(&last.read(9, 0, 200_000).unwrap()[..], &whole[..]);
    // Reported at its version again, not as corrupt.
    let hb = last.heartbeat_with(pb::HeartbeatResponse::default());
    assert!(
        hb.chunks.iter().any(|c| c.handle == 9 && c.version == 2),
        "{hb:?}"
    );
}

/// Rot in bytes only the last copy ever held cannot be rebuilt: the mend fails, saying
/// which block, and the copy stays corrupt (never served).
#[test]
fn a_block_no_other_copy_matches_is_not_mended() {
    let old_bytes = vec![3u8; 100_000];
    let mut old = H::named("cs1");
    old.create(9);
    old.write(9, 0, &old_bytes);
    let mut last = H::uncached();
    last.create(9);
    last.write(9, 0, &old_bytes);
    assert!(last.set_version(0, 9, 2).error.is_none());
    let w = last.req(R::Write(pb::WriteChunkRequest {
        handle: 9,
        version: 2,
        offset: 100_000,
        data: Bytes::from(vec![4u8; 60_000]),
        ..Default::default()
    }));
    assert!(w.error.is_none(), "{w:?}");
    last.disk.data.get_mut(&9).unwrap()[150_000] ^= 1;
    assert!(matches!(
        last.read(9, 140_000, 10),
        Err(FsError::Corrupt(_))
    ));
    let (r, _) = mend(&mut last, &mut [&mut old], 9, 2);
    let e = FsError::from_pb(r.error.as_ref().expect("the mend fails"));
    assert!(
        matches!(&e, FsError::Corrupt(m) if m.contains("block 2 matches no other copy")),
        "{e:?}"
    );
    assert!(matches!(last.read(9, 0, 10), Err(FsError::Corrupt(_))));
    // A mend of a copy this server does not hold corrupt is refused.
    let (r, asked) = mend(&mut old, &mut [], 5, 1);
    assert!(r.error.is_some() && asked == 0, "{r:?}");
}

/// An order to mend a copy this server still serves (read back after a restart, its rot
/// not yet found) verifies it: a whole copy is left as it is; a rotten one is taken out
/// of service, reported, and mended.
#[test]
fn a_served_copy_ordered_mended_is_verified_first() {
    let bytes: Vec<u8> = (0..100_000u32).map(|i| (i * 5) as u8).collect();
    let mut old = H::named("cs1");
    old.create(9);
    old.write(9, 0, &bytes);
    let mut last = H::uncached();
    last.create(9);
    last.write(9, 0, &bytes);
    let (r, asked) = mend(&mut last, &mut [&mut old], 9, 1);
    assert!(r.error.is_none() && asked == 0, "{r:?}");
    assert_eq!(&last.read(9, 0, 100_000).unwrap()[..], &bytes[..]);
    last.disk.data.get_mut(&9).unwrap()[5] ^= 2;
    last.calls.clear();
    let (r, asked) = mend(&mut last, &mut [&mut old], 9, 1);
    assert!(r.error.is_none() && asked == 1, "{r:?}");
    assert_eq!(last.disk.data[&9], bytes);
    assert_eq!(&last.read(9, 0, 100_000).unwrap()[..], &bytes[..]);
    // A mend of another version than the copy's is refused.
    let (r, asked) = mend(&mut last, &mut [&mut old], 9, 3);
    assert!(r.error.is_some() && asked == 0, "{r:?}");
}

// ---- capacity ------------------------------------------------------------------------

/// `--capacity` is a quota the server keeps (`space.rs`): a write, a secondary's apply
/// and a clone that would grow its chunks past it are refused `NoSpace`, with nothing
/// written or forwarded; an overwrite within a chunk, and growth up to the quota
/// exactly, still go; a deleted chunk makes room again; heartbeats report the count.
#[test]
fn the_capacity_is_a_quota_the_server_keeps() {
    let mut h = H::with(ChunkserverConfig {
        address: "cs0".into(),
        capacity_bytes: 1000,
        ..Default::default()
    });
    let no_space = |r: &pb::ChunkResponse| {
        let e = r.error.as_ref().map(FsError::from_pb);
        assert!(
            matches!(&e, Some(FsError::NoSpace(m)) if m.contains("capacity of 1000")),
            "{r:?}"
        );
    };
    h.create(1);
    h.create(2);
    assert!(h.write(1, 0, &[1; 600]).error.is_none());
    no_space(&h.write(2, 0, &[2; 500]));
    assert!(
        h.disk.data[&2].is_empty(),
        "a refused write reached the disk"
    );
    // Overwriting bytes the chunk has grows nothing.
    assert!(h.write(1, 100, &[3; 500]).error.is_none());
    assert!(h.write(2, 0, &[2; 400]).error.is_none(), "up to the quota");
    assert_eq!(h.cs.used_bytes(), 1000);
    // As primary, refused before anything is forwarded.
    let r = h.run(Input::Request {
        id: 900,
        arrived: h.now,
        req: pb::ChunkRequest {
            req: Some(R::Write(pb::WriteChunkRequest {
                capability: None,
                secondary_capabilities: vec![],
                handle: 1,
                version: 1,
                offset: 600,
                data: Bytes::from_static(b"x"),
                secondaries: vec!["cs1".into()],
                client_id: 1,
                client_seq: 1,
                data_id: 0,
                write_seq: 0,
            })),
        },
        from: crate::auth::Caller::Insecure,
    });
    no_space(&r[0].1);
    assert!(h.calls.is_empty(), "forwarded: {:?}", h.calls);
    // As secondary, refused in its turn: the primary's next mutation is not held for it.
    // (Chunk 1 took mutations 1 and 2 as primary.)
    no_space(&send_apply(&mut h, 3, 600, b"y")[0].1);
    let r = send_apply(&mut h, 4, 0, b"z");
    assert!(r[0].1.error.is_none(), "{r:?}");
    // A clone past the quota is refused once its bytes are in, and stores nothing.
    let mut src = H::new();
    src.create(5);
    src.write(5, 0, &[5; 300]);
    let replies = order_clone(&mut h, 5);
    let (replies, _) = serve_clone(&mut h, &mut src, replies);
    no_space(&replies[0].1);
    assert!(!h.disk.data.contains_key(&5));
    h.cs.check_invariants().unwrap();
    // Heartbeats report the count; the master's order to delete chunk 1 makes room.
    h.calls.clear();
    h.run(Input::Tick);
    let c = h.calls.pop().expect("a heartbeat");
    let Outgoing::Master(pb::MasterRequest {
        req: Some(MReq::Heartbeat(hb)),
        ..
    }) = &c.req
    else {
        panic!("{:?}", c.req)
    };
    assert_eq!((hb.used_bytes, hb.capacity_bytes), (1000, 1000));
    h.run(Input::CallResult {
        id: c.id,
        result: Ok(Reply::Master(pb::MasterResponse {
            resp: Some(pb::master_response::Resp::Heartbeat(delete_order(0, 1))),
            ..Default::default()
        })),
    });
    assert_eq!(h.cs.used_bytes(), 400);
    assert!(h.write(2, 400, &[2; 600]).error.is_none(), "room made");
    h.cs.check_invariants().unwrap();
    // A restart counts what the store holds.
    let metas: Vec<pb::ChunkMeta> = h.disk.meta.values().cloned().collect();
    let cs = Chunkserver::recover(h.cs.config().clone(), h.now, metas);
    assert_eq!(cs.used_bytes(), 1000);
    cs.check_invariants().unwrap();
}

/// A record is refused past the quota, but padding is not: the client must be able to
/// move on to a new chunk, which the master may place on a server with room. A
/// secondary lets padding through as well.
#[test]
fn padding_passes_the_quota_and_a_record_does_not() {
    let mut h = H::with(ChunkserverConfig {
        address: "cs0".into(),
        capacity_bytes: CHUNK - 5,
        ..Default::default()
    });
    h.create(1);
    let rec = vec![7u8; 200_000];
    for _ in 0..4 {
        append(&mut h, &rec).unwrap();
    }
    // 248,571 bytes of quota and 248,576 of chunk left: a record that fits the chunk
    // but not the quota is refused.
    let e = append(&mut h, &vec![8u8; 248_574]).unwrap_err();
    assert!(matches!(e, FsError::NoSpace(_)), "{e:?}");
    // One the chunk has no room for pads it to its full size, past the quota.
    let a = append(&mut h, &vec![9u8; (CHUNK / 4) as usize]).unwrap();
    assert!(a.chunk_full);
    assert_eq!(h.cs.used_bytes(), CHUNK);
    h.cs.check_invariants().unwrap();
    // A secondary takes the primary's padding too.
    let mut s = H::with(ChunkserverConfig {
        address: "cs1".into(),
        capacity_bytes: 10,
        ..Default::default()
    });
    s.create(1);
    let r = send_apply(&mut s, 1, CHUNK, b"");
    assert!(r[0].1.error.is_none(), "{r:?}");
    assert_eq!(s.cs.used_bytes(), CHUNK);
}

/// A client's certificate, and another chunkserver's, do not make a master: every order
/// (a version change, a clone, a revocation, a mend) is refused from them without
/// touching the chunk, and so is a forwarded mutation from anyone but a chunkserver.
#[test]
fn orders_and_forwarded_mutations_are_refused_from_the_wrong_role() {
    use crate::auth::Caller;
    let mut h = H::new();
    h.create(9);
    let client = Caller::Client {
        user: "mallory".into(),
        groups: vec![],
    };
    let peer = Caller::Chunkserver { name: "cs2".into() };
    let orders = [
        R::SetVersion(pb::SetVersionRequest {
            handle: 9,
            version: 1_000_000_000,
            chunk_size: CHUNK,
            ..Default::default()
        }),
        R::SetVersion(pb::SetVersionRequest {
            handle: 9,
            version: 2,
            epoch: u64::MAX,
            chunk_size: CHUNK,
            ..Default::default()
        }),
        R::RevokeLease(pb::RevokeLeaseRequest {
            handle: 9,
            ..Default::default()
        }),
        R::Clone(pb::CloneChunkRequest {
            handle: 9,
            version: 2,
            source: "elsewhere:1".into(),
            ..Default::default()
        }),
        R::Mend(pb::MendChunkRequest {
            handle: 9,
            ..Default::default()
        }),
    ];
    for from in [&client, &peer] {
        for o in &orders {
            let r = h.req_from(o.clone(), from.clone());
            let e = r.error.expect("refused");
            assert_eq!(
                e.code,
                pb::ErrorCode::PermissionDenied as i32,
                "{o:?}: {e:?}"
            );
        }
    }
    let apply = R::Apply(pb::ApplyMutationRequest {
        handle: 9,
        version: 1,
        serial: 4000,
        offset: 0,
        data: Bytes::from_static(b"forged"),
        ..Default::default()
    });
    let r = h.req_from(apply.clone(), client.clone());
    assert_eq!(
        r.error.unwrap().code,
        pb::ErrorCode::PermissionDenied as i32
    );
    assert_eq!(h.cs.refused(), 2 * orders.len() as u64 + 1);
    // Nothing changed: the copy is at version 1, still the primary's, still empty, and
    // the epoch is the one it had.
    assert!(h.cs.is_primary(9, h.now));
    assert_eq!(h.cs.epoch(), 0);
    assert_eq!(h.read(9, 0, 6).unwrap().len(), 0);
    // The same orders from a master are carried out.
    let r = h.req_from(
        R::RevokeLease(pb::RevokeLeaseRequest {
            handle: 9,
            ..Default::default()
        }),
        Caller::Master { replica: 1 },
    );
    assert!(r.error.is_none(), "{r:?}");
    assert!(!h.cs.is_primary(9, h.now));
}

/// Gives `h` a capability key signed from `secret`, as a master's heartbeat reply does,
/// and returns what the master knows of the server's keys after its next heartbeat.
fn give_a_key(h: &mut H, secret: &[u8]) -> crate::capability::ServerKeys {
    use crate::capability::ServerKeys;
    let (call, hb) = next_heartbeat(h);
    assert!(hb.capability_keys.is_empty());
    let mut keys = ServerKeys::from_heartbeat(h.now, &hb);
    let key = keys.next_key(secret, h.now).expect("a first key");
    h.run(Input::CallResult {
        id: call,
        result: Ok(Reply::Master(pb::MasterResponse {
            resp: Some(pb::master_response::Resp::Heartbeat(
                pb::HeartbeatResponse {
                    lease_duration_ms: 60_000,
                    capability_key: Some(key),
                    ..Default::default()
                },
            )),
            ..Default::default()
        })),
    });
    let (_, hb) = next_heartbeat(h);
    assert_eq!(hb.capability_keys.len(), 1, "the key taken is reported");
    ServerKeys::from_heartbeat(h.now, &hb)
}

/// A grant goes to the primary and two secondaries, and one secondary never takes it: the
/// master's capability for the primary names the one that did. A write naming exactly
/// that one goes through; one that leaves it out (the primary alone: the secondary would
/// miss an acknowledged write at its current version), adds the one that did not take the
/// version, or names a server outside the grant is refused, and nothing is forwarded.
#[test]
fn a_write_names_exactly_the_secondaries_its_capability_does() {
    use crate::auth::Caller;
    use crate::capability::{APPEND, WRITE, Want};
    let mut h = H::new();
    let r = h.req(R::SetVersion(pb::SetVersionRequest {
        handle: 9,
        version: 1,
        create: true,
        lease_ms: 60_000,
        chunk_size: CHUNK,
        secondaries: vec!["cs1".into(), "cs2".into()],
        names_secondaries: true,
        ..Default::default()
    }));
    assert!(r.error.is_none(), "{r:?}");
    let secret = [4u8; 32];
    let keys = give_a_key(&mut h, &secret);
    let alice = Caller::Client {
        user: "alice".into(),
        groups: vec![],
    };
    let cap = |ops: u32| {
        keys.issue_to_primary(
            &secret,
            h.now,
            std::time::Duration::from_secs(30),
            Want {
                handle: 9,
                version: 1,
                ops,
            },
            &alice,
            vec!["cs1".into()],
        )
    };
    let (write_cap, append_cap) = (cap(WRITE), cap(APPEND));
    let write = |named: &[&str], seq: u64| {
        R::Write(pb::WriteChunkRequest {
            handle: 9,
            version: 1,
            offset: 0,
            data: Bytes::from_static(b"alice"),
            client_id: 1,
            client_seq: seq,
            secondaries: named.iter().map(|s| s.to_string()).collect(),
            capability: Some(write_cap.clone()),
            ..Default::default()
        })
    };
    let append = |named: &[&str]| {
        R::Append(pb::AppendChunkRequest {
            handle: 9,
            version: 1,
            data: Bytes::from_static(b"rec"),
            secondaries: named.iter().map(|s| s.to_string()).collect(),
            capability: Some(append_cap.clone()),
            ..Default::default()
        })
    };
    let refused = [
        (write(&[], 1), pb::ErrorCode::PermissionDenied),
        (write(&["cs1", "cs2"], 2), pb::ErrorCode::PermissionDenied),
        (write(&["cs2"], 3), pb::ErrorCode::PermissionDenied),
        (write(&["cs1", "cs9"], 4), pb::ErrorCode::PermissionDenied),
        (append(&[]), pb::ErrorCode::PermissionDenied),
        (append(&["cs2", "cs1"]), pb::ErrorCode::PermissionDenied),
    ];
    for (r, code) in &refused {
        let e = h.req_from(r.clone(), alice.clone()).error.expect("refused");
        assert_eq!(e.code, *code as i32, "{r:?}: {e:?}");
        assert!(e.message.contains("names secondaries"), "{e:?}");
    }
    assert!(h.calls.is_empty(), "nothing forwarded: {:?}", h.calls);
    assert_eq!(h.read(9, 0, 8).unwrap().len(), 0, "nothing was written");
    // The one that took the version gets the write.
    let id = h.next;
    h.next += 1;
    let replies = h.run(Input::Request {
        id,
        arrived: h.now,
        req: pb::ChunkRequest {
            req: Some(write(&["cs1"], 5)),
        },
        from: alice.clone(),
    });
    assert!(replies.is_empty(), "waits for cs1: {replies:?}");
    assert_eq!(h.calls.len(), 1, "forwarded to cs1 alone: {:?}", h.calls);
}

/// A capability check on every path a client's bytes take (`crate::capability`): the
/// key arrives in a heartbeat reply and is reported in the next heartbeat; a read, a
/// write, an append, a pushed piece and a forwarded mutation each go through under the
/// capability the master signs for their sender, and are refused without one, under an
/// expired one, another's, or one for other operations, changing nothing; and so does
/// a chunkserver's read of another's copy (a clone's, a mend's).
#[test]
fn reads_writes_pushes_and_mutations_need_a_capability_for_their_sender() {
    use crate::auth::Caller;
    use crate::capability::{APPEND, READ, WRITE, Want};
    let mut h = H::new();
    h.create(9);
    let secret = [4u8; 32];
    let keys = give_a_key(&mut h, &secret);
    let alice = Caller::Client {
        user: "alice".into(),
        groups: vec![],
    };
    let peer = Caller::Chunkserver { name: "cs2".into() };
    let life = std::time::Duration::from_secs(30);
    let t = h.now;
    let cap = |ops: u32, who: &Caller| {
        Some(keys.issue(
            &secret,
            t,
            life,
            Want {
                handle: 9,
                version: 1,
                ops,
            },
            who,
        ))
    };
    let (read_cap, write_cap, append_cap) =
        (cap(READ, &alice), cap(WRITE, &alice), cap(APPEND, &alice));
    let write = |c: Option<pb::Capability>, seq: u64| {
        R::Write(pb::WriteChunkRequest {
            handle: 9,
            version: 1,
            offset: 0,
            data: Bytes::from_static(b"alice"),
            client_id: 1,
            client_seq: seq,
            capability: c,
            ..Default::default()
        })
    };
    let read = |c: Option<pb::Capability>| {
        R::Read(pb::ReadChunkRequest {
            handle: 9,
            version: 1,
            offset: 0,
            length: 5,
            capability: c,
        })
    };
    let push = |c: Option<pb::Capability>| {
        R::Push(pb::PushDataRequest {
            data_id: 5,
            offset: 0,
            total: 3,
            piece: Bytes::from_static(b"abc"),
            handle: 9,
            capabilities: c.into_iter().collect(),
            ..Default::default()
        })
    };
    let apply = |c: Option<pb::Capability>| {
        R::Apply(pb::ApplyMutationRequest {
            handle: 9,
            version: 1,
            serial: 1,
            offset: 0,
            data: Bytes::from_static(b"mallory"),
            capability: c,
            ..Default::default()
        })
    };
    let bob = Caller::Client {
        user: "bob".into(),
        groups: vec![],
    };
    let refused = [
        (write(None, 1), alice.clone()),
        (write(read_cap.clone(), 1), alice.clone()),
        (write(write_cap.clone(), 1), bob.clone()),
        (read(None), alice.clone()),
        (read(write_cap.clone()), alice.clone()),
        (read(read_cap.clone()), bob.clone()),
        (push(None), alice.clone()),
        (push(read_cap.clone()), alice.clone()),
        (apply(None), peer.clone()),
        (apply(read_cap.clone()), peer.clone()),
        (
            R::Append(pb::AppendChunkRequest {
                handle: 9,
                version: 1,
                data: Bytes::from_static(b"rec"),
                capability: write_cap.clone(),
                ..Default::default()
            }),
            alice.clone(),
        ),
    ];
    for (r, from) in &refused {
        let e = h.req_from(r.clone(), from.clone()).error.expect("refused");
        assert_eq!(
            e.code,
            pb::ErrorCode::PermissionDenied as i32,
            "{r:?}: {e:?}"
        );
    }
    assert_eq!(h.cs.refused(), refused.len() as u64);
    assert_eq!(h.read(9, 0, 8).unwrap().len(), 0, "nothing was written");
    // Under their own capabilities they go through.
    let r = h.req_from(push(write_cap.clone()), alice.clone());
    assert!(r.error.is_none(), "{r:?}");
    // Another writer can neither add to alice's pushed data nor write with it.
    let bob_cap = cap(WRITE, &bob);
    let e = h
        .req_from(push(bob_cap.clone()), bob.clone())
        .error
        .expect("refused");
    assert!(e.message.contains("belongs to another writer"), "{e:?}");
    let with_pushed = |c: Option<pb::Capability>, seq: u64| {
        R::Write(pb::WriteChunkRequest {
            handle: 9,
            version: 1,
            offset: 0,
            client_id: 1,
            client_seq: seq,
            data_id: 5,
            capability: c,
            ..Default::default()
        })
    };
    let e = h
        .req_from(with_pushed(bob_cap, 2), bob.clone())
        .error
        .expect("refused");
    assert!(e.message.contains("belongs to another writer"), "{e:?}");
    let r = h.req_from(with_pushed(write_cap.clone(), 3), alice.clone());
    assert!(r.error.is_none(), "{r:?}");
    assert_eq!(&h.read(9, 0, 3).unwrap()[..], b"abc");
    let r = h.req_from(write(write_cap.clone(), 4), alice.clone());
    assert!(r.error.is_none(), "{r:?}");
    let r = h.req_from(read(read_cap.clone()), alice.clone());
    assert_eq!(r.error, None);
    let r = h.req_from(
        R::Append(pb::AppendChunkRequest {
            handle: 9,
            version: 1,
            data: Bytes::from_static(b"rec"),
            capability: append_cap,
            ..Default::default()
        }),
        alice.clone(),
    );
    assert!(r.error.is_none(), "{r:?}");
    // A chunkserver reading for a clone or a mend needs the master's leave as well,
    // one to read: with it, it reads.
    for c in [None, cap(WRITE, &peer), cap(READ, &alice)] {
        let e = h.req_from(read(c), peer.clone()).error.expect("refused");
        assert_eq!(e.code, pb::ErrorCode::PermissionDenied as i32, "{e:?}");
    }
    let r = h.req_from(read(cap(READ, &peer)), peer.clone());
    assert!(r.error.is_none(), "{r:?}");
    // Past its life, a capability is refused.
    h.now = h.now + life + std::time::Duration::from_millis(1);
    let e = h
        .req_from(read(read_cap), alice.clone())
        .error
        .expect("expired");
    assert!(e.message.contains("expired"), "{e:?}");
}
