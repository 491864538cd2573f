//! Tessera's protocol core.
//!
//! Pure state machines for the master ([`master`]) and the chunkserver ([`chunkserver`]),
//! the wire and log types ([`pb`]), the traits of the abstract runtime ([`runtime`]), the
//! drivers that run a state machine over those traits ([`driver`]) and the client library
//! ([`client`]). Nothing here reads a clock, draws OS randomness or touches a socket or a
//! disk: time and randomness come in as arguments, and I/O leaves as effects.

pub mod auth;
pub mod capability;
pub mod chunkserver;
pub mod client;
pub mod driver;
pub mod error;
pub mod fuzz;
pub mod group;
pub mod master;
pub mod masters;
pub mod path;
pub mod pb;
pub mod record;
pub mod rng;
pub mod runtime;
pub mod testkit;
pub mod trace;
pub mod types;
pub mod wire;

pub use error::{FsError, RpcError, StoreError};
pub use types::{BLOCK_SIZE, ChunkHandle, LogSeq, MAX_CHUNK_SIZE, Time, Version};
