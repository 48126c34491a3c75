//! Compiles qlauncher's copies of KubeVirt's handler <-> launcher gRPC API, hook sidecar API and
//! VEP-190 plugin sidecar API and backup tunnel NBD service (`proto/`) into Rust.
//!
//! protox parses the `.proto` files in pure Rust, so no `protoc` binary is needed; tonic-prost-build
//! then generates the prost messages and the tonic client and server stubs into `OUT_DIR`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTOS: [&str; 10] = [
        "proto/kubevirt/cmd/v1/cmd.proto",
        "proto/kubevirt/cmd/info/info.proto",
        "proto/kubevirt/notify/v1/notify.proto",
        "proto/kubevirt/notify/info/info.proto",
        "proto/kubevirt/hooks/info/info.proto",
        "proto/kubevirt/hooks/v1alpha1/v1alpha1.proto",
        "proto/kubevirt/hooks/v1alpha2/v1alpha2.proto",
        "proto/kubevirt/hooks/v1alpha3/v1alpha3.proto",
        "proto/kubevirt/hooks/plugins/v1alpha1/plugins.proto",
        "proto/kubevirt/nbd/v1/nbd.proto",
    ];
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    // The pod's two resident binaries link as position-dependent executables (as Go links
    // KubeVirt's): with no load-time relocation, their RELRO data (vtables, 0.36 MiB for the
    // launcher) stays clean file-backed pages that trimming can drop, not copied-on-write
    // anonymous memory, and the dynamic relocation table is never read. `qlauncher` is the
    // launcher (the image's virt-launcher is a link to it).
    for bin in ["qlauncher", "virt-launcher-monitor"] {
        println!("cargo:rustc-link-arg-bin={bin}=-no-pie");
    }
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
