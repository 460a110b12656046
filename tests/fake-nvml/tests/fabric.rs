//! NVSwitch placeholder addresses, NVLink remote device types and GPU fabric
//! info, through nvml-wrapper and the raw bindings.

mod common;

use std::collections::BTreeSet;

use common::{builtin_yaml, open, remote_type, setup, struct_version, uuid_text};
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{self as sys, NvmlLib};
use topodra_fake_nvml::Profile;

const SWITCH: sys::nvmlIntNvLinkDeviceType_t =
    sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH;

/// GPUs with at least one active link to an NVSwitch, by UUID: the way a
/// consumer finds the NVSwitch fabric when the addresses say nothing.
fn switch_attached(nvml: &Nvml) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for i in 0..nvml.device_count().expect("count") {
        let d = nvml.device_by_index(i).expect("gpu");
        for link in 0..sys::NVML_NVLINK_MAX_LINKS {
            if d.link_wrapper_for(link).is_active().unwrap_or(false)
                && remote_type(nvml, &d, link) == Ok(SWITCH)
            {
                out.insert(d.uuid().expect("uuid"));
            }
        }
    }
    out
}

#[test]
fn placeholder_switch_addresses_keep_the_switch_type() {
    for name in ["hgx-h100-placeholder", "gb200"] {
        let (_dir, lib) = setup(&builtin_yaml(name));
        let nvml = open(&lib).expect("init");
        let d = nvml.device_by_index(0).expect("gpu 0");
        for link in 0..18 {
            let r = d.link_wrapper_for(link).remote_pci_info().expect("remote");
            assert_eq!(r.bus_id, "FFFFFFFF:FF:FF.0", "{name} link {link}");
            assert_eq!((r.domain, r.bus, r.device), (0xFFFF_FFFF, 0xFF, 0xFF));
            assert_eq!(remote_type(&nvml, &d, link), Ok(SWITCH));
        }
        let n = nvml.device_count().expect("count") as usize;
        assert_eq!(switch_attached(&nvml).len(), n, "{name}: one fabric");
    }
    // The same machine with real switch addresses.
    let (_dir, lib) = setup(&builtin_yaml("dgx-h100"));
    let nvml = open(&lib).expect("init");
    let d = nvml.device_by_index(0).expect("gpu 0");
    let r = d.link_wrapper_for(0).remote_pci_info().expect("remote");
    assert_eq!(r.bus_id, "00000000:06:00.0");
    assert_eq!(switch_attached(&nvml).len(), 8);
}

#[test]
fn placeholder_legacy_bus_id() {
    let (_dir, lib) = setup(&builtin_yaml("gb200"));
    // SAFETY: the fake library exports the NVML ABI these bindings describe.
    let raw = unsafe { NvmlLib::new(&lib) }.expect("dlopen");
    // SAFETY: valid out pointers; the handle comes from the library.
    unsafe {
        assert_eq!(raw.nvmlInit_v2(), common::SUCCESS);
        let mut dev: sys::nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(
            raw.nvmlDeviceGetHandleByIndex_v2(3, &mut dev),
            common::SUCCESS
        );
        let mut pci: sys::nvmlPciInfo_t = std::mem::zeroed();
        assert_eq!(
            raw.nvmlDeviceGetNvLinkRemotePciInfo_v2(dev, 17, &mut pci),
            common::SUCCESS
        );
        let legacy = std::ffi::CStr::from_ptr(pci.busIdLegacy.as_ptr());
        assert_eq!(legacy.to_str(), Ok("FFFF:FF:FF.0"));
        assert_eq!(raw.nvmlShutdown(), common::SUCCESS);
    }
}

/// A POWER9-style NVLink to the CPU's NPU: type IBMNPU, its own address.
#[test]
fn ibmnpu_remotes() {
    let mut p = Profile::builtin("mismatch").expect("builtin");
    p.gpus.truncate(1);
    p.pci.truncate(1);
    p.gpus[0].nvlinks = serde_saphyr::from_str(
        "[{remote: \"0007:00:00.0\", remote_type: ibmnpu, count: 2}, {remote: \"0007:00:00.1\", remote_type: ibmnpu}]",
    )
    .expect("links");
    let (_dir, lib) = setup(&p.to_yaml());
    let nvml = open(&lib).expect("init");
    let d = nvml.device_by_index(0).expect("gpu");
    for (link, addr) in [(0, "00000007:00:00.0"), (2, "00000007:00:00.1")] {
        assert_eq!(
            remote_type(&nvml, &d, link),
            Ok(sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_IBMNPU)
        );
        let r = d.link_wrapper_for(link).remote_pci_info().expect("remote");
        assert_eq!(r.bus_id, addr);
    }
}

#[test]
fn fabric_info_versions() {
    let p = Profile::builtin("gb200").expect("builtin");
    let f = p.gpus[0].fabric.clone().expect("fabric");
    let (_dir, lib) = setup(&p.to_yaml());
    // SAFETY: the fake library exports the NVML ABI these bindings describe.
    let raw = unsafe { NvmlLib::new(&lib) }.expect("dlopen");
    // SAFETY: valid out pointers of the declared types; handles from the library.
    unsafe {
        assert_eq!(raw.nvmlInit_v2(), common::SUCCESS);
        let mut dev: sys::nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(
            raw.nvmlDeviceGetHandleByIndex_v2(2, &mut dev),
            common::SUCCESS
        );

        let mut v1: sys::nvmlGpuFabricInfo_t = std::mem::zeroed();
        assert_eq!(
            raw.nvmlDeviceGetGpuFabricInfo(dev, &mut v1),
            common::SUCCESS
        );
        assert_eq!(uuid_text(&v1.clusterUuid), f.cluster_uuid);
        assert_eq!(v1.cliqueId, f.clique_id);
        assert_eq!(u32::from(v1.state), sys::NVML_GPU_FABRIC_STATE_COMPLETED);
        assert_eq!(v1.status, common::SUCCESS);

        // v2 into a v2-sized buffer: no healthSummary written past it.
        let mut buf = [0xAAu8; std::mem::size_of::<sys::nvmlGpuFabricInfo_v3_t>()];
        let v2p = buf.as_mut_ptr().cast::<sys::nvmlGpuFabricInfo_v2_t>();
        let v2 = struct_version::<sys::nvmlGpuFabricInfo_v2_t>(2);
        v2p.write_unaligned(sys::nvmlGpuFabricInfo_v2_t {
            version: v2,
            ..std::mem::zeroed()
        });
        assert_eq!(
            raw.nvmlDeviceGetGpuFabricInfoV(dev, v2p.cast()),
            common::SUCCESS
        );
        let got = v2p.read_unaligned();
        assert_eq!(got.version, v2);
        assert_eq!(got.cliqueId, f.clique_id);
        assert_eq!(got.healthMask, 0);
        let v2_len = std::mem::size_of::<sys::nvmlGpuFabricInfo_v2_t>();
        assert!(buf[v2_len..].iter().all(|b| *b == 0xAA), "wrote past v2");

        let mut v3: sys::nvmlGpuFabricInfoV_t = std::mem::zeroed();
        v3.version = struct_version::<sys::nvmlGpuFabricInfo_v3_t>(3);
        assert_eq!(
            raw.nvmlDeviceGetGpuFabricInfoV(dev, &mut v3),
            common::SUCCESS
        );
        assert_eq!(uuid_text(&v3.clusterUuid), f.cluster_uuid);
        assert_eq!(
            u32::from(v3.healthSummary),
            sys::NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED
        );

        for bad in [0, 3 << 24, struct_version::<sys::nvmlGpuFabricInfo_v3_t>(2)] {
            v3.version = bad;
            assert_eq!(
                raw.nvmlDeviceGetGpuFabricInfoV(dev, &mut v3),
                sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
                "version {bad:#x}"
            );
        }
        assert_eq!(
            raw.nvmlDeviceGetGpuFabricInfoV(dev, std::ptr::null_mut()),
            sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(raw.nvmlShutdown(), common::SUCCESS);
    }
}

/// All four GPUs of the tray share the rack's cluster and clique.
#[test]
fn gb200_gpus_share_one_clique() {
    let (_dir, lib) = setup(&builtin_yaml("gb200"));
    let nvml = open(&lib).expect("init");
    let mut cliques = BTreeSet::new();
    for i in 0..4 {
        let d = nvml.device_by_index(i).expect("gpu");
        let f = common::fabric_v3(&nvml, &d).expect("fabric");
        cliques.insert((uuid_text(&f.clusterUuid), f.cliqueId, f.state, f.status));
    }
    assert_eq!(cliques.len(), 1);
}

#[test]
fn gpus_without_fabric_are_not_supported() {
    let (_dir, lib) = setup(&builtin_yaml("dgx-h100"));
    // SAFETY: the fake library exports the NVML ABI these bindings describe.
    let raw = unsafe { NvmlLib::new(&lib) }.expect("dlopen");
    // SAFETY: valid out pointers; handle from the library.
    unsafe {
        assert_eq!(raw.nvmlInit_v2(), common::SUCCESS);
        let mut dev: sys::nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(
            raw.nvmlDeviceGetHandleByIndex_v2(0, &mut dev),
            common::SUCCESS
        );
        let mut v1: sys::nvmlGpuFabricInfo_t = std::mem::zeroed();
        assert_eq!(
            raw.nvmlDeviceGetGpuFabricInfo(dev, &mut v1),
            sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
        );
        let mut v3: sys::nvmlGpuFabricInfoV_t = std::mem::zeroed();
        v3.version = struct_version::<sys::nvmlGpuFabricInfo_v3_t>(3);
        assert_eq!(
            raw.nvmlDeviceGetGpuFabricInfoV(dev, &mut v3),
            sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(raw.nvmlShutdown(), common::SUCCESS);
    }
}
