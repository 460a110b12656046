use std::path::Path;

use super::*;

const PROC_DEVICES: &str = "Character devices:
  1 mem
195 nvidia-frontend
195 nvidia
236 nvidia-nvlink
509 nvidia-uvm
510 nvidia-caps

Block devices:
  8 sd
509 nvidia-uvm-fake-block
";

#[test]
fn proc_devices_char_section_only() {
    let m = char_majors(PROC_DEVICES);
    assert_eq!(m.get("nvidia-uvm"), Some(&509));
    assert_eq!(m.get("nvidia-frontend"), Some(&195));
    assert_eq!(m.get("sd"), None);
    assert_eq!(m.get("nvidia-uvm-fake-block"), None);
}

#[test]
fn missing_nodes_fall_back_to_registered_majors() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("dev")).unwrap();
    let proc = dir.path().join("devices");
    fs::write(&proc, PROC_DEVICES).unwrap();
    let nodes = HostDeviceNodes::new(dir.path()).with_proc_devices(&proc);
    for (name, major, minor) in [
        ("nvidia-uvm", 509, 0),
        ("nvidia-uvm-tools", 509, 1),
        ("nvidiactl", 195, 255),
        ("nvidia7", 195, 7),
    ] {
        assert_eq!(
            nodes.lookup(name).unwrap(),
            Some(NodeInfo::char(major, minor)),
            "{name}"
        );
    }
    assert_eq!(nodes.lookup("nvidia-caps").unwrap(), None);
    assert_eq!(nodes.lookup("nvidiafoo").unwrap(), None);
}

#[test]
fn nothing_registered_means_none() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = HostDeviceNodes::new(dir.path()).with_proc_devices(dir.path().join("missing"));
    assert_eq!(nodes.lookup("nvidia-uvm").unwrap(), None);
}

#[test]
fn a_regular_file_is_not_a_device() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("dev")).unwrap();
    fs::write(dir.path().join("dev/nvidia0"), "").unwrap();
    let err = HostDeviceNodes::new(dir.path())
        .lookup("nvidia0")
        .unwrap_err();
    assert!(matches!(err, CdiError::NotADeviceNode { .. }), "{err}");
    assert!(err.to_string().contains("dev/nvidia0"));
}

#[test]
fn stats_real_char_devices() {
    // /dev/null is 1:3 on every Linux system.
    if !Path::new("/dev/null").exists() {
        return;
    }
    let info = HostDeviceNodes::new("/").lookup("null").unwrap().unwrap();
    assert_eq!(info, NodeInfo::char(1, 3).owned(0o666, 0, 0));
}

#[test]
fn mig_access_nodes_come_from_the_capabilities_files() {
    let dir = tempfile::tempdir().unwrap();
    let gi = dir.path().join("caps/gpu2/mig/gi3");
    std::fs::create_dir_all(gi.join("ci0")).unwrap();
    let access = "DeviceFileMinor: 39\nDeviceFileMode: 292\nDeviceFileModify: 1\n";
    std::fs::write(gi.join("access"), access).unwrap();
    std::fs::write(gi.join("ci0/access"), access.replace("39", "40")).unwrap();
    let proc_devices = dir.path().join("devices");
    std::fs::write(&proc_devices, PROC_DEVICES).unwrap();
    let nodes = HostDeviceNodes::new(dir.path())
        .with_proc_devices(&proc_devices)
        .with_capabilities_dir(dir.path().join("caps"));
    let names = nodes.mig_access_nodes(2, 3, 0).unwrap();
    assert_eq!(
        names,
        ["nvidia-caps/nvidia-cap39", "nvidia-caps/nvidia-cap40"]
    );
    // No node under /dev yet: the major comes from /proc/devices.
    assert_eq!(
        nodes.lookup(&names[0]).unwrap(),
        Some(NodeInfo::char(510, 39))
    );
    let missing = nodes.mig_access_nodes(2, 4, 0).unwrap_err().to_string();
    assert!(missing.contains("gpu2/mig/gi4/access"), "{missing}");
    std::fs::write(gi.join("access"), "garbage").unwrap();
    let bad = nodes.mig_access_nodes(2, 3, 0).unwrap_err().to_string();
    assert!(bad.contains("DeviceFileMinor"), "{bad}");
}
