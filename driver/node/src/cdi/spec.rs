//! The CDI spec document, as container runtimes read it from a spec directory.
//!
//! Field names follow the CDI specification. Optional fields are left out of the JSON
//! when empty, both to keep files small and because the presence of some fields raises
//! the `cdiVersion` a runtime demands ([`super::version::minimum_version`]).
//!
//! Reading is tolerant (unknown fields are ignored) so that specs written by other
//! tools, such as the NVIDIA Container Toolkit's, can be parsed for the parts we use.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A whole CDI spec file: one vendor/class and the devices it defines.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// Semver of the CDI schema this document needs; see `super::minimum_version`.
    pub cdi_version: String,
    /// `vendor/class`, e.g. `super::CDI_KIND`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Always written, even when empty: the field is required by the schema.
    #[serde(default)]
    pub devices: Vec<Device>,
    /// Edits applied whenever any device of this spec is injected.
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// One injectable device, named `kind=name` by its users.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Always written: runtimes reject a device whose edits are empty, and an explicit
    /// object makes that mistake visible in the file rather than hiding it.
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

/// Changes a runtime makes to the container's OCI spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `KEY=VALUE` entries appended to the container environment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// Since 0.7.0 (the JSON name is `additionalGids`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_gids: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// Since 0.7.0; some of its fields since 1.1.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intel_rdt: Option<IntelRdt>,
    /// Since 1.1.0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub net_devices: Vec<NetDevice>,
}

impl ContainerEdits {
    pub(crate) fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.additional_gids.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
            && self.intel_rdt.is_none()
            && self.net_devices.is_empty()
    }
}

/// A device node to create in the container (and allow in its device cgroup).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path inside the container.
    pub path: String,
    /// Path on the host when it differs from `path`. Since 0.5.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// `c` (char), `b` (block), `u` (unbuffered char) or `p` (FIFO).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Cgroup access, letters of `rwm`; omitted means `rwm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

/// A mount added to the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    /// Filesystem type; since 0.4.0.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// An OCI hook the runtime runs at `hook_name`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    pub hook_name: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Seconds; must be positive when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// Linux resctrl settings (`intelRdt`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IntelRdt {
    #[serde(default, rename = "closID", skip_serializing_if = "Option::is_none")]
    pub clos_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l3_cache_schema: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_bw_schema: Option<String>,
    /// Since 1.1.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schemata: Option<Vec<String>>,
    /// Since 1.1.0.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enable_monitoring: bool,
}

/// A host network interface moved into the container. Since 1.1.0.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetDevice {
    pub host_interface_name: String,
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_optional_fields_are_left_out() {
        let spec = Spec {
            cdi_version: "0.3.0".into(),
            kind: "vendor.com/gpu".into(),
            devices: vec![Device {
                name: "a".into(),
                container_edits: ContainerEdits {
                    device_nodes: vec![DeviceNode {
                        path: "/dev/a".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                ..Default::default()
            }],
            ..Default::default()
        };
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(
            json,
            r#"{"cdiVersion":"0.3.0","kind":"vendor.com/gpu","devices":[{"name":"a","containerEdits":{"deviceNodes":[{"path":"/dev/a"}]}}]}"#
        );
    }

    #[test]
    fn json_names_follow_the_cdi_schema() {
        let edits = ContainerEdits {
            device_nodes: vec![DeviceNode {
                path: "/dev/x".into(),
                host_path: Some("/host/dev/x".into()),
                kind: Some("c".into()),
                major: Some(195),
                minor: Some(0),
                file_mode: Some(0o666),
                permissions: Some("rw".into()),
                uid: Some(1),
                gid: Some(2),
            }],
            mounts: vec![Mount {
                host_path: "/a".into(),
                container_path: "/b".into(),
                kind: Some("bind".into()),
                options: vec!["ro".into()],
            }],
            hooks: vec![Hook {
                hook_name: "createContainer".into(),
                path: "/bin/true".into(),
                args: vec!["true".into()],
                env: vec!["A=b".into()],
                timeout: Some(5),
            }],
            additional_gids: vec![44],
            intel_rdt: Some(IntelRdt {
                clos_id: Some("gpu".into()),
                enable_monitoring: true,
                ..Default::default()
            }),
            net_devices: vec![NetDevice {
                host_interface_name: "eth1".into(),
                name: "net1".into(),
            }],
            env: vec!["K=V".into()],
        };
        let v = serde_json::to_value(&edits).unwrap();
        let mut keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "additionalGids",
                "deviceNodes",
                "env",
                "hooks",
                "intelRdt",
                "mounts",
                "netDevices"
            ]
        );
        let node = &v["deviceNodes"][0];
        for key in [
            "path",
            "hostPath",
            "type",
            "major",
            "minor",
            "fileMode",
            "permissions",
            "uid",
            "gid",
        ] {
            assert!(node.get(key).is_some(), "{key}");
        }
        assert_eq!(v["mounts"][0]["type"], "bind");
        assert_eq!(v["mounts"][0]["containerPath"], "/b");
        assert_eq!(v["hooks"][0]["hookName"], "createContainer");
        assert_eq!(v["intelRdt"]["closID"], "gpu");
        assert_eq!(v["intelRdt"]["enableMonitoring"], true);
        assert_eq!(v["netDevices"][0]["hostInterfaceName"], "eth1");
        let back: ContainerEdits = serde_json::from_value(v).unwrap();
        assert_eq!(back, edits);
    }

    #[test]
    fn reading_ignores_fields_we_do_not_model() {
        let spec: Spec = serde_json::from_str(
            r#"{"cdiVersion":"0.5.0","kind":"a.com/b","future":1,
                "devices":[{"name":"x","containerEdits":{"env":["A=1"],"newThing":[]}}]}"#,
        )
        .unwrap();
        assert_eq!(spec.devices[0].container_edits.env, ["A=1"]);
    }
}
