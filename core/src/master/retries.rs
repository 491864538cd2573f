//! Requests asked for twice: the retry cache.
//!
//! A client retries a call whose reply did not come, and the first attempt may have been
//! done: its record durable, its reply lost. Done again, a create would fail with
//! `AlreadyExists` because of itself, a delete with `NotFound`, a rename would fail with
//! its file already moved, and a plain append would take a second region. So every call
//! carries a token the client drew once for it (`MasterRequest.token`), the record of a
//! mutation that succeeded names it (`LogRecord.token`), and the master keeps the latest
//! [`KEPT`] of them, rebuilt on replay and kept in checkpoints: a mutation asked again
//! with a token it knows is answered as the first time, and nothing is done.
//!
//! A refusal is remembered too, in memory: a mutation refused for what the namespace
//! held (not found, already exists, not a directory, not empty, invalid) is refused the
//! same way when asked again. Otherwise a copy of the request that reached the master
//! late (a client's earlier attempt, held up in the network while a later one was
//! answered) would be done after its caller had been told it was not: a delete refused
//! with `NotFound` would delete a directory made since. A refusal for a passing reason
//! (unavailable, storage) is not remembered: the client asks again to have it done.
//! Refusals log nothing, so a restarted master has forgotten them; a request held up
//! across a master's restart would need a connection that outlived the master's process.
//! A request lost with a master that crashed before its record was durable left no record
//! and no token; asked again, it is done.

use crate::types::HashMap;
use std::collections::VecDeque;

use super::{Master, RequestId, ok};
use crate::error::FsError;
use crate::pb::{self, log_record::Op, master_request::Req, master_response::Resp};

/// How many completed requests the master remembers. A client asks again within its
/// retry time (90 s by default); at 700 mutations a second this covers that.
pub const KEPT: usize = 65_536;

/// A request that succeeded, as its record tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completed {
    /// The path the request named first (a rename's source).
    pub path: String,
    /// A plain append's region: (offset, length).
    pub append: Option<(u64, u64)>,
}

impl Completed {
    /// What a record made for a request with a token says of it; None for records no
    /// request with a token makes.
    pub fn of(op: &Op) -> Option<Completed> {
        let (path, append) = match op {
            Op::Mkdir(o) => (&o.path, None),
            Op::Create(o) => (&o.path, None),
            Op::Rename(o) => (&o.src, None),
            Op::Remove(o) => (&o.path, None),
            Op::SetLength(o) => (
                &o.path,
                Some((o.append_offset, o.length.checked_sub(o.append_offset)?)),
            ),
            _ => return None,
        };
        Some(Completed {
            path: path.clone(),
            append,
        })
    }
}

/// The latest completed requests by token, oldest forgotten first. Part of the master's
/// persistent state ([`super::meta::Meta`]): a retry may reach a restarted master.
#[derive(Debug, Default)]
pub struct Retries {
    by_token: HashMap<u64, Completed>,
    order: VecDeque<u64>,
    /// How many of them are append regions.
    appends: usize,
}

/// The latest refused mutations by token (the path they named first, the refusal),
/// oldest forgotten first; in memory only (see the module's text).
#[derive(Debug, Default)]
pub(super) struct Refusals {
    by_token: HashMap<u64, (Kind, String, FsError)>,
    order: VecDeque<u64>,
}

impl Refusals {
    /// Whether a refusal says what the namespace held, so the same request asked again
    /// must get it again; a passing one (unavailable, storage) invites asking again.
    fn lasting(e: &FsError) -> bool {
        matches!(
            e,
            FsError::NotFound(_)
                | FsError::AlreadyExists(_)
                | FsError::NotADirectory(_)
                | FsError::IsADirectory(_)
                | FsError::NotEmpty(_)
                | FsError::InvalidArgument(_)
        )
    }

    /// Remembers a lasting refusal of the request `r` with `token`, that named `path`.
    pub(super) fn insert(&mut self, token: u64, r: &Req, path: &str, e: &FsError) {
        if token == 0 || !Self::lasting(e) {
            return;
        }
        if self
            .by_token
            .insert(
                token,
                (std::mem::discriminant(r), path.to_string(), e.clone()),
            )
            .is_none()
        {
            self.order.push_back(token);
        }
        while self.order.len() > KEPT {
            let old = self.order.pop_front().expect("not empty");
            self.by_token.remove(&old);
        }
        debug_assert_eq!(self.order.len(), self.by_token.len());
    }

    /// The refusal of `r` asked with `token` before, naming `path`.
    fn of(&self, token: u64, r: &Req, path: &str) -> Option<&FsError> {
        match self.by_token.get(&token) {
            Some((kind, first, e)) if *kind == std::mem::discriminant(r) && first == path => {
                Some(e)
            }
            _ => None,
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_token.len()
    }
}

/// Which request a refusal answered.
type Kind = std::mem::Discriminant<Req>;

impl Retries {
    pub fn get(&self, token: u64) -> Option<&Completed> {
        self.by_token.get(&token)
    }

    /// Remembers `c` under `token` (not 0), forgetting the oldest beyond [`KEPT`].
    pub fn insert(&mut self, token: u64, c: Completed) {
        assert_ne!(token, 0, "token 0 means none");
        self.appends += usize::from(c.append.is_some());
        match self.by_token.insert(token, c) {
            None => self.order.push_back(token),
            Some(was) => self.appends -= usize::from(was.append.is_some()),
        }
        while self.order.len() > KEPT {
            let old = self.order.pop_front().expect("not empty");
            if let Some(was) = self.by_token.remove(&old) {
                self.appends -= usize::from(was.append.is_some());
            }
        }
        debug_assert_eq!(self.order.len(), self.by_token.len());
    }

    /// Forgets the append regions given in the file at `path`, or in any file below it:
    /// the name is being moved away or removed, and a file made there later is another
    /// file. A reservation asked for again then gets a new region in whatever file has the
    /// name by then, never the old region, which in the new file may be someone else's.
    pub fn forget_appends_under(&mut self, path: &str) {
        if self.appends == 0 {
            return;
        }
        let under = |p: &str| {
            p == path
                || (p.len() > path.len()
                    && p.starts_with(path)
                    && (path == "/" || p.as_bytes()[path.len()] == b'/'))
        };
        let before = self.by_token.len();
        self.by_token
            .retain(|_, c| c.append.is_none() || !under(&c.path));
        if self.by_token.len() != before {
            let kept = &self.by_token;
            self.order.retain(|t| kept.contains_key(t));
            self.appends -= before - self.by_token.len();
        }
        debug_assert_eq!(self.order.len(), self.by_token.len());
    }

    /// Oldest first, as checkpoints keep them.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Completed)> {
        self.order.iter().map(|t| (*t, &self.by_token[t]))
    }
}

/// The path a mutation names first, and the append length it asks for; None for calls
/// that change nothing or that are safe to do twice (mkdir -p, extending a file).
pub(super) fn mutation(r: &Req) -> Option<(&str, Option<u64>)> {
    match r {
        Req::Mkdir(m) if !m.parents => Some((&m.path, None)),
        Req::Create(c) => Some((&c.path, None)),
        Req::Delete(d) => Some((&d.path, None)),
        Req::Rename(r) => Some((&r.src, None)),
        Req::ReserveAppend(a) => Some((&a.path, Some(a.length))),
        _ => None,
    }
}

impl Master {
    /// Answers a mutation asked again with the token of one that succeeded, as it was
    /// answered then, once everything logged is durable (the first record may not be
    /// yet), or refuses it as it was refused. None: not a repeat; do the request.
    pub(super) fn answer_repeat(
        &mut self,
        id: RequestId,
        req: &pb::MasterRequest,
        r: &Req,
    ) -> Option<Result<bool, FsError>> {
        if req.token == 0 {
            return None;
        }
        let (path, append) = mutation(r)?;
        if let Some(e) = self.refusals.of(req.token, r, path) {
            tracing::debug!(token = req.token, %path, "asked again; refused as before");
            return Some(Err(e.clone()));
        }
        let done = self.meta.retries.get(req.token)?;
        let path = match crate::path::normalize(path) {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        let same = done.path == path && done.append.map(|(_, len)| len) == append;
        if !same {
            return Some(Err(FsError::InvalidArgument(format!(
                "request token {:#x} was used for another request",
                req.token
            ))));
        }
        let resp = match done.append {
            // The region is forgotten when its file's name moves away (see
            // `forget_appends_under`); a file shorter than the region is not the one it
            // was cut from either: a new region, as for a first request.
            Some((offset, len))
                if self
                    .meta
                    .ns
                    .file(&path)
                    .is_ok_and(|f| f.length >= offset + len) =>
            {
                Resp::ReserveAppend(pb::ReserveAppendResponse { offset })
            }
            Some(_) => return None,
            None => Resp::Empty(pb::Empty {}),
        };
        tracing::debug!(token = req.token, %path, "asked again; answered as before");
        let last = self.last_seq;
        self.hold(last, Some((id, ok(resp))), None);
        Some(Ok(true))
    }
}
