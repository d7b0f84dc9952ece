//! Compiles proto/*.proto with protox (pure Rust; no system protoc) and
//! generates prost messages plus tonic clients and servers.

use std::{env, path::PathBuf};

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/registry.proto", "proto/health.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    // Encoded descriptors for gRPC server reflection.
    std::fs::write(out.join("descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
