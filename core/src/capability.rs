//! Chunk capabilities: a master's signed leave for one caller to read, write or append to
//! one chunk, at one version, on one chunkserver, for a short while.
//!
//! A chunkserver knows no file and no user, so what the master decided (this caller may
//! read this file) must travel with the request. Every chunk location and write target
//! the master hands out carries a [`pb::Capability`] per server, signed (HMAC-SHA256)
//! with a key that server alone holds; the server checks it locally, before it reads,
//! writes, appends or buffers a pushed piece, without asking the master.
//!
//! Keys: every key is derived from the cluster's secret (`CapabilitySecretOp`, logged
//! once, so every master replica derives the same), the server's id, the server's run
//! (`boot`, drawn at each start) and the key's number: [`server_key`]. The leader hands a
//! server its next key in a heartbeat reply once its newest is [`KEY_ROTATION`] old; the
//! server keeps a key [`KEY_LIFETIME`] from when it sent the heartbeat the reply answers,
//! and reports the keys it holds, with their ages, in every heartbeat (copies to the
//! other replicas too, so a shadow master signs as the leader does). A key taken from one
//! server forges capabilities for that server only, and a restart forgets every key.
//!
//! Time: a capability's expiry is counted from when its key reached the server, by the
//! server's clock. The master estimates a key's age as the age last reported plus the
//! time since, which is never more than its true age: so a capability lives at most its
//! lifetime (the lease duration) from when it is signed, give or take the server's clock
//! rate, which leases bound already.
//!
//! Pure: keys and the time come in as arguments (DESIGN.md: `core/` does no I/O).

use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::auth::Caller;
use crate::error::FsError;
use crate::pb;
use crate::types::{ChunkHandle, Time, Version};

/// The length of the cluster's secret and of every key.
pub const SECRET_BYTES: usize = 32;
/// Operations a capability may allow.
pub const READ: u32 = 1;
pub const WRITE: u32 = 2;
pub const APPEND: u32 = 4;
/// How long a chunkserver keeps a key. A capability signed with it expires with it.
pub const KEY_LIFETIME: Duration = Duration::from_secs(30 * 60);
/// A master hands a server a new key once its newest is this old: a capability signed
/// with the newest key then always has a lease period to run before its key expires.
pub const KEY_ROTATION: Duration = Duration::from_secs(10 * 60);
/// The most keys a chunkserver holds; taking another drops the oldest.
pub const MAX_KEYS: usize = 4;

type HmacSha256 = Hmac<Sha256>;

/// Server `server_id`'s key number `key_id` in its run `boot`, from the cluster secret.
pub fn server_key(secret: &[u8], server_id: u64, boot: u64, key_id: u64) -> [u8; SECRET_BYTES] {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
    m.update(b"tessera chunk capability key v1\0");
    m.update(&server_id.to_le_bytes());
    m.update(&boot.to_le_bytes());
    m.update(&key_id.to_le_bytes());
    m.finalize().into_bytes().into()
}

/// The MAC of every field of `cap` but `mac`, each at a fixed width or length-prefixed,
/// so no two capabilities sign alike.
fn mac_of(key: &[u8], cap: &pb::Capability) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
    m.update(b"tessera chunk capability v1\0");
    m.update(&cap.key_id.to_le_bytes());
    m.update(&cap.handle.to_le_bytes());
    m.update(&cap.version.to_le_bytes());
    m.update(&cap.ops.to_le_bytes());
    m.update(&(cap.subject.len() as u64).to_le_bytes());
    m.update(cap.subject.as_bytes());
    m.update(&cap.expires_ms.to_le_bytes());
    m.update(&(cap.secondaries.len() as u64).to_le_bytes());
    for s in &cap.secondaries {
        m.update(&(s.len() as u64).to_le_bytes());
        m.update(s.as_bytes());
    }
    m
}

/// Signs `cap` with `key`.
pub fn sign(key: &[u8], cap: &mut pb::Capability) {
    cap.mac = bytes::Bytes::copy_from_slice(&mac_of(key, cap).finalize().into_bytes());
}

/// Whether `cap`'s MAC is `key`'s (compared in constant time).
pub fn mac_matches(key: &[u8], cap: &pb::Capability) -> bool {
    mac_of(key, cap).verify_slice(&cap.mac).is_ok()
}

/// What a request asks of a chunk, for its capability to allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Want {
    pub handle: ChunkHandle,
    pub version: Version,
    /// One of [`READ`], [`WRITE`], [`APPEND`]; a push or a forwarded mutation asks for
    /// either of the last two ([`WRITE`] | [`APPEND`]).
    pub ops: u32,
}

#[derive(Clone, Debug)]
struct Key {
    id: u64,
    secret: [u8; SECRET_BYTES],
    /// When the heartbeat its reply answered was sent, by this server's clock: no later
    /// than when any master counted its age from.
    from: Time,
}

/// The keys a chunkserver holds (in memory: a restart forgets them, and its next run
/// takes keys of its own `boot`).
#[derive(Clone, Debug, Default)]
pub struct KeyRing {
    keys: Vec<Key>,
}

impl KeyRing {
    /// Takes `key`, given in the reply to a heartbeat sent at `sent_at`. A key it holds
    /// already is not taken again (its age stays); a malformed one is ignored.
    pub fn take(&mut self, now: Time, sent_at: Time, key: &pb::CapabilityKey) {
        self.expire(now);
        let Ok(secret) = <[u8; SECRET_BYTES]>::try_from(key.secret.as_ref()) else {
            tracing::warn!(
                len = key.secret.len(),
                "a capability key of the wrong length"
            );
            return;
        };
        if key.id == 0 || self.keys.iter().any(|k| k.id == key.id) {
            return;
        }
        if self.keys.len() >= MAX_KEYS {
            self.keys.remove(0);
        }
        self.keys.push(Key {
            id: key.id,
            secret,
            from: sent_at,
        });
    }

    fn expire(&mut self, now: Time) {
        self.keys
            .retain(|k| now.saturating_sub(k.from) <= KEY_LIFETIME);
    }

    /// The keys held, oldest first, with their ages: for the heartbeat.
    pub fn held(&mut self, now: Time) -> Vec<pb::HeldKey> {
        self.expire(now);
        self.keys
            .iter()
            .map(|k| pb::HeldKey {
                id: k.id,
                age_ms: now.saturating_sub(k.from).as_millis() as u64,
            })
            .collect()
    }

    /// Whether `cap` allows `caller` what `want` asks, now. Unchecked for a caller
    /// without an identity (an insecure cluster has no keys to check with).
    pub fn check(
        &self,
        now: Time,
        cap: Option<&pb::Capability>,
        want: Want,
        caller: &Caller,
    ) -> Result<(), FsError> {
        if *caller == Caller::Insecure {
            return Ok(());
        }
        let denied = |m: String| {
            Err(FsError::PermissionDenied(format!(
                "chunk {}: {m}",
                want.handle
            )))
        };
        let Some(cap) = cap else {
            return denied("no capability: ask the master for the chunk's locations".into());
        };
        let Some(key) = self.keys.iter().find(|k| k.id == cap.key_id) else {
            return denied(format!(
                "a capability signed with key {}, which this server does not hold",
                cap.key_id
            ));
        };
        let age = now.saturating_sub(key.from);
        if age > KEY_LIFETIME || age.as_millis() > u128::from(cap.expires_ms) {
            return denied("the capability has expired".into());
        }
        if !mac_matches(&key.secret, cap) {
            return denied("the capability's signature does not match".into());
        }
        if cap.handle != want.handle || cap.version != want.version {
            return denied(format!(
                "the capability is for chunk {} version {}, not version {}",
                cap.handle, cap.version, want.version
            ));
        }
        if cap.ops & want.ops == 0 {
            return denied(format!(
                "the capability allows {}, not {}",
                ops_name(cap.ops),
                ops_name(want.ops)
            ));
        }
        // A chunkserver relays a pusher's piece or a writer's mutation under the
        // pusher's or the writer's capability; anyone else, and a chunkserver reading,
        // uses only their own.
        let relayed = matches!(caller, Caller::Chunkserver { .. }) && want.ops != READ;
        if !relayed && cap.subject != caller.label() {
            return denied(format!(
                "the capability was given to {}, not to {}",
                cap.subject,
                caller.label()
            ));
        }
        Ok(())
    }
}

fn ops_name(ops: u32) -> String {
    let names: Vec<&str> = [(READ, "read"), (WRITE, "write"), (APPEND, "append")]
        .iter()
        .filter(|(b, _)| ops & b != 0)
        .map(|&(_, n)| n)
        .collect();
    if names.is_empty() {
        "nothing".into()
    } else {
        names.join(" and ")
    }
}

/// What a master knows of a server's keys: its run, and the keys it reported, with when.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerKeys {
    pub server_id: u64,
    pub boot: u64,
    /// (key id, age reported in ms), as the last heartbeat listed them.
    pub held: Vec<(u64, u64)>,
    /// When that heartbeat arrived, by the master's clock.
    pub heard: Time,
    /// A newer key this master handed the server in its reply, and when: signed with at
    /// once, before the server reports it (the server counts it from when it sent the
    /// heartbeat, before the reply was made: so from then on, it is never younger
    /// there than here). A server that did not get it refuses, and the client asks again.
    pub sent: Option<(u64, Time)>,
}

impl ServerKeys {
    pub fn from_heartbeat(now: Time, hb: &pb::HeartbeatRequest) -> ServerKeys {
        ServerKeys {
            server_id: hb.server_id,
            boot: hb.boot,
            // Bounded: a server holds at most MAX_KEYS; more is not believed.
            held: hb
                .capability_keys
                .iter()
                .rev()
                .take(MAX_KEYS)
                .rev()
                .map(|k| (k.id, k.age_ms))
                .collect(),
            heard: now,
            sent: None,
        }
    }

    /// The newest key and its estimated age now (never above its true age).
    fn newest(&self, now: Time) -> Option<(u64, u64)> {
        let since = now.saturating_sub(self.heard).as_millis() as u64;
        let reported = self
            .held
            .iter()
            .max_by_key(|(id, _)| *id)
            .map(|&(id, age)| (id, age.saturating_add(since)));
        match self.sent {
            Some((id, at)) if reported.is_none_or(|(r, _)| id > r) => {
                Some((id, now.saturating_sub(at).as_millis() as u64))
            }
            _ => reported,
        }
    }

    /// The key to hand the server in a heartbeat reply: its next, once its newest is
    /// [`KEY_ROTATION`] old or it holds none. Noted as sent.
    pub fn next_key(&mut self, secret: &[u8], now: Time) -> Option<pb::CapabilityKey> {
        if secret.is_empty() {
            return None;
        }
        // What the server reported decides, not a key sent before it reported.
        self.sent = None;
        let id = match self.newest(now) {
            Some((_, age)) if age < KEY_ROTATION.as_millis() as u64 => return None,
            Some((id, _)) => id.checked_add(1)?,
            None => 1,
        };
        self.sent = Some((id, now));
        Some(pb::CapabilityKey {
            id,
            secret: bytes::Bytes::copy_from_slice(&server_key(
                secret,
                self.server_id,
                self.boot,
                id,
            )),
        })
    }

    /// A capability for `subject` to do `ops` on the chunk at this server, for `life`.
    /// Unsigned (no `mac`: the server refuses it) when the server holds no key young
    /// enough, or the cluster has no secret yet.
    pub fn issue(
        &self,
        secret: &[u8],
        now: Time,
        life: Duration,
        want: Want,
        subject: &Caller,
    ) -> pb::Capability {
        self.issue_to_primary(secret, now, life, want, subject, Vec::new())
    }

    /// As [`ServerKeys::issue`], for a lease's primary: the capability names the lease's
    /// `secondaries`, which a write or append there must name exactly.
    pub fn issue_to_primary(
        &self,
        secret: &[u8],
        now: Time,
        life: Duration,
        want: Want,
        subject: &Caller,
        mut secondaries: Vec<String>,
    ) -> pb::Capability {
        secondaries.sort();
        let Want {
            handle,
            version,
            ops,
        } = want;
        let mut cap = pb::Capability {
            key_id: 0,
            handle,
            version,
            ops,
            subject: subject.label(),
            expires_ms: 0,
            mac: bytes::Bytes::new(),
            secondaries,
        };
        let lifetime = KEY_LIFETIME.as_millis() as u64;
        match self.newest(now) {
            Some((id, age)) if !secret.is_empty() && age < lifetime => {
                cap.key_id = id;
                cap.expires_ms = age.saturating_add(life.as_millis() as u64).min(lifetime);
                let key = server_key(secret, self.server_id, self.boot, id);
                sign(&key, &mut cap);
            }
            _ => {}
        }
        cap
    }
}

/// Gives every replica of every chunk location in `r` a capability for `subject` to read
/// it there (`keys` says what the master knows of the server at an address). Nothing for
/// a caller without an identity, on an insecure cluster.
pub fn sign_locations<'a>(
    r: &mut pb::GetChunksResponse,
    secret: &[u8],
    now: Time,
    life: Duration,
    subject: &Caller,
    keys: impl Fn(&str) -> Option<&'a ServerKeys>,
) {
    if *subject == Caller::Insecure {
        return;
    }
    let none = ServerKeys::default();
    for l in &mut r.chunks {
        l.capabilities = l
            .replicas
            .iter()
            .map(|a| {
                keys(a).unwrap_or(&none).issue(
                    secret,
                    now,
                    life,
                    Want {
                        handle: l.handle,
                        version: l.version,
                        ops: READ,
                    },
                    subject,
                )
            })
            .collect();
    }
}

/// Gives the primary and each secondary of `t` a capability for `subject` to do `ops`
/// there, for as long as the lease has to run (`life` at most).
pub fn sign_target<'a>(
    t: &mut pb::WriteTarget,
    secret: &[u8],
    now: Time,
    life: Duration,
    ops: u32,
    subject: &Caller,
    keys: impl Fn(&str) -> Option<&'a ServerKeys>,
) {
    if *subject == Caller::Insecure {
        return;
    }
    let none = ServerKeys::default();
    let life = life.min(Duration::from_millis(t.lease_expires_in_ms));
    let want = Want {
        handle: t.handle,
        version: t.version,
        ops,
    };
    let primary = keys(&t.primary).unwrap_or(&none).issue_to_primary(
        secret,
        now,
        life,
        want,
        subject,
        t.secondaries.clone(),
    );
    t.capabilities = std::iter::once(primary)
        .chain(t.secondaries.iter().map(|a| {
            keys(a)
                .unwrap_or(&none)
                .issue(secret, now, life, want, subject)
        }))
        .collect();
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: [u8; 32] = [7; 32];

    fn alice() -> Caller {
        Caller::Client {
            user: "alice".into(),
            groups: vec![],
        }
    }

    fn ring_with_key(at: Time) -> (KeyRing, ServerKeys) {
        let mut keys = ServerKeys {
            server_id: 42,
            boot: 9,
            held: vec![],
            heard: at,
            sent: None,
        };
        let k = keys
            .next_key(&SECRET, at)
            .expect("a server without keys gets one");
        let mut ring = KeyRing::default();
        ring.take(at, at, &k);
        keys.held = ring.held(at).iter().map(|k| (k.id, k.age_ms)).collect();
        (ring, keys)
    }

    const WANT: Want = Want {
        handle: 5,
        version: 3,
        ops: READ,
    };

    #[test]
    fn a_capability_allows_what_it_names_to_whom_it_names_until_it_expires() {
        let t0 = Time::from_millis(1_000);
        let (ring, keys) = ring_with_key(t0);
        let life = Duration::from_secs(60);
        let cap = keys.issue(
            &SECRET,
            t0,
            life,
            Want {
                handle: 5,
                version: 3,
                ops: READ | WRITE,
            },
            &alice(),
        );
        assert_eq!(ring.check(t0, Some(&cap), WANT, &alice()), Ok(()));
        let later = t0 + life;
        assert_eq!(ring.check(later, Some(&cap), WANT, &alice()), Ok(()));
        // A chunkserver relays alice's mutation under her capability, but reads only
        // under its own.
        let relay = Caller::Chunkserver { name: "cs1".into() };
        let relayed = Want { ops: WRITE, ..WANT };
        assert_eq!(ring.check(t0, Some(&cap), relayed, &relay), Ok(()));
        assert!(ring.check(t0, Some(&cap), WANT, &relay).is_err());
        let refused = |now: Time, cap: Option<&pb::Capability>, want: Want, who: &Caller| match ring
            .check(now, cap, want, who)
        {
            Err(FsError::PermissionDenied(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(
            refused(later + Duration::from_millis(1), Some(&cap), WANT, &alice())
                .contains("expired")
        );
        assert!(refused(t0, None, WANT, &alice()).contains("no capability"));
        let bob = Caller::Client {
            user: "bob".into(),
            groups: vec![],
        };
        assert!(refused(t0, Some(&cap), WANT, &bob).contains("given to client:alice"));
        for want in [
            Want { handle: 6, ..WANT },
            Want { version: 4, ..WANT },
            Want { version: 2, ..WANT },
        ] {
            assert!(refused(t0, Some(&cap), want, &alice()).contains("the capability is for"));
        }
        assert!(
            refused(
                t0,
                Some(&cap),
                Want {
                    ops: APPEND,
                    ..WANT
                },
                &alice()
            )
            .contains("allows read and write")
        );
        // Any field altered, the signature no longer matches.
        let mut altered = vec![];
        for f in 0..6 {
            let mut c = cap.clone();
            match f {
                0 => c.handle = 6,
                1 => c.version = 4,
                2 => c.ops |= APPEND,
                3 => c.subject = "client:bob".into(),
                4 => c.expires_ms += 1,
                _ => {
                    let mut m = c.mac.to_vec();
                    m[0] ^= 1;
                    c.mac = m.into();
                }
            }
            altered.push(c);
        }
        for c in &altered {
            let want = Want {
                handle: c.handle,
                version: c.version,
                ops: READ,
            };
            assert!(
                refused(t0, Some(c), want, &alice()).contains("signature"),
                "{c:?}"
            );
        }
        // Insecure clusters do not check.
        assert_eq!(ring.check(t0, None, WANT, &Caller::Insecure), Ok(()));
    }

    #[test]
    fn a_key_is_one_servers_and_one_runs() {
        let t0 = Time::from_millis(1_000);
        let (ring, keys) = ring_with_key(t0);
        let life = Duration::from_secs(60);
        for other in [
            ServerKeys {
                server_id: 43,
                ..keys.clone()
            },
            ServerKeys {
                boot: 10,
                ..keys.clone()
            },
        ] {
            let cap = other.issue(&SECRET, t0, life, WANT, &alice());
            assert!(
                matches!(ring.check(t0, Some(&cap), WANT, &alice()), Err(FsError::PermissionDenied(m)) if m.contains("signature"))
            );
        }
        let cap = keys.issue(&[8; 32], t0, life, WANT, &alice());
        assert!(ring.check(t0, Some(&cap), WANT, &alice()).is_err());
    }

    #[test]
    fn keys_rotate_expire_and_are_bounded() {
        let t0 = Time::from_millis(1_000);
        let (mut ring, mut keys) = ring_with_key(t0);
        assert_eq!(keys.next_key(&SECRET, t0), None, "a young key is kept");
        let t1 = t0 + KEY_ROTATION;
        let k2 = keys
            .next_key(&SECRET, t1)
            .expect("an old key is followed by another");
        assert_eq!(k2.id, 2);
        // The key just sent signs at once: a server that has not taken it refuses (the
        // client asks again), one that has, accepts.
        let cap = keys.issue(&SECRET, t1, KEY_LIFETIME, WANT, &alice());
        assert_eq!(
            (cap.key_id, cap.expires_ms),
            (2, KEY_LIFETIME.as_millis() as u64)
        );
        assert!(ring.check(t1, Some(&cap), WANT, &alice()).is_err());
        ring.take(t1, t1, &k2);
        ring.take(t1, t1, &k2);
        keys.held = ring.held(t1).iter().map(|k| (k.id, k.age_ms)).collect();
        keys.heard = t1;
        assert_eq!(
            keys.held,
            vec![(1, KEY_ROTATION.as_millis() as u64), (2, 0)]
        );
        let cap = keys.issue(&SECRET, t1, Duration::from_secs(60), WANT, &alice());
        assert_eq!((cap.key_id, cap.expires_ms), (2, 60_000));
        assert_eq!(ring.check(t1, Some(&cap), WANT, &alice()), Ok(()));
        // Past its lifetime a key is gone, and so is every capability it signed.
        let old = ServerKeys {
            held: vec![(1, 0)],
            heard: t0,
            sent: None,
            ..keys.clone()
        }
        .issue(&SECRET, t0, KEY_LIFETIME, WANT, &alice());
        let t2 = t0 + KEY_LIFETIME + Duration::from_millis(1);
        assert!(ring.check(t2, Some(&old), WANT, &alice()).is_err());
        assert_eq!(
            ring.held(t2).iter().map(|k| k.id).collect::<Vec<_>>(),
            vec![2]
        );
        for id in 3..10 {
            ring.take(
                t2,
                t2,
                &pb::CapabilityKey {
                    id,
                    secret: vec![1; 32].into(),
                },
            );
        }
        assert_eq!(ring.held(t2).len(), MAX_KEYS);
        ring.take(
            t2,
            t2,
            &pb::CapabilityKey {
                id: 20,
                secret: vec![1; 31].into(),
            },
        );
        assert!(ring.held(t2).iter().all(|k| k.id != 20));
    }

    #[test]
    fn a_capability_without_a_key_is_unsigned_and_refused() {
        let t0 = Time::from_millis(1_000);
        let mut keys = ServerKeys::default();
        let cap = keys.issue(&SECRET, t0, Duration::from_secs(60), WANT, &alice());
        assert!(cap.mac.is_empty());
        let (ring, _) = ring_with_key(t0);
        assert!(ring.check(t0, Some(&cap), WANT, &alice()).is_err());
        assert_eq!(keys.next_key(&[], t0), None, "no secret, no keys");
    }
}
