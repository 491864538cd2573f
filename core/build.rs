//! Compiles `proto/tessera.proto` and `proto/trace.proto` with protox, a protobuf
//! compiler written in Rust, so the build needs no `protoc` binary on the machine. Also
//! fingerprints the protocol code (the .proto files and the state machines' sources),
//! which a trace records so that replay by another build can say the code differs.

use std::path::Path;

fn main() {
    let protos = ["proto/tessera.proto", "proto/trace.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let descriptors = match protox::compile(protos, ["proto"]) {
        Ok(d) => d,
        Err(e) => panic!("the .proto files do not compile: {e}"),
    };
    let mut config = prost_build::Config::new();
    // Chunk data travels as `Bytes` so a read or a forward never copies it.
    config.bytes(["."]);
    if let Err(e) = config.compile_fds(descriptors) {
        panic!("generating Rust for the .proto files failed: {e}");
    }

    // FNV-1a over the files' names and contents, in a fixed order, and the compiler's
    // version (the standard library's hasher and maps are part of the behaviour).
    let mut files: Vec<String> = protos.iter().map(|p| p.to_string()).collect();
    for f in [
        "src/types.rs",
        "src/rng.rs",
        "src/path.rs",
        "src/error.rs",
        "src/record.rs",
    ] {
        println!("cargo:rerun-if-changed={f}");
        files.push(f.to_string());
    }
    for dir in ["src/master", "src/chunkserver"] {
        println!("cargo:rerun-if-changed={dir}");
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reading {dir}: {e}"))
            .filter_map(|e| e.ok())
            .map(|e| e.path().display().to_string())
            .filter(|p| p.ends_with(".rs") && !p.ends_with("tests.rs"))
            .collect();
        names.sort();
        files.extend(names);
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("-V")
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    for b in &version {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    for f in &files {
        let body = std::fs::read(Path::new(f)).unwrap_or_else(|e| panic!("reading {f}: {e}"));
        for b in f.as_bytes().iter().chain(&body) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    println!("cargo:rustc-env=TESSERA_PROTOCOL={h:016x}");
}
