use std::path::Path;

use super::*;
use crate::cdi::nodes::TableDeviceNodes;
use crate::cdi::nvidia_files::{NvidiaFilesSource, NvidiaRoot, tests::fake_driver_root};
use crate::cdi::spec::Mount;
use crate::cdi::version::Version;
use crate::cdi::{CdiConfig, DriverCapability};

const UID: &str = "0b7c2f4e-3c1d-4a5e-9f60-1d2e3f4a5b6c";

fn gpu(minor: u32, numa: u32, cpus: &str) -> ClaimGpu {
    ClaimGpu {
        device_name: format!("gpu-{minor}"),
        minor,
        uuid: Some(format!("GPU-0000000{minor}-aaaa-bbbb-cccc-dddddddddddd")),
        numa_node: Some(numa),
        local_cpus: cpus.parse().unwrap(),
        mig_nodes: vec![],
        requests: vec![],
        pci_bus_id: None,
        share: None,
    }
}

fn request(gpus: Vec<ClaimGpu>) -> ClaimSpecRequest {
    ClaimSpecRequest {
        claim_uid: UID.into(),
        claim_namespace: "team-a".into(),
        claim_name: "train-gpus".into(),
        gpus,
        env_hints: true,
        kind: CdiKind::default(),
        capabilities: DriverCapabilities::all(),
    }
}

fn driver_edits() -> ContainerEdits {
    ContainerEdits {
        mounts: vec![Mount {
            host_path: "/usr/lib64/libcuda.so.1".into(),
            container_path: "/usr/lib64/libcuda.so.1".into(),
            kind: Some("bind".into()),
            options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "rbind".into()],
        }],
        ..Default::default()
    }
}

fn driver() -> NvidiaFiles {
    NvidiaFiles::fixed(
        NvidiaFilesSource::Discovered { root: "/".into() },
        driver_edits(),
    )
}

/// The driver's mounts plus the device-list mount every spec carries.
fn with_void_mount(mut mounts: Vec<Mount>) -> Vec<Mount> {
    mounts.push(Mount {
        host_path: "/dev/null".into(),
        container_path: VOID_DEVICE_LIST_MOUNT.into(),
        kind: Some("bind".into()),
        options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "bind".into()],
    });
    mounts
}

#[test]
fn two_gpu_claim() {
    let nodes = TableDeviceNodes::nvidia([0, 1, 2, 3], 509);
    let req = request(vec![gpu(2, 1, "28-41,84-97"), gpu(3, 1, "28-41,84-97")]);
    let spec = claim_spec(&req, &nodes, &driver()).unwrap();

    assert_eq!(spec.kind, "k8s.gpu.topodra.dev/claim");
    // Annotations make 0.6.0 the floor, and nothing newer is used.
    assert_eq!(spec.cdi_version, "0.6.0");
    assert_eq!(spec.annotations[ANNOTATION_CLAIM_UID], UID);
    assert_eq!(spec.annotations[ANNOTATION_CLAIM_NAMESPACE], "team-a");
    let names: Vec<_> = spec.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, [format!("{UID}-gpu-2"), format!("{UID}-gpu-3")]);
    let node = &spec.devices[1].container_edits.device_nodes[0];
    assert_eq!(node.path, "/dev/nvidia3");
    assert_eq!(
        (node.kind.as_deref(), node.major, node.minor),
        (Some("c"), Some(195), Some(3))
    );
    assert_eq!(node.host_path, None);

    let ctl: Vec<_> = spec
        .container_edits
        .device_nodes
        .iter()
        .map(|n| (n.path.as_str(), n.major, n.minor))
        .collect();
    assert_eq!(
        ctl,
        [
            ("/dev/nvidiactl", Some(195), Some(255)),
            ("/dev/nvidia-uvm", Some(509), Some(0)),
            ("/dev/nvidia-uvm-tools", Some(509), Some(1)),
        ]
    );
    assert_eq!(
        spec.container_edits.env,
        [
            "TOPODRA_VISIBLE_GPUS=GPU-00000002-aaaa-bbbb-cccc-dddddddddddd,GPU-00000003-aaaa-bbbb-cccc-dddddddddddd",
            "TOPODRA_NUMA_NODES=1",
            "TOPODRA_CPUS=28-41,84-97",
            "CUDA_DEVICE_ORDER=PCI_BUS_ID",
            "NVIDIA_VISIBLE_DEVICES=void",
        ]
    );
    assert_eq!(
        spec.container_edits.mounts,
        with_void_mount(driver_edits().mounts)
    );
    assert_eq!(
        req.cdi_device_ids(),
        [
            format!("k8s.gpu.topodra.dev/claim={UID}-gpu-2"),
            format!("k8s.gpu.topodra.dev/claim={UID}-gpu-3"),
        ]
    );
}

/// The whole file, as runtimes will read it.
#[test]
fn golden_json() {
    let mut nodes = TableDeviceNodes::nvidia([0, 1], 509);
    // A host node as a driver installed with NVreg_DeviceFileMode=0660 and the
    // video group (44) leaves it: its mode and owner are stated.
    let gpu1 = nodes.0.get_mut("nvidia1").unwrap();
    *gpu1 = gpu1.owned(0o660, 0, 44);
    let req = request(vec![gpu(0, 0, "0-13,56-69"), gpu(1, 0, "0-13,56-69")]);
    let spec = claim_spec(&req, &nodes, &driver()).unwrap();
    let got = serde_json::to_value(&spec).unwrap();
    let want = serde_json::json!({
      "cdiVersion": "0.6.0",
      "kind": "k8s.gpu.topodra.dev/claim",
      "annotations": {
        "topodra.dev/claim-name": "train-gpus",
        "topodra.dev/claim-namespace": "team-a",
        "topodra.dev/claim-uid": UID
      },
      "devices": [
        {
          "name": format!("{UID}-gpu-0"),
          "annotations": {"topodra.dev/gpu-uuid": "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"},
          "containerEdits": {"deviceNodes": [
            {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "permissions": "rw"}
          ]}
        },
        {
          "name": format!("{UID}-gpu-1"),
          "annotations": {"topodra.dev/gpu-uuid": "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd"},
          "containerEdits": {"deviceNodes": [
            {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1, "fileMode": 0o660,
             "permissions": "rw", "uid": 0, "gid": 44}
          ]}
        }
      ],
      "containerEdits": {
        "env": [
          "TOPODRA_VISIBLE_GPUS=GPU-00000000-aaaa-bbbb-cccc-dddddddddddd,GPU-00000001-aaaa-bbbb-cccc-dddddddddddd",
          "TOPODRA_NUMA_NODES=0",
          "TOPODRA_CPUS=0-13,56-69",
          "CUDA_DEVICE_ORDER=PCI_BUS_ID",
          "NVIDIA_VISIBLE_DEVICES=void"
        ],
        "deviceNodes": [
          {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255, "permissions": "rw"},
          {"path": "/dev/nvidia-uvm", "type": "c", "major": 509, "minor": 0, "permissions": "rw"},
          {"path": "/dev/nvidia-uvm-tools", "type": "c", "major": 509, "minor": 1, "permissions": "rw"}
        ],
        "mounts": [
          {
            "hostPath": "/usr/lib64/libcuda.so.1",
            "containerPath": "/usr/lib64/libcuda.so.1",
            "type": "bind",
            "options": ["ro", "nosuid", "nodev", "rbind"]
          },
          {
            "hostPath": "/dev/null",
            "containerPath": "/var/run/nvidia-container-devices/void",
            "type": "bind",
            "options": ["ro", "nosuid", "nodev", "bind"]
          }
        ]
      }
    });
    assert_eq!(
        got,
        want,
        "{}",
        serde_json::to_string_pretty(&spec).unwrap()
    );
}

#[test]
fn hints_cover_gpus_on_different_numa_nodes() {
    let nodes = TableDeviceNodes::nvidia([0, 4], 509);
    let req = request(vec![gpu(0, 0, "0-13"), gpu(4, 2, "56-69")]);
    let spec = claim_spec(&req, &nodes, &driver()).unwrap();
    assert!(
        spec.container_edits
            .env
            .contains(&"TOPODRA_NUMA_NODES=0,2".to_owned())
    );
    assert!(
        spec.container_edits
            .env
            .contains(&"TOPODRA_CPUS=0-13,56-69".to_owned())
    );
}

#[test]
fn partial_topology_leaves_the_hint_out() {
    let nodes = TableDeviceNodes::nvidia([0, 1], 509);
    let mut unknown = gpu(1, 0, "0-3");
    unknown.numa_node = None;
    unknown.local_cpus = IdList::new();
    unknown.uuid = None;
    let spec = claim_spec(&request(vec![gpu(0, 0, "0-3"), unknown]), &nodes, &driver()).unwrap();
    assert_eq!(
        spec.container_edits.env,
        [
            "CUDA_DEVICE_ORDER=PCI_BUS_ID",
            "NVIDIA_VISIBLE_DEVICES=void"
        ]
    );
    assert!(spec.devices[1].annotations.is_empty());
}

#[test]
fn hints_off_and_toolkit_env() {
    let nodes = TableDeviceNodes::nvidia([0], 509);
    let mut edits = driver_edits();
    edits.env = vec![
        "NVIDIA_VISIBLE_DEVICES=all".into(),
        "CUDA_DEVICE_ORDER=FASTEST_FIRST".into(),
        "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib64".into(),
    ];
    let drv = NvidiaFiles::fixed(
        NvidiaFilesSource::Toolkit {
            spec: "/var/run/cdi/nvidia.yaml".into(),
        },
        edits,
    );
    let mut req = request(vec![gpu(0, 0, "0-3")]);
    let spec = claim_spec(&req, &nodes, &drv).unwrap();
    // Ours win: a toolkit spec cannot turn the claim into every GPU of the node.
    assert_eq!(
        spec.container_edits.env.last().unwrap(),
        "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib64"
    );
    assert!(
        spec.container_edits
            .env
            .contains(&"NVIDIA_VISIBLE_DEVICES=void".to_owned())
    );
    assert!(
        !spec
            .container_edits
            .env
            .contains(&"NVIDIA_VISIBLE_DEVICES=all".to_owned())
    );
    assert!(
        !spec
            .container_edits
            .env
            .contains(&"CUDA_DEVICE_ORDER=FASTEST_FIRST".to_owned())
    );

    req.env_hints = false;
    let spec = claim_spec(&req, &nodes, &drv).unwrap();
    assert_eq!(
        spec.container_edits.env,
        [
            "NVIDIA_VISIBLE_DEVICES=void",
            "CUDA_DEVICE_ORDER=FASTEST_FIRST",
            "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib64"
        ]
    );
}

#[test]
fn missing_nodes() {
    let mut nodes = TableDeviceNodes::nvidia([0], 509);
    let err = claim_spec(&request(vec![gpu(1, 0, "0")]), &nodes, &driver()).unwrap_err();
    assert!(err.to_string().contains("/dev/nvidia1"), "{err}");

    nodes.0.remove("nvidia-uvm-tools");
    let spec = claim_spec(&request(vec![gpu(0, 0, "0")]), &nodes, &driver()).unwrap();
    assert_eq!(spec.container_edits.device_nodes.len(), 2);

    nodes.0.remove("nvidia-uvm");
    let err = claim_spec(&request(vec![gpu(0, 0, "0")]), &nodes, &driver()).unwrap_err();
    assert!(err.to_string().contains("/dev/nvidia-uvm"), "{err}");
}

#[test]
fn bad_requests() {
    let nodes = TableDeviceNodes::nvidia([0], 509);
    let err = claim_spec(&request(vec![]), &nodes, &driver()).unwrap_err();
    assert!(matches!(err, CdiError::NoDevices { .. }), "{err}");

    let err = claim_spec(
        &request(vec![gpu(0, 0, "0"), gpu(0, 0, "0")]),
        &nodes,
        &driver(),
    )
    .unwrap_err();
    assert!(matches!(err, CdiError::DuplicateDevice { .. }), "{err}");

    for uid in ["", "../etc", "a/b", "x y", "-abc"] {
        let mut req = request(vec![gpu(0, 0, "0")]);
        req.claim_uid = uid.into();
        let err = claim_spec(&req, &nodes, &driver()).unwrap_err();
        assert!(matches!(err, CdiError::InvalidClaimUid { .. }), "{uid}");
    }

    let mut req = request(vec![gpu(0, 0, "0")]);
    req.gpus[0].device_name = "gpu_0!".into();
    let err = claim_spec(&req, &nodes, &driver()).unwrap_err();
    assert!(matches!(err, CdiError::InvalidSpec { .. }), "{err}");
}

#[test]
fn from_inventory_gpu() {
    let mut g = Gpu::at("0000:18:00.0".parse().unwrap());
    assert!(matches!(
        ClaimGpu::from_gpu(&g),
        Err(CdiError::GpuWithoutMinor { .. })
    ));
    g.minor = Some(2);
    g.uuid = Some("GPU-x".into());
    g.numa_node = Some(0);
    g.local_cpus = "0-3".parse().unwrap();
    let c = ClaimGpu::from_gpu(&g).unwrap();
    assert_eq!(c.device_name, "gpu-2");
    assert_eq!(c.minor, 2);
}

#[test]
fn with_discovered_driver_files() {
    let root = fake_driver_root();
    let hook = Path::new("/var/lib/kubelet/plugins/gpu.topodra.dev/nvidia-cdi-hook");
    let files = NvidiaFiles::discover(&NvidiaRoot::new(root.path()), hook).unwrap();
    let nodes = TableDeviceNodes::nvidia([0], 509);
    let spec = claim_spec(&request(vec![gpu(0, 0, "0-7")]), &nodes, &files).unwrap();
    assert_eq!(spec.cdi_version, Version::V0_6_0.to_string());
    let all = files.edits(&DriverCapabilities::all());
    assert_eq!(spec.container_edits.mounts, with_void_mount(all.mounts));
    assert_eq!(spec.container_edits.hooks, all.hooks);
    assert!(
        spec.container_edits
            .hooks
            .iter()
            .all(|h| Path::new(&h.path) == hook)
    );
    assert!(validate(&spec).is_ok());

    // A compute-only claim keeps CUDA and the files of no class, not the tools.
    let mut req = request(vec![gpu(0, 0, "0-7")]);
    req.capabilities = DriverCapabilities::new([DriverCapability::Compute]).unwrap();
    let spec = claim_spec(&req, &nodes, &files).unwrap();
    let paths: Vec<&str> = spec
        .container_edits
        .mounts
        .iter()
        .map(|m| m.container_path.as_str())
        .collect();
    assert!(
        paths.iter().any(|p| p.ends_with("libcuda.so.550.90.07")),
        "{paths:?}"
    );
    assert!(
        !paths.iter().any(|p| p.ends_with("nvidia-smi")),
        "{paths:?}"
    );
    assert!(
        !paths.iter().any(|p| p.contains("libnvidia-ml.so")),
        "{paths:?}"
    );
}

#[test]
fn each_device_records_its_requests() {
    let mut g0 = gpu(0, 0, "0-3");
    g0.requests = vec!["gpus".into(), "extra".into()];
    let req = request(vec![g0, gpu(1, 0, "0-3")]);
    let spec = claim_spec(&req, &TableDeviceNodes::nvidia([0, 1], 509), &driver()).unwrap();
    assert_eq!(
        spec.devices[0].annotations[ANNOTATION_REQUESTS],
        "gpus,extra"
    );
    assert!(
        !spec.devices[1]
            .annotations
            .contains_key(ANNOTATION_REQUESTS)
    );
}

#[test]
fn a_gpu_gets_its_drm_nodes_and_by_path_links_with_graphics() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("dev");
    std::fs::create_dir_all(dev.join("dri/by-path")).unwrap();
    let mknod = |path: &str, major: &str, minor: &str| {
        std::process::Command::new("mknod")
            .arg(dev.join(path))
            .args(["c", major, minor])
            .status()
            .is_ok_and(|s| s.success())
    };
    let made = mknod("nvidia0", "195", "0")
        && mknod("nvidiactl", "195", "255")
        && mknod("nvidia-uvm", "509", "0")
        && mknod("dri/card1", "226", "1")
        && mknod("dri/renderD128", "226", "128");
    if !made {
        eprintln!("skipping: mknod needs CAP_MKNOD");
        return;
    }
    let bus = "0000:18:00.0";
    std::os::unix::fs::symlink("../card1", dev.join(format!("dri/by-path/pci-{bus}-card")))
        .unwrap();
    std::os::unix::fs::symlink(
        "../renderD128",
        dev.join(format!("dri/by-path/pci-{bus}-render")),
    )
    .unwrap();
    // Another GPU's link is not this one's.
    std::os::unix::fs::symlink("../card2", dev.join("dri/by-path/pci-0000:2a:00.0-card")).unwrap();
    // sysfs lists the DRM minors and connectors under the PCI device.
    let drm = dir.path().join(format!("sys/bus/pci/devices/{bus}/drm"));
    for entry in ["card1", "renderD128", "card1-DP-1"] {
        std::fs::create_dir_all(drm.join(entry)).unwrap();
    }
    let config = CdiConfig {
        dev_root: dir.path().to_owned(),
        sysfs_root: dir.path().join("sys"),
        ..CdiConfig::default()
    };
    let nodes = config.device_nodes();
    let mut g = gpu(0, 0, "0-3");
    g.pci_bus_id = Some(bus.into());
    let hook = Path::new("/usr/bin/nvidia-cdi-hook");
    let root = fake_driver_root();
    let files = NvidiaFiles::discover(&NvidiaRoot::new(root.path()), hook).unwrap();

    let spec = claim_spec(&request(vec![g.clone()]), &nodes, &files).unwrap();
    let edits = &spec.devices[0].container_edits;
    let paths: Vec<&str> = edits.device_nodes.iter().map(|n| n.path.as_str()).collect();
    assert_eq!(
        paths,
        ["/dev/nvidia0", "/dev/dri/card1", "/dev/dri/renderD128"]
    );
    let card = &edits.device_nodes[1];
    assert_eq!((card.major, card.minor), (Some(226), Some(1)));
    // The by-path links, then the memory-limit hook every whole GPU gets.
    assert_eq!(edits.hooks.len(), 2);
    assert_eq!(edits.hooks[1].hook_name, "createRuntime");
    assert_eq!(
        edits.hooks[1].args[1..],
        [
            "apply-cuda-memory-limits",
            "--driver-root",
            &root.path().to_string_lossy(),
            "--gpu-id",
            "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
        ]
    );
    assert_eq!(
        edits.hooks[0].args,
        [
            "nvidia-cdi-hook",
            "create-symlinks",
            "--link",
            "../card1::/dev/dri/by-path/pci-0000:18:00.0-card",
            "--link",
            "../renderD128::/dev/dri/by-path/pci-0000:18:00.0-render"
        ]
    );
    assert!(validate(&spec).is_ok());

    // Without graphics, no DRM nodes.
    let mut req = request(vec![g]);
    req.capabilities = DriverCapabilities::new([DriverCapability::Compute]).unwrap();
    let spec = claim_spec(&req, &nodes, &files).unwrap();
    assert_eq!(spec.devices[0].container_edits.device_nodes.len(), 1);
    let names: Vec<&str> = spec.devices[0]
        .container_edits
        .hooks
        .iter()
        .map(|h| h.args[1].as_str())
        .collect();
    assert_eq!(names, ["apply-cuda-memory-limits"]);
}

#[test]
fn a_share_says_what_it_got_and_that_memory_is_not_enforced() {
    let mut g = gpu(2, 0, "0-3");
    g.device_name = "gpu-2-ts".into();
    g.share = Some((
        "5b1d7c1e-0000-4000-8000-000000000001".into(),
        topodra_model::checkpoint::ShareIntent {
            mode: topodra_model::checkpoint::ShareMode::TimeSlicing,
            gpu_device: "gpu-2".into(),
            gpu_uuid: "GPU-x".into(),
            timeslice: 3,
            memory_bytes: Some(20 << 30),
            compute_percent: None,
            pipe_dir: None,
            prior_compute_mode: None,
        },
    ));
    let nodes = TableDeviceNodes::nvidia([2], 509);
    let spec = claim_spec(&request(vec![g]), &nodes, &driver()).unwrap();
    let device = &spec.devices[0];
    assert_eq!(device.name, format!("{UID}-gpu-2-ts"));
    let env = &device.container_edits.env;
    assert_eq!(
        env,
        &[
            "TOPODRA_SHARING=TimeSlicing",
            "TOPODRA_GPU_MEMORY_SHARE=21474836480",
            "TOPODRA_TIME_SLICE_INTERVAL=Long",
            "TOPODRA_GPU_MEMORY_SHARE_ENFORCED=false",
        ]
    );
    let a = &device.annotations;
    assert_eq!(
        a["topodra.dev/share-id"],
        "5b1d7c1e-0000-4000-8000-000000000001"
    );
    assert_eq!(a["topodra.dev/sharing"], "TimeSlicing");
    assert_eq!(a["topodra.dev/shared-gpu"], "gpu-2");
    assert_eq!(a["topodra.dev/timeslice"], "3");
    assert_eq!(a["topodra.dev/memory-bytes"], "21474836480");
    // The GPU's own node, as for the whole GPU.
    assert_eq!(device.container_edits.device_nodes[0].path, "/dev/nvidia2");
}

#[test]
fn an_mps_share_gets_its_daemons_pipe_directory_and_its_limits() {
    let mut g = gpu(2, 0, "0-3");
    g.device_name = "gpu-2-mps".into();
    g.share = Some((
        "5b1d7c1e-0000-4000-8000-000000000002".into(),
        topodra_model::checkpoint::ShareIntent {
            mode: topodra_model::checkpoint::ShareMode::Mps,
            gpu_device: "gpu-2".into(),
            gpu_uuid: "GPU-x".into(),
            timeslice: 0,
            memory_bytes: Some(10 << 30),
            compute_percent: Some(30),
            pipe_dir: Some("/var/lib/kubelet/plugins/gpu.topodra.dev/mps/gpu-2/pipe".into()),
            prior_compute_mode: Some(0),
        },
    ));
    let nodes = TableDeviceNodes::nvidia([2], 509);
    let spec = claim_spec(&request(vec![g]), &nodes, &driver()).unwrap();
    let device = &spec.devices[0];
    assert_eq!(
        device.container_edits.env,
        [
            "TOPODRA_SHARING=MPS",
            "TOPODRA_GPU_MEMORY_SHARE=10737418240",
            "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M",
            "TOPODRA_GPU_MEMORY_SHARE_ENFORCED=true",
        ]
    );
    let mounts = &device.container_edits.mounts;
    assert_eq!(mounts.len(), 2);
    assert_eq!(
        mounts[0].host_path,
        "/var/lib/kubelet/plugins/gpu.topodra.dev/mps/gpu-2/pipe"
    );
    assert_eq!(mounts[0].container_path, "/tmp/nvidia-mps");
    // The daemon's shared memory replaces the container's own.
    assert_eq!(
        mounts[1].host_path,
        "/var/lib/kubelet/plugins/gpu.topodra.dev/mps/gpu-2/shm"
    );
    assert_eq!(mounts[1].container_path, "/dev/shm");
    let a = &device.annotations;
    assert_eq!(a["topodra.dev/sharing"], "MPS");
    assert_eq!(a["topodra.dev/compute-percent"], "30");
    assert_eq!(a["topodra.dev/prior-compute-mode"], "0");
    assert!(!a.contains_key("topodra.dev/timeslice"));
}
