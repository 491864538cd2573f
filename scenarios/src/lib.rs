//! Tessera's named failure scenarios: each a cluster shape, a workload and a fault mix.
//! Built with `--cfg madsim`; see the README for the invocation.
#![cfg(madsim)]

use std::time::Duration;

use tessera_sim::cluster::{Knobs, Shape};
use tessera_sim::faults::FaultMix;
use tessera_sim::run::Scenario;
use tessera_sim::workload::{Kind, Workload};

const SHAPE: Shape = Shape {
    masters: 1,
    chunkservers: 5,
    racks: 3,
    clients: 2,
};

const WORKLOAD: Workload = Workload {
    kind: Kind::Private,
    no_reads: false,
    ops: 60,
    max_files: 4,
    max_write: 150 << 10,
    max_file: 600 << 10,
    think: Duration::from_millis(200),
    delete_permille: 20,
};

const NO_FAULTS: FaultMix = FaultMix {
    server_crashes: false,
    partitions: false,
    master_cut: false,
    master_restarts: false,
    corruption: false,
    full_disks: false,
    slow_disks: false,
    lossy_net: false,
    power_cuts: false,
    rogue: false,
    net_trouble: false,
    any_partitions: false,
    clock_jumps: false,
    stuck_disks: false,
    misdirected_writes: false,
    client_crashes: false,
    group_faults: false,
    replacements: false,
    minority_faults: false,
    mid_write_crashes: false,
    beyond_claim: false,
};

fn keep(_: &mut Knobs) {}

fn short_gc(k: &mut Knobs) {
    k.gc_delay = Duration::from_millis(500);
}

fn eager_scrub(k: &mut Knobs) {
    k.scrub_interval = Duration::from_millis(500);
    k.scrub_idle = Duration::from_secs(1);
}

/// Chunks of three blocks and more, as the last copy rot needs (a write into one block,
/// rot in another); the size a restarted master gives files stays the same.
fn rot_chunks(k: &mut Knobs) {
    if k.chunk_size < 256 << 10 {
        k.chunk_size = 256 << 10;
    }
    k.restart_chunk_size = 0;
}

/// A sync can outlast a heartbeat interval and still end within a call's deadline, as
/// the lost remove needs; and the collector leaves deleted files for ten minutes, so
/// the file whose remove was lost is not reclaimed meanwhile (as it may be, rightly).
fn lost_remove_knobs(k: &mut Knobs) {
    k.gc_delay = Duration::from_secs(600);
    k.restart_chunk_size = 0;
    k.heartbeat = k.heartbeat.min(Duration::from_millis(500));
    k.rpc_timeout = k.rpc_timeout.max(Duration::from_secs(1));
}

/// A master group of three under shared clients racing namespace operations and
/// writes on one directory (a linearizability check).
fn group_scenario(sc: Scenario) -> Scenario {
    Scenario {
        shape: Shape { masters: 3, ..MANY },
        shadow_write: true,
        rename_onto: true,
        workload: Workload {
            kind: Kind::Shared { files: 2 },
            ops: 40,
            ..WORKLOAD
        },
        ..sc
    }
}

const fn scenario(name: &'static str, faults: FaultMix) -> Scenario {
    Scenario {
        name,
        shape: SHAPE,
        workload: WORKLOAD,
        faults,
        tweak: keep,
        heal_within: Duration::from_secs(180),
        silent_corruption: false,
        last_copy_rot: false,
        long_lived: false,
        lost_remove: false,
        clone_race: false,
        shadow_write: false,
        rename_onto: false,
        stale_collected: false,
        vary: false,
    }
}

const MANY: Shape = Shape {
    masters: 1,
    chunkservers: 5,
    racks: 3,
    clients: 4,
};

pub fn all() -> Vec<Scenario> {
    vec![
        Scenario {
            rename_onto: true,
            ..scenario("steady", NO_FAULTS)
        },
        // After healing, also a client that outlives every replica of a file it knew
        // (`tessera_sim::long_lived`).
        Scenario {
            long_lived: true,
            ..scenario(
                "chunkserver-crash",
                FaultMix {
                    server_crashes: true,
                    power_cuts: true,
                    rogue: true,
                    slow_disks: true,
                    ..NO_FAULTS
                },
            )
        },
        scenario(
            "partition",
            FaultMix {
                partitions: true,
                master_cut: true,
                lossy_net: true,
                net_trouble: true,
                any_partitions: true,
                ..NO_FAULTS
            },
        ),
        scenario(
            "master-restart",
            FaultMix {
                master_restarts: true,
                slow_disks: true,
                ..NO_FAULTS
            },
        ),
        scenario(
            "disk-corruption",
            FaultMix {
                corruption: true,
                full_disks: true,
                misdirected_writes: true,
                ..NO_FAULTS
            },
        ),
        Scenario {
            tweak: short_gc,
            workload: Workload {
                delete_permille: 200,
                ..WORKLOAD
            },
            ..scenario(
                "gc",
                FaultMix {
                    server_crashes: true,
                    master_restarts: true,
                    ..NO_FAULTS
                },
            )
        },
        scenario(
            "beyond-claim",
            FaultMix {
                beyond_claim: true,
                ..NO_FAULTS
            },
        ),
        Scenario {
            shape: MANY,
            workload: Workload {
                kind: Kind::Shared { files: 2 },
                ops: 40,
                ..WORKLOAD
            },
            rename_onto: true,
            ..scenario(
                "concurrent-writers",
                FaultMix {
                    server_crashes: true,
                    master_restarts: true,
                    partitions: true,
                    slow_disks: true,
                    lossy_net: true,
                    net_trouble: true,
                    client_crashes: true,
                    clock_jumps: true,
                    ..NO_FAULTS
                },
            )
        },
        Scenario {
            shape: MANY,
            workload: Workload {
                kind: Kind::Appends { files: 2 },
                ops: 50,
                max_write: 64 << 10,
                ..WORKLOAD
            },
            ..scenario(
                "record-append",
                FaultMix {
                    server_crashes: true,
                    power_cuts: true,
                    slow_disks: true,
                    lossy_net: true,
                    master_restarts: true,
                    client_crashes: true,
                    clock_jumps: true,
                    ..NO_FAULTS
                },
            )
        },
        // Servers crash and come back stale; after healing every stale copy must be
        // collected, and clones race rot at their source's read and a version bump at
        // their completion (`tessera_sim::clone_race`).
        Scenario {
            stale_collected: true,
            clone_race: true,
            ..scenario(
                "stale-replica",
                FaultMix {
                    server_crashes: true,
                    ..NO_FAULTS
                },
            )
        },
        Scenario {
            tweak: eager_scrub,
            silent_corruption: true,
            workload: Workload {
                no_reads: true,
                delete_permille: 0,
                ..WORKLOAD
            },
            ..scenario("scrub", NO_FAULTS)
        },
        // The one copy of a chunk's current version rots in a block its older copies
        // hold (a write taken while the others were down), on a cluster of exactly R
        // servers after a workload with crashes: it must be mended from them, not
        // deleted (`tessera_sim::rot`).
        Scenario {
            shape: Shape {
                chunkservers: 3,
                ..SHAPE
            },
            tweak: rot_chunks,
            last_copy_rot: true,
            ..scenario(
                "last-copy-rot",
                FaultMix {
                    server_crashes: true,
                    slow_disks: true,
                    ..NO_FAULTS
                },
            )
        },
        // The master loses power while the remove of a deleted file is still unsynced,
        // its holders having reported their copies meanwhile: no copy may have been
        // ordered deleted, and the file, undeleted, reads back whole; then a rename lost
        // the same way, which no call may have seen (`tessera_sim::lost_remove`).
        Scenario {
            lost_remove: true,
            tweak: lost_remove_knobs,
            ..scenario(
                "lost-remove",
                FaultMix {
                    master_restarts: true,
                    server_crashes: true,
                    ..NO_FAULTS
                },
            )
        },
        // The same with a master group: the leader, cut off from the other replicas
        // (still reaching chunkservers and clients), takes a remove it can never commit
        // and hears every holder's heartbeat; the others elect a leader without it.
        Scenario {
            shape: Shape {
                masters: 3,
                ..SHAPE
            },
            lost_remove: true,
            tweak: lost_remove_knobs,
            ..scenario(
                "lost-remove-group",
                FaultMix {
                    group_faults: true,
                    server_crashes: true,
                    ..NO_FAULTS
                },
            )
        },
        // A disk that stops answering for seconds: orders sit on it past their callers'
        // deadlines and land late.
        scenario(
            "stuck-disk",
            FaultMix {
                server_crashes: true,
                stuck_disks: true,
                ..NO_FAULTS
            },
        ),
        // A master group of three: the leader killed or cut off from the other replicas
        // (still reaching chunkservers and clients), shadows killed, while shared
        // clients race namespace operations and writes on one directory (a
        // linearizability check) and chunkservers crash.
        group_scenario(scenario(
            "master-failover",
            FaultMix {
                group_faults: true,
                server_crashes: true,
                slow_disks: true,
                lossy_net: true,
                net_trouble: true,
                clock_jumps: true,
                ..NO_FAULTS
            },
        )),
        // A master group of five: up to two replicas impaired at once (killed, or cut
        // off from the others), so the three left must elect and commit, under the same
        // shared clients and chunkserver crashes.
        Scenario {
            shape: Shape { masters: 5, ..MANY },
            ..group_scenario(scenario(
                "master-failover-5",
                FaultMix {
                    group_faults: true,
                    minority_faults: true,
                    server_crashes: true,
                    slow_disks: true,
                    lossy_net: true,
                    clock_jumps: true,
                    ..NO_FAULTS
                },
            ))
        },
        // A master group whose members change: a shadow is lost, removed by an admin,
        // and joins again on a new disk under a new id (the leader makes it a voter once
        // it holds the log), among leader crashes and cuts, under the same shared
        // clients. After healing every replica must be a voter of one agreed group.
        group_scenario(scenario(
            "master-replace",
            FaultMix {
                group_faults: true,
                replacements: true,
                server_crashes: true,
                lossy_net: true,
                clock_jumps: true,
                ..NO_FAULTS
            },
        )),
        // Every fault kind the design claims to survive, the seed keeping some (swarm
        // testing), on a cluster shape (a master group of three in about a quarter of
        // the runs), replication and workload the seed picks.
        Scenario {
            vary: true,
            heal_within: Duration::from_secs(300),
            ..scenario(
                "all-faults",
                FaultMix {
                    group_faults: true,
                    ..FaultMix::ALL
                },
            )
        },
    ]
}

/// The shape the speed figure asks for: 1 master, 9 chunkservers, 4 clients.
pub fn steady_large() -> Scenario {
    Scenario {
        shape: Shape {
            masters: 1,
            chunkservers: 9,
            racks: 3,
            clients: 4,
        },
        ..scenario("steady-large", NO_FAULTS)
    }
}

pub fn find(name: &str) -> Option<Scenario> {
    all()
        .into_iter()
        .chain([steady_large()])
        .find(|s| s.name == name)
}
