//! Generates the gRPC service every Tessera node serves: one unary method, `Call`, whose
//! request and response are the prost-encoded envelopes of `core/proto/tessera.proto`,
//! passed through as bytes (the drivers decode them; nothing is encoded twice), in
//! pieces where a reply carries bulk data.

fn main() {
    let call = tonic_build::manual::Method::builder()
        .name("call")
        .route_name("Call")
        .input_type("tessera_core::runtime::Parts")
        .output_type("tessera_core::runtime::Parts")
        .codec_path("crate::codec::RawCodec")
        .build();
    let node = tonic_build::manual::Service::builder()
        .name("Node")
        .package("tessera")
        .method(call)
        .build();
    tonic_build::manual::Builder::new().compile(&[node]);
}
