//! Wire compatibility: round trips, exact encodings for known field tags, and
//! a pinned table of every package, message, field number and RPC, checked
//! against the schema the crate was generated from. A renumbered, renamed or
//! retyped field fails here before it can reach a kubelet.

use std::collections::HashMap;
use std::fmt::Debug;

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};
use topodra_proto::{FILE_DESCRIPTOR_SET, dra, health, pluginregistration};

fn round_trip<M: Message + Default + PartialEq + Debug>(msg: &M) -> Vec<u8> {
    let bytes = msg.encode_to_vec();
    let back = M::decode(bytes.as_slice()).expect("decode");
    assert_eq!(&back, msg);
    bytes
}

// ---- plugin registration ------------------------------------------------

#[test]
fn plugin_info_wire() {
    use pluginregistration::v1::PluginInfo;
    let msg = PluginInfo {
        r#type: "t".into(),
        name: "n".into(),
        endpoint: "e".into(),
        supported_versions: vec!["a".into(), "b".into()],
    };
    let bytes = round_trip(&msg);
    assert_eq!(
        bytes,
        [
            0x0a, 1, b't', // 1: type
            0x12, 1, b'n', // 2: name
            0x1a, 1, b'e', // 3: endpoint
            0x22, 1, b'a', // 4: supported_versions
            0x22, 1, b'b',
        ]
    );
}

#[test]
fn registration_status_wire() {
    use pluginregistration::v1::{InfoRequest, RegistrationStatus, RegistrationStatusResponse};
    let msg = RegistrationStatus {
        plugin_registered: true,
        error: "x".into(),
    };
    assert_eq!(round_trip(&msg), [0x08, 1, 0x12, 1, b'x']);
    assert!(round_trip(&InfoRequest {}).is_empty());
    assert!(round_trip(&RegistrationStatusResponse {}).is_empty());
}

// ---- DRA v1 / v1beta1 ---------------------------------------------------

#[test]
fn dra_v1_claim_and_request_wire() {
    use dra::v1::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
    let claim = Claim {
        namespace: "a".into(),
        uid: "b".into(),
        name: "c".into(),
    };
    let claim_bytes = round_trip(&claim);
    assert_eq!(claim_bytes, [0x0a, 1, b'a', 0x12, 1, b'b', 0x1a, 1, b'c']);

    let mut expected = vec![0x0a, 9];
    expected.extend_from_slice(&claim_bytes);
    let prep = NodePrepareResourcesRequest {
        claims: vec![claim.clone()],
    };
    assert_eq!(round_trip(&prep), expected);
    let unprep = NodeUnprepareResourcesRequest {
        claims: vec![claim],
    };
    assert_eq!(round_trip(&unprep), expected);
}

#[test]
fn dra_v1_device_wire_with_share_id() {
    use dra::v1::Device;
    let dev = Device {
        request_names: vec!["r".into()],
        pool_name: "p".into(),
        device_name: "d".into(),
        cdi_device_ids: vec!["x".into()],
        share_id: Some("s".into()),
    };
    assert_eq!(
        round_trip(&dev),
        [
            0x0a, 1, b'r', // 1: request_names
            0x12, 1, b'p', // 2: pool_name
            0x1a, 1, b'd', // 3: device_name
            0x22, 1, b'x', // 4: cdi_device_ids
            0x2a, 1, b's', // 5: share_id
        ]
    );
    // share_id is proto3 `optional`: an empty value is still present...
    let empty = Device {
        share_id: Some(String::new()),
        ..Device::default()
    };
    assert_eq!(round_trip(&empty), [0x2a, 0]);
    // ...and an absent one is not encoded at all.
    assert!(round_trip(&Device::default()).is_empty());
}

#[test]
fn dra_v1_responses_wire() {
    use dra::v1::{
        Device, NodePrepareResourceResponse, NodePrepareResourcesResponse,
        NodeUnprepareResourceResponse, NodeUnprepareResourcesResponse,
    };
    // Map keyed by claim UID: entry { 1: key, 2: value }.
    let resp = NodePrepareResourcesResponse {
        claims: HashMap::from([(
            "u".to_string(),
            NodePrepareResourceResponse {
                devices: vec![],
                error: "e".into(),
            },
        )]),
    };
    assert_eq!(
        round_trip(&resp),
        [0x0a, 8, 0x0a, 1, b'u', 0x12, 3, 0x12, 1, b'e']
    );

    let with_dev = NodePrepareResourceResponse {
        devices: vec![Device {
            pool_name: "p".into(),
            ..Device::default()
        }],
        error: String::new(),
    };
    assert_eq!(round_trip(&with_dev), [0x0a, 3, 0x12, 1, b'p']);

    let unprep = NodeUnprepareResourcesResponse {
        claims: HashMap::from([(
            "u".to_string(),
            NodeUnprepareResourceResponse { error: "e".into() },
        )]),
    };
    assert_eq!(
        round_trip(&unprep),
        [0x0a, 8, 0x0a, 1, b'u', 0x12, 3, 0x0a, 1, b'e']
    );
}

#[test]
fn dra_v1beta1_wire_is_v1_without_share_id() {
    use dra::v1beta1::{Claim, Device, NodePrepareResourceResponse, NodePrepareResourcesResponse};
    let dev = Device {
        request_names: vec!["r".into()],
        pool_name: "p".into(),
        device_name: "d".into(),
        cdi_device_ids: vec!["x".into()],
    };
    let bytes = round_trip(&dev);
    assert_eq!(
        bytes,
        [0x0a, 1, b'r', 0x12, 1, b'p', 0x1a, 1, b'd', 0x22, 1, b'x']
    );
    // The same bytes decode as a v1 device with no share.
    let v1 = dra::v1::Device::decode(bytes.as_slice()).expect("decode as v1");
    assert_eq!(v1.share_id, None);
    assert_eq!(v1.cdi_device_ids, ["x"]);

    let claim = Claim {
        namespace: "a".into(),
        uid: "b".into(),
        name: "c".into(),
    };
    assert_eq!(
        round_trip(&claim),
        [0x0a, 1, b'a', 0x12, 1, b'b', 0x1a, 1, b'c']
    );
    let resp = NodePrepareResourcesResponse {
        claims: HashMap::from([(
            "u".to_string(),
            NodePrepareResourceResponse {
                devices: vec![dev],
                error: String::new(),
            },
        )]),
    };
    round_trip(&resp);
}

// ---- DRA health ---------------------------------------------------------

#[test]
fn health_v1_wire() {
    use health::v1::{DeviceHealth, DeviceIdentifier, HealthStatus, NodeWatchResourcesResponse};
    let dh = DeviceHealth {
        device: Some(DeviceIdentifier {
            pool_name: "p".into(),
            device_name: "d".into(),
        }),
        health: HealthStatus::Unhealthy.into(),
        last_updated_time: 1,
        health_check_timeout_seconds: 2,
        message: "m".into(),
    };
    let dh_bytes = round_trip(&dh);
    assert_eq!(
        dh_bytes,
        [
            0x0a, 6, 0x0a, 1, b'p', 0x12, 1, b'd', // 1: device {1: pool, 2: device}
            0x10, 2, // 2: health = UNHEALTHY
            0x18, 1, // 3: last_updated_time
            0x20, 2, // 4: health_check_timeout_seconds
            0x2a, 1, b'm', // 5: message
        ]
    );
    let resp = NodeWatchResourcesResponse { devices: vec![dh] };
    let mut expected = vec![0x0a, dh_bytes.len() as u8];
    expected.extend_from_slice(&dh_bytes);
    assert_eq!(round_trip(&resp), expected);

    assert_eq!(HealthStatus::Unknown as i32, 0);
    assert_eq!(HealthStatus::Healthy as i32, 1);
    assert_eq!(HealthStatus::Unhealthy as i32, 2);
}

#[test]
fn health_v1alpha1_wire_matches_v1() {
    use health::v1alpha1::{DeviceHealth, DeviceIdentifier, HealthStatus};
    let dh = DeviceHealth {
        device: Some(DeviceIdentifier {
            pool_name: "p".into(),
            device_name: "d".into(),
        }),
        health: HealthStatus::Healthy.into(),
        last_updated_time: 7,
        health_check_timeout_seconds: 0,
        message: String::new(),
    };
    let bytes = round_trip(&dh);
    assert_eq!(
        bytes,
        [0x0a, 6, 0x0a, 1, b'p', 0x12, 1, b'd', 0x10, 1, 0x18, 7]
    );
    let v1 = health::v1::DeviceHealth::decode(bytes.as_slice()).expect("decode as v1");
    assert_eq!(v1.health(), health::v1::HealthStatus::Healthy);
}

// ---- the schema itself --------------------------------------------------

fn describe_message(out: &mut Vec<String>, prefix: &str, msg: &DescriptorProto) {
    let full = format!("{prefix}.{}", msg.name());
    if msg.field.is_empty() && msg.nested_type.is_empty() {
        out.push(format!("message {full} {{}}"));
    }
    for f in &msg.field {
        let ty = match f.r#type() {
            Type::Message | Type::Enum => f.type_name().trim_start_matches('.').to_string(),
            other => format!("{other:?}").to_lowercase(),
        };
        let label = match (f.label(), f.proto3_optional()) {
            (_, true) => "optional ",
            (Label::Repeated, _) => "repeated ",
            _ => "",
        };
        out.push(format!(
            "field {full}.{} = {} {label}{ty}",
            f.name(),
            f.number()
        ));
    }
    for nested in &msg.nested_type {
        describe_message(out, &full, nested);
    }
}

fn describe_schema() -> Vec<String> {
    let fds = FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).expect("descriptor set");
    let mut out = Vec::new();
    for file in &fds.file {
        let pkg = file.package();
        out.push(format!(
            "file {} package {pkg} {}",
            file.name(),
            file.syntax()
        ));
        for msg in &file.message_type {
            describe_message(&mut out, pkg, msg);
        }
        for e in &file.enum_type {
            for v in &e.value {
                out.push(format!(
                    "enum {pkg}.{}.{} = {}",
                    e.name(),
                    v.name(),
                    v.number()
                ));
            }
        }
        for svc in &file.service {
            for m in &svc.method {
                out.push(format!(
                    "rpc {pkg}.{}.{}({}{}) returns ({}{})",
                    svc.name(),
                    m.name(),
                    if m.client_streaming() { "stream " } else { "" },
                    m.input_type().trim_start_matches('.'),
                    if m.server_streaming() { "stream " } else { "" },
                    m.output_type().trim_start_matches('.'),
                ));
            }
        }
    }
    out
}

const PINNED_SCHEMA: &str = "\
file k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto package pluginregistration proto3
field pluginregistration.PluginInfo.type = 1 string
field pluginregistration.PluginInfo.name = 2 string
field pluginregistration.PluginInfo.endpoint = 3 string
field pluginregistration.PluginInfo.supported_versions = 4 repeated string
field pluginregistration.RegistrationStatus.plugin_registered = 1 bool
field pluginregistration.RegistrationStatus.error = 2 string
message pluginregistration.RegistrationStatusResponse {}
message pluginregistration.InfoRequest {}
rpc pluginregistration.Registration.GetInfo(pluginregistration.InfoRequest) returns (pluginregistration.PluginInfo)
rpc pluginregistration.Registration.NotifyRegistrationStatus(pluginregistration.RegistrationStatus) returns (pluginregistration.RegistrationStatusResponse)
file k8s.io/kubelet/pkg/apis/dra/v1/api.proto package k8s.io.kubelet.pkg.apis.dra.v1 proto3
field k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesRequest.claims = 1 repeated k8s.io.kubelet.pkg.apis.dra.v1.Claim
field k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesResponse.claims = 1 repeated k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesResponse.ClaimsEntry
field k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesResponse.ClaimsEntry.key = 1 string
field k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesResponse.ClaimsEntry.value = 2 k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourceResponse
field k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourceResponse.devices = 1 repeated k8s.io.kubelet.pkg.apis.dra.v1.Device
field k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourceResponse.error = 2 string
field k8s.io.kubelet.pkg.apis.dra.v1.Device.request_names = 1 repeated string
field k8s.io.kubelet.pkg.apis.dra.v1.Device.pool_name = 2 string
field k8s.io.kubelet.pkg.apis.dra.v1.Device.device_name = 3 string
field k8s.io.kubelet.pkg.apis.dra.v1.Device.cdi_device_ids = 4 repeated string
field k8s.io.kubelet.pkg.apis.dra.v1.Device.share_id = 5 optional string
field k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourcesRequest.claims = 1 repeated k8s.io.kubelet.pkg.apis.dra.v1.Claim
field k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourcesResponse.claims = 1 repeated k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourcesResponse.ClaimsEntry
field k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourcesResponse.ClaimsEntry.key = 1 string
field k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourcesResponse.ClaimsEntry.value = 2 k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourceResponse
field k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourceResponse.error = 1 string
field k8s.io.kubelet.pkg.apis.dra.v1.Claim.namespace = 1 string
field k8s.io.kubelet.pkg.apis.dra.v1.Claim.uid = 2 string
field k8s.io.kubelet.pkg.apis.dra.v1.Claim.name = 3 string
rpc k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin.NodePrepareResources(k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesRequest) returns (k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesResponse)
rpc k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin.NodeUnprepareResources(k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourcesRequest) returns (k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourcesResponse)
file k8s.io/kubelet/pkg/apis/dra/v1beta1/api.proto package k8s.io.kubelet.pkg.apis.dra.v1beta1 proto3
field k8s.io.kubelet.pkg.apis.dra.v1beta1.NodePrepareResourcesRequest.claims = 1 repeated k8s.io.kubelet.pkg.apis.dra.v1beta1.Claim
field k8s.io.kubelet.pkg.apis.dra.v1beta1.NodePrepareResourcesResponse.claims = 1 repeated k8s.io.kubelet.pkg.apis.dra.v1beta1.NodePrepareResourcesResponse.ClaimsEntry
field k8s.io.kubelet.pkg.apis.dra.v1beta1.NodePrepareResourcesResponse.ClaimsEntry.key = 1 string
field k8s.io.kubelet.pkg.apis.dra.v1beta1.NodePrepareResourcesResponse.ClaimsEntry.value = 2 k8s.io.kubelet.pkg.apis.dra.v1beta1.NodePrepareResourceResponse
field k8s.io.kubelet.pkg.apis.dra.v1beta1.NodePrepareResourceResponse.devices = 1 repeated k8s.io.kubelet.pkg.apis.dra.v1beta1.Device
field k8s.io.kubelet.pkg.apis.dra.v1beta1.NodePrepareResourceResponse.error = 2 string
field k8s.io.kubelet.pkg.apis.dra.v1beta1.Device.request_names = 1 repeated string
field k8s.io.kubelet.pkg.apis.dra.v1beta1.Device.pool_name = 2 string
field k8s.io.kubelet.pkg.apis.dra.v1beta1.Device.device_name = 3 string
field k8s.io.kubelet.pkg.apis.dra.v1beta1.Device.cdi_device_ids = 4 repeated string
field k8s.io.kubelet.pkg.apis.dra.v1beta1.NodeUnprepareResourcesRequest.claims = 1 repeated k8s.io.kubelet.pkg.apis.dra.v1beta1.Claim
field k8s.io.kubelet.pkg.apis.dra.v1beta1.NodeUnprepareResourcesResponse.claims = 1 repeated k8s.io.kubelet.pkg.apis.dra.v1beta1.NodeUnprepareResourcesResponse.ClaimsEntry
field k8s.io.kubelet.pkg.apis.dra.v1beta1.NodeUnprepareResourcesResponse.ClaimsEntry.key = 1 string
field k8s.io.kubelet.pkg.apis.dra.v1beta1.NodeUnprepareResourcesResponse.ClaimsEntry.value = 2 k8s.io.kubelet.pkg.apis.dra.v1beta1.NodeUnprepareResourceResponse
field k8s.io.kubelet.pkg.apis.dra.v1beta1.NodeUnprepareResourceResponse.error = 1 string
field k8s.io.kubelet.pkg.apis.dra.v1beta1.Claim.namespace = 1 string
field k8s.io.kubelet.pkg.apis.dra.v1beta1.Claim.uid = 2 string
field k8s.io.kubelet.pkg.apis.dra.v1beta1.Claim.name = 3 string
rpc k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin.NodePrepareResources(k8s.io.kubelet.pkg.apis.dra.v1beta1.NodePrepareResourcesRequest) returns (k8s.io.kubelet.pkg.apis.dra.v1beta1.NodePrepareResourcesResponse)
rpc k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin.NodeUnprepareResources(k8s.io.kubelet.pkg.apis.dra.v1beta1.NodeUnprepareResourcesRequest) returns (k8s.io.kubelet.pkg.apis.dra.v1beta1.NodeUnprepareResourcesResponse)
file k8s.io/kubelet/pkg/apis/dra-health/v1/api.proto package v1 proto3
message v1.NodeWatchResourcesRequest {}
field v1.DeviceIdentifier.pool_name = 1 string
field v1.DeviceIdentifier.device_name = 2 string
field v1.DeviceHealth.device = 1 v1.DeviceIdentifier
field v1.DeviceHealth.health = 2 v1.HealthStatus
field v1.DeviceHealth.last_updated_time = 3 int64
field v1.DeviceHealth.health_check_timeout_seconds = 4 int64
field v1.DeviceHealth.message = 5 string
field v1.NodeWatchResourcesResponse.devices = 1 repeated v1.DeviceHealth
enum v1.HealthStatus.UNKNOWN = 0
enum v1.HealthStatus.HEALTHY = 1
enum v1.HealthStatus.UNHEALTHY = 2
rpc v1.DRAResourceHealth.NodeWatchResources(v1.NodeWatchResourcesRequest) returns (stream v1.NodeWatchResourcesResponse)
file k8s.io/kubelet/pkg/apis/dra-health/v1alpha1/api.proto package v1alpha1 proto3
message v1alpha1.NodeWatchResourcesRequest {}
field v1alpha1.DeviceIdentifier.pool_name = 1 string
field v1alpha1.DeviceIdentifier.device_name = 2 string
field v1alpha1.DeviceHealth.device = 1 v1alpha1.DeviceIdentifier
field v1alpha1.DeviceHealth.health = 2 v1alpha1.HealthStatus
field v1alpha1.DeviceHealth.last_updated_time = 3 int64
field v1alpha1.DeviceHealth.health_check_timeout_seconds = 4 int64
field v1alpha1.DeviceHealth.message = 5 string
field v1alpha1.NodeWatchResourcesResponse.devices = 1 repeated v1alpha1.DeviceHealth
enum v1alpha1.HealthStatus.UNKNOWN = 0
enum v1alpha1.HealthStatus.HEALTHY = 1
enum v1alpha1.HealthStatus.UNHEALTHY = 2
rpc v1alpha1.DRAResourceHealth.NodeWatchResources(v1alpha1.NodeWatchResourcesRequest) returns (stream v1alpha1.NodeWatchResourcesResponse)
";

/// Every package, message, field (name, number, cardinality, type), enum
/// value and RPC, exactly as upstream defines them. Changing the .proto
/// files without changing this table fails; so does the reverse.
#[test]
fn schema_is_pinned() {
    let actual = describe_schema();
    let expected: Vec<&str> = PINNED_SCHEMA.lines().collect();
    if actual != expected {
        let actual_text = actual.join("\n");
        panic!("schema drifted from the pinned upstream contract:\n{actual_text}");
    }
}
