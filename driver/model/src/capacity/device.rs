//! What the model keeps of one published device.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceTaint};

use super::Level;
use super::values::{self, InvalidValue};
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
    /// The record of one device, and the topology values of it that were not taken
    /// (see [`values`]).
    pub(crate) fn from_device(dev: &Device, driver: &str) -> (Self, Vec<InvalidValue>) {
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
        let mut invalid = Vec::new();
        let groups = Level::ALL.map(|l| {
            values::group_key(l, get(l.attribute())).unwrap_or_else(|e| {
                invalid.push(e);
                None
            })
        });
        let record = Self {
            name: dev.name.clone(),
            kind,
            groups,
            tainted: dev
                .taints
                .as_deref()
                .is_some_and(|t| t.iter().any(keeps_off)),
        };
        (record, invalid)
    }

    pub(crate) fn group(&self, level: Level) -> Option<&str> {
        self.groups[level_index(level)].as_deref()
    }
}

pub(super) fn level_index(level: Level) -> usize {
    Level::ALL.iter().position(|l| *l == level).unwrap_or(0)
}

/// NoSchedule and NoExecute keep new allocations off a device; the `None` effect
/// only informs.
pub(super) fn keeps_off(t: &DeviceTaint) -> bool {
    matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")
}

/// What the model takes from a slice's devices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct SliceDevices {
    pub(super) records: BTreeMap<String, DeviceRecord>,
    /// Names that more than one device of the slice carries. The API server refuses
    /// such a slice, so only a broken or hostile writer gets one past it.
    pub(super) duplicates: Vec<String>,
    /// Topology values not taken, by device name.
    pub(super) invalid: Vec<(String, InvalidValue)>,
}

/// The devices of a slice, by name.
pub(super) fn records(devices: &[Device], driver: &str) -> SliceDevices {
    let mut out = SliceDevices::default();
    for d in devices {
        let (record, invalid) = DeviceRecord::from_device(d, driver);
        out.invalid
            .extend(invalid.into_iter().map(|v| (d.name.clone(), v)));
        if out.records.insert(d.name.clone(), record).is_some() && !out.duplicates.contains(&d.name)
        {
            out.duplicates.push(d.name.clone());
        }
    }
    out
}

/// What a model that keeps one driver's node-bound slices makes of `slice`: its name
/// and node; `Err(name)` for a slice it must forget (another driver's, or bound to
/// no node); `None` for a slice without a name.
pub(super) fn node_slice(
    slice: &k8s_openapi::api::resource::v1::ResourceSlice,
    driver: &str,
) -> Option<Result<(String, String), String>> {
    let name = slice.metadata.name.clone()?;
    let spec = &slice.spec;
    match spec.node_name.clone().filter(|n| !n.is_empty()) {
        Some(node) if spec.driver == driver => Some(Ok((name, node))),
        _ => Some(Err(name)),
    }
}
