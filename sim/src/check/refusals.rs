//! Refusals judged by the state they read. An answer "not found", "already exists",
//! "not empty", "not a directory" or "is a directory" tells the client how the namespace
//! stands, as an Ok does: given while a record that made that state is not yet durable,
//! a crash (or a deposed leader's lost term) may lose the record, and the client was
//! told of a state that never was. The master's namespace locks forbid it: a mutation
//! keeps its locks until its record is durable, and a request on the same name, or
//! below a directory the mutation changes, waits for them. So, judged from outside, at
//! any master (a deposed leader's too):
//!
//! > a request refused for the state of a name is answered only once every record its
//! > master had logged before that step, touching that name or a directory above it
//! > (or, for "not empty", a name below it), is durable.
//!
//! A rename that forgets to lock its destination, say, refuses a rename or a create of
//! the destination "already exists" while the create that made it is still unsynced.
//! Records logged in the same step as the refusal are not judged (the step may have
//! taken them after it answered), nor is a refusal repeated to a request asked again
//! with the token of one this master refused (`master::retries`): it was judged when
//! it was first given, and the request's answer stands from then.

use std::collections::{BTreeMap, HashMap, HashSet};

use tessera_core::master::{Effects, Input, Master};
use tessera_core::pb::{self, log_record::Op, master_request::Req};

#[derive(Default)]
pub struct Refusals {
    /// Per master node: the epoch of the master it runs, and the names each record it
    /// logged and has not yet made durable touches, by record.
    pending: HashMap<String, (u64, BTreeMap<u64, Vec<String>>)>,
    /// Requests a master took and has not answered: the names each asks about, and the
    /// request's token.
    asked: HashMap<(String, u64), (Vec<String>, u64)>,
    /// The tokens of requests each master refused.
    refused: HashSet<(String, u64)>,
    /// Refusals judged.
    pub judged: u64,
}

/// The error codes that report how the namespace stands.
fn state_refusal(e: &pb::Error) -> bool {
    use pb::ErrorCode as E;
    [
        E::NotFound,
        E::AlreadyExists,
        E::NotEmpty,
        E::NotADirectory,
        E::IsADirectory,
    ]
    .iter()
    .any(|&c| e.code == c as i32)
}

fn normalized(paths: &[&str]) -> Vec<String> {
    paths
        .iter()
        .filter_map(|p| tessera_core::path::normalize(p).ok())
        .collect()
}

/// The names a request asks about.
fn asks(req: &Req) -> Vec<String> {
    match req {
        Req::Mkdir(r) => normalized(&[&r.path]),
        Req::Create(r) => normalized(&[&r.path]),
        Req::Delete(r) => normalized(&[&r.path]),
        Req::Rename(r) => normalized(&[&r.src, &r.dst]),
        Req::List(r) => normalized(&[&r.path]),
        Req::Stat(r) => normalized(&[&r.path]),
        Req::GetChunks(r) => normalized(&[&r.path]),
        Req::GetWriteTarget(r) => normalized(&[&r.path]),
        Req::ExtendFile(r) => normalized(&[&r.path]),
        Req::ReserveAppend(r) => normalized(&[&r.path]),
        Req::SetPermissions(r) => normalized(&[&r.path]),
        _ => Vec::new(),
    }
}

/// The names a record changes the standing of.
fn touches(op: &Op) -> Vec<String> {
    match op {
        Op::Mkdir(o) => normalized(&[&o.path]),
        Op::Create(o) => normalized(&[&o.path]),
        Op::Rename(o) => normalized(&[&o.src, &o.dst]),
        Op::Remove(o) => normalized(&[&o.path]),
        _ => Vec::new(),
    }
}

/// Whether `x` is below `anc`.
fn below(x: &str, anc: &str) -> bool {
    x != anc
        && (anc == "/"
            || x.strip_prefix(anc)
                .is_some_and(|rest| rest.starts_with('/')))
}

/// Whether a record touching `touched` may change a refusal `code` about `name`: the
/// name itself, or a directory above it (moved or removed, it takes the name along);
/// and for "not empty", a name below it.
fn related(touched: &str, name: &str, code: i32) -> bool {
    touched == name
        || below(name, touched)
        || (code == pb::ErrorCode::NotEmpty as i32 && below(touched, name))
}

impl Refusals {
    /// A master run on `node` starts afresh: what the last one logged and was asked dies
    /// with it.
    pub fn master_started(&mut self, node: &str) {
        self.pending.remove(node);
        self.asked.retain(|(n, _), _| n != node);
        self.refused.retain(|(n, _)| n != node);
    }

    /// Master `node`'s step: the refusals it gave, judged against the records it had
    /// logged before it; then its new records, and those now durable forgotten.
    pub fn master_step(
        &mut self,
        node: &str,
        input: &Input,
        effects: &Effects,
        master: &Master,
    ) -> Vec<String> {
        let mut found = Vec::new();
        let epoch = master.epoch();
        if self.pending.get(node).is_some_and(|(e, _)| *e != epoch) {
            // Another term's master on this replica: the last one's requests died with it.
            self.master_started(node);
        }
        let (_, pending) = self
            .pending
            .entry(node.to_string())
            .or_insert_with(|| (epoch, BTreeMap::new()));
        if let Input::Request { id, req, .. } = input
            && let Some(r) = &req.req
        {
            let names = asks(r);
            if !names.is_empty() {
                self.asked
                    .insert((node.to_string(), *id), (names, req.token));
            }
        }
        let before = effects
            .log
            .first()
            .map_or(master.last_seq(), |(s, _)| s.saturating_sub(1));
        let synced = master.synced_seq();
        for (id, resp) in &effects.replies {
            let Some((names, token)) = self.asked.remove(&(node.to_string(), *id)) else {
                continue;
            };
            let Some(e) = resp.error.as_ref().filter(|e| state_refusal(e)) else {
                continue;
            };
            if token != 0 && !self.refused.insert((node.to_string(), token)) {
                continue;
            }
            self.judged += 1;
            let unsynced = (synced < before)
                .then(|| pending.range(synced + 1..=before))
                .into_iter()
                .flatten()
                .find(|(_, touched)| {
                    touched
                        .iter()
                        .any(|t| names.iter().any(|n| related(t, n, e.code)))
                });
            if let Some((seq, touched)) = unsynced {
                found.push(format!(
                    "{node} refused request {id} on {names:?} ({:?}: {}) while record {seq}, \
                     touching {touched:?}, was not yet durable (durable through {synced}): \
                     a crash could lose the state the refusal reported",
                    pb::ErrorCode::try_from(e.code).unwrap_or(pb::ErrorCode::Unspecified),
                    e.message
                ));
            }
        }
        for (seq, rec) in &effects.log {
            if let Some(op) = &rec.op {
                let touched = touches(op);
                if !touched.is_empty() {
                    pending.insert(*seq, touched);
                }
            }
        }
        let durable = pending.split_off(&(synced + 1));
        *pending = durable;
        found
    }
}

#[cfg(test)]
mod tests {
    use super::related;

    #[test]
    fn names_relate_above_and_for_not_empty_below() {
        use tessera_core::pb::ErrorCode as E;
        let (found, empty) = (E::NotFound as i32, E::NotEmpty as i32);
        assert!(related("/a", "/a", found));
        assert!(related("/a", "/a/b", found));
        assert!(related("/", "/a", found));
        assert!(!related("/a/b", "/a", found));
        assert!(related("/a/b", "/a", empty));
        assert!(!related("/a", "/ab", found));
        assert!(!related("/ab", "/a", empty));
        assert!(!related("/a/b", "/a/c", empty));
    }
}
