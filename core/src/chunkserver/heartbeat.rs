//! Heartbeats: what the server holds, reported to the master, and the master's orders in
//! the reply (deletions, the cluster id).

use super::*;

impl Chunkserver {
    pub(super) fn heartbeat(&mut self) {
        let now = self.now;
        let mut chunks: Vec<pb::ChunkReport> = self
            .chunks
            .iter()
            .map(|(&handle, c)| pb::ChunkReport {
                handle,
                version: c.meta.version,
                length: c.meta.length,
            })
            .collect();
        // A corrupt copy is reported at version 0: stale to the master, which then has
        // it deleted (and the disk space comes back).
        chunks.extend(self.corrupt.iter().map(|&handle| pb::ChunkReport {
            handle,
            version: 0,
            length: 0,
        }));
        chunks.sort_by_key(|c| c.handle);
        // Ask to extend leases only on chunks written during the current term (GFS §3.1):
        // an idle chunk's lease lapses, so the master may clone or re-grant it.
        let mut lease_extensions: Vec<ChunkHandle> = self
            .chunks
            .iter()
            .filter(|(_, c)| {
                c.lease_until.is_some_and(|t| now < t)
                    && c.last_write > Time::ZERO
                    && c.last_write >= c.lease_from
            })
            .map(|(&h, _)| h)
            .collect();
        lease_extensions.sort_unstable();
        // Versions and copies on their way to the disk, and clones reading or waiting
        // their turn: one may land after this report (a stuck disk, a long queue), so the
        // master must not yet take their absence for good.
        let mut changing: Vec<ChunkHandle> = self
            .pending
            .values()
            .filter_map(|p| match p {
                Pending::Commit {
                    h, meta: Some(_), ..
                } => Some(*h),
                Pending::Mend(m) => Some(m.handle()),
                _ => None,
            })
            .chain(self.calls.values().filter_map(|c| match c {
                CallCtx::CloneRead { h, .. } => Some(*h),
                CallCtx::MendRead(m) => Some(m.handle()),
                _ => None,
            }))
            .chain(self.queues.iter().filter_map(|(&h, q)| {
                q.iter()
                    .any(|j| matches!(j, Job::Request(_, Req::Clone(_) | Req::Mend(_), _)))
                    .then_some(h)
            }))
            .collect();
        changing.sort_unstable();
        changing.dedup();
        let used_bytes = self.used_bytes();
        // The configured capacity is a quota; a disk with less room left caps it.
        let capacity_bytes = match self.disk_available {
            Some(free) => self.cfg.capacity_bytes.min(used_bytes.saturating_add(free)),
            None => self.cfg.capacity_bytes,
        };
        let req = pb::MasterRequest {
            req: Some(MReq::Heartbeat(pb::HeartbeatRequest {
                address: self.cfg.address.clone(),
                rack: self.cfg.rack.clone(),
                capacity_bytes,
                used_bytes,
                chunks,
                lease_extensions,
                server_id: self.server_id,
                cluster_id: self.cluster_id,
                changing,
                copy: false,
                // Leases of older terms were given up as this one was stored (`epoch.rs`).
                epoch: self.epoch,
                boot: self.cfg.boot,
                capability_keys: self.keys.held(now),
                report_seq: self.step,
            })),
            ..Default::default()
        };
        self.call(
            Dest::Master,
            Outgoing::Master(req),
            CallCtx::Heartbeat { sent_at: now },
        );
    }

    pub(super) fn on_heartbeat_reply(&mut self, sent_at: Time, result: Result<Reply, RpcError>) {
        let hb = match result {
            Ok(Reply::Master(pb::MasterResponse {
                error: None,
                resp: Some(pb::master_response::Resp::Heartbeat(hb)),
                ..
            })) => hb,
            Ok(Reply::Master(pb::MasterResponse { error: Some(e), .. }))
                if e.code == pb::ErrorCode::InvalidArgument as i32 =>
            {
                // The master will not have this server (another cluster's, or its address
                // taken by another server): only an operator can fix that.
                tracing::error!(server = %self.cfg.address, error = %e.message, "the master refuses this server");
                return;
            }
            Ok(other) => {
                tracing::warn!(reply = ?other, "heartbeat refused");
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "heartbeat failed");
                return;
            }
        };
        if hb.cluster_id != self.cluster_id {
            if self.cluster_id != 0 {
                tracing::error!(
                    server = %self.cfg.address,
                    ours = self.cluster_id,
                    theirs = hb.cluster_id,
                    "ignoring a heartbeat reply from a master of another cluster"
                );
                return;
            }
            // First contact: the id is stored for good before anything this master says
            // is acted on, and this reply's orders wait for the next one.
            if !self.joining {
                tracing::info!(server = %self.cfg.address, cluster_id = %format_args!("{:016x}", hb.cluster_id), "joining the cluster");
                self.joining = true;
                let meta = self.identity(hb.cluster_id, self.epoch);
                self.store(
                    Pending::Join {
                        cluster_id: hb.cluster_id,
                    },
                    StoreOp::WriteMeta {
                        handle: IDENTITY_HANDLE,
                        meta,
                    },
                );
            }
            return;
        }
        if let Some(e) = self.stale_master(hb.epoch, None) {
            // An older term's orders are never acted on; a newer term's once it is stored.
            tracing::debug!(server = %self.cfg.address, error = %e, "heartbeat reply not acted on");
            return;
        }
        if let Some(k) = &hb.capability_key {
            // Counted from when the heartbeat went: no later than the master counts.
            self.keys.take(self.now, sent_at, k);
        }
        let until = sent_at + Duration::from_millis(hb.lease_duration_ms);
        for h in hb.extended_leases {
            if let Some(c) = self.chunks.get_mut(&h)
                && c.lease_until.is_some()
            {
                c.lease_until = Some(until);
                c.lease_from = sent_at;
            }
        }
        for d in hb.delete_chunks {
            tracing::debug!(chunk = d.handle, version = d.version, server = %self.cfg.address, "deleting on the master's word");
            self.enqueue(d.handle, Job::Delete(d.version));
        }
    }
}
