//! Compiles the etcd API subset under `proto/` with `protox` (a protobuf
//! compiler written in Rust), so building needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/etcd/mvccpb/kv.proto",
        "proto/etcd/etcdserverpb/rpc.proto",
        "proto/etcd/v3electionpb/v3election.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    // Clients only: accel serves none of these APIs.
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(descriptors)?;
    Ok(())
}
