//! Generated prost types for every RPC, op-log record and checkpoint
//! (`core/proto/tessera.proto`), plus small constructors used across the crate.
#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/tessera.rs"));
