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
//! A reply can be lost after the record is durable, and the client asks again: the
//! retry cache (`retries.rs`) answers it with the region given the first time.

use super::locks::{LockSet, Mode};
use super::{Master, RequestId, ok};
use crate::error::FsError;
use crate::pb::{self, log_record::Op, master_response::Resp};

impl Master {
    pub(super) fn on_reserve_append(
        &mut self,
        id: RequestId,
        r: &pb::ReserveAppendRequest,
        from: &crate::auth::Caller,
    ) -> Result<bool, FsError> {
        let path = crate::path::normalize(&r.path)?;
        self.check(from).write(&path)?;
        let set = LockSet::on(&path, Mode::Write)?;
        if !self.lock(&set) {
            return Ok(false);
        }
        let offset = match self.meta.ns.file(&path) {
            Ok(f) => f.length,
            Err(e) => {
                self.locks.release(&set);
                return Err(e);
            }
        };
        let reply = Some((
            id,
            ok(Resp::ReserveAppend(pb::ReserveAppendResponse { offset })),
        ));
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
        match self.log_for_request(Op::SetLength(pb::SetLengthOp {
            path: path.clone(),
            length: end,
            append_offset: offset,
        })) {
            Ok((seq, _)) => {
                assert_eq!(
                    self.meta.ns.file(&path).map(|f| f.length),
                    Ok(end),
                    "a reservation extends the file over its region"
                );
                assert!(
                    self.request_token == 0
                        || self
                            .meta
                            .retries
                            .get(self.request_token)
                            .and_then(|c| c.append)
                            == Some((offset, r.length)),
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
