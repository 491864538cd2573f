//! Owners, groups and permission bits, as POSIX and HDFS keep them.
//!
//! Every file and directory has an owner, a group and nine bits (read, write, search for
//! its owner, for the members of its group, for everyone else), and the sticky bit. The
//! master checks them for every namespace call and before it hands out a capability,
//! the leader and a shadow alike ([`Check`]), against the caller its transport
//! authenticated (`crate::auth::Caller`):
//! - every directory on a path's way must be searchable (x);
//! - a listing needs r and x on the directory; a file's chunk locations r on the file; a
//!   write target, a length extension or an append reservation w on the file;
//! - a new entry, a delete or a rename needs w and x on each parent it changes; in a
//!   sticky directory only the owner of an entry (or of the directory) may delete or
//!   move it; deleting a directory with what is in it needs r, w and x on every
//!   directory below, and their sticky bits are kept the same way;
//! - only an entry's owner may change its bits, or give it a group the owner is in;
//!   only the superuser gives an entry to another owner.
//!
//! An admin, and every caller of an insecure cluster, is the superuser. A new entry is
//! its creator's, in its parent's group (as BSD and HDFS do), with the bits the client
//! asked for (its umask applied there).
//!
//! Owner and group names are kept once each ([`Names`]); an entry holds their ids, so it
//! costs 10 bytes more, not two strings.

use std::fmt::Write as _;

use super::namespace::{Found, Namespace, Node};
use crate::auth::{self, Caller};
use crate::error::FsError;
use crate::pb;
use crate::types::HashMap;

pub type NameId = u32;

/// The superuser's name: the owner of what was made before permissions, and of what an
/// insecure cluster's callers make.
pub const SUPERUSER: &str = "root";
/// Distinct owner and group names a namespace keeps at most.
pub const MAX_NAMES: usize = 1 << 20;
/// The sticky bit: in a directory with it, only an entry's owner (or the directory's)
/// may delete or move the entry.
pub const STICKY: u32 = 0o1000;
/// The bits a mode may have.
pub const MAX_MODE: u32 = 0o1777;
pub const DEFAULT_DIR_MODE: u32 = 0o755;
pub const DEFAULT_FILE_MODE: u32 = 0o644;

const R: u16 = 4;
const W: u16 = 2;
const X: u16 = 1;

/// An entry's owner, group and bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Perms {
    pub owner: NameId,
    pub group: NameId,
    pub mode: u16,
}

impl Perms {
    /// A directory made before permissions (and the root of such a cluster).
    pub const LEGACY_DIR: Perms = Perms {
        owner: 0,
        group: 0,
        mode: DEFAULT_DIR_MODE as u16,
    };
    /// A file made before permissions.
    pub const LEGACY_FILE: Perms = Perms {
        owner: 0,
        group: 0,
        mode: DEFAULT_FILE_MODE as u16,
    };
}

/// Refuses a mode with bits beyond [`MAX_MODE`] (set-id bits have no meaning here).
pub fn valid_mode(mode: u32) -> Result<u16, FsError> {
    if mode > MAX_MODE {
        return Err(FsError::InvalidArgument(format!(
            "mode {mode:o} has bits beyond {MAX_MODE:o}"
        )));
    }
    Ok(mode as u16)
}

/// `rwxr-x--T` for a mode, as `ls -l` prints it (without the type letter).
pub fn mode_string(mode: u32) -> String {
    let mut s = String::with_capacity(9);
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        let x = bits & 1 != 0;
        s.push(match (shift, x, mode & STICKY != 0) {
            (0, true, true) => 't',
            (0, false, true) => 'T',
            (_, true, _) => 'x',
            _ => '-',
        });
    }
    s
}

/// Reads a mode as `chmod` takes it: octal digits (`755`, `1777`).
pub fn parse_mode(s: &str) -> Result<u32, String> {
    let mode = u32::from_str_radix(s, 8).map_err(|_| format!("{s:?} is not an octal mode"))?;
    if s.is_empty() || s.len() > 4 || mode > MAX_MODE {
        return Err(format!(
            "{s:?}: a mode is up to four octal digits, at most 1777"
        ));
    }
    Ok(mode)
}

/// Every owner and group name, each kept once, by id. Id 0 is [`SUPERUSER`]. Names are
/// never dropped: there are as many as certificates and `chown`s have named.
#[derive(Clone, Debug)]
pub struct Names {
    list: Vec<Box<str>>,
    ids: HashMap<Box<str>, NameId>,
}

impl Default for Names {
    fn default() -> Names {
        let mut ids = HashMap::default();
        ids.insert(Box::from(SUPERUSER), 0);
        Names {
            list: vec![Box::from(SUPERUSER)],
            ids,
        }
    }
}

impl Names {
    pub fn id(&self, name: &str) -> Option<NameId> {
        self.ids.get(name).copied()
    }

    pub fn name(&self, id: NameId) -> &str {
        &self.list[id as usize]
    }

    /// The id of `name`, kept now if it is new.
    pub fn intern(&mut self, name: &str) -> Result<NameId, FsError> {
        if let Some(id) = self.id(name) {
            return Ok(id);
        }
        if !auth::valid_name(name) {
            return Err(FsError::InvalidArgument(format!(
                "{name:?} is not a user or group name (1 to {} letters, digits, '.', '_' \
                 or '-', not starting with '-' or '.')",
                auth::MAX_NAME
            )));
        }
        if self.list.len() >= MAX_NAMES {
            return Err(FsError::NoSpace(format!(
                "the namespace holds {MAX_NAMES} owner and group names, the most it keeps"
            )));
        }
        let id = self.list.len() as NameId;
        self.list.push(Box::from(name));
        self.ids.insert(Box::from(name), id);
        Ok(id)
    }

    /// Permissions as a record or checkpoint carries them; `legacy` if it carries none.
    pub fn take(&mut self, p: Option<&pb::Permissions>, legacy: Perms) -> Result<Perms, FsError> {
        let Some(p) = p else {
            return Ok(legacy);
        };
        Ok(Perms {
            owner: self.intern(&p.owner)?,
            group: self.intern(&p.group)?,
            mode: valid_mode(p.mode)?,
        })
    }

    /// How many names are kept (a mark for [`Names::forget_after`]).
    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Forgets the names kept since `mark`: a record that does not apply leaves the
    /// table as it was.
    pub fn forget_after(&mut self, mark: usize) {
        for name in self.list.drain(mark.max(1)..) {
            self.ids.remove(&name);
        }
    }

    /// `p` as records and replies carry it.
    pub fn to_pb(&self, p: Perms) -> pb::Permissions {
        pb::Permissions {
            owner: self.name(p.owner).to_string(),
            group: self.name(p.group).to_string(),
            mode: p.mode.into(),
        }
    }
}

/// A caller as permissions see it.
#[derive(Clone, Copy, Debug)]
pub struct Who<'a> {
    pub name: &'a str,
    pub groups: &'a [String],
    pub superuser: bool,
}

impl<'a> Who<'a> {
    pub fn of(c: &'a Caller) -> Who<'a> {
        match c {
            Caller::Insecure => Who {
                name: SUPERUSER,
                groups: &[],
                superuser: true,
            },
            Caller::Admin { name } => Who {
                name,
                groups: &[],
                superuser: true,
            },
            Caller::Client { user, groups } => Who {
                name: user,
                groups,
                superuser: false,
            },
            // Servers make no namespace calls (`crate::auth` refuses them): nobody.
            Caller::Master { .. } | Caller::Chunkserver { .. } => Who {
                name: "",
                groups: &[],
                superuser: false,
            },
        }
    }
}

/// What `who` may do in `ns`: each method is Ok, or the refusal `who` gets. A path that
/// does not resolve is let through once every directory on its way that exists was
/// searchable: the call then fails as it would for anyone (not found, not a directory).
pub struct Check<'a> {
    pub ns: &'a Namespace,
    pub who: Who<'a>,
}

impl<'a> Check<'a> {
    pub fn new(ns: &'a Namespace, caller: &'a Caller) -> Check<'a> {
        Check {
            ns,
            who: Who::of(caller),
        }
    }

    fn owns(&self, p: Perms) -> bool {
        self.ns.names.id(self.who.name) == Some(p.owner)
    }

    fn in_group(&self, group: NameId) -> bool {
        let name = self.ns.names.name(group);
        self.who.groups.iter().any(|g| g == name)
    }

    fn allows(&self, p: Perms, want: u16) -> bool {
        if self.who.superuser {
            return true;
        }
        let bits = if self.owns(p) {
            p.mode >> 6
        } else if self.in_group(p.group) {
            p.mode >> 3
        } else {
            p.mode
        };
        bits & want == want
    }

    fn deny(&self, path: &str, p: Perms, what: &str) -> FsError {
        let names = &self.ns.names;
        let mut m = format!("{path}: user {} ", self.who.name);
        if !self.who.groups.is_empty() {
            let _ = write!(m, "(groups {}) ", self.who.groups.join(","));
        }
        let _ = write!(
            m,
            "may not {what} (owner {}, group {}, {})",
            names.name(p.owner),
            names.name(p.group),
            mode_string(p.mode.into())
        );
        FsError::PermissionDenied(m)
    }

    fn need(&self, path: &str, p: Perms, want: u16, what: &str) -> Result<(), FsError> {
        if self.allows(p, want) {
            Ok(())
        } else {
            Err(self.deny(path, p, what))
        }
    }

    /// What `path` names, once every directory on its way was searchable; and its
    /// parent's permissions if the walk reached the parent.
    fn walk(&self, path: &str) -> Result<(Found<'a>, Option<Perms>), FsError> {
        let (found, walked) = self.ns.find(path)?;
        // The directories' paths only for a refusal: every namespace call walks here.
        if let Some(i) = walked.iter().position(|&p| !self.allows(p, X)) {
            let dir = &crate::path::ancestors(path)?[i];
            return Err(self.deny(dir, walked[i], "search this directory"));
        }
        let ancestors = crate::path::components(path)?.len();
        let parent = (walked.len() == ancestors)
            .then(|| walked.last().copied())
            .flatten();
        Ok((found, parent))
    }

    /// A file's or directory's information (stat).
    pub fn stat(&self, path: &str) -> Result<(), FsError> {
        self.walk(path).map(|_| ())
    }

    /// A directory's listing: r and x on it.
    pub fn list(&self, path: &str) -> Result<(), FsError> {
        let p = match self.walk(path)?.0 {
            Found::Root => self.ns.root,
            Found::Entry(n @ Node::Dir { .. }) => n.perms(),
            Found::Entry(Node::File(_)) | Found::Missing => return Ok(()),
        };
        self.need(path, p, R | X, "list this directory")
    }

    /// A file's chunk locations, with capabilities to read them: r on it.
    pub fn read(&self, path: &str) -> Result<(), FsError> {
        match self.walk(path)?.0 {
            Found::Entry(Node::File(f)) => self.need(path, f.perms, R, "read this file"),
            _ => Ok(()),
        }
    }

    /// A write target, a longer length, an append's region: w on the file.
    pub fn write(&self, path: &str) -> Result<(), FsError> {
        match self.walk(path)?.0 {
            Found::Entry(Node::File(f)) => self.need(path, f.perms, W, "write this file"),
            _ => Ok(()),
        }
    }

    /// A new entry at `path`: w and x on its parent. Gives the parent's permissions (its
    /// group is the new entry's), if the parent exists.
    pub fn create(&self, path: &str) -> Result<Option<Perms>, FsError> {
        let (_, parent) = self.walk(path)?;
        if let Some(p) = parent {
            let (dir, _) = crate::path::split_last(path)?;
            self.need(&dir, p, W | X, "add entries to this directory")?;
        }
        Ok(parent)
    }

    /// The entry at `path` taken out of its directory (a delete, or a rename's source):
    /// w and x on the parent, and the sticky bit's rule.
    fn unlink(&self, path: &str, what: &str) -> Result<Found<'a>, FsError> {
        let (found, parent) = self.walk(path)?;
        let (Found::Entry(node), Some(p)) = (found, parent) else {
            return Ok(found);
        };
        let (dir, _) = crate::path::split_last(path)?;
        self.need(&dir, p, W | X, what)?;
        self.sticky(&dir, p, path, node.perms())?;
        Ok(found)
    }

    /// In a sticky directory `dir`, whether `who` may take out the entry at `path`.
    fn sticky(&self, dir: &str, d: Perms, path: &str, entry: Perms) -> Result<(), FsError> {
        if u32::from(d.mode) & STICKY == 0 || self.who.superuser || self.owns(d) || self.owns(entry)
        {
            return Ok(());
        }
        Err(self.deny(
            path,
            entry,
            &format!("take out another user's entry of sticky directory {dir}"),
        ))
    }

    /// A delete of `path`, with everything below it if it is a directory.
    pub fn delete(&self, path: &str) -> Result<(), FsError> {
        let found = self.unlink(path, "delete entries of this directory")?;
        let Found::Entry(Node::Dir { id, perms, .. }) = found else {
            return Ok(());
        };
        if self.who.superuser {
            return Ok(());
        }
        // What is below goes too: each directory's entries are taken out of it.
        let mut stack = vec![(*id, *perms, path.to_string())];
        while let Some((id, p, at)) = stack.pop() {
            let mut children = self.ns.children(id).peekable();
            if children.peek().is_none() {
                continue;
            }
            self.need(&at, p, R | W | X, "delete what is in this directory")?;
            for (name, node) in children {
                let child = format!("{}/{name}", at.trim_end_matches('/'));
                self.sticky(&at, p, &child, node.perms())?;
                if let Node::Dir { id, perms, .. } = node {
                    stack.push((*id, *perms, child));
                }
            }
        }
        Ok(())
    }

    /// A move of `src` to `dst`.
    pub fn rename(&self, src: &str, dst: &str) -> Result<(), FsError> {
        self.unlink(src, "move entries out of this directory")?;
        self.create(dst).map(|_| ())
    }

    /// New permissions for `path`: a new owner only from the superuser; a new group from
    /// the owner, if in it; new bits from the owner.
    pub fn set_perms(
        &self,
        path: &str,
        owner: Option<&str>,
        group: Option<&str>,
        mode: Option<u32>,
    ) -> Result<(), FsError> {
        let p = match self.walk(path)?.0 {
            Found::Root => self.ns.root,
            Found::Entry(n) => n.perms(),
            Found::Missing => return Ok(()),
        };
        if self.who.superuser {
            return Ok(());
        }
        let names = &self.ns.names;
        if let Some(o) = owner
            && names.id(o) != Some(p.owner)
        {
            return Err(self.deny(
                path,
                p,
                &format!("give this entry to {o} (only an admin may)"),
            ));
        }
        if (group.is_some() || mode.is_some()) && !self.owns(p) {
            return Err(self.deny(path, p, "change this entry's group or bits (not its owner)"));
        }
        if let Some(g) = group
            && names.id(g) != Some(p.group)
            && !self.who.groups.iter().any(|m| m == g)
        {
            return Err(self.deny(path, p, &format!("give this entry group {g} (not in it)")));
        }
        Ok(())
    }

    /// The permissions a new entry at `path` takes: `who`'s, in its parent's group
    /// (`parent`, as [`Check::create`] gave it), with `mode`.
    pub fn new_entry(&self, parent: Option<Perms>, mode: u32) -> pb::Permissions {
        let group = parent.unwrap_or(self.ns.root).group;
        pb::Permissions {
            owner: self.who.name.to_string(),
            group: self.ns.names.name(group).to_string(),
            mode,
        }
    }
}
