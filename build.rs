//! Compiles `proto/leaseq/v1/*.proto` with protox (a pure-Rust protobuf
//! compiler), so a fresh machine needs nothing but cargo: no system `protoc`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/leaseq/v1/queue.proto", "proto/leaseq/v1/admin.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // The encoded descriptor set feeds server reflection.
    let descriptor_path = out.join("leaseq_descriptor.bin");
    std::fs::write(&descriptor_path, prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
