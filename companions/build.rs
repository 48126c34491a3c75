//! Compiles the client side of KubeVirt's cmd API (qlauncher's copies in `../proto`) for
//! virt-probe and virt-freezer; nothing without the `cmd-client` feature (the static build of
//! container-disk and virt-tail).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    #[cfg(feature = "cmd-client")]
    {
        const PROTOS: [&str; 2] = [
            "../proto/kubevirt/cmd/v1/cmd.proto",
            "../proto/kubevirt/cmd/info/info.proto",
        ];
        for proto in PROTOS {
            println!("cargo:rerun-if-changed={proto}");
        }
        let descriptors = protox::compile(PROTOS, ["../proto"])?;
        tonic_prost_build::configure()
            .build_server(false)
            .build_client(true)
            .build_transport(false)
            .compile_fds(descriptors)?;
    }
    Ok(())
}
