//! The unmodified nvml-wrapper crate, loading the fake library, sees what
//! each profile describes. Every test installs its own copy of the library
//! and profile in a temp dir, so the tests run in parallel without sharing
//! NVML state.

mod common;

use common::{builtin_yaml, fabric_v3, instance_ids, open, remote_type, setup, uuid_text};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::Brand;
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{self as sys, NvmlLib};
use topodra_fake_nvml::profile::{
    Architecture, FabricState, Gpu, RemoteType, SwitchRemotePci, XidEvent, parse_compute_capability,
};
use topodra_fake_nvml::{BusId, Profile};

fn arch(a: Architecture) -> DeviceArchitecture {
    match a {
        Architecture::Ampere => DeviceArchitecture::Ampere,
        Architecture::Ada => DeviceArchitecture::Ada,
        Architecture::Hopper => DeviceArchitecture::Hopper,
        Architecture::Blackwell => DeviceArchitecture::Blackwell,
        other => panic!("no profile uses {other:?}"),
    }
}

/// Checks everything the driver reads through nvml-wrapper.
fn check_profile(name: &str) {
    let p = Profile::builtin(name).expect("builtin");
    let (_dir, lib) = setup(&p.to_yaml());
    let nvml = open(&lib).expect("init");

    assert_eq!(nvml.sys_driver_version().expect("driver"), p.driver_version);
    assert_eq!(
        nvml.sys_cuda_driver_version().expect("cuda"),
        p.cuda_driver_version
    );
    assert_eq!(
        nvml.sys_nvml_version().expect("nvml version"),
        p.nvml_version()
    );

    let gpus = p.nvml_gpus();
    assert_eq!(nvml.device_count().expect("count") as usize, gpus.len());

    for g in gpus {
        if g.lost || g.lost_after_ms.is_some() {
            // Covered by tests/lost.rs.
            continue;
        }
        let d = nvml.device_by_index(g.index).expect("by index");
        let bus = BusId::parse(&g.bus_id).expect("bus");
        assert_eq!(d.index().expect("index"), g.index);
        assert_eq!(d.minor_number().expect("minor"), g.minor);
        assert_eq!(d.name().expect("name"), g.name);
        assert_eq!(d.uuid().expect("uuid"), g.uuid);
        assert_eq!(d.brand().expect("brand"), Brand::Nvidia);
        assert_eq!(d.architecture().expect("arch"), arch(g.architecture));
        let cc = d.cuda_compute_capability().expect("cc");
        assert_eq!(
            Some((cc.major, cc.minor)),
            parse_compute_capability(&g.compute_capability)
        );
        let mem = d.memory_info().expect("memory");
        assert_eq!(mem.total, g.memory_mib * 1024 * 1024);
        assert_eq!(mem.free + mem.used + mem.reserved, mem.total);

        let pci = d.pci_info().expect("pci");
        assert_eq!(pci.bus_id, bus.nvml());
        assert!(
            pci.bus_id.len() == 16 && pci.bus_id.starts_with("0000"),
            "8-digit domain"
        );
        assert_eq!(pci.domain, bus.domain);
        assert_eq!(pci.bus, u32::from(bus.bus));
        assert_eq!(pci.pci_device_id, g.pci_device_id);
        assert_eq!(pci.pci_sub_system_id, Some(g.pci_subsystem_id));

        match g.mig {
            Some(m) => {
                let got = d.mig_mode().expect("mig");
                assert_eq!((got.current != 0, got.pending != 0), (m.current, m.pending));
            }
            None => assert!(matches!(d.mig_mode(), Err(NvmlError::NotSupported))),
        }
        match g.numa_node_id {
            Some(n) => assert_eq!(d.numa_node_id().expect("numa"), n),
            None => assert!(matches!(d.numa_node_id(), Err(NvmlError::NotSupported))),
        }
        check_mig(&nvml, &d, g);
        check_fabric(&nvml, &d, g);

        // Lookups by the other keys land on the same device.
        let by_uuid = nvml.device_by_uuid(g.uuid.as_str()).expect("by uuid");
        assert_eq!(by_uuid.index().expect("index"), g.index);
        let by_bus = nvml
            .device_by_pci_bus_id(g.bus_id.as_str())
            .expect("by 4-digit bus");
        assert_eq!(by_bus.index().expect("index"), g.index);
        let by_nvml_bus = nvml
            .device_by_pci_bus_id(bus.nvml())
            .expect("by 8-digit bus");
        assert_eq!(by_nvml_bus.index().expect("index"), g.index);

        check_nvlinks(&nvml, &d, &p, g);
    }
}

fn check_nvlinks(nvml: &Nvml, d: &Device<'_>, p: &Profile, g: &Gpu) {
    let links = p.links_of(g);
    let slots = p.nvlink_slots(g);
    if slots == 0 {
        assert!(matches!(
            d.link_wrapper_for(0).is_active(),
            Err(NvmlError::NotSupported)
        ));
        return;
    }
    let switches = p.nvswitches();
    let placeholder = p.switch_remote_pci() == SwitchRemotePci::Placeholder;
    for link in 0..slots {
        let w = d.link_wrapper_for(link);
        let want = links.iter().find(|l| l.link == link);
        assert_eq!(
            w.is_active().expect("state"),
            want.is_some_and(|l| l.active)
        );
        assert_eq!(w.version().expect("version"), p.nvlink_version(g));
        let Some(l) = want else {
            assert!(matches!(w.remote_pci_info(), Err(NvmlError::NotSupported)));
            continue;
        };
        let r = w.remote_pci_info().expect("remote");
        let kind = remote_type(nvml, d, link).expect("remote type");
        match l.kind {
            RemoteType::Gpu => {
                let peer = p.gpu_by_bus_id(l.remote).expect("peer");
                assert_eq!(r.bus_id, l.remote.nvml());
                assert_eq!(r.pci_device_id, peer.pci_device_id);
                assert_eq!(
                    kind,
                    sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU
                );
            }
            RemoteType::Switch => {
                assert!(switches.contains(&l.remote), "remote is a switch");
                let want = if placeholder {
                    "FFFFFFFF:FF:FF.0".to_owned()
                } else {
                    l.remote.nvml()
                };
                assert_eq!(r.bus_id, want);
                assert_eq!(
                    kind,
                    sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH
                );
            }
            RemoteType::Ibmnpu => assert_eq!(
                kind,
                sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_IBMNPU
            ),
        }
    }
    assert!(matches!(
        d.link_wrapper_for(slots).is_active(),
        Err(NvmlError::InvalidArg)
    ));
}

/// MIG handles, as NVML enumerates them under the parent.
fn check_mig(nvml: &Nvml, d: &Device<'_>, g: &Gpu) {
    assert!(!d.mig_is_mig_device_handle().expect("is mig"));
    if !g.mig.is_some_and(|m| m.current) {
        // nvml.h: "Returns zero if MIG is not supported or enabled".
        assert_eq!(d.mig_device_count().expect("max count"), 0);
        assert!(g.mig_devices.is_empty());
        return;
    }
    let max = d.mig_device_count().expect("max count");
    assert_eq!(max, g.max_mig_devices());
    for (i, want) in (0..).zip(&g.mig_devices) {
        let m = d.mig_device_by_index(i).expect("mig handle");
        assert!(m.mig_is_mig_device_handle().expect("is mig"));
        assert_eq!(m.index().expect("mig index"), i);
        assert_eq!(m.uuid().expect("mig uuid"), want.uuid);
        assert_eq!(
            m.name().expect("mig name"),
            format!("{} MIG {}", g.name, want.profile)
        );
        assert_eq!(
            m.memory_info().expect("mig memory").total,
            want.memory_mib << 20
        );
        let a = m.attributes().expect("attributes");
        assert_eq!(a.multiprocessor_count, want.multiprocessors);
        assert_eq!(a.gpu_instance_slice_count, want.gpu_instance_slices);
        assert_eq!(a.compute_instance_slice_count, want.compute_instance_slices);
        assert_eq!(a.memory_size_mb, want.memory_mib);
        assert_eq!(a.shared_copy_engine_count, want.copy_engines);
        assert_eq!(
            instance_ids(nvml, &m),
            Ok((want.gpu_instance_id, want.compute_instance_id))
        );
        let parent = m.mig_parent_device().expect("parent");
        assert_eq!(parent.uuid().expect("parent uuid"), g.uuid);
    }
    let used = u32::try_from(g.mig_devices.len()).expect("count");
    for i in used..max {
        assert!(matches!(d.mig_device_by_index(i), Err(NvmlError::NotFound)));
    }
    assert!(matches!(
        d.mig_device_by_index(max),
        Err(NvmlError::InvalidArg)
    ));
}

fn check_fabric(nvml: &Nvml, d: &Device<'_>, g: &Gpu) {
    let got = fabric_v3(nvml, d);
    let Some(f) = &g.fabric else {
        assert_eq!(
            got.err(),
            Some(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED)
        );
        return;
    };
    let info = got.expect("fabric info");
    assert_eq!(uuid_text(&info.clusterUuid), f.cluster_uuid);
    assert_eq!(info.cliqueId, f.clique_id);
    let state = match f.state {
        FabricState::NotSupported => sys::NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
        FabricState::NotStarted => sys::NVML_GPU_FABRIC_STATE_NOT_STARTED,
        FabricState::InProgress => sys::NVML_GPU_FABRIC_STATE_IN_PROGRESS,
        FabricState::Completed => sys::NVML_GPU_FABRIC_STATE_COMPLETED,
    };
    assert_eq!(u32::from(info.state), state);
}

#[test]
fn dgx_h100() {
    check_profile("dgx-h100");
}

#[test]
fn dgx_a100() {
    check_profile("dgx-a100");
}

#[test]
fn l40s_pcie() {
    check_profile("l40s-pcie");
}

#[test]
fn snc4_xeon() {
    check_profile("snc4-xeon");
}

#[test]
fn gb200() {
    check_profile("gb200");
}

#[test]
fn dgx_a100_mig() {
    check_profile("dgx-a100-mig");
}

#[test]
fn hgx_h100_placeholder() {
    check_profile("hgx-h100-placeholder");
}

#[test]
fn lost_gpu_profile() {
    check_profile("lost-gpu");
}

#[test]
fn empty_has_no_devices() {
    check_profile("empty");
}

#[test]
fn mismatch_hides_one_gpu_from_nvml() {
    check_profile("mismatch");
    let p = Profile::builtin("mismatch").expect("builtin");
    let (_dir, lib) = setup(&p.to_yaml());
    let nvml = open(&lib).expect("init");
    let hidden = p.gpus.iter().find(|g| g.nvml_hidden).expect("hidden gpu");
    assert!(matches!(
        nvml.device_by_pci_bus_id(hidden.bus_id.as_str()),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        nvml.device_by_uuid(hidden.uuid.as_str()),
        Err(NvmlError::NotFound)
    ));
}

#[test]
fn init_error_profile_fails_init() {
    let (_dir, lib) = setup(&builtin_yaml("init-failure"));
    assert!(matches!(open(&lib), Err(NvmlError::DriverNotLoaded)));
}

#[test]
fn missing_profile_is_driver_not_loaded() {
    let (dir, lib) = setup(&builtin_yaml("empty"));
    std::fs::remove_file(dir.path().join("nvml-profile.yaml")).expect("rm");
    assert!(matches!(open(&lib), Err(NvmlError::DriverNotLoaded)));
}

#[test]
fn broken_profile_is_unknown() {
    let (_dir, lib) = setup("name: [broken");
    assert!(matches!(open(&lib), Err(NvmlError::Unknown)));
}

#[test]
fn xid_event_round_trip() {
    let mut p = Profile::builtin("dgx-h100").expect("builtin");
    p.xid_events.push(XidEvent {
        gpu_index: 1,
        xid: 79,
        after_ms: 150,
        gpu_instance: None,
    });
    let (_dir, lib) = setup(&p.to_yaml());
    let nvml = open(&lib).expect("init");
    let d1 = nvml.device_by_index(1).expect("gpu 1");
    assert!(
        d1.supported_event_types()
            .expect("types")
            .contains(EventTypes::CRITICAL_XID_ERROR)
    );
    let set = nvml.create_event_set().expect("set");
    let set = d1
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .map_err(|e| e.error)
        .expect("register");
    // Not due yet.
    assert!(matches!(set.wait(10), Err(NvmlError::Timeout)));
    let ev = set.wait(5_000).expect("event");
    assert_eq!(ev.device.index().expect("index"), 1);
    assert!(ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR));
    assert_eq!(ev.event_data, Some(XidError::Value(79)));
    // Delivered once only.
    assert!(matches!(set.wait(50), Err(NvmlError::Timeout)));
}

#[test]
fn refcounted_init_and_shutdown() {
    let (_dir, lib) = setup(&builtin_yaml("dgx-h100"));
    let a = open(&lib).expect("first");
    let b = open(&lib).expect("second");
    drop(a);
    // Still initialised for the second user.
    assert_eq!(b.device_count().expect("count"), 8);
}

/// What nvml-wrapper cannot reach: the raw symbols' argument checks and the
/// remote device type (nvml-wrapper 0.13 discards the value it reads).
#[test]
fn raw_abi_edge_cases() {
    let (_dir, lib) = setup(&builtin_yaml("dgx-h100"));
    // SAFETY: the fake library exports the NVML ABI these bindings describe.
    let raw = unsafe { NvmlLib::new(&lib) }.expect("dlopen");
    let mut count = 0u32;
    // SAFETY: valid out-pointers throughout; handles come from the library.
    unsafe {
        assert_eq!(
            raw.nvmlDeviceGetCount_v2(&mut count),
            sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
        );
        assert_eq!(raw.nvmlInit_v2(), sys::nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(
            raw.nvmlDeviceGetCount_v2(std::ptr::null_mut()),
            sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );
        let mut dev: sys::nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(
            raw.nvmlDeviceGetHandleByIndex_v2(0, &mut dev),
            sys::nvmlReturn_enum_NVML_SUCCESS
        );
        let mut small = [0 as std::ffi::c_char; 4];
        assert_eq!(
            raw.nvmlDeviceGetName(dev, small.as_mut_ptr(), 4),
            sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE
        );
        let mut kind: sys::nvmlIntNvLinkDeviceType_t = 0;
        assert_eq!(
            raw.nvmlDeviceGetNvLinkRemoteDeviceType(dev, 0, &mut kind),
            sys::nvmlReturn_enum_NVML_SUCCESS
        );
        assert_eq!(
            kind,
            sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH
        );
        assert_eq!(
            raw.nvmlDeviceGetNvLinkRemoteDeviceType(dev, 18, &mut kind),
            sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );
        let bogus = 0x1234usize as sys::nvmlDevice_t;
        let mut minor = 0u32;
        assert_eq!(
            raw.nvmlDeviceGetMinorNumber(bogus, &mut minor),
            sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );
        let msg = std::ffi::CStr::from_ptr(
            raw.nvmlErrorString(sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST),
        );
        assert_eq!(msg.to_str(), Ok("GPU is lost"));
        assert_eq!(raw.nvmlShutdown(), sys::nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(
            raw.nvmlShutdown(),
            sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
        );
    }
}

#[test]
fn point_to_point_peers_are_gpus() {
    let (_dir, lib) = setup(&builtin_yaml("snc4-xeon"));
    let nvml = open(&lib).expect("init");
    let d = nvml.device_by_index(0).expect("device 0");
    assert_eq!(
        remote_type(&nvml, &d, 0),
        Ok(sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU)
    );
}

/// `nvmlDeviceGetVirtualizationMode` answers the profile's mode, bare metal unless
/// the GPU says otherwise.
#[test]
fn virtualization_mode_follows_the_profile() {
    use nvml_wrapper::enum_wrappers::device::GpuVirtualizationMode;
    let mut p = Profile::builtin("dgx-h100").expect("builtin");
    p.gpus[1].virtualization = topodra_fake_nvml::profile::Virtualization::Passthrough;
    let (_dir, lib) = setup(&p.to_yaml());
    let nvml = open(&lib).expect("init");
    let mode = |i| {
        nvml.device_by_index(i)
            .and_then(|d| d.virtualization_mode())
    };
    assert!(matches!(mode(0), Ok(GpuVirtualizationMode::Bare)));
    assert!(matches!(mode(1), Ok(GpuVirtualizationMode::PassThrough)));
}
