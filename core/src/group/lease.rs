//! How long a leader knows it still leads, in time, so that its master extends chunk
//! leases only while no other replica can have been elected.
//!
//! Every few ticks the leader asks raft-rs for a read index with the time it asked as
//! the context; raft-rs sends it with a heartbeat round and hands it back once a
//! majority answered that round. A majority then heard from this leader after `sent`.
//! A follower that heard from a leader votes for no one else until an election timeout
//! of its own has passed since (raft-rs's `check_quorum`), and a replica that restarted
//! votes for no one until one election timeout after its start (`Replica::vote_after`),
//! as it may have heard from a leader just before. Any new leader needs a vote from a
//! member of that majority, so none is elected before `sent` plus an election timeout.
//! The leader's authority ends there, shortened by the clock-rate bound the masters
//! already assume (`max_clock_skew` over a lease period).
//!
//! A chunk lease extended before that point ends within a lease period of it, and a new
//! leader grants nothing on an existing chunk for a lease period (plus the skew and an
//! order's lifetime, `MasterConfig::order_lifetime`) after it was elected: the two never overlap. Grants are held to the
//! same point: each waits for its version reservation to commit, but a leader may learn
//! of that commit late (a process paused with the answers queued), so a grant whose
//! reservation is durable is sent only while the leader's authority lasts.

use std::time::Duration;

use crate::types::{Time, millis};

/// The context of a read index asked for authority: a marker byte and the time.
const MARK: u8 = b'L';

#[derive(Debug, Default)]
pub struct Authority {
    /// The latest time a majority is known to have heard from this leader since.
    contact: Option<Time>,
}

impl Authority {
    pub fn context(now: Time) -> Vec<u8> {
        let mut c = vec![MARK];
        c.extend_from_slice(&now.as_millis().to_be_bytes());
        c
    }

    /// A read index raft-rs handed back; false if it was not one of ours.
    pub fn confirmed(&mut self, ctx: &[u8]) -> bool {
        let Some((&MARK, t)) = ctx.split_first() else {
            return false;
        };
        let Ok(t) = <[u8; 8]>::try_from(t) else {
            return false;
        };
        let t = Time(u64::from_be_bytes(t));
        self.contact = Some(self.contact.map_or(t, |c| c.max(t)));
        true
    }

    /// Until when this leader knows it leads (Time::ZERO: not known at all).
    pub fn until(&self, election: Duration, lease: Duration, skew: Duration) -> Time {
        let Some(c) = self.contact else {
            return Time::ZERO;
        };
        // The followers' election timeout as this leader's clock may count it.
        let e = millis(election);
        let margin = e.saturating_mul(millis(skew)) / millis(lease).max(1);
        c + Duration::from_millis(e.saturating_sub(margin))
    }

    /// A new term: nothing is known.
    pub fn reset(&mut self) {
        self.contact = None;
    }
}
