//! Compiles the kubelet contracts under `proto/` without `protoc`: `protox`
//! parses them into a `FileDescriptorSet`, `tonic-prost-build` generates the
//! messages, clients and servers from it.

use std::path::PathBuf;

const PROTO_ROOT: &str = "proto";

const PROTOS: &[&str] = &[
    "k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto",
    "k8s.io/kubelet/pkg/apis/dra/v1/api.proto",
    "k8s.io/kubelet/pkg/apis/dra/v1beta1/api.proto",
    "k8s.io/kubelet/pkg/apis/dra-health/v1/api.proto",
    "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1/api.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Only the contract files matter; without this cargo reruns the script
    // whenever any file in the package changes.
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    println!("cargo:rerun-if-changed=build.rs");

    let fds = protox::compile(PROTOS, [PROTO_ROOT])?;

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    // Kept as bytes too, so tests (and gRPC reflection, if ever wanted) can
    // inspect the compiled schema.
    let fds_bytes = prost::Message::encode_to_vec(&fds);
    std::fs::write(out_dir.join("topodra_proto_descriptor.bin"), fds_bytes)?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .emit_rerun_if_changed(false)
        .compile_fds(fds)?;
    Ok(())
}
