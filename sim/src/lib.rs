//! Tessera's deterministic simulator.
//!
//! The real protocol code — the master and chunkserver state machines, their drivers and
//! the client library from `tessera-core` — runs in a madsim world where time, the
//! network and the disks are simulated, and faults are injected by seed. Built only with
//! `--cfg madsim` (see the README); without it this crate is empty.
#![cfg(madsim)]

pub mod bench;
pub mod check;
pub mod cluster;
pub mod disk;
pub mod faults;
pub mod metastore;
pub mod net;
pub mod run;
pub mod runtime;
pub mod workload;
