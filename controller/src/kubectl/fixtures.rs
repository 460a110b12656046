//! A small cluster for the output tests and the examples of docs/kubectl-topodra.md:
//! two DGX H100 nodes (two NUMA nodes of four GPUs each, one PCIe root per GPU, one
//! NVLink domain), slices made by the plugin's own slice builder, claims allocated as
//! the scheduler writes them, and one GPU tainted by the plugin's health checks.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceClaim};
use serde_json::json;
use topodra_model::capacity::Cluster;
use topodra_model::health::UNHEALTHY_TAINT_KEY;
use topodra_model::inventory::{MigDevice, MigMode};
use topodra_model::slice::attributes::NUMA_NODE;
use topodra_model::slice::{DEFAULT_DRIVER_NAME, SliceOptions, build_slices};
use topodra_model::{Gpu, Inventory, NumaKind, NumaNode, PciAddress, PcieRoot};

pub(crate) const DRIVER: &str = DEFAULT_DRIVER_NAME;

fn numa(id: u32, cpus: &str) -> NumaNode {
    NumaNode {
        id,
        socket: Some(id),
        cpus: cpus.parse().unwrap(),
        memory_bytes: 1 << 40,
        kind: NumaKind::Cpu,
    }
}

/// A DGX H100 as discovery sees it: eight GPUs in bus order, four per NUMA node and
/// socket, each behind its own root complex, all in one NVSwitch domain.
pub(crate) fn dgx_h100() -> Inventory {
    let buses: [u8; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];
    let gpus = buses
        .iter()
        .zip(0u32..)
        .map(|(bus, i)| {
            let node = u32::from(i >= 4);
            let mut g = Gpu::at(PciAddress::new(0, *bus, 0, 0));
            g.index = Some(i);
            g.minor = Some(i);
            g.uuid = Some(format!("GPU-8f1c2d3e-4b5a-4c6d-9e7f-a0b1c2d3e4{i:02}"));
            g.product_name = Some("NVIDIA H100 80GB HBM3".to_owned());
            g.memory_bytes = Some(81559 << 20);
            g.numa_node = Some(node);
            g.same_socket_numa_nodes = vec![node];
            g.socket = Some(node);
            g.pcie_root = Some(PcieRoot {
                domain: 0,
                bus: bus - 3,
            });
            g.nvlink_domain = Some("nvl0".to_owned());
            g
        })
        .collect();
    Inventory {
        numa_nodes: vec![numa(0, "0-55,112-167"), numa(1, "56-111,168-223")],
        gpus,
        ..Default::default()
    }
}

/// The DGX H100 with its last GPU in MIG mode as seven 1g.10gb devices.
pub(crate) fn dgx_h100_mig() -> Inventory {
    let mut inv = dgx_h100();
    let gpu = &mut inv.gpus[7];
    gpu.mig_mode = Some(MigMode {
        current: true,
        pending: true,
    });
    gpu.mig_devices = (0..7)
        .map(|gi| MigDevice {
            uuid: format!("MIG-0c6e1b8a-7d2f-5e4a-9b3c-00000000000{gi}"),
            gpu_instance: gi + 7,
            compute_instance: 0,
            profile: Some("1g.10gb".to_owned()),
            memory_bytes: Some(9984 << 20),
            multiprocessors: Some(16),
            placement: None,
            profile_id: None,
        })
        .collect();
    inv
}

/// Adds a node's slices to the cluster, with the named devices tainted NoSchedule.
pub(crate) fn add_node(cluster: &mut Cluster, node: &str, inv: &Inventory, tainted: &[&str]) {
    let mut opts = SliceOptions::new(node);
    opts.device_taints = tainted
        .iter()
        .map(|d| {
            let taint = DeviceTaint {
                key: UNHEALTHY_TAINT_KEY.to_owned(),
                effect: "NoSchedule".to_owned(),
                value: Some("XidCritical".to_owned()),
                ..Default::default()
            };
            ((*d).to_owned(), vec![taint])
        })
        .collect::<BTreeMap<_, _>>();
    for s in build_slices(inv, &opts).unwrap() {
        cluster.apply_slice(&s);
    }
}

/// A claim in `default` allocated the listed devices of one node.
pub(crate) fn allocated_claim(name: &str, node: &str, devices: &[&str]) -> ResourceClaim {
    let results: Vec<_> = devices
        .iter()
        .map(|d| json!({"request": "gpus", "driver": DRIVER, "pool": node, "device": d}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": DRIVER, "count": devices.len()}}]}},
        "status": {"allocation": {"devices": {"results": results}}},
    }))
    .unwrap()
}

/// A claim in `default` for `count` GPUs of our class on one NUMA node, not allocated.
pub(crate) fn pending_claim(name: &str, count: u32) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {
            "requests": [{"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": count}}],
            "constraints": [{"requests": ["gpus"], "matchAttribute": NUMA_NODE}],
        }},
    }))
    .unwrap()
}

/// Two DGX H100 nodes:
/// - `dgx-h100-a`: claim `train-a` holds gpu-0, gpu-1, gpu-2 (NUMA 0) and gpu-4
///   (NUMA 1); gpu-7 is tainted by the health checks.
/// - `dgx-h100-b`: claim `infer-b` holds gpu-0, gpu-1 (NUMA 0) and gpu-5 (NUMA 1).
///
/// Eight GPUs are free, five of them on one node, yet no NUMA node has four free.
pub(crate) fn two_dgx() -> Cluster {
    let mut c = Cluster::new(DRIVER);
    add_node(&mut c, "dgx-h100-a", &dgx_h100(), &["gpu-7"]);
    add_node(&mut c, "dgx-h100-b", &dgx_h100(), &[]);
    c.apply_claim(&allocated_claim(
        "train-a",
        "dgx-h100-a",
        &["gpu-0", "gpu-1", "gpu-2", "gpu-4"],
    ));
    c.apply_claim(&allocated_claim(
        "infer-b",
        "dgx-h100-b",
        &["gpu-0", "gpu-1", "gpu-5"],
    ));
    c
}

/// A DGX H100 with dynamic MIG (`dgx-h100-m`): gpu-0 allocated whole, and gpu-5,
/// gpu-6 and gpu-7 (NUMA 1) each carved by one 1g.10gb at placement 6.
pub(crate) fn carved_dgx() -> Cluster {
    let mut c = Cluster::new(DRIVER);
    let mut opts = SliceOptions::new("dgx-h100-m");
    opts.dynamic_mig = topodra_model::slice::DynamicMig::All;
    for s in build_slices(&topodra_model::slice::fixtures::dgx_h100_mig(), &opts).unwrap() {
        c.apply_slice(&s);
    }
    c.apply_claim(&allocated_claim("whole", "dgx-h100-m", &["gpu-0"]));
    for g in 5..8 {
        c.apply_claim(&allocated_claim(
            &format!("small-{g}"),
            "dgx-h100-m",
            &[&format!("gpu-{g}-mig-1g-10gb-6")],
        ));
    }
    c
}

/// A claim in `default` holding one share of a shared device, as the scheduler
/// writes it: a share id and the memory the share consumes.
pub(crate) fn share_claim(name: &str, node: &str, device: &str, memory: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "time-sliced.topodra.dev",
            "capacity": {"requests": {"memory": memory}}}}]}},
        "status": {"allocation": {"devices": {"results": [{
            "request": "gpu", "driver": DRIVER, "pool": node, "device": device,
            "shareID": format!("{name}-0"), "consumedCapacity": {"memory": memory}}]}}},
    }))
    .unwrap()
}

/// A DGX H100 with time-slicing (`dgx-h100-t`, 81559Mi per GPU, 19Gi shares by
/// default): claim `train-t` holds gpu-0 and gpu-1 (NUMA 0) whole; on NUMA 1,
/// `ci-a` holds 60Gi of gpu-5, `notebook-b` 40Gi of gpu-6, `notebook-c` and
/// `notebook-d` 20Gi each of gpu-7.
pub(crate) fn time_sliced_dgx() -> Cluster {
    let mut c = Cluster::new(DRIVER);
    let mut opts = SliceOptions::new("dgx-h100-t");
    opts.sharing.time_slicing = Some(topodra_model::slice::TimeSlicing::default());
    for s in build_slices(&dgx_h100(), &opts).unwrap() {
        c.apply_slice(&s);
    }
    c.apply_claim(&allocated_claim(
        "train-t",
        "dgx-h100-t",
        &["gpu-0", "gpu-1"],
    ));
    for (claim, device, memory) in [
        ("ci-a", "gpu-5-ts", "60Gi"),
        ("notebook-b", "gpu-6-ts", "40Gi"),
        ("notebook-c", "gpu-7-ts", "20Gi"),
        ("notebook-d", "gpu-7-ts", "20Gi"),
    ] {
        c.apply_claim(&share_claim(claim, "dgx-h100-t", device, memory));
    }
    c
}

/// Compares output with `testdata/<name>`; `TOPODRA_BLESS=1` rewrites the file instead.
pub(crate) fn golden(name: &str, actual: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/kubectl/testdata")
        .join(name);
    if std::env::var_os("TOPODRA_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (TOPODRA_BLESS=1 writes it)", path.display()));
    assert_eq!(
        actual,
        expected,
        "{} differs (TOPODRA_BLESS=1 rewrites it)",
        path.display()
    );
}
