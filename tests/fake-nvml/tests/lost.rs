//! GPUs that fall off the bus, at init (`lost`) or later (`lost_after_ms`,
//! `recovered_after_ms`), through the real nvml-wrapper. Delays are kept
//! small: the tests shrink the builtin `lost-gpu` timeline.

mod common;

use std::time::{Duration, Instant};

use common::{fabric_v3, open, setup};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;
use topodra_fake_nvml::Profile;

fn lost_gpu() -> Profile {
    Profile::builtin("lost-gpu").expect("builtin")
}

/// Sleeps until `ms` after `t0`.
fn until(t0: Instant, ms: u64) {
    let at = t0 + Duration::from_millis(ms);
    if let Some(d) = at.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

fn ms_since(t0: Instant) -> u64 {
    u64::try_from(t0.elapsed().as_millis()).expect("short test")
}

#[test]
fn builtin_timeline_is_as_documented() {
    let p = lost_gpu();
    let bus: Vec<&str> = p.gpus.iter().map(|g| g.bus_id.as_str()).collect();
    assert_eq!(
        bus,
        [
            "0000:18:00.0",
            "0000:19:00.0",
            "0000:9a:00.0",
            "0000:9b:00.0"
        ]
    );
    assert_eq!(p.gpus[2].lost_after_ms, Some(1500));
    assert_eq!(p.gpus[2].recovered_after_ms, Some(6000));
    assert!(p.gpus[3].lost);
    assert!(p.gpus[..3].iter().all(|g| !g.lost));
    // The schedule itself, without sleeping.
    assert!(!p.gpus[2].lost_at(1499));
    assert!(p.gpus[2].lost_at(1500));
    assert!(p.gpus[2].lost_at(5999));
    assert!(!p.gpus[2].lost_at(6000));
    assert!(p.gpus[3].lost_at(0) && p.gpus[3].lost_at(u64::MAX));
}

#[test]
fn lost_at_init_has_no_handle() {
    let p = lost_gpu();
    let (_dir, lib) = setup(&p.to_yaml());
    let nvml = open(&lib).expect("init");
    // Still counted: nvidia-smi lists it and fails on its handle.
    assert_eq!(nvml.device_count().expect("count"), 4);
    let lost = &p.gpus[3];
    assert!(matches!(nvml.device_by_index(3), Err(NvmlError::GpuLost)));
    assert!(matches!(
        nvml.device_by_pci_bus_id(lost.bus_id.as_str()),
        Err(NvmlError::GpuLost)
    ));
    assert!(matches!(
        nvml.device_by_uuid(lost.uuid.as_str()),
        Err(NvmlError::GpuLost)
    ));
    // GPUs before it in NVML order are found by UUID: the search never
    // reaches the lost one.
    for g in &p.gpus[..2] {
        let d = nvml.device_by_uuid(g.uuid.as_str()).expect("by uuid");
        assert_eq!(d.index().expect("index"), g.index);
    }
}

/// nvml.h: the UUID lookup "may initialize additional GPUs as it searches"
/// and answers GPU_IS_LOST "if any GPU has fallen off the bus".
#[test]
fn uuid_search_past_a_lost_gpu_fails() {
    let mut p = lost_gpu();
    p.gpus[1].lost = true;
    p.gpus[3].lost = false;
    let (_dir, lib) = setup(&p.to_yaml());
    let nvml = open(&lib).expect("init");
    assert!(nvml.device_by_uuid(p.gpus[0].uuid.as_str()).is_ok());
    assert!(matches!(
        nvml.device_by_uuid(p.gpus[3].uuid.as_str()),
        Err(NvmlError::GpuLost)
    ));
    // Index and bus id lookups only look at their target.
    assert!(nvml.device_by_index(3).is_ok());
    assert!(nvml.device_by_pci_bus_id(p.gpus[3].bus_id.as_str()).is_ok());
}

/// A GPU falls off the bus while a handle is held, then comes back: identity
/// queries keep answering, live ones and new lookups answer GPU_IS_LOST.
#[test]
fn lost_after_a_delay_then_recovered() {
    const LOST_MS: u64 = 500;
    const BACK_MS: u64 = 2500;
    let mut p = lost_gpu();
    p.gpus[2].lost_after_ms = Some(LOST_MS);
    p.gpus[2].recovered_after_ms = Some(BACK_MS);
    let g = p.gpus[2].clone();
    let (_dir, lib) = setup(&p.to_yaml());

    let t0 = Instant::now();
    let nvml = open(&lib).expect("init");
    let d = nvml.device_by_index(2).expect("before the loss");
    let healthy = d.memory_info().is_ok();
    if ms_since(t0) < LOST_MS {
        assert!(healthy, "behaves normally before lost_after_ms");
    } else {
        eprintln!("starved past lost_after_ms; skipping the before-loss check");
    }

    until(t0, LOST_MS + 500);
    let identity = (d.uuid(), d.pci_info(), d.index(), d.name());
    let live = (
        d.memory_info(),
        d.numa_node_id(),
        d.link_wrapper_for(0).is_active(),
        d.supported_event_types(),
        fabric_v3(&nvml, &d).err(),
    );
    let by_index = nvml.device_by_index(2).err();
    let by_bus = nvml.device_by_pci_bus_id(g.bus_id.as_str()).err();
    let other = nvml.device_by_index(1).is_ok();
    if ms_since(t0) < BACK_MS {
        assert_eq!(identity.0.expect("uuid"), g.uuid);
        assert_eq!(identity.1.expect("pci").bus_id, "00000000:9A:00.0");
        assert_eq!(identity.2.expect("index"), 2);
        assert_eq!(identity.3.expect("name"), g.name);
        assert!(matches!(live.0, Err(NvmlError::GpuLost)));
        assert!(matches!(live.1, Err(NvmlError::GpuLost)));
        assert!(matches!(live.2, Err(NvmlError::GpuLost)));
        assert!(matches!(live.3, Err(NvmlError::GpuLost)));
        assert_eq!(live.4, Some(sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST));
        assert!(matches!(by_index, Some(NvmlError::GpuLost)));
        assert!(matches!(by_bus, Some(NvmlError::GpuLost)));
        assert!(other, "the other GPUs are unaffected");
        let set = nvml.create_event_set().expect("set");
        assert!(matches!(
            d.register_events(EventTypes::CRITICAL_XID_ERROR, set)
                .map_err(|e| e.error),
            Err(NvmlError::GpuLost)
        ));
    } else {
        eprintln!("starved past recovered_after_ms; skipping the lost-window checks");
    }

    until(t0, BACK_MS + 100);
    assert!(d.memory_info().is_ok(), "the held handle works again");
    let again = nvml.device_by_index(2).expect("lookup after recovery");
    assert_eq!(again.uuid().expect("uuid"), g.uuid);
}

/// The clock starts at the first nvmlInit and survives shutdown: a consumer
/// that re-initialises does not get a healthy GPU back.
#[test]
fn reinit_keeps_the_timeline() {
    let mut p = lost_gpu();
    p.gpus[2].lost_after_ms = Some(200);
    p.gpus[2].recovered_after_ms = None;
    let (_dir, lib) = setup(&p.to_yaml());
    let t0 = Instant::now();
    let first = open(&lib).expect("init");
    drop(first);
    until(t0, 400);
    let nvml = open(&lib).expect("re-init");
    assert!(matches!(nvml.device_by_index(2), Err(NvmlError::GpuLost)));
}
