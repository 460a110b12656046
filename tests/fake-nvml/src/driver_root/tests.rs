use std::ffi::{CString, c_int, c_uint};
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use object::read::elf::ElfFile64;

use super::*;

/// `DT_SONAME` of a 64-bit ELF shared object, read from its dynamic section.
fn soname(path: &Path) -> Option<String> {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let elf: ElfFile64<'_> =
        ElfFile64::parse(&*data).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let table = elf
        .elf_section_table()
        .dynamic_table(elf.endian(), elf.data())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let entry = table.iter().find(|d| d.tag == object::elf::DT_SONAME)?;
    let name = table
        .string(entry)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Some(String::from_utf8_lossy(name).into_owned())
}

fn build(layout: Layout, options: &Options) -> (tempfile::TempDir, DriverRoot) {
    let dir = tempfile::tempdir().unwrap();
    let root = DriverRoot::build(&dir.path().join("root"), layout, R570_VERSION, options)
        .unwrap_or_else(|e| panic!("building the driver root: {e}"));
    (dir, root)
}

#[test]
fn libraries_carry_their_sonames_and_links() {
    for layout in [Layout::Debian, Layout::Rhel] {
        let (_dir, root) = build(layout, &Options::default());
        assert_eq!(
            root.libraries.len(),
            LIBRARIES.len() + GRAPHICS_LIBRARIES.len()
        );
        for lib in &root.libraries {
            let file = root.host_path(&lib.path);
            let meta = std::fs::symlink_metadata(&file).unwrap();
            assert!(meta.is_file(), "{} is a regular file", lib.path);
            assert!(
                lib.path.starts_with(&format!("/{}/", layout.lib_dir())),
                "{lib:?}"
            );
            assert_eq!(
                soname(&file).as_deref(),
                Some(lib.soname.as_str()),
                "{lib:?}"
            );
            for (link, target) in &lib.links {
                let host = root.host_path(link);
                assert_eq!(std::fs::read_link(&host).unwrap(), Path::new(target));
                assert_eq!(
                    std::fs::canonicalize(&host).unwrap(),
                    std::fs::canonicalize(&file).unwrap(),
                    "{link} resolves to {}",
                    lib.path
                );
            }
        }
        let v = R570_VERSION;
        let dir = layout.lib_dir();
        let cuda = root.library("libcuda.so").unwrap();
        assert_eq!(cuda.path, format!("/{dir}/libcuda.so.{v}"));
        assert_eq!(cuda.soname, "libcuda.so.1");
        assert_eq!(
            cuda.links,
            [
                (format!("/{dir}/libcuda.so.1"), format!("libcuda.so.{v}")),
                (format!("/{dir}/libcuda.so"), "libcuda.so.1".into()),
            ]
        );
        let nvvm = root.library("libnvidia-nvvm.so").unwrap();
        assert_eq!(nvvm.soname, "libnvidia-nvvm.so.4");
        let nvvm70 = root.library("libnvidia-nvvm70.so").unwrap();
        assert_eq!(nvvm70.path, format!("/{dir}/libnvidia-nvvm70.so.4"));
        assert!(nvvm70.links.is_empty());
        let gpucomp = root.library("libnvidia-gpucomp.so").unwrap();
        assert_eq!(gpucomp.soname, format!("libnvidia-gpucomp.so.{v}"));
        assert!(gpucomp.links.is_empty());
        let vdpau = root.library("libvdpau_nvidia.so").unwrap();
        assert_eq!(vdpau.path, format!("/{dir}/vdpau/libvdpau_nvidia.so.{v}"));
        assert_eq!(
            vdpau.links,
            [(
                format!("/{dir}/vdpau/libvdpau_nvidia.so.1"),
                format!("libvdpau_nvidia.so.{v}")
            )]
        );
        // The toolkit adds this link in containers because the driver lacks it.
        assert!(
            !root
                .host_path(&format!("/{dir}/libnvidia-opticalflow.so"))
                .exists()
        );
    }
}

#[test]
fn nvml_is_the_fake_with_the_real_soname() {
    let profile = "name: x\n";
    let (_dir, root) = build(
        Layout::Debian,
        &Options {
            nvml_profile: Some(profile.into()),
            ..Options::default()
        },
    );
    let nvml = root.library("libnvidia-ml.so").unwrap();
    let file = root.host_path(&nvml.path);
    assert_eq!(soname(&file).as_deref(), Some("libnvidia-ml.so.1"));
    assert_eq!(
        std::fs::metadata(&file).unwrap().len(),
        std::fs::metadata(crate::cdylib_path()).unwrap().len()
    );
    assert_eq!(
        std::fs::read_to_string(root.lib_dir().join(crate::ffi::PROFILE_FILE_NAME)).unwrap(),
        profile
    );
}

type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
type CuGetInt = unsafe extern "C" fn(*mut c_int) -> c_int;

/// What a CUDA program in a container does first: dlopen `libcuda.so.1` and
/// initialise the driver API.
#[test]
fn libcuda_answers_init_version_and_count() {
    let (_dir, root) = build(
        Layout::Rhel,
        &Options {
            gpu_minors: vec![0, 1, 2],
            ..Options::default()
        },
    );
    let path = CString::new(
        root.lib_dir()
            .join("libcuda.so.1")
            .as_os_str()
            .as_bytes()
            .to_vec(),
    )
    .unwrap();
    // SAFETY: a NUL-terminated path; the stub has no constructors.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen libcuda.so.1");
    let sym = |name: &str| {
        let c = CString::new(name).unwrap();
        // SAFETY: `handle` is a live handle and `c` a NUL-terminated name.
        let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
        assert!(!p.is_null(), "{name} is exported");
        p
    };
    // SAFETY: the stub defines these with exactly the CUDA signatures.
    let (init, version, count): (CuInit, CuGetInt, CuGetInt) = unsafe {
        (
            std::mem::transmute::<*mut libc::c_void, CuInit>(sym("cuInit")),
            std::mem::transmute::<*mut libc::c_void, CuGetInt>(sym("cuDriverGetVersion")),
            std::mem::transmute::<*mut libc::c_void, CuGetInt>(sym("cuDeviceGetCount")),
        )
    };
    let mut n: c_int = -1;
    // SAFETY: valid pointers to live ints, or NULL where the test says so.
    unsafe {
        assert_eq!(count(&mut n), 3, "CUDA_ERROR_NOT_INITIALIZED before cuInit");
        assert_eq!(version(&mut n), 0);
        assert_eq!(n, R570_CUDA_VERSION);
        assert_eq!(version(std::ptr::null_mut()), 1, "CUDA_ERROR_INVALID_VALUE");
        assert_eq!(init(1), 1, "flags must be 0");
        assert_eq!(init(0), 0);
        assert_eq!(count(&mut n), 0);
        assert_eq!(n, 3);
        libc::dlclose(handle);
    }
}

#[test]
fn binaries_run_and_print() {
    let (_dir, root) = build(Layout::Debian, &Options::default());
    // With the graphics stack's nvidia-xconfig.
    assert_eq!(
        root.binaries.len(),
        BINARIES.len() + IMEX_BINARIES.len() + 1
    );
    for bin in &root.binaries {
        let path = root.host_path(bin);
        assert_ne!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o111,
            0,
            "{bin} is executable"
        );
        let out = Command::new(&path).output().unwrap();
        assert!(out.status.success(), "{bin}: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains(R570_VERSION), "{bin}: {text}");
    }
    let smi = Command::new(root.host_path("/usr/bin/nvidia-smi"))
        .output()
        .unwrap();
    let text = String::from_utf8(smi.stdout).unwrap();
    assert!(text.starts_with("NVIDIA-SMI 570.172.08"), "{text}");
    assert!(text.contains("CUDA Version: 12.8"), "{text}");

    let (_dir2, no_imex) = build(
        Layout::Debian,
        &Options {
            imex_binaries: false,
            ..Options::default()
        },
    );
    assert!(!no_imex.host_path("/usr/bin/nvidia-imex").exists());
}

#[test]
fn merged_usr_firmware_and_sockets() {
    let (_dir, root) = build(
        Layout::Rhel,
        &Options {
            fabricmanager_socket: true,
            ..Options::default()
        },
    );
    for (link, target) in [
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("bin", "usr/bin"),
    ] {
        assert_eq!(
            std::fs::read_link(root.root.join(link)).unwrap(),
            Path::new(target)
        );
    }
    assert_eq!(
        root.firmware,
        [
            "/lib/firmware/nvidia/570.172.08/gsp_ga10x.bin",
            "/lib/firmware/nvidia/570.172.08/gsp_tu10x.bin"
        ]
    );
    for fw in &root.firmware {
        assert!(root.host_path(fw).is_file(), "{fw}");
        // Through the merged /usr link.
        assert!(root.host_path(&format!("/usr{fw}")).is_file(), "{fw}");
    }
    assert_eq!(
        root.sockets,
        [
            "/run/nvidia-persistenced/socket",
            "/run/nvidia-fabricmanager/socket"
        ]
    );
    for s in &root.sockets {
        let meta = std::fs::metadata(root.host_path(s)).unwrap();
        assert!(meta.file_type().is_socket(), "{s}");
        // Also where the daemon documents it, through var/run -> ../run.
        assert!(root.host_path(&format!("/var{s}")).exists(), "{s}");
    }

    let (_dir2, split) = build(
        Layout::Debian,
        &Options {
            merged_usr: false,
            ..Options::default()
        },
    );
    assert!(split.root.join("lib").is_dir());
    assert!(!split.root.join("lib").is_symlink());
    assert!(split.host_path(&split.firmware[0]).is_file());
    assert!(
        !split
            .host_path(&format!("/usr{}", split.firmware[0]))
            .exists()
    );
}

#[test]
fn socket_on_a_path_too_long_to_bind() {
    let dir = tempfile::tempdir().unwrap();
    let deep = dir.path().join("d".repeat(100));
    let root = DriverRoot::build(&deep, Layout::Debian, R570_VERSION, &Options::default()).unwrap();
    let socket = root.host_path(PERSISTENCED_SOCKET);
    assert!(socket.as_os_str().len() >= 108);
    assert!(std::fs::metadata(&socket).unwrap().file_type().is_socket());
}

#[test]
fn device_nodes_when_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        gpu_minors: vec![0, 3],
        dev_root: Some(dir.path().join("dev-root")),
        ..Options::default()
    };
    let root = DriverRoot::build(
        &dir.path().join("root"),
        Layout::Debian,
        R570_VERSION,
        &options,
    )
    .unwrap();
    assert_eq!(root.dev_root, dir.path().join("dev-root"));
    let nodes = match &root.device_nodes {
        DeviceNodes::Created(nodes) => nodes,
        DeviceNodes::Skipped { reason } => {
            eprintln!("skipping the device node checks: {reason}");
            return;
        }
        DeviceNodes::NotRequested => panic!("device nodes were requested"),
    };
    let got: Vec<(&str, u32, u32)> = nodes
        .iter()
        .map(|n| (n.path.as_str(), n.major, n.minor))
        .collect();
    assert_eq!(
        got,
        [
            ("/dev/nvidiactl", 195, 255),
            ("/dev/nvidia0", 195, 0),
            ("/dev/nvidia3", 195, 3),
            ("/dev/nvidia-modeset", 195, 254),
            ("/dev/nvidia-uvm", DEFAULT_UVM_MAJOR, 0),
            ("/dev/nvidia-uvm-tools", DEFAULT_UVM_MAJOR, 1),
        ]
    );
    for n in nodes {
        let meta = std::fs::metadata(root.dev_root.join(n.path.trim_start_matches('/'))).unwrap();
        assert!(meta.file_type().is_char_device(), "{}", n.path);
        assert_eq!(libc::major(meta.rdev()), n.major);
        assert_eq!(libc::minor(meta.rdev()), n.minor);
        assert_eq!(meta.mode() & 0o7777, 0o666, "{}", n.path);
    }
    assert!(!root.root.join("dev").exists(), "nodes go to the dev root");
}

#[test]
fn uvm_major_matches_the_simulated_node() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = std::fs::read_to_string(crate::profiles_dir().join("l40s-pcie.yaml")).unwrap();
    let node = crate::sim::materialize(dir.path(), &yaml, &crate::cdylib_path()).unwrap();
    let text = std::fs::read_to_string(&node.proc_devices).unwrap();
    assert!(
        text.contains(&format!("\n{DEFAULT_UVM_MAJOR} nvidia-uvm\n")),
        "{text}"
    );
}

#[test]
fn rebuilding_in_place_replaces_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("root");
    DriverRoot::build(&path, Layout::Debian, R570_VERSION, &Options::default()).unwrap();
    let again = DriverRoot::build(&path, Layout::Debian, R570_VERSION, &Options::default());
    assert!(again.is_ok(), "{again:?}");
}

#[test]
fn graphics_files_where_their_loaders_look() {
    for (layout, xorg) in [
        (Layout::Debian, "/usr/lib/xorg/modules"),
        (Layout::Rhel, "/usr/lib64/xorg/modules"),
    ] {
        let (_dir, root) = build(layout, &Options::default());
        for f in &root.graphics_files {
            assert!(root.host_path(f).exists(), "{f}");
        }
        let icd =
            std::fs::read_to_string(root.host_path("/etc/OpenCL/vendors/nvidia.icd")).unwrap();
        assert_eq!(icd, "libnvidia-opencl.so.1\n");
        let egl = root.host_path("/usr/share/glvnd/egl_vendor.d/10_nvidia.json");
        assert!(
            std::fs::read_to_string(egl)
                .unwrap()
                .contains("libEGL_nvidia.so.0")
        );
        let glx = root.host_path(&format!(
            "{xorg}/extensions/libglxserver_nvidia.so.{R570_VERSION}"
        ));
        assert_eq!(
            soname(&glx).as_deref(),
            Some(format!("libglxserver_nvidia.so.{R570_VERSION}").as_str())
        );
        assert!(
            root.host_path(&format!("{xorg}/drivers/nvidia_drv.so"))
                .is_file()
        );
        let gbm = root.lib_dir().join("gbm/nvidia-drm_gbm.so");
        assert_eq!(
            std::fs::canonicalize(&gbm).unwrap(),
            std::fs::canonicalize(
                root.host_path(&root.library("libnvidia-allocator.so").unwrap().path)
            )
            .unwrap()
        );
        let wayland = root.library("libnvidia-egl-wayland.so").unwrap();
        assert_eq!(wayland.soname, "libnvidia-egl-wayland.so.1");
        assert!(root.host_path("/usr/bin/nvidia-xconfig").is_file());
    }
    let (_dir, bare) = build(
        Layout::Debian,
        &Options {
            graphics: false,
            ..Options::default()
        },
    );
    assert!(bare.graphics_files.is_empty());
    assert!(!bare.host_path("/usr/share/glvnd").exists());
    assert!(bare.library("libnvidia-egl-gbm.so").is_none());
}
