//! Every builtin profile parses, validates, and matches its committed hwloc
//! XML. `TOPODRA_REGENERATE=1` rewrites the XML files instead of comparing.

use std::process::Command;

use topodra_fake_nvml::hwloc_xml::render;
use topodra_fake_nvml::{Profile, builtin_names, profiles_dir};

#[test]
fn builtins_parse_and_validate() {
    for name in builtin_names() {
        let p = Profile::builtin(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(&p.name, name, "file name and profile name differ");
        assert!(!p.sources.trim().is_empty(), "{name}: sources is empty");
        // The serialised form must read back to the same profile.
        let again = Profile::from_yaml_str(&p.to_yaml()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(again, p);
    }
}

#[test]
fn profile_dir_has_no_strays() {
    let mut found: Vec<String> = std::fs::read_dir(profiles_dir())
        .expect("profiles dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .map(|n| n.trim_end_matches(".yaml").to_owned())
        .collect();
    found.sort();
    let mut known: Vec<String> = builtin_names().iter().map(|s| s.to_string()).collect();
    known.sort();
    assert_eq!(found, known, "profiles/*.yaml and builtin_names() disagree");
}

#[test]
fn committed_xml_matches_render() {
    let regenerate = std::env::var_os("TOPODRA_REGENERATE").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for name in builtin_names() {
        let p = Profile::builtin(name).expect("builtin");
        let xml = render(&p);
        let path = profiles_dir().join(format!("{name}.hwloc.xml"));
        if regenerate {
            std::fs::write(&path, &xml).expect("write xml");
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(committed) if committed == xml => {}
            _ => stale.push(path.display().to_string()),
        }
    }
    assert!(
        stale.is_empty(),
        "out of date: {stale:?}; run `TOPODRA_REGENERATE=1 cargo test -p topodra-fake-nvml`"
    );
}

/// hwloc's own loader must accept each file without complaint. Skipped
/// where `lstopo-no-graphics` is not installed.
#[test]
fn lstopo_loads_rendered_xml() {
    if Command::new("lstopo-no-graphics")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("lstopo-no-graphics not installed; skipping");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    for name in builtin_names() {
        let p = Profile::builtin(name).expect("builtin");
        let path = dir.path().join(format!("{name}.xml"));
        std::fs::write(&path, render(&p)).expect("write");
        let out = Command::new("lstopo-no-graphics")
            .arg("-i")
            .arg(&path)
            .arg("--whole-io")
            .arg("-v")
            .env("HWLOC_DEBUG_CHECK", "1")
            .output()
            .expect("run lstopo");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.trim().is_empty(),
            "{name}: {stderr}"
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        for g in p.gpus.iter().filter(|g| !g.hwloc_hidden) {
            assert!(
                stdout.contains(&g.bus_id),
                "{name}: lstopo does not show {}",
                g.bus_id
            );
        }
    }
}

fn base() -> String {
    std::fs::read_to_string(profiles_dir().join("mismatch.yaml")).expect("read")
}

fn expect_error(yaml: &str, needle: &str) {
    match Profile::from_yaml_str(yaml) {
        Ok(_) => panic!("accepted a profile that should fail with {needle:?}"),
        Err(e) => assert!(e.to_string().contains(needle), "error {e} lacks {needle:?}"),
    }
}

/// Each edit of `yaml` (`from` replaced by `to`, once) makes a profile that fails
/// with an error containing `needle`.
#[track_caller]
fn expect_errors(yaml: &str, edits: &[(&str, &str, &str)]) {
    for (from, to, needle) in edits {
        expect_error(&yaml.replacen(from, to, 1), needle);
    }
}

#[test]
fn validation_errors_are_clear() {
    let b = base();
    expect_errors(
        &b,
        &[
            (
                "bus_id: \"0000:2a:00.0\"",
                "bus_id: \"0000:18:00.0\"",
                "duplicate GPU bus id",
            ),
            (
                "- gpu: \"0000:2a:00.0\"",
                "- gpu: \"0000:2b:00.0\"",
                "missing from gpus",
            ),
            ("  - [10]", "  - [10, 20]", "square"),
            (
                "name: mismatch",
                "name: mismatch\nbogus: 1",
                "unknown field",
            ),
            (
                "threads_per_core: 2",
                "threads_per_core: 2\ninit_error: NOPE",
                "unknown NVML return code",
            ),
            ("numa_node: 0\n", "numa_node: 5\n", "NUMA node 5"),
            ("index: 1\n", "index: 4\n", "without gaps"),
        ],
    );
    expect_error(
        &b.replacen("bus: \"0000:29\"", "bus: \"0000:17\"", 1)
            .replacen("bus_id: \"0000:29:01.0\"", "bus_id: \"0000:17:01.0\"", 1),
        "duplicate host bridge",
    );
}

#[test]
fn overlapping_sibling_bridges_are_rejected() {
    let yaml = base().replacen(
        "      - bridge:\n          bus_id: \"0000:17:01.0\"",
        "      - bridge:\n          bus_id: \"0000:17:02.0\"\n          children:\n            - device: {bus_id: \"0000:18:00.1\", class: 0x0200, vendor: 0x15b3, device_id: 0x1021}\n      - bridge:\n          bus_id: \"0000:17:01.0\"",
        1,
    );
    expect_error(&yaml, "overlapping bus ranges");
}

fn builtin(name: &str) -> String {
    std::fs::read_to_string(profiles_dir().join(format!("{name}.yaml"))).expect("read")
}

#[test]
fn mig_devices_are_validated() {
    expect_errors(
        &builtin("dgx-a100-mig"),
        &[
            (
                "mig: {current: true, pending: true}",
                "mig: {current: false, pending: true}",
                "need MIG mode enabled",
            ),
            (
                "profile: \"3g.20gb\"",
                "profile: \"2g.20gb\"",
                "does not match gpu_instance_slices",
            ),
            (
                "profile: \"3g.20gb\"",
                "profile: \"1c.3g.20gb\"",
                "does not match compute_instance_slices",
            ),
            (
                "gpu_instance_id: 8,",
                "gpu_instance_id: 7,",
                "duplicate (gpu instance, compute instance)",
            ),
            ("gpu_instance_id: 8,", "gpu_instance_id: 15,", "ids must be"),
            (
                "MIG-6e1c0f2a-4b3d-5a7e-9c8f-000000000001",
                "MIG-6e1c0f2a-4b3d-5a7e-9c8f-000000000000",
                "duplicate uuid",
            ),
            ("uuid: \"MIG-", "uuid: \"GPU-", "must look like MIG-"),
            // Two compute instances sharing GI 2 may not use more than its 3 slices.
            (
                "gpu_instance_id: 4, compute_instance_id: 0, profile: \"2g.10gb\", gpu_instance_slices: 2, compute_instance_slices: 2, memory_mib: 9984",
                "gpu_instance_id: 2, compute_instance_id: 1, profile: \"2c.3g.20gb\", gpu_instance_slices: 3, compute_instance_slices: 2, memory_mib: 20096",
                "more slices than their GPU instance",
            ),
            (
                "copy_engines: 3, decoders: 2,",
                "copy_engines: 3, decoders: 2, gi_cap_minor: 66,",
                "access minor is not unique",
            ),
        ],
    );
}

#[test]
fn fabric_and_loss_fields_are_validated() {
    expect_errors(
        &builtin("gb200"),
        &[
            (
                "cluster_uuid: \"6f1d2c3b",
                "cluster_uuid: \"6f1d2c3",
                "invalid UUID",
            ),
            (
                "state: completed}",
                "state: completed, status: NOPE}",
                "unknown NVML return code",
            ),
            ("state: completed}", "state: done}", "unknown variant"),
        ],
    );
    expect_errors(
        &builtin("lost-gpu"),
        &[
            (
                "    lost: true\n",
                "    lost: true\n    lost_after_ms: 5\n",
                "exclusive",
            ),
            (
                "recovered_after_ms: 6000",
                "recovered_after_ms: 1000",
                "must be after the loss",
            ),
            (
                "    lost_after_ms: 1500\n",
                "",
                "needs lost or lost_after_ms",
            ),
        ],
    );
}

#[test]
fn nvlink_remote_types_are_validated() {
    let b = builtin("snc4-xeon");
    assert!(b.contains("nvlinks:"), "snc4-xeon has explicit links");
    let first_remote = b
        .split("remote: \"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("a remote")
        .to_owned();
    expect_error(
        &b.replacen(
            &format!("remote: \"{first_remote}\""),
            &format!("remote: \"{first_remote}\", remote_type: switch"),
            1,
        ),
        "is not a Switch",
    );
    expect_error(
        &b.replacen(
            &format!("remote: \"{first_remote}\""),
            "remote: \"0007:00:00.0\"",
            1,
        ),
        "neither a GPU nor an NVSwitch",
    );
    let h = builtin("dgx-h100");
    expect_error(
        &h.replacen("switch_remote_pci", "x", 1).replacen(
            "links_per_gpu: 18",
            "links_per_gpu: 18\n  switch_remote_pci: hidden",
            1,
        ),
        "unknown variant",
    );
}
