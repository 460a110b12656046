//! The simulated node's `/proc/devices` and nvidia-capabilities tree.

use std::path::Path;

use topodra_fake_nvml::sim::{self, NVIDIA_CAPS_MAJOR};
use topodra_fake_nvml::{cdylib_path, profiles_dir};

fn node(name: &str) -> (tempfile::TempDir, sim::SimNode) {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = std::fs::read_to_string(profiles_dir().join(format!("{name}.yaml"))).expect("read");
    let node = sim::materialize(dir.path(), &yaml, &cdylib_path()).expect("materialize");
    (dir, node)
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Relative paths of all files under `dir`, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).expect("under dir");
                out.push(rel.display().to_string());
            }
        }
    }
    out.sort();
    out
}

fn cap(minor: u32) -> String {
    format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
}

#[test]
fn proc_devices_registers_nvidia_caps() {
    let (_dir, sim) = node("dgx-h100");
    let text = read(&sim.proc_devices);
    assert!(
        text.contains(&format!("\n{NVIDIA_CAPS_MAJOR} nvidia-caps\n")),
        "{text}"
    );
    assert!(text.contains("\n195 nvidia-frontend\n"));
    assert!(sim.plugin_args().contains(&format!(
        "--nvidia-capabilities-dir={}",
        sim.capabilities_dir.display()
    )));
}

#[test]
fn mig_capabilities_of_dgx_a100_mig() {
    let (_dir, sim) = node("dgx-a100-mig");
    let caps = &sim.capabilities_dir;
    assert_eq!(
        read(&caps.join("mig/config")),
        "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n"
    );
    assert_eq!(read(&caps.join("mig/monitor")), cap(2));
    // GPU 0 (minor 0): seven 1g.5gb in GI 7..13, CI 0.
    for gi in 7..=13 {
        let base = 3 + gi * 9;
        assert_eq!(
            read(&caps.join(format!("gpu0/mig/gi{gi}/access"))),
            cap(base)
        );
        assert_eq!(
            read(&caps.join(format!("gpu0/mig/gi{gi}/ci0/access"))),
            cap(base + 1)
        );
    }
    // GPU 1 (minor 1): GI 2, 4, 7.
    for (gi, minor) in [(2, 156), (4, 174), (7, 201)] {
        assert_eq!(
            read(&caps.join(format!("gpu1/mig/gi{gi}/access"))),
            cap(minor)
        );
        assert_eq!(
            read(&caps.join(format!("gpu1/mig/gi{gi}/ci0/access"))),
            cap(minor + 1)
        );
    }
    // Nothing for the pending or whole GPUs.
    assert_eq!(files(caps).len(), 2 + 2 * (7 + 3));
}

#[test]
fn no_mig_devices_no_access_files() {
    let (_dir, h100) = node("dgx-h100");
    assert_eq!(files(&h100.capabilities_dir), ["mig/config", "mig/monitor"]);
    let (_dir2, l40s) = node("l40s-pcie");
    assert!(files(&l40s.capabilities_dir).is_empty());
    assert!(l40s.capabilities_dir.is_dir());
}

#[test]
fn driver_root_of_real_files() {
    let (_dir, sim) = node("l40s-pcie");
    let profile = read(&profiles_dir().join("l40s-pcie.yaml"));
    let lib = sim.driver_root.join("usr/lib/x86_64-linux-gnu");
    let version = "550.90.07";
    for name in [
        "libcuda.so.1",
        "libnvidia-ml.so.1",
        &format!("libnvidia-ptxjitcompiler.so.{version}"),
    ] {
        let bytes = std::fs::read(lib.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(&bytes[..4], b"\x7fELF", "{name} is an ELF file");
    }
    // The root's NVML answers with this node's profile.
    assert_eq!(read(&lib.join("nvml-profile.yaml")), profile);
    let smi = std::process::Command::new(sim.driver_root.join("usr/bin/nvidia-smi"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&smi.stdout).contains(version));
    // No device nodes: tests make their own in the dev root.
    assert!(files(&sim.dev_root).is_empty());
}

#[test]
fn cpu_sysfs_under_the_host_root() {
    let (dir, sim) = node("dgx-h100");
    assert_eq!(sim.cpu_host_root, dir.path().join("host-root"));
    let system = sim.cpu_host_root.join("sys/devices/system");
    assert_eq!(read(&system.join("cpu/online")), "0-223\n");
    assert_eq!(read(&system.join("node/node1/cpulist")), "56-111,168-223\n");
    // Not a plugin flag: the plugin reads CPUs from the hwloc XML.
    assert!(
        !sim.plugin_args()
            .iter()
            .any(|a| a.contains(&sim.cpu_host_root.display().to_string()))
    );
}

/// `driver_root_device_nodes`: the driver's nodes under `<driver-root>/dev`, with
/// the numbers the node's `/proc/devices` registers; without it, no `dev/` there.
#[test]
fn device_nodes_in_the_driver_root_on_request() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    let (_plain_dir, plain) = node("dgx-h100");
    assert!(!plain.driver_root.join("dev").exists());

    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = std::fs::read_to_string(profiles_dir().join("dgx-h100.yaml")).expect("read");
    let options = sim::SimOptions {
        driver_root_device_nodes: true,
    };
    let sim = match sim::materialize_with(dir.path(), &yaml, &cdylib_path(), options) {
        Ok(sim) => sim,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            eprintln!("skipped: {e}");
            return;
        }
        Err(e) => panic!("materialize: {e}"),
    };
    let dev = sim.driver_root.join("dev");
    let proc_devices = read(&sim.proc_devices);
    for (name, major, minor) in [
        ("nvidiactl", 195, 255),
        ("nvidia0", 195, 0),
        ("nvidia7", 195, 7),
        ("nvidia-uvm", 509, 0),
        ("nvidia-uvm-tools", 509, 1),
    ] {
        let md = std::fs::metadata(dev.join(name)).expect(name);
        assert!(md.file_type().is_char_device(), "{name}");
        let rdev = md.rdev();
        assert_eq!(
            (libc::major(rdev), libc::minor(rdev)),
            (major, minor),
            "{name}"
        );
        assert!(
            proc_devices.contains(&format!("\n{major} nvidia")),
            "{name}"
        );
    }
}

/// MIG instances belong to the node, not to one copy of NVML: an instance made
/// through the node's NVML shows in the capabilities mirror and through the
/// driver root's copy, and a reboot takes it away again.
#[test]
fn mig_state_is_the_nodes_and_a_reboot_resets_it() {
    use nvml_wrapper::Nvml;
    use nvml_wrapper_sys::bindings as sys;

    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = std::fs::read_to_string(profiles_dir().join("dgx-a100-mig.yaml")).expect("read");
    let sim = sim::materialize(dir.path(), &yaml, &cdylib_path()).expect("materialize");
    let nvml = Nvml::builder()
        .lib_path(sim.nvml_lib.as_os_str())
        .init()
        .expect("init");
    // GPU 1 has 3g.20gb, 2g.10gb and 1g.5gb from the profile; a 1g.5gb more.
    let gpu1 = nvml.device_by_index(1).expect("gpu 1");
    // SAFETY: handles of this library, valid out pointers.
    let (gi, id) = unsafe {
        let mut gi = std::ptr::null_mut();
        let mut ci = std::ptr::null_mut();
        assert_eq!(
            nvml.lib()
                .nvmlDeviceCreateGpuInstance(gpu1.handle(), 19, &mut gi),
            0
        );
        assert_eq!(
            nvml.lib()
                .nvmlGpuInstanceCreateComputeInstance(gi, 0, &mut ci),
            0
        );
        let mut info: sys::nvmlGpuInstanceInfo_t = std::mem::zeroed();
        assert_eq!(nvml.lib().nvmlGpuInstanceGetInfo(gi, &mut info), 0);
        (gi, info.id)
    };
    assert!(!gi.is_null());
    let access = sim
        .capabilities_dir
        .join(format!("gpu1/mig/gi{id}/ci0/access"));
    assert!(access.exists(), "{}", access.display());

    let root_lib = sim
        .driver_root
        .join("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
    let root = Nvml::builder()
        .lib_path(root_lib.as_os_str())
        .init()
        .expect("root's copy");
    let count = |n: &Nvml| {
        let g = n.device_by_index(1).expect("gpu 1");
        (0..7).filter(|i| g.mig_device_by_index(*i).is_ok()).count()
    };
    assert_eq!(
        count(&root),
        4,
        "the driver root's NVML sees the new instance"
    );

    sim.reboot(&yaml).expect("reboot");
    assert_eq!(count(&nvml), 3);
    assert!(!access.exists());
    assert!(sim.capabilities_dir.join("gpu1/mig/gi2/access").exists());
}
