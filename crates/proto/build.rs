//! Compiles `proto/leaseq/v1/*.proto` with protox, a pure-Rust protobuf
//! compiler, so a fresh machine needs nothing but cargo: no system `protoc`.
//!
//! `proto/` inside this crate is a symbolic link to the repository's
//! `proto/` (the one copy every client is generated from); `cargo package`
//! follows it, so the published crate carries the files themselves and
//! builds from them alone (tests/release.rs runs `cargo publish --dry-run`).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    let protos = [
        root.join("leaseq/v1/queue.proto"),
        root.join("leaseq/v1/admin.proto"),
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let fds = protox::compile(&protos, [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // The encoded descriptor set feeds server reflection.
    std::fs::write(
        out.join("leaseq_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
