//! Who sent a request, and what each kind of sender may ask.
//!
//! The transport authenticates every connection (mutual TLS, a certificate from the
//! cluster's authority naming its holder's role and identity: `runtime-real`'s `tls`)
//! and hands each request to its node with the [`Caller`] it proved to be. The state
//! machines decide what that caller may do here, so the simulator, whose network names
//! each message's sender the same way, runs the very code the binary runs.
//!
//! What each role may send (DESIGN.md, "Trust model"):
//! - a master replica: orders to chunkservers (versions, clones, revocations, mends) and
//!   raft messages for its own id;
//! - a chunkserver: heartbeats and corruption reports (for the server its certificate
//!   names: `master/heartbeat.rs` binds the two), mutations forwarded to other replicas,
//!   pieces pushed along a chain, reads of another copy (a clone's or a mend's source);
//! - a client: namespace calls, chunk reads, writes, appends and pushes;
//! - an admin: what a client may, and admin calls (`report`, `fsck`, member changes).
//!
//! Checking a role is not all: what a message claims that the receiver can check (a
//! server id, an epoch, a length) is checked against the receiver's own state as well,
//! even from an authenticated peer.

use std::fmt;

use crate::error::FsError;
use crate::pb::{chunk_request, master_request};

/// The identity a request's transport authenticated.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Caller {
    /// Nobody was authenticated: the cluster runs with `--insecure`, and every request is
    /// taken as it comes (as on a cluster from before authentication). A secured
    /// transport never hands a request on under this name.
    Insecure,
    /// A master replica (its replica id; a master that runs alone is replica 1).
    Master { replica: u64 },
    /// A chunkserver, by the name its certificate gives it (its host's name, say). The
    /// server id its heartbeats carry is bound to that name by the master.
    Chunkserver { name: String },
    /// A user, and the groups the certificate gives it.
    Client { user: String, groups: Vec<String> },
    /// An administrator: a client that may do anything, and admin calls.
    Admin { name: String },
}

/// The role part of a [`Caller`], for a message's rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Master,
    Chunkserver,
    Client,
    Admin,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Master => "master",
            Role::Chunkserver => "chunkserver",
            Role::Client => "client",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "master" => Role::Master,
            "chunkserver" => Role::Chunkserver,
            "client" => Role::Client,
            "admin" => Role::Admin,
            _ => return None,
        })
    }
}

/// The kind of server a call is made to. A caller knows which it means to reach (a
/// master request goes to a master, a chunk request to a chunkserver), and a secured
/// transport checks that the server it reached holds a certificate of that role: a
/// chunkserver's certificate cannot answer a heartbeat as the master, nor a master's
/// serve chunk reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServerRole {
    Master,
    Chunkserver,
}

impl ServerRole {
    pub fn role(self) -> Role {
        match self {
            ServerRole::Master => Role::Master,
            ServerRole::Chunkserver => Role::Chunkserver,
        }
    }
}

/// The longest name a certificate may give (a user, a group, a chunkserver).
pub const MAX_NAME: usize = 64;
/// The most groups a client's certificate may name.
pub const MAX_GROUPS: usize = 32;

/// Whether `s` may be a user, group or chunkserver name: 1 to [`MAX_NAME`] characters of
/// letters, digits, `.`, `_` and `-`, not starting with `-` or `.`. Names travel in
/// certificates and traces as [`Caller::label`], so they hold none of its separators.
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && !s.starts_with(['-', '.'])
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl Caller {
    pub fn role(&self) -> Option<Role> {
        Some(match self {
            Caller::Insecure => return None,
            Caller::Master { .. } => Role::Master,
            Caller::Chunkserver { .. } => Role::Chunkserver,
            Caller::Client { .. } => Role::Client,
            Caller::Admin { .. } => Role::Admin,
        })
    }

    /// The caller in one line, as certificates and traces carry it: `master:3`,
    /// `chunkserver:rack1-07`, `client:alice:staff,ops` (groups after a second colon),
    /// `admin:root`; the empty string for [`Caller::Insecure`]. [`Caller::parse`] reads
    /// it back.
    pub fn label(&self) -> String {
        match self {
            Caller::Insecure => String::new(),
            Caller::Master { replica } => format!("master:{replica}"),
            Caller::Chunkserver { name } => format!("chunkserver:{name}"),
            Caller::Client { user, groups } if groups.is_empty() => format!("client:{user}"),
            Caller::Client { user, groups } => format!("client:{user}:{}", groups.join(",")),
            Caller::Admin { name } => format!("admin:{name}"),
        }
    }

    /// Reads a [`Caller::label`]; an error says what is wrong with it.
    pub fn parse(label: &str) -> Result<Caller, String> {
        if label.is_empty() {
            return Ok(Caller::Insecure);
        }
        let (role, rest) = label
            .split_once(':')
            .ok_or_else(|| format!("{label:?} names no role (role:name)"))?;
        let role = Role::parse(role)
            .ok_or_else(|| format!("{role:?} is no role (master, chunkserver, client or admin)"))?;
        let name_ok = |n: &str| {
            if valid_name(n) {
                Ok(n.to_string())
            } else {
                Err(format!(
                    "{n:?} is no valid name (1-{MAX_NAME} of letters, digits, '.', '_', '-')"
                ))
            }
        };
        Ok(match role {
            Role::Master => {
                let replica = rest
                    .parse::<u64>()
                    .ok()
                    .filter(|&r| r > 0)
                    .ok_or_else(|| format!("{rest:?} is no master replica id (1 and up)"))?;
                Caller::Master { replica }
            }
            Role::Chunkserver => Caller::Chunkserver {
                name: name_ok(rest)?,
            },
            Role::Admin => Caller::Admin {
                name: name_ok(rest)?,
            },
            Role::Client => {
                let (user, groups) = match rest.split_once(':') {
                    Some((u, g)) => (u, g.split(',').map(name_ok).collect::<Result<_, _>>()?),
                    None => (rest, Vec::new()),
                };
                let groups: Vec<String> = groups;
                if groups.len() > MAX_GROUPS {
                    return Err(format!("{} groups, more than {MAX_GROUPS}", groups.len()));
                }
                Caller::Client {
                    user: name_ok(user)?,
                    groups,
                }
            }
        })
    }

    fn is(&self, roles: &[Role]) -> bool {
        match self.role() {
            None => true,
            Some(r) => roles.contains(&r),
        }
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Caller::Insecure => f.write_str("an unauthenticated peer"),
            c => write!(f, "{}", c.label()),
        }
    }
}

/// Refuses `caller` unless it has one of `roles`: what `what` allows.
fn allow(caller: &Caller, roles: &[Role], what: &str) -> Result<(), FsError> {
    if caller.is(roles) {
        return Ok(());
    }
    let names: Vec<&str> = roles.iter().map(|r| r.name()).collect();
    Err(FsError::PermissionDenied(format!(
        "{caller} may not send {what}: only {}",
        names.join(" or ")
    )))
}

const USERS: &[Role] = &[Role::Client, Role::Admin];

/// Whether `caller` may send a master request of this kind. What the request claims
/// beyond its kind (a heartbeat's server, a raft message's sender) is checked where it
/// is handled.
pub fn master_request(caller: &Caller, req: &master_request::Req) -> Result<(), FsError> {
    use master_request::Req;
    match req {
        Req::Mkdir(_) => allow(caller, USERS, "mkdir"),
        Req::Create(_) => allow(caller, USERS, "create"),
        Req::Delete(_) => allow(caller, USERS, "delete"),
        Req::Rename(_) => allow(caller, USERS, "rename"),
        Req::List(_) => allow(caller, USERS, "list"),
        Req::Stat(_) => allow(caller, USERS, "stat"),
        Req::GetChunks(_) => allow(caller, USERS, "get_chunks"),
        Req::GetWriteTarget(_) => allow(caller, USERS, "get_write_target"),
        Req::ExtendFile(_) => allow(caller, USERS, "extend_file"),
        Req::ReserveAppend(_) => allow(caller, USERS, "reserve_append"),
        // Which of a user's may change is the namespace's to say (`master::perms`).
        Req::SetPermissions(_) => allow(caller, USERS, "set_permissions"),
        Req::Heartbeat(_) => allow(caller, &[Role::Chunkserver], "heartbeats"),
        Req::ReportCorrupt(_) => allow(caller, &[Role::Chunkserver], "corruption reports"),
        Req::Report(_) => allow(caller, &[Role::Admin], "report (tessera admin report)"),
        Req::Fsck(_) => allow(caller, &[Role::Admin], "fsck (tessera admin fsck)"),
        Req::Raft(_) | Req::RaftBatch(_) => allow(caller, &[Role::Master], "raft messages"),
        // Which replica leads, for anyone who needs to find it.
        Req::ReplicaStatus(_) => Ok(()),
        Req::ChangeMembers(_) => allow(
            caller,
            &[Role::Admin],
            "member changes (tessera admin masters)",
        ),
    }
}

/// Whether `caller` may send a chunk request of this kind.
pub fn chunk_request(caller: &Caller, req: &chunk_request::Req) -> Result<(), FsError> {
    use chunk_request::Req;
    // A chunkserver reads another's copy as a clone's or a mend's source, and passes a
    // pushed piece on along the chain.
    const READERS: &[Role] = &[Role::Client, Role::Admin, Role::Chunkserver];
    const ORDERS: &[Role] = &[Role::Master];
    match req {
        Req::Read(_) => allow(caller, READERS, "chunk reads"),
        Req::Push(_) => allow(caller, READERS, "pushed data"),
        Req::Write(_) => allow(caller, USERS, "chunk writes"),
        Req::Append(_) => allow(caller, USERS, "record appends"),
        Req::Apply(_) => allow(
            caller,
            &[Role::Chunkserver],
            "mutations to a secondary (a primary forwards them)",
        ),
        Req::SetVersion(_) => allow(caller, ORDERS, "version changes"),
        Req::Clone(_) => allow(caller, ORDERS, "clone orders"),
        Req::RevokeLease(_) => allow(caller, ORDERS, "lease revocations"),
        Req::Mend(_) => allow(caller, ORDERS, "mend orders"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb;

    #[test]
    fn a_label_reads_back_as_its_caller() {
        for c in [
            Caller::Insecure,
            Caller::Master { replica: 3 },
            Caller::Chunkserver {
                name: "rack1-07".into(),
            },
            Caller::Client {
                user: "alice".into(),
                groups: vec![],
            },
            Caller::Client {
                user: "bob".into(),
                groups: vec!["staff".into(), "ops".into()],
            },
            Caller::Admin {
                name: "root".into(),
            },
        ] {
            assert_eq!(Caller::parse(&c.label()), Ok(c.clone()), "{}", c.label());
        }
    }

    #[test]
    fn bad_labels_are_refused() {
        for l in [
            "master",
            "master:0",
            "master:x",
            "king:x",
            "client:",
            "client:a b",
            "client:alice:",
            "client:alice:st:ff",
            "chunkserver:-x",
            "admin:.hidden",
        ] {
            assert!(Caller::parse(l).is_err(), "{l} was taken");
        }
        let many = format!("client:u:{}", vec!["g"; MAX_GROUPS + 1].join(","));
        assert!(Caller::parse(&many).is_err());
        assert!(Caller::parse(&format!("admin:{}", "a".repeat(MAX_NAME + 1))).is_err());
    }

    #[test]
    fn orders_come_only_from_masters_and_forwards_only_from_chunkservers() {
        let client = Caller::Client {
            user: "u".into(),
            groups: vec![],
        };
        let cs = Caller::Chunkserver { name: "c".into() };
        let master = Caller::Master { replica: 1 };
        let order = chunk_request::Req::SetVersion(pb::SetVersionRequest::default());
        let apply = chunk_request::Req::Apply(pb::ApplyMutationRequest::default());
        let read = chunk_request::Req::Read(pb::ReadChunkRequest::default());
        assert!(chunk_request(&client, &order).is_err());
        assert!(chunk_request(&cs, &order).is_err());
        assert!(chunk_request(&master, &order).is_ok());
        assert!(chunk_request(&client, &apply).is_err());
        assert!(chunk_request(&cs, &apply).is_ok());
        assert!(chunk_request(&client, &read).is_ok());
        assert!(chunk_request(&master, &read).is_err());
        assert!(chunk_request(&Caller::Insecure, &order).is_ok());
        let hb = master_request::Req::Heartbeat(pb::HeartbeatRequest::default());
        assert!(master_request(&client, &hb).is_err());
        assert!(master_request(&cs, &hb).is_ok());
        let fsck = master_request::Req::Fsck(pb::FsckRequest::default());
        assert!(master_request(&client, &fsck).is_err());
        let admin = Caller::Admin { name: "a".into() };
        assert!(master_request(&admin, &fsck).is_ok());
        let e = master_request(&client, &hb).unwrap_err();
        assert_eq!(
            e.to_string(),
            "permission denied: client:u may not send heartbeats: only chunkserver"
        );
    }
}
