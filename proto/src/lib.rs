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

#[cfg(test)]
mod tests {
    use prost::Message as _;

    fn fds() -> prost_types::FileDescriptorSet {
        prost_types::FileDescriptorSet::decode(super::FILE_DESCRIPTOR_SET).expect("descriptor set")
    }

    fn field_numbers(message: &str) -> Vec<(String, i32)> {
        let set = fds();
        let file = set
            .file
            .iter()
            .find(|f| f.package() == "api")
            .expect("api package");
        let m = file
            .message_type
            .iter()
            .find(|m| m.name() == message)
            .expect("message");
        m.field
            .iter()
            .map(|f| (f.name().to_string(), f.number()))
            .collect()
    }

    #[test]
    fn bundle_fields_match_upstream_numbers() {
        let want = [
            ("csvName", 1),
            ("packageName", 2),
            ("channelName", 3),
            ("csvJson", 4),
            ("object", 5),
            ("bundlePath", 6),
            ("providedApis", 7),
            ("requiredApis", 8),
            ("version", 9),
            ("skipRange", 10),
            ("dependencies", 11),
            ("properties", 12),
            ("replaces", 13),
            ("skips", 14),
            ("deprecation", 15),
        ];
        let got = field_numbers("Bundle");
        assert_eq!(
            got,
            want.iter()
                .map(|(n, i)| ((*n).to_string(), *i))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn registry_service_has_every_rpc() {
        let set = fds();
        let file = set
            .file
            .iter()
            .find(|f| f.package() == "api")
            .expect("api package");
        let svc = file
            .service
            .iter()
            .find(|s| s.name() == "Registry")
            .expect("Registry");
        let names: Vec<&str> = svc.method.iter().map(|m| m.name()).collect();
        assert_eq!(
            names,
            [
                "ListPackages",
                "GetPackage",
                "GetBundle",
                "GetBundleForChannel",
                "GetChannelEntriesThatReplace",
                "GetBundleThatReplaces",
                "GetChannelEntriesThatProvide",
                "GetLatestChannelEntriesThatProvide",
                "GetDefaultBundleThatProvides",
                "ListBundles",
            ]
        );
        let streaming: Vec<&str> = svc
            .method
            .iter()
            .filter(|m| m.server_streaming())
            .map(|m| m.name())
            .collect();
        assert_eq!(
            streaming,
            [
                "ListPackages",
                "GetChannelEntriesThatReplace",
                "GetChannelEntriesThatProvide",
                "GetLatestChannelEntriesThatProvide",
                "ListBundles"
            ]
        );
        assert_eq!(
            field_numbers("GetReplacementRequest"),
            [
                ("csvName".into(), 1),
                ("pkgName".into(), 2),
                ("channelName".into(), 3)
            ]
        );
        assert_eq!(field_numbers("Package").len(), 4);
        assert_eq!(field_numbers("ChannelEntry").len(), 4);
    }
}
