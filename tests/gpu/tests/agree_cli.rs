//! `topodra-gpu-check agree` as gpu-check.sh runs it, on the h200-vm machine's
//! discovery fixture. Being an integration test, it also makes `cargo test` build
//! the binary that `make gpu-check-dry` runs.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// `nvidia-smi -q -x` as driver 580 wrote it on that machine, cut to the fields the
/// check reads (tags as NVIDIA's nvsmi DTD names them).
fn smi_xml(uuid: &str, memory_mib: u32) -> String {
    format!(
        r#"<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
  <driver_version>580.159.04</driver_version>
  <attached_gpus>1</attached_gpus>
  <gpu id="00000000:00:06.0">
    <product_name>NVIDIA H200</product_name>
    <mig_mode><current_mig>Disabled</current_mig><pending_mig>Disabled</pending_mig></mig_mode>
    <uuid>{uuid}</uuid>
    <minor_number>0</minor_number>
    <pci><pci_bus_id>00000000:00:06.0</pci_bus_id></pci>
    <fb_memory_usage><total>{memory_mib} MiB</total></fb_memory_usage>
  </gpu>
</nvidia_smi_log>
"#
    )
}

const UUID: &str = "GPU-11f42855-bbc5-4b61-a0ae-9780bc370569";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fake-nvml/real/h200-vm")
}

/// Runs `agree` with `xml` and a sysfs whose GPU has `cpus` near it.
fn agree(dir: &Path, xml: &str, cpus: &str) -> (bool, String) {
    let sysfs = dir.join("sys");
    let gpu = sysfs.join("bus/pci/devices/0000:00:06.0");
    std::fs::create_dir_all(&gpu).unwrap();
    std::fs::write(gpu.join("local_cpulist"), format!("{cpus}\n")).unwrap();
    std::fs::write(dir.join("smi.xml"), xml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_topodra-gpu-check"))
        .arg("agree")
        .arg("--out")
        .arg(dir.join("out"))
        .arg("--inventory")
        .arg(fixture().join("inventory.json"))
        .arg("--nvidia-smi-xml")
        .arg(dir.join("smi.xml"))
        .arg("--sysfs")
        .arg(&sysfs)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_h200_fixture_agrees_with_what_its_machine_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, stdout) = agree(dir.path(), &smi_xml(UUID, 143_771), "0-15");
    assert!(ok, "{stdout}");
    for step in ["agree-driver", "agree-gpus", "agree-sysfs"] {
        assert!(
            stdout.contains(&format!("gpu-check: {step}: PASS")),
            "{step}:\n{stdout}"
        );
    }
    let verdicts = std::fs::read_to_string(dir.path().join("out/agree-verdicts.json")).unwrap();
    assert!(verdicts.contains("\"PASS\""), "{verdicts}");
}

#[test]
fn a_disagreement_fails_and_says_where() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, stdout) = agree(dir.path(), &smi_xml(UUID, 81_559), "0-7");
    assert!(!ok, "{stdout}");
    assert!(
        stdout.contains("gpu-check: agree-gpus: FAIL") && stdout.contains("memory MiB"),
        "{stdout}"
    );
    assert!(
        stdout.contains("gpu-check: agree-sysfs: FAIL") && stdout.contains("sysfs \\\"0-7\\\""),
        "{stdout}"
    );
}
