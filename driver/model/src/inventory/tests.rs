use super::*;

#[test]
fn cuda_version_decodes_nvml_encoding() {
    assert_eq!(
        CudaVersion::from_nvml(12040),
        Some(CudaVersion {
            major: 12,
            minor: 4
        })
    );
    assert_eq!(CudaVersion::from_nvml(0), None);
    assert_eq!(CudaVersion::from_nvml(11080).unwrap().to_string(), "11.8");
}

#[test]
fn distance_matrix_lookup_uses_node_ids() {
    let m = DistanceMatrix::new(vec![0, 8], vec![10, 40, 40, 10]).unwrap();
    assert_eq!(m.get(0, 8), Some(40));
    assert_eq!(m.get(8, 8), Some(10));
    assert_eq!(m.get(1, 0), None);
    assert!(DistanceMatrix::new(vec![0, 1], vec![10]).is_none());
}

fn mig(gi: u32, ci: u32) -> MigDevice {
    MigDevice {
        uuid: format!("MIG-{gi}-{ci}"),
        gpu_instance: gi,
        compute_instance: ci,
        profile: Some("1g.5gb".into()),
        memory_bytes: Some(5 << 30),
        multiprocessors: Some(14),
        placement: None,
        profile_id: None,
    }
}

#[test]
fn mig_mode_decides_what_is_offered() {
    let at = |bus: &str, minor: u32, mode: Option<(bool, bool)>| {
        let mut g = Gpu::at(bus.parse().unwrap());
        g.minor = Some(minor);
        g.uuid = Some(format!("GPU-{minor}"));
        g.memory_bytes = Some(40 << 30);
        g.mig_mode = mode.map(|(current, pending)| MigMode { current, pending });
        g
    };
    let mut on = at("0000:07:00.0", 0, Some((true, true)));
    on.mig_devices = vec![mig(7, 0), mig(8, 0)];
    let inv = Inventory {
        gpus: vec![
            on,
            at("0000:0f:00.0", 1, Some((false, true))),
            at("0000:47:00.0", 2, Some((true, false))),
            at("0000:4e:00.0", 3, Some((false, false))),
            at("0000:87:00.0", 4, None),
        ],
        ..Inventory::default()
    };
    let offered: Vec<(String, Option<String>, Option<u64>)> = inv
        .allocatable()
        .iter()
        .map(|d| (d.name(), d.uuid().map(str::to_owned), d.memory_bytes()))
        .collect();
    assert_eq!(
        offered,
        vec![
            (
                "gpu-0-mig-7-0".into(),
                Some("MIG-7-0".into()),
                Some(5 << 30)
            ),
            (
                "gpu-0-mig-8-0".into(),
                Some("MIG-8-0".into()),
                Some(5 << 30)
            ),
            ("gpu-3".into(), Some("GPU-3".into()), Some(40 << 30)),
            ("gpu-4".into(), Some("GPU-4".into()), Some(40 << 30)),
        ]
    );
    assert_eq!(inv.gpus[1].offer(), Offer::MigChangePending);
    assert_eq!(inv.gpus[2].offer(), Offer::MigChangePending);
}

#[test]
fn device_names_are_dns_labels() {
    let mut g = Gpu::at("0000:18:00.0".parse().unwrap());
    assert_eq!(g.device_name(), "gpu-pci-0000-18-00-0");
    g.minor = Some(3);
    assert_eq!(g.device_name(), "gpu-3");
}
