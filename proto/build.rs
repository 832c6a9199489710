//! Compiles the `.proto` files with `protox` (a protobuf compiler written in
//! Rust), so building needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/accel/rendezvous/v1/rendezvous.proto",
        "proto/accel/rendezvous/store/v1/store.proto",
        "proto/torchft/lighthouse.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    // The generated code uses the crate's small-buffer codec (see `codec`).
    // A job's end carries its goodput accounting; boxed, so every event on
    // an agent's stream is not as large as the largest.
    tonic_prost_build::configure()
        .codec_path("crate::codec::CompactCodec")
        .boxed(".accel.rendezvous.v1.JobSucceeded.goodput")
        .boxed(".accel.rendezvous.v1.JobFailed.goodput")
        .compile_fds(descriptors)?;
    Ok(())
}
