//! operator-registry gRPC API (`api.Registry`, `api.ExperimentalRegistry`)
//! and `grpc.health.v1.Health`, generated at build time from `proto/*.proto`.

/// The `api` package: Registry service and its messages.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod api {
    tonic::include_proto!("api");
}

/// `grpc.health.v1`: the standard health checking protocol.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod health {
    tonic::include_proto!("grpc.health.v1");
}

/// Encoded `FileDescriptorSet` of every proto file here (with imports), for
/// server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptor.bin"));

/// Fully qualified service names.
pub const REGISTRY_SERVICE: &str = "api.Registry";
/// Fully qualified health service name.
pub const HEALTH_SERVICE: &str = "grpc.health.v1.Health";
