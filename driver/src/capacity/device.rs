//! What the model keeps of one published device.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceTaint};

use super::Level;
use crate::slice::attributes::{TYPE, TYPE_GPU, TYPE_MIG};

/// Whole GPUs are what the figures count; MIG devices are counted apart, since one
/// is a slice of a GPU and never part of an aligned set of GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum DeviceKind {
    Gpu,
    Mig,
    Other,
}

/// One device of a slice, reduced to what placement depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeviceRecord {
    pub(crate) name: String,
    pub(crate) kind: DeviceKind,
    /// The group key at each level (index = position in [`Level::ALL`]); `None` when
    /// the device does not carry the attribute, so no constraint on it can match.
    pub(crate) groups: [Option<String>; 5],
    /// A taint that keeps new claims off (NoSchedule or NoExecute) in the slice.
    pub(crate) tainted: bool,
}

impl DeviceRecord {
    pub(crate) fn from_device(dev: &Device, driver: &str) -> Self {
        let attrs = dev.attributes.as_ref();
        let get = |name: &str| -> Option<&DeviceAttribute> {
            let attrs = attrs?;
            attrs
                .get(name)
                .or_else(|| attrs.get(&format!("{driver}/{name}")))
        };
        let kind = match get(TYPE).and_then(|a| a.string.as_deref()) {
            Some(TYPE_GPU) => DeviceKind::Gpu,
            Some(TYPE_MIG) => DeviceKind::Mig,
            _ => DeviceKind::Other,
        };
        let groups = Level::ALL.map(|l| get(l.attribute()).and_then(group_key));
        Self {
            name: dev.name.clone(),
            kind,
            groups,
            tainted: dev
                .taints
                .as_deref()
                .is_some_and(|t| t.iter().any(keeps_off)),
        }
    }

    pub(crate) fn group(&self, level: Level) -> Option<&str> {
        self.groups[level_index(level)].as_deref()
    }
}

pub(super) fn level_index(level: Level) -> usize {
    Level::ALL.iter().position(|l| *l == level).unwrap_or(0)
}

/// The value a device is grouped by. For the list form of `numaNode` that is the
/// first element, the device's own node: the model reports strict NUMA locality,
/// whatever wider match the list allows.
fn group_key(a: &DeviceAttribute) -> Option<String> {
    if let Some(i) = a.int {
        return Some(i.to_string());
    }
    if let Some(s) = &a.string {
        return Some(s.clone());
    }
    if let Some(i) = a.ints.as_ref().and_then(|v| v.first()) {
        return Some(i.to_string());
    }
    if let Some(s) = a.strings.as_ref().and_then(|v| v.first()) {
        return Some(s.clone());
    }
    a.version.clone()
}

/// NoSchedule and NoExecute keep new allocations off a device; the `None` effect
/// only informs.
pub(super) fn keeps_off(t: &DeviceTaint) -> bool {
    matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")
}

/// The devices of a slice, by name.
pub(super) fn records(devices: &[Device], driver: &str) -> BTreeMap<String, DeviceRecord> {
    devices
        .iter()
        .map(|d| (d.name.clone(), DeviceRecord::from_device(d, driver)))
        .collect()
}
