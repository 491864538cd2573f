//! Compiles `proto/tessera.proto` with protox, a protobuf compiler written in Rust, so the
//! build needs no `protoc` binary on the machine.

fn main() {
    let proto = "proto/tessera.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = match protox::compile([proto], ["proto"]) {
        Ok(d) => d,
        Err(e) => panic!("{proto} does not compile: {e}"),
    };
    let mut config = prost_build::Config::new();
    // Chunk data travels as `Bytes` so a read or a forward never copies it.
    config.bytes(["."]);
    if let Err(e) = config.compile_fds(descriptors) {
        panic!("generating Rust for {proto} failed: {e}");
    }
}
