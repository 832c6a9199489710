//! Compiles the `.proto` files with `protox` (a protobuf compiler written in
//! Rust), so building needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/accel/rendezvous/v1/rendezvous.proto",
        "proto/accel/rendezvous/store/v1/store.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    // The generated code uses the crate's small-buffer codec (see `codec`).
    tonic_prost_build::configure()
        .codec_path("crate::codec::CompactCodec")
        .compile_fds(descriptors)?;
    Ok(())
}
