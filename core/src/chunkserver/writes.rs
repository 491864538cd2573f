//! Writes and record appends: the primary orders mutations and forwards them to the
//! secondaries; each replica applies a mutation only when its data is durable.

use super::push::owner_of;
use super::*;

impl Chunkserver {
    pub(super) fn start_write(
        &mut self,
        id: RequestId,
        r: pb::WriteChunkRequest,
    ) -> Result<Option<pb::ChunkResponse>, FsError> {
        let h = r.handle;
        self.usable(h, r.version, true)?;
        if !self.is_primary(h, self.now) {
            return Err(FsError::Unavailable(format!(
                "{} holds no lease on chunk {h}",
                self.cfg.address
            )));
        }
        // Before the pushed data is taken: a copy of an attempt finds it gone (the first
        // copy took it), and a late attempt leaves it to expire.
        let c = self.chunks.get_mut(&h).expect("usable");
        if let Some(a) = c.writers.get(&r.client_id) {
            if r.client_seq < a.seq {
                // Retryable: a late attempt's writer is no longer waiting, and a write
                // overtaken by a concurrent one from the same client goes again.
                return Err(FsError::Unavailable(format!(
                    "write attempt {} of writer {:x} was overtaken by its attempt {}",
                    r.client_seq, r.client_id, a.seq
                )));
            }
            if r.client_seq == a.seq {
                // A copy of the latest attempt: answered as it was, never applied twice.
                let serial = a.serial;
                return Ok(match &a.answer {
                    Some(answer) => Some(answer.clone()),
                    None => {
                        if let Some(f) = self.forwarding.get_mut(&(h, r.version, serial)) {
                            // Answered when the first copy is; the chunk is free meanwhile.
                            // As many wait as may queue on the chunk, however many copies
                            // the network (or a forger) sends.
                            if f.copies.len() >= self.cfg.max_queued_per_chunk {
                                return Err(FsError::Unavailable(format!(
                                    "{} busy: {} copies of write attempt {} of writer {:x} \
                                     wait on chunk {h}",
                                    self.cfg.address,
                                    f.copies.len(),
                                    r.client_seq,
                                    r.client_id
                                )));
                            }
                            f.copies.push(id);
                            self.finish(h);
                            None
                        } else {
                            // Answered and forgotten meanwhile: the writer has its answer.
                            Some(err(FsError::Unavailable(format!(
                                "write attempt {} of writer {:x} was already answered",
                                r.client_seq, r.client_id
                            ))))
                        }
                    }
                });
            }
        }
        self.lease_secondaries_are(h, &r.secondaries)?;
        let owner = owner_of(r.capability.as_ref(), h);
        let data = self.data_of(r.data_id, r.data, owner)?;
        let end = check_range(r.offset, data.len(), self.lease_chunk_size(h))?;
        // Before anything is forwarded or recorded: a write this server has no room for
        // goes nowhere.
        self.room_for(h, end)?;
        let forward = Forward {
            version: r.version,
            offset: r.offset,
            data,
            data_id: r.data_id,
            secondaries: r.secondaries,
            capabilities: r.secondary_capabilities,
            reply: empty(),
            writer: Some((r.client_id, r.client_seq)),
        };
        self.mutate(id, h, forward)
    }

    /// A record append: the primary picks the offset, its copy's end. A record that does
    /// not fit is not written; the chunk is padded to its full size on every replica
    /// instead (an empty write at the chunk's end, which fills the gap with zeros), and
    /// the client moves on to the next chunk. No writer sequence check: appends from one
    /// writer have no order to keep, and a late duplicate is what at-least-once allows.
    pub(super) fn start_append(
        &mut self,
        id: RequestId,
        r: pb::AppendChunkRequest,
    ) -> Result<Option<pb::ChunkResponse>, FsError> {
        let h = r.handle;
        self.usable(h, r.version, true)?;
        if !self.is_primary(h, self.now) {
            return Err(FsError::Unavailable(format!(
                "{} holds no lease on chunk {h}",
                self.cfg.address
            )));
        }
        self.lease_secondaries_are(h, &r.secondaries)?;
        let owner = owner_of(r.capability.as_ref(), h);
        let record = self.data_of(r.data_id, r.data, owner)?;
        // The size of this chunk's file, as the master said in the grant: the client
        // cannot be trusted to say it, and the master's default for new files may differ.
        let chunk_size = self.lease_chunk_size(h);
        let max = chunk_size / 4;
        if record.is_empty() || record.len() as u64 > max {
            return Err(FsError::InvalidArgument(format!(
                "a record must be 1 to {max} bytes, not {}",
                record.len()
            )));
        }
        let c = self.chunks.get_mut(&h).expect("usable");
        let length = c.meta.length;
        let fits = length + record.len() as u64 <= chunk_size;
        // A record is refused if this server has no room for it. Padding is not: it is
        // less than a record (a quarter chunk at most), and without it the client could
        // not move on to a new chunk, which the master may place where there is room.
        if fits {
            self.room_for(h, length + record.len() as u64)?;
        }
        let (offset, data, full) = if fits {
            (length, record, false)
        } else {
            (chunk_size, Bytes::new(), true)
        };
        // The secondaries use their own pushed copy, unless the chunk is being padded.
        let data_id = if full || !fits { 0 } else { r.data_id };
        tracing::debug!(chunk = h, server = %self.cfg.address, offset, len = data.len(), full, "record append");
        let forward = Forward {
            version: r.version,
            offset,
            data,
            data_id,
            secondaries: r.secondaries,
            capabilities: r.secondary_capabilities,
            reply: ok(Resp::Append(pb::AppendChunkResponse {
                offset: if full { 0 } else { offset },
                chunk_full: full,
            })),
            writer: None,
        };
        self.mutate(id, h, forward)
    }

    /// As primary: gives the mutation the chunk's next serial, sends it to the
    /// secondaries and writes it here, all at once; the client is answered once every
    /// replica has applied it. The chunk's next mutation starts when this server's own
    /// write is done, so serials still follow the order of local writes, and the
    /// secondaries apply them in serial order however the network delivers them. The
    /// caller has checked the mutation's range.
    pub(super) fn mutate(
        &mut self,
        id: RequestId,
        h: ChunkHandle,
        f: Forward,
    ) -> Result<Option<pb::ChunkResponse>, FsError> {
        let c = self.chunks.get_mut(&h).expect("usable");
        c.serial += 1;
        let serial = c.serial;
        if let Some((client, seq)) = f.writer {
            let attempt = Attempt {
                seq,
                serial,
                answer: None,
            };
            c.writers.insert(client, attempt);
        }
        self.forwarding.insert(
            (h, f.version, serial),
            Forwarding {
                id,
                copies: Vec::new(),
                writer: f.writer,
                waiting: f.secondaries.len() + 1,
                error: None,
                local: None,
                reply: f.reply,
            },
        );
        if !f.secondaries.is_empty() {
            tracing::debug!(chunk = h, server = %self.cfg.address, serial, offset = f.offset, len = f.data.len(), to = ?f.secondaries, "forwarding mutation");
        }
        let mut caps = f.capabilities.into_iter();
        for to in f.secondaries {
            let capability = caps.next();
            let req = pb::ChunkRequest {
                req: Some(Req::Apply(pb::ApplyMutationRequest {
                    handle: h,
                    version: f.version,
                    serial,
                    offset: f.offset,
                    data: if f.data_id == 0 {
                        f.data.clone()
                    } else {
                        Bytes::new()
                    },
                    data_id: f.data_id,
                    capability,
                })),
            };
            self.call(
                Dest::Peer(to),
                Outgoing::Chunk(req),
                CallCtx::Forward {
                    h,
                    version: f.version,
                    serial,
                },
            );
        }
        self.forwards.insert(h, (f.version, serial));
        self.apply_local(id, h, f.offset, f.data)
    }

    /// A mutation from the primary, in its serial order.
    pub(super) fn start_apply(
        &mut self,
        id: RequestId,
        r: pb::ApplyMutationRequest,
    ) -> Result<Option<pb::ChunkResponse>, FsError> {
        self.apply_mutation(id, r, false)
    }

    /// Applies a mutation from the primary. One that arrived before its predecessor (the
    /// primary has several out at once, and the network may reorder them) waits for it,
    /// at most `apply_hold`; `released` says that wait is over.
    pub(super) fn apply_mutation(
        &mut self,
        id: RequestId,
        r: pb::ApplyMutationRequest,
        released: bool,
    ) -> Result<Option<pb::ChunkResponse>, FsError> {
        let h = r.handle;
        self.usable(h, r.version, true)?;
        let c = self.chunks.get(&h).expect("usable");
        if r.serial <= c.serial {
            return Err(FsError::InvalidArgument(format!(
                "mutation {} of chunk {h} arrived after mutation {}",
                r.serial, c.serial
            )));
        }
        if r.serial > c.serial + 1 && !released {
            if self.held.contains_key(&(h, r.serial)) {
                return Err(FsError::InvalidArgument(format!(
                    "mutation {} of chunk {h} is already waiting",
                    r.serial
                )));
            }
            if r.serial > c.serial + 4096 || self.held.len() >= 65_536 {
                return Err(FsError::Unavailable(format!(
                    "mutation {} of chunk {h} is too far ahead of {}",
                    r.serial, c.serial
                )));
            }
            tracing::debug!(chunk = h, server = %self.cfg.address, serial = r.serial, last = c.serial, "holding a mutation for its predecessor");
            let now = self.now;
            self.held.insert((h, r.serial), (id, r, now));
            self.finish(h);
            return Ok(None);
        }
        let owner = owner_of(r.capability.as_ref(), h);
        let data = self.data_of(r.data_id, r.data, owner)?;
        // A secondary knows no chunk size (its primary checked the mutation against it).
        check_range(r.offset, data.len(), MAX_CHUNK_SIZE)?;
        self.chunks.get_mut(&h).expect("usable").serial = r.serial;
        // Refused in its turn, as a full disk would refuse it: the primary's next
        // mutation follows this one's serial. Padding (no data) passes, as on the primary.
        if !data.is_empty() {
            self.room_for(h, r.offset + data.len() as u64)?;
        }
        tracing::debug!(chunk = h, server = %self.cfg.address, serial = r.serial, offset = r.offset, len = data.len(), "applying mutation");
        self.apply_local(id, h, r.offset, data)
    }

    /// Mutations held longer than `apply_hold`: their predecessors are not coming.
    pub(super) fn release_held(&mut self) {
        let hold = self.cfg.apply_hold;
        let now = self.now;
        let due: Vec<(ChunkHandle, u64)> = self
            .held
            .iter()
            .filter(|(_, (_, _, since))| *since + hold <= now)
            .map(|(k, _)| *k)
            .collect();
        for k in due {
            if let Some((id, r, _)) = self.held.remove(&k) {
                self.enqueue(k.0, Job::Released(id, r));
            }
        }
    }

    /// Fails every mutation held on `h` (its version moved on, or it is gone).
    pub(super) fn drop_held(&mut self, h: ChunkHandle) {
        let keys: Vec<(ChunkHandle, u64)> = self
            .held
            .range((h, 0)..=(h, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some((id, _, _)) = self.held.remove(&k) {
                self.out.replies.push((
                    id,
                    err(FsError::StaleVersion(format!(
                        "chunk {h} moved on while mutation {} waited",
                        k.1
                    ))),
                ));
            }
        }
    }

    /// The chunk size the lease on `h` was granted with; the caller has checked that
    /// this server holds the lease.
    /// Every secondary a write or an append names must be one the grant went to (the
    /// capability, checked before, says which of them took it): a writer that adds one
    /// would spread the mutation where it does not belong.
    fn lease_secondaries_are(&self, h: ChunkHandle, named: &[String]) -> Result<(), FsError> {
        let Some(lease) = self
            .chunks
            .get(&h)
            .and_then(|c| c.lease_secondaries.as_ref())
        else {
            return Ok(());
        };
        if let Some(s) = named.iter().find(|s| !lease.contains(s)) {
            return Err(FsError::InvalidArgument(format!(
                "chunk {h}: the mutation names secondary {s}, not one of the lease's {lease:?}"
            )));
        }
        Ok(())
    }

    pub(super) fn lease_chunk_size(&self, h: ChunkHandle) -> u64 {
        let c = self.chunks.get(&h).expect("a leased chunk is held");
        assert!(
            c.lease_until.is_some() && c.lease_chunk_size > 0,
            "chunk {h}: no lease, or one without a chunk size"
        );
        c.lease_chunk_size
    }

    /// Writes `data` at `offset` on this replica, durably; then replies (or forwards).
    pub(super) fn apply_local(
        &mut self,
        id: RequestId,
        h: ChunkHandle,
        offset: u64,
        data: Bytes,
    ) -> Result<Option<pb::ChunkResponse>, FsError> {
        // The primary's caller checked against the file's chunk size already.
        let end = check_range(offset, data.len(), MAX_CHUNK_SIZE)?;
        let length = self.chunks.get(&h).expect("usable").meta.length;
        // A write past the end fills the gap with zeros, so the chunk has no holes.
        let (off, data) = if offset > length {
            let mut d = BytesMut::zeroed((offset - length) as usize);
            d.extend_from_slice(&data);
            (length, d.freeze())
        } else {
            (offset, data)
        };
        let edges = Edges::new(off, end, length);
        let ranges = edges.ranges(length);
        if ranges.is_empty() {
            self.commit_write(id, h, off, data, end, Vec::new());
        } else {
            self.store(
                Pending::WriteEdges {
                    id,
                    h,
                    off,
                    data,
                    end,
                },
                StoreOp::Read { handle: h, ranges },
            );
        }
        Ok(None)
    }

    /// Finishes a write once the old bytes of its partly overwritten edge blocks are read:
    /// those blocks are verified first (a write must not bless corrupt bytes with a fresh
    /// checksum), then the touched blocks' checksums are recomputed.
    pub(super) fn commit_write(
        &mut self,
        id: RequestId,
        h: ChunkHandle,
        off: u64,
        data: Bytes,
        end: u64,
        read: Vec<Bytes>,
    ) {
        let c = self.chunks.get(&h).expect("chunk is busy, so present");
        let mut meta = c.meta.clone();
        // Durable with the bytes: a restart must not forget which mutations are behind.
        meta.serial = c.serial;
        let edges = Edges::new(off, end, meta.length);
        let mut read = read.into_iter();
        let head = if edges.head { read.next() } else { None };
        let tail = match (edges.tail, edges.shared) {
            (true, true) => head.clone(),
            (true, false) => read.next(),
            (false, _) => None,
        };
        let intact = |block: u64, bytes: &Option<Bytes>| match bytes {
            Some(b) => {
                b.len() as u64 == (block + BLOCK_SIZE).min(meta.length) - block
                    && checksum::verify(&meta.checksums, block, b).is_ok()
            }
            None => false,
        };
        if (edges.head && !intact(edges.fb, &head)) || (edges.tail && !intact(edges.tb, &tail)) {
            return self.found_corrupt(h, id);
        }
        // The touched blocks' new bytes: the old head, the data, the old tail (no copy).
        let head_part = head
            .as_ref()
            .map_or(&[][..], |b| &b[..(off - edges.fb) as usize]);
        let tail_part = tail
            .as_ref()
            .map_or(&[][..], |b| &b[(end - edges.tb) as usize..]);
        checksum::update(
            &mut meta.checksums,
            edges.fb,
            &[head_part, &data, tail_part],
        );
        let fill = cache_fill(edges.fb, head_part, off, &data, tail_part);
        // Bytes below the old length are overwritten: say so durably first, so a crash
        // in the middle is repaired rather than leaving the whole copy corrupt.
        let intent = (off < meta.length).then(|| pb::ChunkMeta {
            writing: Some(pb::WriteIntent {
                offset: off,
                length: end - off,
            }),
            ..c.meta.clone()
        });
        meta.length = meta.length.max(end);
        let op = self.store(
            Pending::Commit {
                id: Some(id),
                h,
                meta: Some(meta.clone()),
                lease: None,
            },
            StoreOp::Write {
                handle: h,
                offset: off,
                data: data.clone(),
                meta,
                intent,
            },
        );
        self.fills.insert(op, (h, fill));
    }
}
