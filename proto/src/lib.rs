//! Kubelet gRPC contracts used by topodra.
//!
//! Generated at build time from the `.proto` files under `proto/` (compiled
//! with `protox`, no `protoc` needed) by `tonic-prost-build`; every package
//! comes with its messages, a client and a server.
//!
//! | Rust module | proto package | service |
//! | --- | --- | --- |
//! | [`pluginregistration::v1`] | `pluginregistration` | `Registration` |
//! | [`dra::v1`] | `k8s.io.kubelet.pkg.apis.dra.v1` | `DRAPlugin` |
//! | [`dra::v1beta1`] | `k8s.io.kubelet.pkg.apis.dra.v1beta1` | `DRAPlugin` |
//! | [`health::v1`] | `v1` | `DRAResourceHealth` |
//! | [`health::v1alpha1`] | `v1alpha1` | `DRAResourceHealth` |
//!
//! Two kinds of names matter and they differ for DRA:
//! - the *registration* name that goes into `PluginInfo.supported_versions`
//!   (`"v1.DRAPlugin"`: last package component + service), which is what the
//!   kubelet matches, and
//! - the full *gRPC* service name used on the wire
//!   (`"k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"`).
//!
//! For the health API both are the same because its package is the bare
//! version.

/// Kubelet plugin registration (plugin watcher), v1.
pub mod pluginregistration {
    /// Proto package `pluginregistration` (upstream never renamed it to v1).
    pub mod v1 {
        #![allow(
            missing_docs,
            missing_debug_implementations,
            unreachable_pub,
            clippy::all,
            clippy::unwrap_used
        )]
        include!(concat!(env!("OUT_DIR"), "/pluginregistration.rs"));

        /// `PluginInfo.type` for a DRA driver's kubelet plugin.
        pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
        /// `PluginInfo.type` for a CSI driver.
        pub const CSI_PLUGIN_TYPE: &str = "CSIPlugin";
        /// `PluginInfo.type` for a device plugin.
        pub const DEVICE_PLUGIN_TYPE: &str = "DevicePlugin";
        /// Full gRPC name of the registration service.
        pub const REGISTRATION_GRPC_SERVICE: &str = "pluginregistration.Registration";
    }
}

/// Kubelet <-> DRA plugin API (NodePrepareResources / NodeUnprepareResources).
pub mod dra {
    /// Proto package `k8s.io.kubelet.pkg.apis.dra.v1`.
    pub mod v1 {
        #![allow(
            missing_docs,
            missing_debug_implementations,
            unreachable_pub,
            clippy::all,
            clippy::unwrap_used
        )]
        include!(concat!(
            env!("OUT_DIR"),
            "/k8s.io.kubelet.pkg.apis.dra.v1.rs"
        ));

        /// Entry for `PluginInfo.supported_versions` announcing this service.
        pub const DRA_PLUGIN_SERVICE: &str = "v1.DRAPlugin";
        /// Full gRPC service name on the wire.
        pub const DRA_PLUGIN_GRPC_SERVICE: &str = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin";
    }

    /// Proto package `k8s.io.kubelet.pkg.apis.dra.v1beta1`.
    pub mod v1beta1 {
        #![allow(
            missing_docs,
            missing_debug_implementations,
            unreachable_pub,
            clippy::all,
            clippy::unwrap_used
        )]
        include!(concat!(
            env!("OUT_DIR"),
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.rs"
        ));

        /// Entry for `PluginInfo.supported_versions` announcing this service.
        pub const DRA_PLUGIN_SERVICE: &str = "v1beta1.DRAPlugin";
        /// Full gRPC service name on the wire.
        pub const DRA_PLUGIN_GRPC_SERVICE: &str = "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin";
    }
}

/// DRA device health API (server-streaming `NodeWatchResources`).
pub mod health {
    /// Proto package `v1` (k8s.io/kubelet/pkg/apis/dra-health/v1).
    pub mod v1 {
        #![allow(
            missing_docs,
            missing_debug_implementations,
            unreachable_pub,
            clippy::all,
            clippy::unwrap_used
        )]
        include!(concat!(env!("OUT_DIR"), "/v1.rs"));

        /// Entry for `PluginInfo.supported_versions` announcing this service
        /// (also its full gRPC service name).
        pub const DRA_RESOURCE_HEALTH_SERVICE: &str = "v1.DRAResourceHealth";
        /// Full gRPC service name on the wire.
        pub const DRA_RESOURCE_HEALTH_GRPC_SERVICE: &str = "v1.DRAResourceHealth";
    }

    /// Proto package `v1alpha1` (k8s.io/kubelet/pkg/apis/dra-health/v1alpha1).
    /// Superseded by [`v1`]; served for kubelets that predate it.
    pub mod v1alpha1 {
        #![allow(
            missing_docs,
            missing_debug_implementations,
            unreachable_pub,
            clippy::all,
            clippy::unwrap_used
        )]
        include!(concat!(env!("OUT_DIR"), "/v1alpha1.rs"));

        /// Entry for `PluginInfo.supported_versions` announcing this service
        /// (also its full gRPC service name).
        pub const DRA_RESOURCE_HEALTH_SERVICE: &str = "v1alpha1.DRAResourceHealth";
        /// Full gRPC service name on the wire.
        pub const DRA_RESOURCE_HEALTH_GRPC_SERVICE: &str = "v1alpha1.DRAResourceHealth";
    }
}

/// `PluginInfo.type` of a DRA kubelet plugin.
pub const DRA_PLUGIN_TYPE: &str = pluginregistration::v1::DRA_PLUGIN_TYPE;

/// Everything topodra can announce in `PluginInfo.supported_versions`, in the
/// order to announce it: the kubelet takes the first DRAPlugin entry it
/// knows, so v1 comes before v1beta1; it picks the newest health service it
/// knows, and ignores entries it does not know.
pub const DRA_SUPPORTED_SERVICES: &[&str] = &[
    dra::v1::DRA_PLUGIN_SERVICE,
    dra::v1beta1::DRA_PLUGIN_SERVICE,
    health::v1::DRA_RESOURCE_HEALTH_SERVICE,
    health::v1alpha1::DRA_RESOURCE_HEALTH_SERVICE,
];

/// The compiled schema of all contracts, an encoded
/// `google.protobuf.FileDescriptorSet` (usable for gRPC reflection and for
/// checking field numbers).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/topodra_proto_descriptor.bin"));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_service_names_match_generated_code() {
        assert_eq!(
            pluginregistration::v1::registration_server::SERVICE_NAME,
            pluginregistration::v1::REGISTRATION_GRPC_SERVICE
        );
        assert_eq!(
            dra::v1::dra_plugin_server::SERVICE_NAME,
            dra::v1::DRA_PLUGIN_GRPC_SERVICE
        );
        assert_eq!(
            dra::v1beta1::dra_plugin_server::SERVICE_NAME,
            dra::v1beta1::DRA_PLUGIN_GRPC_SERVICE
        );
        assert_eq!(
            health::v1::dra_resource_health_server::SERVICE_NAME,
            health::v1::DRA_RESOURCE_HEALTH_GRPC_SERVICE
        );
        assert_eq!(
            health::v1alpha1::dra_resource_health_server::SERVICE_NAME,
            health::v1alpha1::DRA_RESOURCE_HEALTH_GRPC_SERVICE
        );
    }

    /// The registration name is `<last package component>.<service>`.
    #[test]
    fn registration_names_derive_from_grpc_names() {
        fn short(full: &str) -> String {
            let mut parts = full.rsplitn(3, '.');
            let service = parts.next().unwrap_or_default();
            let version = parts.next().unwrap_or_default();
            format!("{version}.{service}")
        }
        assert_eq!(
            short(dra::v1::DRA_PLUGIN_GRPC_SERVICE),
            dra::v1::DRA_PLUGIN_SERVICE
        );
        assert_eq!(
            short(dra::v1beta1::DRA_PLUGIN_GRPC_SERVICE),
            dra::v1beta1::DRA_PLUGIN_SERVICE
        );
        assert_eq!(
            short(health::v1::DRA_RESOURCE_HEALTH_GRPC_SERVICE),
            health::v1::DRA_RESOURCE_HEALTH_SERVICE
        );
        assert_eq!(
            short(health::v1alpha1::DRA_RESOURCE_HEALTH_GRPC_SERVICE),
            health::v1alpha1::DRA_RESOURCE_HEALTH_SERVICE
        );
    }

    #[test]
    fn supported_services_order() {
        assert_eq!(
            DRA_SUPPORTED_SERVICES,
            [
                "v1.DRAPlugin",
                "v1beta1.DRAPlugin",
                "v1.DRAResourceHealth",
                "v1alpha1.DRAResourceHealth"
            ]
        );
        assert_eq!(DRA_PLUGIN_TYPE, "DRAPlugin");
    }
}
