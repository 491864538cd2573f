//! Tessera on real sockets and disks: the `Runtime` on tokio, the `Transport` on tonic
//! gRPC, the chunkserver's `ChunkStore` on local files, and the `MetaStore` on rocksdb.
//! The same drivers and state machines as in the simulator run over these.

pub mod admin;
pub mod bench_meta;
pub mod chunkstore;
pub mod dev;
pub mod metastore;
pub mod rt;
pub mod server;
pub mod tls;
pub mod traces;
pub mod transport;
