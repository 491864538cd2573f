//! Messages carried back in answers. A replica's messages to another go as calls of
//! their own, and the answer to such a call used to say nothing. But nearly every message
//! a follower sends is an answer to the leader that just called it (an append response,
//! a heartbeat response). So a call may ask for its answer to carry messages back
//! (`RaftBatch::answers`): the receiver holds the answer until whatever the call made it
//! write is durable, and puts in it the messages it has for the caller at that moment.
//! That is half the calls between a leader and its followers, and one call fewer on the
//! path of every mutation (the leader's append out, the follower's response back in the
//! same call's answer).
//!
//! Nothing is held back for an answer: a message goes when it would have gone anyway,
//! in an answer if one to its receiver is due then, and as a call of its own otherwise.
//! An answer lost with its call (a timeout, a cut link) loses its messages, as a lost call
//! would: raft-rs sends again what is not answered.

use crate::master::RequestId;
use crate::pb;

/// The most a batch of messages put into one answer takes, encoded (the messages past it
/// go as calls): an answer is held in memory beside the others.
pub const ANSWER_BYTES: usize = 1 << 20;

/// The largest call whose answer is held: the transport counts a request's bytes
/// against its memory bound until it is answered, and a follower catching up is sent
/// many large appends at once. Those are answered at once; their responses go as calls.
pub const HOLD_BYTES: usize = 64 << 10;

#[derive(Debug)]
struct Held {
    id: RequestId,
    /// The replica that called (the sender its messages named).
    peer: u64,
    /// The Persist the answer waits for (0: none); `None` until the end of the step it
    /// came in.
    after: Option<u64>,
}

/// Calls from other replicas whose answers are held (see the module's comment).
#[derive(Debug, Default)]
pub struct Answers {
    held: Vec<Held>,
    /// Every Persist up to and including this number is durable.
    durable: u64,
}

impl Answers {
    /// Call `id` from replica `peer` asked for its answer to carry messages back.
    pub fn hold(&mut self, id: RequestId, peer: u64) {
        self.held.push(Held {
            id,
            peer,
            after: None,
        });
    }

    /// Every Persist up to and including `number` is durable.
    pub fn persisted(&mut self, number: u64) {
        self.durable = self.durable.max(number);
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// At the end of a step. The calls that came in this step wait for `pending`, the
    /// last Persist not yet durable (what they made this replica write is in it or
    /// before it). The answers now due are returned, each with the messages `send`
    /// held for its caller (taken out of `send`): all of them in the last answer due to
    /// each caller, within [`ANSWER_BYTES`], and none with a snapshot.
    pub fn due(
        &mut self,
        pending: Option<u64>,
        send: &mut Vec<(String, pb::RaftMessage)>,
    ) -> Vec<(RequestId, pb::RaftBatch)> {
        for h in &mut self.held {
            h.after.get_or_insert(pending.unwrap_or(0));
        }
        let durable = self.durable;
        let (due, held): (Vec<Held>, Vec<Held>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.after.is_some_and(|a| a <= durable));
        self.held = held;
        let mut out: Vec<(RequestId, pb::RaftBatch)> = Vec::with_capacity(due.len());
        for (i, h) in due.iter().enumerate() {
            let mut batch = pb::RaftBatch::default();
            let last_for_peer = !due[i + 1..].iter().any(|later| later.peer == h.peer);
            if last_for_peer {
                // The first of the caller's messages, in order, up to a snapshot or the
                // bound: the rest go as calls, after the answer.
                let (mut size, mut full) = (0, false);
                send.retain(|(_, m)| {
                    use prost::Message as _;
                    if m.to != h.peer {
                        return true;
                    }
                    let n = m.encoded_len() + 8;
                    full = full || m.snapshot.is_some() || size + n > ANSWER_BYTES;
                    if full {
                        return true;
                    }
                    size += n;
                    batch.messages.push(m.clone());
                    false
                });
            }
            out.push((h.id, batch));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(to: u64, index: u64) -> (String, pb::RaftMessage) {
        (
            format!("m{to}"),
            pb::RaftMessage {
                to,
                index,
                ..Default::default()
            },
        )
    }

    /// An answer waits for the Persist that was pending when its call came, then carries
    /// every message then going to its caller (in the last answer due to it), and
    /// nothing for anyone else.
    #[test]
    fn an_answer_waits_for_its_write_and_carries_what_goes_to_its_caller() {
        let mut a = Answers::default();
        a.hold(1, 2);
        // Step of the call: its append made Persist 5, not yet durable; its caller's
        // heartbeat response goes as a call.
        let mut send = vec![msg(2, 1)];
        assert!(a.due(Some(5), &mut send).is_empty());
        assert_eq!(send.len(), 1);
        // A second call from 2 and one from 3, while Persist 5 is still pending: they
        // wait for it too.
        a.hold(2, 2);
        a.hold(3, 3);
        let mut send = vec![msg(3, 7)];
        let due = a.due(Some(5), &mut send);
        assert!(due.is_empty(), "Persist 5 is still pending: {due:?}");
        a.persisted(4);
        assert!(a.due(None, &mut send).is_empty());
        a.persisted(5);
        let mut send = vec![msg(2, 9), msg(3, 7), msg(2, 10), msg(4, 1)];
        let due = a.due(None, &mut send);
        let ids: Vec<u64> = due.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, vec![1, 2, 3]);
        assert!(due[0].1.messages.is_empty(), "not the last answer to 2");
        let idx: Vec<u64> = due[1].1.messages.iter().map(|m| m.index).collect();
        assert_eq!(idx, vec![9, 10]);
        assert_eq!(due[2].1.messages.len(), 1);
        assert_eq!(send.len(), 1, "the message to 4 goes as a call");
        assert!(a.is_empty());
    }

    /// A snapshot never rides an answer, an answer takes no more than its bound, and the
    /// messages it carries are the first ones, in order: those after go as calls.
    #[test]
    fn an_answer_carries_no_snapshot_and_stays_within_its_bound() {
        let big = pb::RaftMessage {
            to: 2,
            context: vec![0; ANSWER_BYTES / 2 + 1].into(),
            ..Default::default()
        };
        let snap = pb::RaftMessage {
            to: 2,
            snapshot: Some(Default::default()),
            ..Default::default()
        };
        let mut a = Answers::default();
        a.hold(1, 2);
        let mut send = vec![
            msg(2, 1),
            ("m2".to_string(), big.clone()),
            ("m2".to_string(), big),
            msg(2, 4),
        ];
        let due = a.due(None, &mut send);
        let idx: Vec<u64> = due[0].1.messages.iter().map(|m| m.index).collect();
        assert_eq!(idx, vec![1, 0], "the first two fit");
        assert_eq!(
            send.len(),
            2,
            "the third is past the bound, and the fourth after it"
        );
        a.hold(2, 2);
        let mut send = vec![msg(2, 1), ("m2".to_string(), snap), msg(2, 3)];
        let due = a.due(None, &mut send);
        assert_eq!(due[0].1.messages.len(), 1);
        assert_eq!(send.len(), 2);
        assert!(send[0].1.snapshot.is_some());
    }
}
