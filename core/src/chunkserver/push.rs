//! Data pushed ahead of writes: kept in bounded buffers by id, passed down the chain, and
//! dropped when unused for long.

use super::*;

impl Chunkserver {
    /// A piece of pushed data: keep it, and pass it down the chain.
    pub(super) fn on_push(&mut self, id: RequestId, r: pb::PushDataRequest) {
        if let Err(e) = self.keep_piece(&r, owner_of(r.capabilities.first(), r.handle)) {
            return self.out.replies.push((id, err(e)));
        }
        let Some((next, rest)) = r.chain.split_first() else {
            return self.out.replies.push((id, empty()));
        };
        let req = pb::ChunkRequest {
            req: Some(Req::Push(pb::PushDataRequest {
                data_id: r.data_id,
                offset: r.offset,
                total: r.total,
                piece: r.piece.clone(),
                chain: rest.to_vec(),
                // This server's was checked (`check_capability`); the rest go on.
                handle: r.handle,
                capabilities: r.capabilities.iter().skip(1).cloned().collect(),
            })),
        };
        self.call(
            Dest::Peer(next.clone()),
            Outgoing::Chunk(req),
            CallCtx::PushForward {
                id,
                to: next.clone(),
            },
        );
    }

    pub(super) fn keep_piece(
        &mut self,
        r: &pb::PushDataRequest,
        owner: (String, ChunkHandle),
    ) -> Result<(), FsError> {
        let end = r.offset.checked_add(r.piece.len() as u64);
        if r.data_id == 0
            || r.total == 0
            || r.total > MAX_CHUNK_SIZE
            || end.is_none_or(|e| e > r.total)
        {
            return Err(FsError::InvalidArgument(format!(
                "push of {} bytes at {} of {} (id {:x}) does not fit",
                r.piece.len(),
                r.offset,
                r.total,
                r.data_id
            )));
        }
        let end = end.expect("checked");
        if !self.pushed.contains_key(&r.data_id) {
            // One owner may hold half the room at most: past it, its own oldest
            // buffers make room for its next, so one sender's flood cannot push every
            // other sender's data out. Otherwise: room is made oldest first.
            let quota = self.cfg.push_buffer_bytes / 2;
            let held = |s: &Self| -> u64 {
                s.pushed
                    .values()
                    .filter(|b| b.owner == owner)
                    .map(|b| b.total)
                    .sum()
            };
            if !owner.0.is_empty() && r.total > quota {
                return Err(FsError::InvalidArgument(format!(
                    "a push of {} bytes is more than one sender may hold at {} ({quota})",
                    r.total, self.cfg.address
                )));
            }
            while !owner.0.is_empty() && held(self) + r.total > quota {
                let (&old, _) = self
                    .pushed
                    .iter()
                    .filter(|(_, b)| b.owner == owner)
                    .min_by_key(|(k, b)| (b.touched, **k))
                    .expect("over its quota, the owner holds some");
                self.drop_pushed(old);
            }
            while self.pushed_bytes + r.total > self.cfg.push_buffer_bytes {
                let Some((&old, _)) = self.pushed.iter().min_by_key(|(k, b)| (b.touched, **k))
                else {
                    return Err(FsError::Unavailable(format!(
                        "{} has no room for {} bytes of pushed data",
                        self.cfg.address, r.total
                    )));
                };
                self.drop_pushed(old);
            }
            self.pushed_bytes += r.total;
            self.pushed.insert(
                r.data_id,
                PushBuffer {
                    total: r.total,
                    pieces: Default::default(),
                    touched: self.now,
                    owner: owner.clone(),
                },
            );
        }
        let b = self.pushed.get_mut(&r.data_id).expect("present");
        if b.owner != owner {
            return Err(FsError::PermissionDenied(format!(
                "pushed data {:x} at {} belongs to another writer",
                r.data_id, self.cfg.address
            )));
        }
        if b.total != r.total {
            return Err(FsError::InvalidArgument(format!(
                "pushed data {:x} changed its length",
                r.data_id
            )));
        }
        // The buffer is counted at its data's length, so it holds no more than that: of a
        // piece sent again or split differently, only the bytes not yet held are kept (as
        // slices of the piece, uncopied). Keeping every piece whole would let pieces at
        // overlapping offsets hold many times the counted bytes alive.
        let mut at = r.offset;
        let mut gaps = Vec::new();
        let first = b
            .pieces
            .range(..=r.offset)
            .next_back()
            .map_or(r.offset, |(&s, _)| s);
        for (&s, p) in b.pieces.range(first..end) {
            if s > at {
                gaps.push((at, s));
            }
            at = at.max(s + p.len() as u64);
        }
        if at < end {
            gaps.push((at, end));
        }
        for (s, e) in gaps {
            let piece = r
                .piece
                .slice((s - r.offset) as usize..(e - r.offset) as usize);
            b.pieces.insert(s, piece);
        }
        b.touched = self.now;
        assert!(
            b.pieces.values().map(|p| p.len() as u64).sum::<u64>() <= b.total,
            "pushed data {:x} holds more than its length",
            r.data_id
        );
        Ok(())
    }

    pub(super) fn drop_pushed(&mut self, id: u64) -> Option<PushBuffer> {
        let b = self.pushed.remove(&id)?;
        self.pushed_bytes -= b.total;
        Some(b)
    }

    /// The data of a mutation: inline, or pushed ahead under `data_id` (used up here) by
    /// `owner` (`owner_of` the mutation's capability): another's is neither used nor
    /// dropped.
    pub(super) fn data_of(
        &mut self,
        data_id: u64,
        inline: Bytes,
        owner: (String, ChunkHandle),
    ) -> Result<Bytes, FsError> {
        if data_id == 0 {
            return Ok(inline);
        }
        if let Some(b) = self.pushed.get(&data_id)
            && b.owner != owner
        {
            return Err(FsError::PermissionDenied(format!(
                "pushed data {data_id:x} at {} belongs to another writer",
                self.cfg.address
            )));
        }
        match self.drop_pushed(data_id) {
            Some(b) if b.complete() => Ok(b.assemble()),
            Some(_) => Err(FsError::Unavailable(format!(
                "data {data_id:x} arrived only in part at {}",
                self.cfg.address
            ))),
            None => Err(FsError::Unavailable(format!(
                "data {data_id:x} is not at {} (never pushed, or dropped)",
                self.cfg.address
            ))),
        }
    }

    /// Drops pushed data nobody used in time.
    pub(super) fn expire_pushed(&mut self) {
        let ttl = self.cfg.push_buffer_ttl;
        let now = self.now;
        let old: Vec<u64> = self
            .pushed
            .iter()
            .filter(|(_, b)| b.touched + ttl <= now)
            .map(|(k, _)| *k)
            .collect();
        for id in old {
            self.drop_pushed(id);
        }
    }
}

/// Who data pushed, or a mutation sent, under `cap` belongs to: the capability's subject
/// and chunk (`crate::capability`). Nobody, on an insecure cluster, which has none.
pub(super) fn owner_of(cap: Option<&pb::Capability>, handle: ChunkHandle) -> (String, ChunkHandle) {
    match cap {
        Some(c) if !c.subject.is_empty() => (c.subject.clone(), handle),
        _ => (String::new(), 0),
    }
}
