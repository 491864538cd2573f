//! Tessera's deterministic simulator.
//!
//! The real protocol code — the master and chunkserver state machines, their drivers and
//! the client library from `tessera-core` — runs in a madsim world where time, the
//! network and the disks are simulated, and faults are injected by seed. That part builds
//! only with `--cfg madsim` (see the README). Without it the crate holds what needs no
//! async runtime: the checkers (`check`), and the in-process world (`world`) in which the
//! `mutation_protocol` fuzz target (`fuzz`) drives the state machines step by step.

#[cfg(madsim)]
pub mod bench;
pub mod check;

/// The group every simulated client is in, as the root directory is: clients share
/// files (one writes what another made, renames and deletes it), as a team's users do,
/// so files are group-writable (`UMASK`). The rogue is in no group.
pub const USERS: &str = "users";
/// The simulated clients' umask.
pub const UMASK: u32 = 0o002;

/// The root directory of every simulated cluster: the superuser's, in [`USERS`], which
/// may make entries in it.
pub fn root_perms() -> tessera_core::pb::Permissions {
    tessera_core::pb::Permissions {
        owner: tessera_core::master::perms::SUPERUSER.into(),
        group: USERS.into(),
        mode: 0o775,
    }
}
#[cfg(madsim)]
pub mod clone_race;
#[cfg(madsim)]
pub mod cluster;
#[cfg(madsim)]
pub mod deposed_reads;
#[cfg(madsim)]
pub mod disk;
#[cfg(madsim)]
pub mod faults;
pub mod fuzz;
#[cfg(madsim)]
pub mod long_lived;
#[cfg(madsim)]
pub mod lost_remove;
#[cfg(madsim)]
pub mod metastore;
#[cfg(madsim)]
pub mod net;
#[cfg(madsim)]
pub mod rename_onto;
#[cfg(madsim)]
pub mod replace;
#[cfg(madsim)]
pub mod revival;
#[cfg(madsim)]
pub mod rot;
#[cfg(madsim)]
pub mod run;
#[cfg(madsim)]
pub mod runtime;
#[cfg(madsim)]
pub mod shadow_write;
#[cfg(madsim)]
pub mod workload;
pub mod world;
