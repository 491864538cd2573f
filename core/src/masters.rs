//! Which master replica to ask. A client or chunkserver is given every replica's
//! address (`a,b,c`); it asks the one it believes leads, follows a "not the leader, try
//! X" answer, and moves on to the next address when the one it asked cannot be reached
//! or knows no leader. One address is a master that runs alone: nothing changes for it.

use std::sync::{Arc, Mutex};

use crate::error::FsError;

#[derive(Clone, Debug)]
pub struct Masters(Arc<Mutex<State>>);

#[derive(Debug)]
struct State {
    addrs: Vec<String>,
    /// The address asked now (one of `addrs`, or a leader a replica named).
    current: String,
}

impl Masters {
    /// From a comma-separated list of addresses (spaces around them ignored).
    pub fn parse(list: &str) -> Masters {
        let mut addrs: Vec<String> = list
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(String::from)
            .collect();
        if addrs.is_empty() {
            addrs.push(list.to_string());
        }
        let current = addrs[0].clone();
        Masters(Arc::new(Mutex::new(State { addrs, current })))
    }

    /// The replica to ask now.
    pub fn current(&self) -> String {
        self.0.lock().expect("masters lock").current.clone()
    }

    /// Every replica's address, as given.
    pub fn all(&self) -> Vec<String> {
        self.0.lock().expect("masters lock").addrs.clone()
    }

    pub fn len(&self) -> usize {
        self.0.lock().expect("masters lock").addrs.len()
    }

    /// Never: a list parses to at least one address.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// `asked` could not be reached (or timed out): try the next replica.
    pub fn unreachable(&self, asked: &str) {
        let mut s = self.0.lock().expect("masters lock");
        if s.current == asked {
            s.current = next_after(&s.addrs, asked);
        }
    }

    /// `asked` answered that it does not lead and named `leader` ("" if it knows none).
    /// Returns whether there is a new replica to ask at once (a named leader not asked
    /// just now); otherwise the next replica is to be asked after a pause.
    pub fn not_leader(&self, asked: &str, leader: &str) -> bool {
        let mut s = self.0.lock().expect("masters lock");
        if s.current != asked {
            // Another call moved on already.
            return true;
        }
        if !leader.is_empty() && leader != asked {
            s.current = leader.to_string();
            return true;
        }
        if leader.is_empty() {
            s.current = next_after(&s.addrs, asked);
        }
        false
    }

    /// Applies what a master's answer says about where the leader is: `Ok` leaves the
    /// current replica; an error is passed on. Returns whether to ask again at once.
    pub fn after(&self, asked: &str, e: &FsError) -> bool {
        match e {
            FsError::NotLeader(l) => self.not_leader(asked, l),
            _ => false,
        }
    }
}

fn next_after(addrs: &[String], asked: &str) -> String {
    match addrs.iter().position(|a| a == asked) {
        Some(i) => addrs[(i + 1) % addrs.len()].clone(),
        // A leader named by a replica, not in the list, is gone: start the list over.
        None => addrs[0].clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_the_named_leader_and_moves_on_from_silent_replicas() {
        let m = Masters::parse("a:1, b:1,c:1");
        assert_eq!(m.len(), 3);
        assert_eq!(m.current(), "a:1");
        assert!(
            m.not_leader("a:1", "c:1"),
            "a named leader is asked at once"
        );
        assert_eq!(m.current(), "c:1");
        m.unreachable("c:1");
        assert_eq!(m.current(), "a:1");
        assert!(!m.not_leader("a:1", ""), "no leader known: pause");
        assert_eq!(m.current(), "b:1");
        assert!(
            !m.not_leader("b:1", "b:1"),
            "a leader catching up: pause, ask again"
        );
        assert_eq!(m.current(), "b:1");
        m.unreachable("a:1");
        assert_eq!(m.current(), "b:1", "a stale failure moves nothing");
        let one = Masters::parse("solo:9");
        one.unreachable("solo:9");
        assert_eq!(one.current(), "solo:9");
    }
}
