//! Compiles qlauncher's copies of KubeVirt's handler <-> launcher gRPC API (`proto/`) into Rust.
//!
//! protox parses the `.proto` files in pure Rust, so no `protoc` binary is needed; tonic-prost-build
//! then generates the prost messages and the tonic client and server stubs into `OUT_DIR`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTOS: [&str; 4] = [
        "proto/kubevirt/cmd/v1/cmd.proto",
        "proto/kubevirt/cmd/info/info.proto",
        "proto/kubevirt/notify/v1/notify.proto",
        "proto/kubevirt/notify/info/info.proto",
    ];
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
