//! Compiles the kubelet's PodResources API (`proto/podresources/v1/api.proto`), client and
//! server: the agent reads it, and the tests serve it from a fake kubelet with the same code.
//! Needs `protoc`, as the CRI protos of the `k8s-cri` crate already do.

fn main() {
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/podresources/v1/api.proto"], &["proto"])
        .expect("compile proto/podresources/v1/api.proto (is protoc installed?)");
}
