//! Plain appends: the master picks the offset.
//!
//! A client that read the file's length and then wrote there would race every other
//! appender: two that read the same length overwrite each other, and an acknowledged
//! append is lost. Instead the appender asks the master for a region at the file's end.
//! Under the path's write lock the master takes the file's length as the region's start
//! and logs the new length (`SetLength`), so the next reservation starts after it; the
//! reply waits until that record is durable, or a master that crashed and forgot the
//! length would give the same region out again. The client then writes its data there
//! with ordinary writes. Concurrent appends therefore each land whole, in some order.
//!
//! A region whose writer fails or dies stays a hole: it reads as zeros, as any
//! unwritten part of a file does.
//!
//! A reply can be lost after the record is durable, and the client asks again. Each
//! append carries a token the client drew for it; the record names the token and the
//! region, and the master keeps the latest [`RESERVATIONS_KEPT`] of them (rebuilt on
//! replay, kept in checkpoints), so a second request with the same token gets the same
//! region back instead of leaving the first as a hole.

use std::collections::{HashMap, VecDeque};

use super::locks::{LockSet, Mode};
use super::{Master, RequestId, ok};
use crate::error::FsError;
use crate::pb::{self, log_record::Op, master_response::Resp};

/// How many reservations the master remembers for retries. A client asks again within
/// its retry time (90 s by default); at 700 appends a second this covers that.
pub const RESERVATIONS_KEPT: usize = 65_536;

/// A region given to a plain append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub path: String,
    pub offset: u64,
    pub length: u64,
}

/// The latest reservations by token, oldest dropped first. Part of the master's
/// persistent state ([`super::meta::Meta`]): a retry may reach a restarted master.
#[derive(Debug, Default)]
pub struct Reservations {
    by_token: HashMap<u64, Reservation>,
    order: VecDeque<u64>,
}

impl Reservations {
    pub fn get(&self, token: u64) -> Option<&Reservation> {
        self.by_token.get(&token)
    }

    /// Remembers `r` under `token` (not 0), forgetting the oldest beyond the bound.
    pub fn insert(&mut self, token: u64, r: Reservation) {
        assert_ne!(token, 0, "token 0 means none");
        if self.by_token.insert(token, r).is_none() {
            self.order.push_back(token);
        }
        while self.order.len() > RESERVATIONS_KEPT {
            let old = self.order.pop_front().expect("not empty");
            self.by_token.remove(&old);
        }
        debug_assert_eq!(self.order.len(), self.by_token.len());
    }

    /// Oldest first, as checkpoints keep them.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Reservation)> {
        self.order.iter().map(|t| (*t, &self.by_token[t]))
    }
}

impl Master {
    pub(super) fn on_reserve_append(
        &mut self,
        id: RequestId,
        r: &pb::ReserveAppendRequest,
    ) -> Result<bool, FsError> {
        let path = crate::path::normalize(&r.path)?;
        let set = LockSet::on(&path, Mode::Write)?;
        if !self.lock(&set) {
            return Ok(false);
        }
        let length_now = match self.meta.ns.file(&path) {
            Ok(f) => f.length,
            Err(e) => {
                self.locks.release(&set);
                return Err(e);
            }
        };
        let answer = |offset| {
            Some((
                id,
                ok(Resp::ReserveAppend(pb::ReserveAppendResponse { offset })),
            ))
        };
        // Asked again: the region given the first time, if the file still covers it
        // (its record may not be durable yet: answer once everything logged is).
        if let Some(was) = self.meta.appends.get(r.token).filter(|_| r.token != 0) {
            if was.path != path || was.length != r.length {
                self.locks.release(&set);
                return Err(FsError::InvalidArgument(format!(
                    "append token {:#x} was given for {} bytes at {}",
                    r.token, was.length, was.path
                )));
            }
            if was.offset + was.length <= length_now {
                let reply = answer(was.offset);
                let last = self.last_seq;
                self.hold(last, reply, Some(set));
                return Ok(true);
            }
            // The file is not the one the region was cut from (deleted and made
            // again): a new region, as for a first request.
        }
        let offset = length_now;
        let reply = answer(offset);
        if r.length == 0 {
            // Nothing to reserve; but the length answered may come from a record not yet
            // durable: answer once everything logged so far is.
            let last = self.last_seq;
            self.hold(last, reply, Some(set));
            return Ok(true);
        }
        let end = match offset.checked_add(r.length) {
            Some(end) if end <= self.max_file_length() => end,
            _ => {
                self.locks.release(&set);
                return Err(FsError::InvalidArgument(format!(
                    "{path}: appending {} bytes at {offset} goes past the largest file ({} bytes)",
                    r.length,
                    self.max_file_length()
                )));
            }
        };
        match self.log(Op::SetLength(pb::SetLengthOp {
            path: path.clone(),
            length: end,
            append_token: r.token,
            append_offset: offset,
        })) {
            Ok((seq, _)) => {
                assert_eq!(
                    self.meta.ns.file(&path).map(|f| f.length),
                    Ok(end),
                    "a reservation extends the file over its region"
                );
                assert!(
                    r.token == 0
                        || self
                            .meta
                            .appends
                            .get(r.token)
                            .is_some_and(|w| w.offset == offset),
                    "a reservation is remembered under its token"
                );
                self.hold(seq, reply, Some(set));
                Ok(true)
            }
            Err(e) => {
                self.locks.release(&set);
                Err(e)
            }
        }
    }

    /// The largest file length the chunk size allows: chunk indexes stay below
    /// `u64::MAX / chunk_size` (see the write-target request), so byte offsets stay
    /// representable.
    pub(super) fn max_file_length(&self) -> u64 {
        let chunk = self.cfg.chunk_size.max(1);
        (u64::MAX / chunk) * chunk
    }
}
