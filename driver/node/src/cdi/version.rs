//! CDI schema versions and the lowest one a given spec needs.
//!
//! Runtimes refuse a spec whose `cdiVersion` is lower than what its fields require,
//! and older runtimes refuse versions they do not know. Writing exactly the minimum
//! keeps our specs loadable by the widest range of runtimes.
//!
//! When each feature arrived (from the CDI specification's version history):
//!
//! | version | what needs it |
//! |---------|---------------|
//! | 0.3.0   | baseline: env, deviceNodes (path, type, major, minor, fileMode, permissions, uid, gid), mounts (hostPath, containerPath, options), hooks |
//! | 0.4.0   | `type` on a mount |
//! | 0.5.0   | `hostPath` on a device node; a device name starting with a digit |
//! | 0.6.0   | `annotations` on the spec or a device; a dot in the kind's class segment |
//! | 0.7.0   | `intelRdt`; `additionalGids` |
//! | 0.8.0   | no schema change (Go API only) |
//! | 1.0.0   | no schema change (Go API only) |
//! | 1.1.0   | `netDevices`; `schemata` or `enableMonitoring` in `intelRdt` |

use std::fmt;
use std::str::FromStr;

use super::spec::{ContainerEdits, Spec};

/// A CDI schema version (`major.minor.patch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Version {
    pub(crate) major: u32,
    pub(crate) minor: u32,
    pub(crate) patch: u32,
}

impl Version {
    pub(crate) const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    pub(crate) const V0_3_0: Version = Version::new(0, 3, 0);
    pub(crate) const V0_4_0: Version = Version::new(0, 4, 0);
    pub(crate) const V0_5_0: Version = Version::new(0, 5, 0);
    pub(crate) const V0_6_0: Version = Version::new(0, 6, 0);
    pub(crate) const V0_7_0: Version = Version::new(0, 7, 0);
    pub(crate) const V0_8_0: Version = Version::new(0, 8, 0);
    pub(crate) const V1_0_0: Version = Version::new(1, 0, 0);
    pub(crate) const V1_1_0: Version = Version::new(1, 1, 0);

    /// Whether runtimes know this version. They match released versions exactly, so a
    /// well-formed but unreleased version (`0.6.1`) is refused.
    pub(crate) fn is_released(self) -> bool {
        RELEASED.contains(&self)
    }
}

/// Released schema versions, oldest first. 0.1.0 and 0.2.0 predate the current
/// layout and are not accepted for new specs, so the list starts at 0.3.0.
pub(crate) const RELEASED: [Version; 8] = [
    Version::V0_3_0,
    Version::V0_4_0,
    Version::V0_5_0,
    Version::V0_6_0,
    Version::V0_7_0,
    Version::V0_8_0,
    Version::V1_0_0,
    Version::V1_1_0,
];

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// A `cdiVersion` that is not `major.minor.patch`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CDI version {0:?}: expected semver major.minor.patch")]
pub(crate) struct VersionError(pub String);

impl FromStr for Version {
    type Err = VersionError;

    /// Parses semver core versions. A leading `v` is accepted because runtimes accept
    /// it; pre-release and build suffixes are not, because no released CDI version has
    /// one. Leading zeros are refused as semver demands.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || VersionError(s.to_owned());
        let core = s.strip_prefix('v').unwrap_or(s);
        let mut parts = core.split('.');
        let mut next = || -> Result<u32, VersionError> {
            let p = parts.next().ok_or_else(err)?;
            let well_formed = !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
                && (p == "0" || !p.starts_with('0'));
            if !well_formed {
                return Err(err());
            }
            p.parse().map_err(|_| err())
        };
        let v = Version::new(next()?, next()?, next()?);
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(v)
    }
}

/// The lowest released `cdiVersion` whose schema has every field `spec` uses.
pub(crate) fn minimum_version(spec: &Spec) -> Version {
    let edits: Vec<&ContainerEdits> = std::iter::once(&spec.container_edits)
        .chain(spec.devices.iter().map(|d| &d.container_edits))
        .collect();
    let any = |f: fn(&ContainerEdits) -> bool| edits.iter().any(|e| f(e));

    if any(|e| {
        !e.net_devices.is_empty()
            || e.intel_rdt
                .as_ref()
                .is_some_and(|r| r.schemata.is_some() || r.enable_monitoring)
    }) {
        return Version::V1_1_0;
    }
    if any(|e| e.intel_rdt.is_some() || !e.additional_gids.is_empty()) {
        return Version::V0_7_0;
    }
    let class_has_dot = spec
        .kind
        .split_once('/')
        .is_some_and(|(_, class)| class.contains('.'));
    if !spec.annotations.is_empty()
        || spec.devices.iter().any(|d| !d.annotations.is_empty())
        || class_has_dot
    {
        return Version::V0_6_0;
    }
    let name_starts_with_digit = spec
        .devices
        .iter()
        .any(|d| d.name.bytes().next().is_some_and(|b| b.is_ascii_digit()));
    if name_starts_with_digit || any(|e| e.device_nodes.iter().any(|n| n.host_path.is_some())) {
        return Version::V0_5_0;
    }
    if any(|e| e.mounts.iter().any(|m| m.kind.is_some())) {
        return Version::V0_4_0;
    }
    Version::V0_3_0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::spec::{Device, DeviceNode, IntelRdt, Mount, NetDevice};

    fn base() -> Spec {
        Spec {
            cdi_version: String::new(),
            kind: "vendor.com/gpu".into(),
            devices: vec![Device {
                name: "dev0".into(),
                container_edits: ContainerEdits {
                    env: vec!["A=1".into()],
                    device_nodes: vec![DeviceNode {
                        path: "/dev/x".into(),
                        kind: Some("c".into()),
                        major: Some(1),
                        minor: Some(3),
                        permissions: Some("rw".into()),
                        ..Default::default()
                    }],
                    mounts: vec![Mount {
                        host_path: "/a".into(),
                        container_path: "/a".into(),
                        options: vec!["ro".into(), "bind".into()],
                        kind: None,
                    }],
                    ..Default::default()
                },
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn minimum_version_table() {
        type Edit = fn(&mut Spec);
        let cases: Vec<(&str, Edit, Version)> = vec![
            ("baseline", |_| {}, Version::V0_3_0),
            (
                "mount type",
                |s| s.devices[0].container_edits.mounts[0].kind = Some("bind".into()),
                Version::V0_4_0,
            ),
            (
                "mount type at spec level",
                |s| {
                    s.container_edits.mounts.push(Mount {
                        host_path: "/b".into(),
                        container_path: "/b".into(),
                        kind: Some("bind".into()),
                        options: vec![],
                    })
                },
                Version::V0_4_0,
            ),
            (
                "device node hostPath",
                |s| s.devices[0].container_edits.device_nodes[0].host_path = Some("/h".into()),
                Version::V0_5_0,
            ),
            (
                "device name starts with a digit",
                |s| s.devices[0].name = "0abc-gpu-0".into(),
                Version::V0_5_0,
            ),
            (
                "spec annotations",
                |s| {
                    s.annotations.insert("a.com/b".into(), "c".into());
                },
                Version::V0_6_0,
            ),
            (
                "device annotations",
                |s| {
                    s.devices[0].annotations.insert("a".into(), "b".into());
                },
                Version::V0_6_0,
            ),
            (
                "dot in class",
                |s| s.kind = "vendor.com/g.pu".into(),
                Version::V0_6_0,
            ),
            (
                "dot in vendor only",
                |s| s.kind = "k8s.gpu.topodra.dev/claim".into(),
                Version::V0_3_0,
            ),
            (
                "additional gids",
                |s| s.container_edits.additional_gids = vec![44],
                Version::V0_7_0,
            ),
            (
                "intelRdt with closID only",
                |s| {
                    s.devices[0].container_edits.intel_rdt = Some(IntelRdt {
                        clos_id: Some("gpu".into()),
                        ..Default::default()
                    })
                },
                Version::V0_7_0,
            ),
            (
                "intelRdt schemata",
                |s| {
                    s.container_edits.intel_rdt = Some(IntelRdt {
                        schemata: Some(vec!["L3:0=f".into()]),
                        ..Default::default()
                    })
                },
                Version::V1_1_0,
            ),
            (
                "intelRdt monitoring",
                |s| {
                    s.devices[0].container_edits.intel_rdt = Some(IntelRdt {
                        enable_monitoring: true,
                        ..Default::default()
                    })
                },
                Version::V1_1_0,
            ),
            (
                "net devices",
                |s| {
                    s.devices[0].container_edits.net_devices = vec![NetDevice {
                        host_interface_name: "eth1".into(),
                        name: "net1".into(),
                    }]
                },
                Version::V1_1_0,
            ),
            (
                "highest feature wins",
                |s| {
                    s.annotations.insert("a".into(), "b".into());
                    s.devices[0].container_edits.mounts[0].kind = Some("bind".into());
                    s.container_edits.additional_gids = vec![1];
                },
                Version::V0_7_0,
            ),
        ];
        for (name, edit, want) in cases {
            let mut spec = base();
            edit(&mut spec);
            assert_eq!(minimum_version(&spec), want, "{name}");
        }
    }

    #[test]
    fn empty_collections_do_not_raise_the_version() {
        let mut spec = base();
        spec.container_edits.additional_gids = vec![];
        spec.devices[0].annotations.clear();
        spec.devices[0].name = String::new();
        assert_eq!(minimum_version(&spec), Version::V0_3_0);
    }

    #[test]
    fn parse_and_print() {
        for (s, want) in [
            ("0.6.0", Some(Version::V0_6_0)),
            ("v1.1.0", Some(Version::V1_1_0)),
            ("10.20.30", Some(Version::new(10, 20, 30))),
            ("0.6", None),
            ("0.6.0.1", None),
            ("01.0.0", None),
            ("0.6.0-rc1", None),
            ("", None),
            ("a.b.c", None),
            ("0..0", None),
        ] {
            assert_eq!(s.parse::<Version>().ok(), want, "{s}");
        }
        assert_eq!(Version::V0_5_0.to_string(), "0.5.0");
        assert!(Version::V0_6_0.is_released());
        assert!(!Version::new(0, 6, 1).is_released());
        assert!(RELEASED.windows(2).all(|w| w[0] < w[1]));
    }
}
