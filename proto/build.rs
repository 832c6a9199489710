//! Compiles the `.proto` files with `protox` (a protobuf compiler written in
//! Rust), so building needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = "proto/accel/rendezvous/v1/rendezvous.proto";
    println!("cargo:rerun-if-changed={file}");
    let descriptors = protox::compile([file], ["proto"])?;
    // The generated code uses the crate's small-buffer codec (see `codec`).
    tonic_prost_build::configure()
        .codec_path("crate::codec::CompactCodec")
        .compile_fds(descriptors)?;
    Ok(())
}
