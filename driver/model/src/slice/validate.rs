//! The API server's rules for ResourceSlices, checked before anything is sent.
//!
//! A slice the server refuses is a node whose GPUs the scheduler cannot see, reported
//! only as an HTTP 422 in the plugin's log. Checking here turns that into an error that
//! names the device and attribute at fault, at startup or in a unit test.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, Counter, Device, DeviceAttribute, DeviceCapacity, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::SliceError;

mod names;

pub(crate) use names::{check_version, qualified_name};
use names::{dns_label, dns_subdomain};

/// Devices per slice.
pub(crate) const MAX_DEVICES: usize = 128;
/// Devices per slice when a device has taints, consumes counters or carries a
/// list-typed attribute; those cost the server more to store and evaluate.
pub(crate) const MAX_DEVICES_RESTRICTED: usize = 64;
/// Attributes and capacities together, per device.
pub(crate) const MAX_ATTRIBUTES: usize = 32;
/// Bytes in a string or version value.
pub(crate) const MAX_VALUE_LEN: usize = 64;
/// Bytes in a driver name, and in the domain prefix of an attribute name.
pub(crate) const MAX_DOMAIN_LEN: usize = 63;
/// Bytes in the identifier part of an attribute or capacity name.
pub(crate) const MAX_ID_LEN: usize = 32;
/// Bytes in an object name, node name or pool name.
pub(crate) const MAX_SUBDOMAIN_LEN: usize = 253;
/// Bytes in a device name.
pub(crate) const MAX_LABEL_LEN: usize = 63;
/// Counter sets per slice (`ResourceSliceMaxCounterSets`).
pub(crate) const MAX_COUNTER_SETS: usize = 8;
/// Counters per counter set, and per consumption of one
/// (`ResourceSliceMaxCountersPerCounterSet`,
/// `ResourceSliceMaxCountersPerDeviceCounterConsumption`).
pub(crate) const MAX_COUNTERS: usize = 32;
/// Counter sets one device consumes from
/// (`ResourceSliceMaxDeviceCounterConsumptionsPerDevice`).
pub(crate) const MAX_CONSUMPTIONS: usize = 2;

/// The most devices one slice may hold, given the devices in it.
pub(crate) fn device_limit<'a>(devices: impl IntoIterator<Item = &'a Device>) -> usize {
    if devices.into_iter().any(is_restricted) {
        MAX_DEVICES_RESTRICTED
    } else {
        MAX_DEVICES
    }
}

/// Whether this device lowers its slice's device limit to [`MAX_DEVICES_RESTRICTED`].
pub(crate) fn is_restricted(d: &Device) -> bool {
    d.taints.as_ref().is_some_and(|t| !t.is_empty())
        || d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
        || d.attributes
            .as_ref()
            .is_some_and(|a| a.values().any(is_list))
}

fn is_list(a: &DeviceAttribute) -> bool {
    a.bools.is_some() || a.ints.is_some() || a.strings.is_some() || a.versions.is_some()
}

pub(crate) fn validate_driver_name(name: &str) -> Result<(), SliceError> {
    dns_subdomain(name, MAX_DOMAIN_LEN).map_err(|reason| SliceError::DriverName {
        name: name.to_owned(),
        reason,
    })
}

pub(crate) fn validate_node_name(name: &str) -> Result<(), SliceError> {
    dns_subdomain(name, MAX_SUBDOMAIN_LEN).map_err(|reason| SliceError::NodeName {
        name: name.to_owned(),
        reason,
    })
}

/// One slice on its own: names, limits and every device.
pub(crate) fn validate_slice(slice: &ResourceSlice) -> Result<(), SliceError> {
    let slice_name = slice.metadata.name.clone().unwrap_or_default();
    dns_subdomain(&slice_name, MAX_SUBDOMAIN_LEN).map_err(|reason| SliceError::SliceName {
        name: slice_name.clone(),
        reason,
    })?;
    let spec = &slice.spec;
    validate_driver_name(&spec.driver)?;
    if let Some(node) = &spec.node_name {
        validate_node_name(node)?;
    }
    dns_subdomain(&spec.pool.name, MAX_SUBDOMAIN_LEN).map_err(|reason| SliceError::PoolName {
        name: spec.pool.name.clone(),
        reason,
    })?;
    if spec.pool.generation < 0 {
        return Err(SliceError::NegativeGeneration {
            slice: slice_name,
            generation: spec.pool.generation,
        });
    }
    if spec.pool.resource_slice_count < 1 {
        return Err(SliceError::SliceCount {
            slice: slice_name,
            declared: spec.pool.resource_slice_count,
            actual: None,
        });
    }

    let devices = spec.devices.as_deref().unwrap_or_default();
    let sets = spec.shared_counters.as_deref().unwrap_or_default();
    if !devices.is_empty() && !sets.is_empty() {
        return Err(SliceError::CountersAndDevices { slice: slice_name });
    }
    if sets.len() > MAX_COUNTER_SETS {
        return Err(SliceError::TooManyCounterSets {
            slice: slice_name,
            count: sets.len(),
            max: MAX_COUNTER_SETS,
        });
    }
    for set in sets {
        dns_label(&set.name).map_err(|reason| SliceError::CounterName {
            set: set.name.clone(),
            name: set.name.clone(),
            reason,
        })?;
        validate_counters(
            &set.name,
            &format!("counter set {:?}", set.name),
            &set.counters,
        )?;
    }
    let max = device_limit(devices);
    if devices.len() > max {
        return Err(SliceError::TooManyDevices {
            slice: slice_name,
            count: devices.len(),
            max,
        });
    }
    let mut seen = BTreeSet::new();
    for d in devices {
        validate_device(&spec.driver, d)?;
        if !seen.insert(d.name.as_str()) {
            return Err(SliceError::DuplicateDevice {
                pool: spec.pool.name.clone(),
                device: d.name.clone(),
            });
        }
    }
    Ok(())
}

/// All slices of one pool: each slice, plus what must agree across them.
pub(crate) fn validate_pool(slices: &[ResourceSlice]) -> Result<(), SliceError> {
    let Some(first) = slices.first() else {
        return Ok(());
    };
    let pool = &first.spec.pool;
    let mut devices = BTreeSet::new();
    let mut names = BTreeSet::new();
    for s in slices {
        validate_slice(s)?;
        let name = s.metadata.name.clone().unwrap_or_default();
        let mixed = |field, expected: String, found: String| SliceError::MixedPool {
            slice: name.clone(),
            field,
            expected,
            found,
        };
        if s.spec.driver != first.spec.driver {
            return Err(mixed(
                "driver",
                first.spec.driver.clone(),
                s.spec.driver.clone(),
            ));
        }
        if s.spec.pool.name != pool.name {
            return Err(mixed(
                "pool name",
                pool.name.clone(),
                s.spec.pool.name.clone(),
            ));
        }
        if s.spec.pool.generation != pool.generation {
            return Err(mixed(
                "pool generation",
                pool.generation.to_string(),
                s.spec.pool.generation.to_string(),
            ));
        }
        let actual = i64::try_from(slices.len()).unwrap_or(i64::MAX);
        if s.spec.pool.resource_slice_count != actual {
            return Err(SliceError::SliceCount {
                slice: name,
                declared: s.spec.pool.resource_slice_count,
                actual: Some(slices.len()),
            });
        }
        if !names.insert(name.clone()) {
            return Err(SliceError::DuplicateSlice { slice: name });
        }
        for d in s.spec.devices.iter().flatten() {
            if !devices.insert(d.name.as_str()) {
                return Err(SliceError::DuplicateDevice {
                    pool: pool.name.clone(),
                    device: d.name.clone(),
                });
            }
        }
    }
    validate_consumptions(slices)
}

/// Counter set names are unique in the pool, and every counter a device consumes
/// is one of a set in the pool. The API server checks one slice at a time and
/// cannot see this; the scheduler can, and then sets the whole pool aside.
fn validate_consumptions(slices: &[ResourceSlice]) -> Result<(), SliceError> {
    let mut sets = BTreeMap::new();
    for s in slices {
        for set in s.spec.shared_counters.iter().flatten() {
            if sets.insert(set.name.as_str(), &set.counters).is_some() {
                return Err(SliceError::DuplicateCounterSet {
                    pool: s.spec.pool.name.clone(),
                    set: set.name.clone(),
                });
            }
        }
    }
    for d in slices.iter().flat_map(|s| s.spec.devices.iter().flatten()) {
        for c in d.consumes_counters.iter().flatten() {
            let set =
                sets.get(c.counter_set.as_str())
                    .ok_or_else(|| SliceError::UnknownCounterSet {
                        device: d.name.clone(),
                        set: c.counter_set.clone(),
                    })?;
            if let Some(counter) = c.counters.keys().find(|k| !set.contains_key(*k)) {
                return Err(SliceError::UnknownCounter {
                    device: d.name.clone(),
                    set: c.counter_set.clone(),
                    counter: counter.clone(),
                });
            }
        }
    }
    Ok(())
}

/// A counter set's or a consumption's counters: at least one, at most 32, each
/// named by a DNS label.
fn validate_counters(
    set: &str,
    owner: &str,
    counters: &BTreeMap<String, Counter>,
) -> Result<(), SliceError> {
    if counters.is_empty() {
        return Err(SliceError::NoCounters {
            owner: owner.to_owned(),
        });
    }
    if counters.len() > MAX_COUNTERS {
        return Err(SliceError::TooManyCounters {
            owner: owner.to_owned(),
            count: counters.len(),
            max: MAX_COUNTERS,
        });
    }
    for name in counters.keys() {
        dns_label(name).map_err(|reason| SliceError::CounterName {
            set: set.to_owned(),
            name: name.clone(),
            reason,
        })?;
    }
    Ok(())
}

fn validate_device(driver: &str, d: &Device) -> Result<(), SliceError> {
    if let Err(reason) = dns_label(&d.name) {
        return Err(SliceError::DeviceName {
            device: d.name.clone(),
            reason,
        });
    }
    let empty = BTreeMap::new();
    let attributes = d.attributes.as_ref().unwrap_or(&empty);
    let capacity_names = d.capacity.iter().flat_map(|c| c.keys());
    let count = attributes
        .len()
        .saturating_add(d.capacity.as_ref().map_or(0, |c| c.len()));
    if count > MAX_ATTRIBUTES {
        return Err(SliceError::TooManyAttributes {
            device: d.name.clone(),
            count,
            max: MAX_ATTRIBUTES,
        });
    }
    for name in attributes.keys().chain(capacity_names) {
        qualified_name(name).map_err(|reason| SliceError::AttributeName {
            device: d.name.clone(),
            attribute: name.clone(),
            reason,
        })?;
    }
    // CEL reads an unqualified name as `<driver>/<name>`, so `uuid` and
    // `gpu.topodra.dev/uuid` are one attribute to a selector and one would shadow the
    // other.
    let qualify = |n: &str| match n.contains('/') {
        true => n.to_owned(),
        false => format!("{driver}/{n}"),
    };
    for names in [
        attributes.keys().collect::<Vec<_>>(),
        d.capacity.iter().flat_map(|c| c.keys()).collect(),
    ] {
        let mut seen = BTreeSet::new();
        for n in names {
            if !seen.insert(qualify(n)) {
                return Err(SliceError::DuplicateAttribute {
                    device: d.name.clone(),
                    attribute: qualify(n),
                });
            }
        }
    }
    for (name, value) in attributes {
        validate_value(&d.name, name, value)?;
    }
    for (name, c) in d.capacity.iter().flatten() {
        if let Some(policy) = &c.request_policy {
            check_request_policy(d.allow_multiple_allocations == Some(true), c, policy).map_err(
                |reason| SliceError::RequestPolicy {
                    device: d.name.clone(),
                    capacity: name.clone(),
                    reason,
                },
            )?;
        }
    }
    let consumptions = d.consumes_counters.as_deref().unwrap_or_default();
    if consumptions.len() > MAX_CONSUMPTIONS {
        return Err(SliceError::TooManyConsumptions {
            device: d.name.clone(),
            count: consumptions.len(),
            max: MAX_CONSUMPTIONS,
        });
    }
    let mut sets = BTreeSet::new();
    for c in consumptions {
        if !sets.insert(c.counter_set.as_str()) {
            return Err(SliceError::DuplicateConsumption {
                device: d.name.clone(),
                set: c.counter_set.clone(),
            });
        }
        validate_counters(
            &c.counter_set,
            &format!("device {:?} consuming from {:?}", d.name, c.counter_set),
            &c.counters,
        )?;
    }
    Ok(())
}

/// [`validate_device`] for the tests of other modules, under the default driver.
#[cfg(test)]
pub(crate) fn check_device_for_tests(d: &Device) -> Result<(), SliceError> {
    validate_device(super::DEFAULT_DRIVER_NAME, d)
}

/// The API server's rules for a consumable capacity's request policy
/// (`validateRequestPolicy` in the 1.37 resource validation): only on a device
/// that allows multiple allocations; a default whenever a range or values are
/// given; the range inside the capacity, the default inside the range and, with a
/// step, the default and max on the grid from min and one step within the value.
/// Only the forms topodra publishes (a range) are checked in full.
fn check_request_policy(
    multiple: bool,
    c: &DeviceCapacity,
    policy: &CapacityRequestPolicy,
) -> Result<(), String> {
    if !multiple {
        return Err("a request policy needs allowMultipleAllocations".to_owned());
    }
    let bytes = |q: &Quantity| {
        q.0.parse::<crate::config::MemoryQuantity>()
            .map(|m| m.bytes())
            .map_err(|e| e.to_string())
    };
    let value = bytes(&c.value)?;
    if policy.valid_values.is_some() && policy.valid_range.is_some() {
        return Err("validValues and validRange exclude each other".to_owned());
    }
    let Some(range) = &policy.valid_range else {
        return Ok(());
    };
    let default = bytes(
        policy
            .default
            .as_ref()
            .ok_or("validRange needs a default")?,
    )?;
    let min = bytes(&range.min)?;
    let max = range.max.as_ref().map(bytes).transpose()?;
    if min > value || default < min || max.is_some_and(|m| m > value || m < min || default > m) {
        return Err(format!(
            "default {default}, min {min} and max {max:?} must satisfy min <= default <= max <= {value}"
        ));
    }
    if let Some(step) = range.step.as_ref().map(bytes).transpose()? {
        let on_grid = |v: u64| v.saturating_sub(min).is_multiple_of(step);
        if min.saturating_add(step) > value || !on_grid(default) || !max.is_none_or(on_grid) {
            return Err(format!(
                "step {step}: min + step must fit in {value}, and default and max lie on the grid from min"
            ));
        }
    }
    Ok(())
}

fn validate_value(device: &str, attribute: &str, a: &DeviceAttribute) -> Result<(), SliceError> {
    let err_ctx = || (device.to_owned(), attribute.to_owned());
    let set = [
        a.bool.is_some(),
        a.bools.is_some(),
        a.int.is_some(),
        a.ints.is_some(),
        a.string.is_some(),
        a.strings.is_some(),
        a.version.is_some(),
        a.versions.is_some(),
    ]
    .into_iter()
    .filter(|s| *s)
    .count();
    if set != 1 {
        let (device, attribute) = err_ctx();
        return Err(SliceError::ValueCount {
            device,
            attribute,
            count: set,
        });
    }
    let empty_list = a.bools.as_ref().is_some_and(Vec::is_empty)
        || a.ints.as_ref().is_some_and(Vec::is_empty)
        || a.strings.as_ref().is_some_and(Vec::is_empty)
        || a.versions.as_ref().is_some_and(Vec::is_empty);
    if empty_list {
        let (device, attribute) = err_ctx();
        return Err(SliceError::EmptyList { device, attribute });
    }
    let strings = a.string.iter().chain(a.strings.iter().flatten());
    let versions = a.version.iter().chain(a.versions.iter().flatten());
    // Go's len(), which the server uses, counts bytes.
    for s in strings.clone().chain(versions.clone()) {
        if s.len() > MAX_VALUE_LEN {
            let (device, attribute) = err_ctx();
            return Err(SliceError::ValueTooLong {
                device,
                attribute,
                value: s.clone(),
                len: s.len(),
                max: MAX_VALUE_LEN,
            });
        }
    }
    for v in versions {
        check_version(v).map_err(|reason| {
            let (device, attribute) = err_ctx();
            SliceError::InvalidVersion {
                device,
                attribute,
                value: v.clone(),
                reason,
            }
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
