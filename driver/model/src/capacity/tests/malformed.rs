//! Slices no plugin of ours publishes, as anyone allowed to write ResourceSlices can:
//! values out of range or of the wrong type, pools split across nodes, devices named
//! twice.

use k8s_openapi::api::resource::v1::DeviceAttribute;

use super::*;
use crate::slice::attributes::NUMA_NODE;
use crate::slice::fixtures::{int, string, version};

/// Sets attribute `name` of device `i` of a slice.
fn set(slice: &mut ResourceSlice, i: usize, name: &str, value: DeviceAttribute) {
    let dev = &mut slice.spec.devices.as_mut().unwrap()[i];
    dev.attributes
        .get_or_insert_default()
        .insert(name.to_owned(), value);
}

fn numa_keys(c: &Cluster, node: &str) -> Vec<(String, u32)> {
    c.node(node)
        .unwrap()
        .groups(Level::NumaNode)
        .iter()
        .map(|g| (g.key.clone(), g.counts.total))
        .collect()
}

#[test]
fn numa_nodes_no_kernel_has_leave_the_device_numa_unknown() {
    let mut slice = slices("node-a", None, 1).remove(0);
    set(&mut slice, 0, NUMA_NODE, int(-1));
    set(&mut slice, 1, NUMA_NODE, int(i64::MAX));
    set(&mut slice, 2, NUMA_NODE, version("0.0.0"));
    set(&mut slice, 3, NUMA_NODE, string("0\n\u{1b}[31mforged"));
    set(&mut slice, 4, NUMA_NODE, string("../../x"));
    let mut c = Cluster::new(DRIVER);
    c.apply_slice(&slice);
    // The five GPUs still count on the node, in no NUMA group.
    assert_eq!(c.node("node-a").unwrap().gpus.total, 8);
    assert_eq!(numa_keys(&c, "node-a"), [("1".to_owned(), 3)]);

    let findings = c.take_findings();
    let ignored: Vec<(&str, String)> = findings
        .iter()
        .map(|f| match f {
            Finding::InvalidValue { device, value, .. } => (device.as_str(), value.to_string()),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        ignored,
        [
            ("gpu-0", "numaNode int -1".to_owned()),
            ("gpu-1", "numaNode int 9223372036854775807".to_owned()),
            ("gpu-2", "numaNode version \"0.0.0\"".to_owned()),
            (
                "gpu-3",
                "numaNode string \"0\\n\\u{1b}[31mforged\"".to_owned()
            ),
            ("gpu-4", "numaNode string \"../../x\"".to_owned()),
        ]
    );
    // The same slice again (a relist) reports nothing new.
    c.apply_slice(&slice);
    assert_eq!(c.take_findings(), []);
}

#[test]
fn other_topology_values_are_checked_too() {
    let mut slice = slices("node-a", None, 1).remove(0);
    set(&mut slice, 0, "socket", int(-1));
    set(
        &mut slice,
        1,
        "resource.kubernetes.io/pcieRoot",
        string("pci\n0000"),
    );
    set(&mut slice, 2, "pcieSwitch", string("a/../b"));
    set(&mut slice, 3, "nvlinkDomain", string("nvl0\u{1b}[2J"));
    let mut c = Cluster::new(DRIVER);
    c.apply_slice(&slice);
    let s = c.node("node-a").unwrap();
    let total = |l: Level| s.groups(l).iter().map(|g| g.counts.total).sum::<u32>();
    assert_eq!(total(Level::Socket), 7);
    assert_eq!(total(Level::PcieRoot), 7);
    assert_eq!(total(Level::PcieSwitch), 7);
    assert_eq!(total(Level::NvlinkDomain), 7);
    for l in Level::ALL {
        for g in s.groups(l) {
            assert!(
                g.key.chars().all(|c| c.is_ascii_graphic()),
                "{l}: {:?}",
                g.key
            );
        }
    }
    assert_eq!(c.take_findings().len(), 4);
}

#[test]
fn a_pool_whose_slices_name_two_nodes_counts_on_neither() {
    let mut c = Cluster::new(DRIVER);
    let mut pool = slices("node-a", Some(4), 1);
    assert_eq!(pool.len(), 2);
    for s in &pool {
        c.apply_slice(s);
    }
    assert_eq!(c.node("node-a").unwrap().gpus.total, 8);
    c.take_findings();

    pool[1].spec.node_name = Some("node-b".to_owned());
    let changed = c.apply_slice(&pool[1]);
    assert!(changed.contains("node-a"), "{changed:?}");
    assert!(c.node("node-a").is_none(), "node-a would get node-b's GPUs");
    assert!(c.node("node-b").is_none());
    let problem = PoolProblem::NodesDiffer {
        nodes: vec!["node-a".into(), "node-b".into()],
    };
    assert_eq!(
        c.take_findings(),
        [Finding::PoolSkipped {
            pool: "node-a".into(),
            problem: problem.clone()
        }]
    );
    assert_eq!(
        c.skipped_pools().collect::<Vec<_>>(),
        [("node-a", &problem)]
    );
    // Reported once, however often the pool's slices come back.
    c.apply_slice(&pool[0]);
    assert_eq!(c.take_findings(), []);

    // Mended, it counts again.
    pool[1].spec.node_name = Some("node-a".to_owned());
    c.apply_slice(&pool[1]);
    assert_eq!(c.node("node-a").unwrap().gpus.total, 8);
    assert_eq!(c.skipped_pools().count(), 0);
}

#[test]
fn a_device_name_twice_in_a_pool_skips_the_pool() {
    let mut c = Cluster::new(DRIVER);
    let mut pool = slices("node-a", Some(4), 1);
    pool[1].spec.devices.as_mut().unwrap()[0].name = "gpu-0".to_owned();
    for s in &pool {
        c.apply_slice(s);
    }
    assert!(c.node("node-a").is_none(), "seven GPUs would be a lie");
    assert_eq!(
        c.take_findings(),
        [Finding::PoolSkipped {
            pool: "node-a".into(),
            problem: PoolProblem::DuplicateDevices {
                devices: vec!["gpu-0".into()]
            }
        }]
    );

    // Twice in one slice, which the API server would refuse, is the same.
    let mut one = slices("node-b", None, 1).remove(0);
    one.spec.devices.as_mut().unwrap()[7].name = "gpu-6".to_owned();
    c.apply_slice(&one);
    assert!(c.node("node-b").is_none());
    assert_eq!(
        c.skipped_pools()
            .map(|(p, why)| (p, why.reason()))
            .collect::<Vec<_>>(),
        [
            ("node-a", "duplicate_devices"),
            ("node-b", "duplicate_devices")
        ]
    );

    // A pool whose slices are all gone is no longer reported.
    for s in &pool {
        c.delete_slice(s.metadata.name.as_deref().unwrap());
    }
    assert_eq!(c.skipped_pools().count(), 1);
}
