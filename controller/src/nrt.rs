//! NodeResourceTopology objects (`topology.node.k8s.io/v1alpha2`, the CRD that the
//! NFD topology updater writes): one per node, one zone per NUMA node with the GPUs
//! there, so schedulers and platforms that read them keep working with no agent on
//! the nodes.

use serde_json::{Value, json};
use std::collections::BTreeMap;

use topodra_model::capacity::{Counts, CpuCounts, Level, MAX_NUMA_NODE, NodeSummary, amount_text};

pub const GROUP: &str = "topology.node.k8s.io";
pub const VERSION: &str = "v1alpha2";
pub const KIND: &str = "NodeResourceTopology";
pub const PLURAL: &str = "noderesourcetopologies";

/// How the objects are written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NrtOptions {
    /// The resource name in each zone (`nvidia.com/gpu`): what pods of the old stack
    /// request and what the topology-aware scheduler matches against.
    pub resource_name: String,
    /// The kubelet Topology Manager policy and scope the objects announce
    /// (`single-numa-node`, `pod`): consumers read them to decide how strictly to
    /// align. With DRA the kubelet does not align GPUs; these say what the scheduler
    /// should assume.
    pub policy: String,
    pub scope: String,
}

impl NrtOptions {
    /// The deprecated `topologyPolicies` value of the same policy and scope, for
    /// consumers that still read it.
    fn legacy_policy(&self) -> &'static str {
        let pod = self.scope == "pod";
        match (self.policy.as_str(), pod) {
            ("single-numa-node", true) => "SingleNUMANodePodLevel",
            ("single-numa-node", false) => "SingleNUMANodeContainerLevel",
            ("restricted", true) => "RestrictedPodLevel",
            ("restricted", false) => "RestrictedContainerLevel",
            ("best-effort", true) => "BestEffortPodLevel",
            ("best-effort", false) => "BestEffortContainerLevel",
            _ => "None",
        }
    }
}

/// The names MIG profiles take beside a GPU resource `<domain>/gpu`: the device
/// plugin's mixed strategy, `<domain>/mig-<profile>` with `+` written `.`
/// (`nvidia.com/mig-1g.10gb.me`). None for a resource named otherwise.
fn mig_prefix(gpu_resource: &str) -> Option<String> {
    gpu_resource
        .strip_suffix("/gpu")
        .map(|domain| format!("{domain}/mig-"))
}

/// The name of one capacity of shared GPUs beside a GPU resource `<domain>/gpu`:
/// `<domain>/<mode>-<capacity>`, the mode in lower case with words split by `-`
/// (`nvidia.com/time-slicing-memory`, `nvidia.com/mps-compute`). The device plugin
/// has no name for shared memory; the mode is in the name because a GPU's memory
/// goes to the shares of one mode at a time. `None` for a resource named
/// otherwise, or a mode or capacity (both from slices) that would not make a valid
/// resource name.
fn shared_name(gpu_resource: &str, mode: &str, capacity: &str) -> Option<String> {
    let domain = gpu_resource.strip_suffix("/gpu")?;
    let name = format!("{}-{}", kebab(mode)?, kebab(capacity)?);
    // A resource name's part after the domain is at most 63 characters.
    (name.len() <= 63).then(|| format!("{domain}/{name}"))
}

/// `TimeSlicing` as `time-slicing`, `MPS` as `mps`; `None` for anything but ASCII
/// letters and digits.
fn kebab(word: &str) -> Option<String> {
    if word.is_empty() || !word.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    let mut out = String::with_capacity(word.len().saturating_add(4));
    let mut prev_lower = false;
    for c in word.chars() {
        if c.is_ascii_uppercase() && prev_lower {
            out.push('-');
        }
        prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        out.push(c.to_ascii_lowercase());
    }
    Some(out)
}

/// The fields we own in a node's object, as sent by server-side apply. Zones are the
/// node's NUMA nodes that have GPUs or CPUs of the CPU driver, named `node-<id>` as
/// the kubelet and the NFD updater name them (consumers parse the id from it). The
/// GPU resource: capacity is every GPU there, allocatable the ones not unhealthy or
/// tainted, available the free ones. `cpu`, where the CPU driver publishes CPUs
/// there (`cpus`, by NUMA node): capacity and allocatable its CPUs (it leaves the
/// reserved ones out), available those no claim holds, as the NFD updater reported
/// the kubelet's exclusive CPUs. Each MIG profile the zone's GPUs offer, under the
/// device plugin's name for it ([`mig_prefix`]): available the devices of the
/// profile the zone can still hand out together, capacity and allocatable those plus
/// the ones allocated (with dynamic MIG this moves as GPUs are carved). Each
/// capacity of the zone's shared GPUs, per sharing mode ([`shared_name`]): capacity
/// all of it, allocatable what shares hold plus what is left on the GPUs that can
/// take another share (not allocated whole, carved or tainted), available what is
/// left there. A node without shared GPUs gets none of these.
/// `None` when the node's GPUs carry no NUMA node: no zone can be said.
///
/// The capacity model only groups by NUMA node ids a kernel can have; a summary made
/// some other way gets no zone for any other key, so a zone name is always
/// `node-<0..=1023>`.
pub fn desired(
    summary: &NodeSummary,
    cpus: &BTreeMap<u32, CpuCounts>,
    node_uid: &str,
    opts: &NrtOptions,
) -> Option<Value> {
    let gpus: BTreeMap<u16, Counts> = summary
        .groups(Level::NumaNode)
        .iter()
        .filter_map(|g| Some((numa_id(&g.key)?, g.counts)))
        .collect();
    if gpus.is_empty() {
        return None;
    }
    let cpus: BTreeMap<u16, CpuCounts> = cpus
        .iter()
        .filter_map(|(id, c)| Some((u16::try_from(*id).ok()?, *c)))
        .filter(|(id, _)| i64::from(*id) <= MAX_NUMA_NODE)
        .collect();
    let ids: std::collections::BTreeSet<u16> = gpus.keys().chain(cpus.keys()).copied().collect();
    let zones: Vec<Value> = ids
        .into_iter()
        .map(|id| {
            let mut resources = Vec::new();
            if let Some(c) = gpus.get(&id) {
                resources.push(json!({
                    "name": opts.resource_name,
                    "capacity": c.total.to_string(),
                    "allocatable": c.total.saturating_sub(c.unhealthy).to_string(),
                    "available": c.free.to_string(),
                }));
            }
            if let Some(prefix) = mig_prefix(&opts.resource_name) {
                for g in summary
                    .profiles
                    .iter()
                    .filter(|g| g.numa_node.as_deref().and_then(numa_id) == Some(id))
                {
                    let held = g.available.saturating_add(g.allocated).to_string();
                    resources.push(json!({
                        "name": format!("{prefix}{}", g.profile.replace('+', ".")),
                        "capacity": held,
                        "allocatable": held,
                        "available": g.available.to_string(),
                    }));
                }
            }
            for g in summary
                .shared
                .iter()
                .filter(|g| g.numa_node.as_deref().and_then(numa_id) == Some(id))
            {
                for (capacity, f) in &g.capacity {
                    let Some(name) = shared_name(&opts.resource_name, &g.sharing, capacity) else {
                        continue;
                    };
                    let amount = |v: u64| amount_text(capacity, v);
                    resources.push(json!({
                        "name": name,
                        "capacity": amount(f.total),
                        "allocatable": amount(f.allocated.saturating_add(f.free)),
                        "available": amount(f.free),
                    }));
                }
            }
            if let Some(c) = cpus.get(&id) {
                resources.push(json!({
                    "name": "cpu",
                    "capacity": c.total.to_string(),
                    "allocatable": c.total.to_string(),
                    "available": c.free().to_string(),
                }));
            }
            json!({
                "name": format!("node-{id}"),
                "type": "Node",
                "resources": resources,
            })
        })
        .collect();
    if zones.is_empty() {
        return None;
    }
    Some(json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": KIND,
        "metadata": {
            "name": summary.node,
            "labels": {
                topodra_model::slice::MANAGED_BY_LABEL: topodra_model::slice::MANAGED_BY,
            },
            // Owned by the Node: the garbage collector deletes it with the node.
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Node",
                "name": summary.node,
                "uid": node_uid,
            }],
        },
        "topologyPolicies": [opts.legacy_policy()],
        "attributes": [
            {"name": "topologyManagerPolicy", "value": opts.policy},
            {"name": "topologyManagerScope", "value": opts.scope},
        ],
        "zones": zones,
    }))
}

/// A NUMA node id, as a number: the zone name is built from it, never from the text.
/// Only the canonical decimal form counts (not `+1` or `01`), so two groups never
/// give one zone name.
fn numa_id(key: &str) -> Option<u16> {
    key.parse()
        .ok()
        .filter(|id: &u16| i64::from(*id) <= MAX_NUMA_NODE && id.to_string() == key)
}

/// Whether `existing` (as read from the API server) already holds everything
/// `desired` sets: then there is nothing to write. Fields others set are ignored.
pub fn up_to_date(existing: &Value, desired: &Value) -> bool {
    contains(existing, desired)
}

/// `want` is a subset of `have`: every key of an object, every element of an array in
/// order and of the same length; scalars equal. Quantities are compared as the
/// server returns them, which for whole numbers is the same string.
fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, wv)| h.get(k).is_some_and(|hv| contains(hv, wv))),
        (Value::Array(h), Value::Array(w)) => {
            h.len() == w.len() && h.iter().zip(w).all(|(hv, wv)| contains(hv, wv))
        }
        (h, w) => h == w,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::DeviceTaint;
    use topodra_model::capacity::{Cluster, Group};

    use super::*;
    use crate::fixtures::{gpu_slice, nrt_options};

    /// A node with GPUs 0-3 on NUMA 0 and 4-7 on NUMA 1, gpu-0 allocated and gpu-5
    /// tainted.
    fn summary() -> NodeSummary {
        let mut slice = gpu_slice("node-a");
        slice.spec.devices.as_mut().unwrap()[5].taints = Some(vec![DeviceTaint {
            key: "k".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]);
        let claim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "default"},
            "status": {"allocation": {"devices": {"results": [
                {"driver": "gpu.topodra.dev", "pool": "node-a", "device": "gpu-0", "request": "r"}
            ]}}}
        }))
        .unwrap();
        let mut c = Cluster::new("gpu.topodra.dev");
        c.apply_slice(&slice);
        c.apply_claim(&claim);
        c.node("node-a").unwrap().clone()
    }

    #[test]
    fn one_zone_per_numa_node_with_the_gpus_there() {
        let v = desired(&summary(), &BTreeMap::new(), "uid-1", &nrt_options()).unwrap();
        assert_eq!(
            v["zones"],
            json!([
                {"name": "node-0", "type": "Node", "resources": [
                    {"name": "nvidia.com/gpu", "capacity": "4", "allocatable": "4", "available": "3"}]},
                {"name": "node-1", "type": "Node", "resources": [
                    {"name": "nvidia.com/gpu", "capacity": "4", "allocatable": "3", "available": "3"}]},
            ])
        );
        assert_eq!(v["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(v["topologyPolicies"], json!(["SingleNUMANodePodLevel"]));
        assert_eq!(
            v["attributes"][0],
            json!({"name": "topologyManagerPolicy", "value": "single-numa-node"})
        );
    }

    /// With dynamic MIG each zone also counts each profile under the device plugin's
    /// name: what it can still hand out, and that plus what is allocated.
    #[test]
    fn zones_count_mig_profiles_under_the_device_plugins_names() {
        let c = crate::kubectl::fixtures::carved_dgx();
        let v = desired(
            c.node("dgx-h100-m").unwrap(),
            &BTreeMap::new(),
            "uid-1",
            &nrt_options(),
        )
        .unwrap();
        let find = |zone: usize, name: &str| {
            v["zones"][zone]["resources"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == name)
                .cloned()
                .unwrap_or_else(|| panic!("zone {zone} has no {name}: {v}"))
        };
        // NUMA 0: gpu-0 allocated whole, three GPUs uncarved.
        assert_eq!(
            find(0, "nvidia.com/gpu"),
            json!({"name": "nvidia.com/gpu", "capacity": "4", "allocatable": "4", "available": "3"})
        );
        assert_eq!(find(0, "nvidia.com/mig-7g.80gb")["available"], "3");
        // NUMA 1: three GPUs carved by one 1g.10gb each; only gpu-4 takes a 7g.
        assert_eq!(find(1, "nvidia.com/gpu")["available"], "1");
        assert_eq!(
            find(1, "nvidia.com/mig-1g.10gb"),
            json!({"name": "nvidia.com/mig-1g.10gb", "capacity": "28", "allocatable": "28", "available": "25"})
        );
        assert_eq!(find(1, "nvidia.com/mig-7g.80gb")["available"], "1");
        assert_eq!(find(1, "nvidia.com/mig-1g.10gb.me")["available"], "4");
    }

    /// With time-slicing each zone also has the memory of its time-sliced GPUs:
    /// all of it, what shares hold or can still take, and what they can still take.
    #[test]
    fn zones_count_the_memory_shares_can_take() {
        let c = crate::kubectl::fixtures::time_sliced_dgx();
        let v = desired(
            c.node("dgx-h100-t").unwrap(),
            &BTreeMap::new(),
            "uid-1",
            &nrt_options(),
        )
        .unwrap();
        assert_eq!(
            v["zones"],
            json!([
                {"name": "node-0", "type": "Node", "resources": [
                    {"name": "nvidia.com/gpu", "capacity": "4", "allocatable": "4", "available": "2"},
                    // gpu-0 and gpu-1 are allocated whole: only two GPUs take shares.
                    {"name": "nvidia.com/time-slicing-memory", "capacity": "326236Mi",
                     "allocatable": "163118Mi", "available": "163118Mi"}]},
                {"name": "node-1", "type": "Node", "resources": [
                    // gpu-5, gpu-6 and gpu-7 hold shares: neither allocated nor free.
                    {"name": "nvidia.com/gpu", "capacity": "4", "allocatable": "4", "available": "1"},
                    // 140Gi of shares; 182876Mi left on the four GPUs.
                    {"name": "nvidia.com/time-slicing-memory", "capacity": "326236Mi",
                     "allocatable": "326236Mi", "available": "182876Mi"}]},
            ])
        );
    }

    #[test]
    fn shared_resources_are_named_by_mode_and_capacity() {
        let name = |r: &str, m: &str, c: &str| shared_name(r, m, c);
        assert_eq!(
            name("nvidia.com/gpu", "TimeSlicing", "memory").as_deref(),
            Some("nvidia.com/time-slicing-memory")
        );
        assert_eq!(
            name("nvidia.com/gpu", "MPS", "compute").as_deref(),
            Some("nvidia.com/mps-compute")
        );
        assert_eq!(name("gpu.example.com/device", "MPS", "memory"), None);
        for bad in ["", "Time Slicing", "a/b", "x\n", &"A".repeat(60)] {
            assert_eq!(name("nvidia.com/gpu", bad, "memory"), None, "{bad:?}");
        }
    }

    #[test]
    fn zones_carry_the_cpu_drivers_cpus_where_it_publishes_them() {
        let cpus = BTreeMap::from([
            (
                1,
                CpuCounts {
                    total: 56,
                    allocated: 32,
                    grouped: true,
                },
            ),
            (
                2,
                CpuCounts {
                    total: 8,
                    allocated: 0,
                    grouped: true,
                },
            ),
        ]);
        let v = desired(&summary(), &cpus, "uid-1", &nrt_options()).unwrap();
        assert_eq!(
            v["zones"],
            json!([
                {"name": "node-0", "type": "Node", "resources": [
                    {"name": "nvidia.com/gpu", "capacity": "4", "allocatable": "4", "available": "3"}]},
                {"name": "node-1", "type": "Node", "resources": [
                    {"name": "nvidia.com/gpu", "capacity": "4", "allocatable": "3", "available": "3"},
                    {"name": "cpu", "capacity": "56", "allocatable": "56", "available": "24"}]},
                {"name": "node-2", "type": "Node", "resources": [
                    {"name": "cpu", "capacity": "8", "allocatable": "8", "available": "8"}]},
            ])
        );
    }

    #[test]
    fn what_the_server_returns_for_our_apply_is_up_to_date() {
        let want = desired(&summary(), &BTreeMap::new(), "uid-1", &nrt_options()).unwrap();
        let mut have = want.clone();
        have["metadata"]["resourceVersion"] = json!("42");
        have["metadata"]["managedFields"] = json!([{"manager": "topodra-controller"}]);
        have["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] = json!(false);
        assert!(up_to_date(&have, &want));
        have["zones"][1]["resources"][0]["available"] = json!("2");
        assert!(!up_to_date(&have, &want));
        // A zone more on the server (say, written by an old updater) is a difference.
        let mut extra = want.clone();
        extra["zones"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "node-2", "type": "Node"}));
        assert!(!up_to_date(&extra, &want));
    }

    #[test]
    fn zones_are_named_by_numa_ids_only() {
        let mut s = summary();
        let numa = s.levels.get_mut(&Level::NumaNode).unwrap();
        let template = numa[0].clone();
        for key in [
            "-1",
            "9223372036854775807",
            "1024",
            "0.0.0",
            "0\n\u{1b}[31m",
            "../../x",
            "+1",
            "01",
        ] {
            let mut g = template.clone();
            g.key = key.to_owned();
            numa.push(g);
        }
        let v = desired(&s, &BTreeMap::new(), "uid-1", &nrt_options()).unwrap();
        let names: Vec<&str> = v["zones"]
            .as_array()
            .unwrap()
            .iter()
            .map(|z| z["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["node-0", "node-1"]);
        s.levels.insert(
            Level::NumaNode,
            vec![Group {
                key: "x\n".into(),
                counts: template.counts,
            }],
        );
        assert!(desired(&s, &BTreeMap::new(), "uid-1", &nrt_options()).is_none());
    }

    #[test]
    fn gpus_without_a_numa_node_give_no_object() {
        let mut s = summary();
        s.levels.clear();
        assert!(desired(&s, &BTreeMap::new(), "u", &nrt_options()).is_none());
    }
}
