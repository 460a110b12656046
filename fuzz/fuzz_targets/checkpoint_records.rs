//! Whatever records a checkpoint with a valid checksum holds, a start of the prepare
//! state machine recovers from them without failing, and keeps no record it could
//! not act on. The bytes are the checkpoint's data section; the target wraps them in
//! a correctly checksummed envelope, so the fuzzer explores record fields rather
//! than checksums.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};
use topodra_node::cdi::{ContainerEdits, NvidiaFiles, NvidiaFilesSource, TableDeviceNodes};
use topodra_node::prepare::{Preparer, PreparerConfig};
use topodra_model::{Gpu, Inventory, PciAddress};

fuzz_target!(|data: &[u8]| {
    let Ok(data) = std::str::from_utf8(data) else {
        return;
    };
    if serde_json::from_str::<serde_json::Value>(data).is_err() {
        return;
    }
    let checksum = format!("sha256:{:x}", Sha256::digest(data.as_bytes()));
    let envelope = format!("{{\"version\":1,\"checksum\":\"{checksum}\",\"data\":{data}}}");

    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).expect("state dir");
    std::fs::write(state.join("checkpoint.json"), envelope).expect("checkpoint");

    let mut gpu = Gpu::at(PciAddress::new(0, 0x18, 0, 0));
    gpu.minor = Some(0);
    gpu.uuid = Some("GPU-0".into());
    let inventory = Inventory {
        gpus: vec![gpu],
        ..Inventory::default()
    };
    let config = PreparerConfig {
        driver_name: "gpu.topodra.dev".into(),
        node_name: "node-a".into(),
        state_dir: state,
        boot_id: "boot-1".into(),
        cdi_spec_dir: dir.path().join("cdi"),
        dynamic_mig: false,
        carver: None,
        sharing: Default::default(),
        time_slicer: None,
        mps: None,
    };
    let files = NvidiaFiles::fixed(
        NvidiaFilesSource::Discovered { root: "/".into() },
        ContainerEdits::default(),
    );
    let (preparer, _report) = Preparer::start(
        &config,
        &inventory,
        Box::new(TableDeviceNodes::nvidia([0], 509)),
        files,
    )
    .expect("a start never fails on the content of its own checkpoint");
    for uid in preparer.checkpoint().claims.keys() {
        assert!(
            !uid.is_empty() && uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
            "kept a record it cannot act on: {uid:?}"
        );
    }
});
