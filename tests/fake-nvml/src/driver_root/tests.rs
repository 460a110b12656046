use std::ffi::{CString, c_int, c_uint};
use std::io::Write as _;
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
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDeviceGetName = unsafe extern "C" fn(*mut libc::c_char, c_int, c_int) -> c_int;
type CuDeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_int;

/// Whether this host gives this process `/dev/nvidia<minor>` read-write, which is
/// what the stub counts when no test hook points it elsewhere.
fn host_node_usable(minor: u32) -> bool {
    let path = CString::new(format!("/dev/nvidia{minor}")).unwrap();
    // SAFETY: a NUL-terminated path.
    unsafe { libc::access(path.as_ptr(), libc::R_OK | libc::W_OK) == 0 }
}

/// What a CUDA program in a container does first: dlopen `libcuda.so.1` and
/// initialise the driver API; and the error codes of the device calls. In this
/// process the stub looks at the host's `/dev` (setting the test hook here would
/// race with other tests' threads), so the count is whatever of the three nodes
/// this host has; `probe_sees_the_visible_gpus` covers enumeration.
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
    for absent in ["cuModuleLoadData", "cuLaunchKernel", "cuMemAlloc_v2"] {
        let c = CString::new(absent).unwrap();
        // SAFETY: as above.
        let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
        assert!(p.is_null(), "{absent}: a fake cannot run kernels");
    }
    // SAFETY: the stub defines these with exactly the CUDA signatures.
    let (init, version, count, get, name, uuid, uuid_v2) = unsafe {
        (
            std::mem::transmute::<*mut libc::c_void, CuInit>(sym("cuInit")),
            std::mem::transmute::<*mut libc::c_void, CuGetInt>(sym("cuDriverGetVersion")),
            std::mem::transmute::<*mut libc::c_void, CuGetInt>(sym("cuDeviceGetCount")),
            std::mem::transmute::<*mut libc::c_void, CuDeviceGet>(sym("cuDeviceGet")),
            std::mem::transmute::<*mut libc::c_void, CuDeviceGetName>(sym("cuDeviceGetName")),
            std::mem::transmute::<*mut libc::c_void, CuDeviceGetUuid>(sym("cuDeviceGetUuid")),
            std::mem::transmute::<*mut libc::c_void, CuDeviceGetUuid>(sym("cuDeviceGetUuid_v2")),
        )
    };
    let visible = [0, 1, 2]
        .into_iter()
        .filter(|m| host_node_usable(*m))
        .count();
    let visible = c_int::try_from(visible).unwrap();
    let mut n: c_int = -1;
    let mut dev: c_int = -1;
    let mut buf = [0 as libc::c_char; 64];
    let mut bytes = [0u8; 16];
    // SAFETY: valid pointers to live values, or NULL where the test says so.
    unsafe {
        assert_eq!(count(&mut n), 3, "CUDA_ERROR_NOT_INITIALIZED before cuInit");
        assert_eq!(get(&mut dev, 0), 3);
        assert_eq!(name(buf.as_mut_ptr(), 64, 0), 3);
        assert_eq!(uuid(&mut bytes, 0), 3);
        assert_eq!(uuid_v2(&mut bytes, 0), 3);
        assert_eq!(version(&mut n), 0);
        assert_eq!(n, R570_CUDA_VERSION);
        assert_eq!(version(std::ptr::null_mut()), 1, "CUDA_ERROR_INVALID_VALUE");
        assert_eq!(init(1), 1, "flags must be 0");
        assert_eq!(init(0), 0);
        assert_eq!(init(0), 0, "again");
        assert_eq!(count(&mut n), 0);
        assert_eq!(n, visible, "the GPUs whose nodes this host has");
        assert_eq!(count(std::ptr::null_mut()), 1);
        assert_eq!(get(std::ptr::null_mut(), 0), 1);
        assert_eq!(get(&mut dev, visible), 101, "CUDA_ERROR_INVALID_DEVICE");
        assert_eq!(get(&mut dev, -1), 101);
        assert_eq!(name(std::ptr::null_mut(), 64, 0), 1);
        assert_eq!(name(buf.as_mut_ptr(), 0, 0), 1);
        assert_eq!(name(buf.as_mut_ptr(), 64, visible), 101);
        assert_eq!(uuid(std::ptr::null_mut(), 0), 1);
        assert_eq!(uuid(&mut bytes, visible), 101);
        assert_eq!(uuid_v2(&mut bytes, visible), 101);
        if visible > 0 {
            assert_eq!(get(&mut dev, 0), 0);
            assert_eq!(dev, 0, "the handle is the ordinal");
            assert_eq!(name(buf.as_mut_ptr(), 64, dev), 0);
            let text = std::ffi::CStr::from_ptr(buf.as_ptr()).to_str().unwrap();
            assert_eq!(text, "topodra fake GPU");
        }
        libc::dlclose(handle);
    }
}

#[test]
fn gpu_table_rows_and_placeholders() {
    let gpus = [
        CudaGpu {
            minor: 3,
            uuid: "GPU-2A7B3C4D-5e6f-4a1b-8c2d-3e4f5a6b7d03".into(),
            name: "Quote \" and \\ back".into(),
        },
        CudaGpu {
            minor: 1,
            uuid: "GPU-00000000-0000-0000-0000-0000000000ff".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
        },
    ];
    let rows = libcuda_gpu_table(&gpus).unwrap();
    assert_eq!(
        rows,
        "{1, {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, \
         0x00, 0x00, 0x00, 0xff}, \"NVIDIA H100 80GB HBM3\"}, \
         {3, {0x2a, 0x7b, 0x3c, 0x4d, 0x5e, 0x6f, 0x4a, 0x1b, 0x8c, 0x2d, 0x3e, 0x4f, \
         0x5a, 0x6b, 0x7d, 0x03}, \"Quote \\042 and \\134 back\"}, "
    );
    for bad in [
        "2a7b3c4d-5e6f-4a1b-8c2d-3e4f5a6b7d03",
        "GPU-2a7b3c4d5e6f4a1b8c2d3e4f5a6b7d03",
        "GPU-2a7b3c4d-5e6f-4a1b-8c2d-3e4f5a6b7d0g",
        "GPU-2a7b3c4d-5e6f-4a1b-8c2d-3e4f5a6b7d0",
        "MIG-2a7b3c4d-5e6f-4a1b-8c2d-3e4f5a6b7d03",
    ] {
        let err = libcuda_gpu_table(&[CudaGpu {
            minor: 0,
            uuid: bad.into(),
            name: "x".into(),
        }])
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{bad}");
    }
    assert_eq!(
        CudaGpu::placeholder(300).uuid,
        "GPU-746f706f-6472-6100-0000-00000000012c"
    );
    let options = Options {
        gpu_minors: vec![4, 1],
        cuda_gpus: vec![gpus[0].clone()],
        ..Options::default()
    };
    assert_eq!(
        libcuda_gpus(&options),
        [CudaGpu::placeholder(4), CudaGpu::placeholder(1)],
        "entries for minors the root lacks are ignored"
    );
}

/// `tests/gpu/cuda_probe.c`, the program `make gpu-check` runs in a container on
/// a real GPU, run here against the fake libcuda with some of the root's GPU nodes
/// "injected": it sees exactly those GPUs, in minor order, with the profile's
/// names and UUIDs, and reports the kernel skipped because the fake has no
/// module or launch entry points.
#[test]
fn probe_sees_the_visible_gpus() {
    let probe_src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gpu/cuda_probe.c");
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("cuda_probe");
    let cc_out = match Command::new(cc())
        .args(["-O1", "-Wall", "-o"])
        .arg(&probe)
        .arg(&probe_src)
        .arg("-ldl")
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            eprintln!(
                "SKIPPED: no C compiler ({e}) to build {}",
                probe_src.display()
            );
            return;
        }
        Err(e) => panic!("running cc: {e}"),
    };
    assert!(
        cc_out.status.success(),
        "cc {}: {}",
        probe_src.display(),
        String::from_utf8_lossy(&cc_out.stderr)
    );

    let yaml = std::fs::read_to_string(crate::profiles_dir().join("dgx-h100.yaml")).unwrap();
    let profile = crate::Profile::from_yaml_str(&yaml).unwrap();
    let root = DriverRoot::build(
        &dir.path().join("root"),
        Layout::Debian,
        R570_VERSION,
        &Options {
            gpu_minors: profile.gpus.iter().map(|g| g.minor).collect(),
            cuda_gpus: CudaGpu::from_profile(&profile),
            cuda_driver_version: profile.cuda_driver_version,
            device_nodes: false,
            graphics: false,
            ..Options::default()
        },
    )
    .unwrap();

    // The nodes a CDI spec would inject for a claim of GPUs 5 and 2 (plain files:
    // the stub only checks that it may open them), plus nvidiactl, which is no GPU.
    let dev = dir.path().join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    for name in ["nvidia5", "nvidia2", "nvidiactl"] {
        std::fs::write(dev.join(name), "").unwrap();
    }
    let run = |dev_dir: &Path| {
        let out = Command::new(&probe)
            .env_clear()
            .env("LD_LIBRARY_PATH", root.lib_dir())
            .env(CUDA_DEV_DIR_ENV, dev_dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "probe: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };

    let text = run(&dev);
    eprintln!("the probe reported:\n{text}");
    let lines: Vec<&str> = text.lines().collect();
    let gpu = |minor: u32| profile.gpus.iter().find(|g| g.minor == minor).unwrap();
    let lib = root.lib_dir().join("libcuda.so.1");
    assert_eq!(
        lines[0],
        format!(
            "cuda init=0 version={} count=2 lib={}",
            profile.cuda_driver_version,
            lib.display()
        ),
        "{text}"
    );
    for (i, minor) in [2, 5].into_iter().enumerate() {
        let g = gpu(minor);
        assert_eq!(
            lines[1 + i],
            format!(
                "device {i} uuid={} name={}",
                g.uuid,
                g.name.replace(' ', "_")
            ),
            "{text}"
        );
    }
    assert!(
        lines[3].starts_with("kernel skipped missing-symbols cuDevicePrimaryCtxRetain "),
        "{text}"
    );
    for call in [
        "cuModuleLoadData",
        "cuLaunchKernel",
        "cuMemAlloc_v2",
        "cuMemcpyDtoH_v2",
    ] {
        assert!(lines[3].contains(&format!(" {call}")), "{text}");
    }
    assert!(!lines[3].contains("cuDeviceGet "), "{text}");
    assert_eq!(lines[4..], ["probe done"], "{text}");

    // No node the process may use: no GPU, and nothing to run a kernel on.
    let empty = dir.path().join("empty-dev");
    std::fs::create_dir_all(&empty).unwrap();
    let text = run(&empty);
    assert!(text.starts_with("cuda init=0 version="), "{text}");
    assert!(text.contains(" count=0 lib="), "{text}");
    assert!(!text.contains("\ndevice "), "{text}");
    assert!(text.ends_with("probe done\n"), "{text}");
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

/// A root for the `nvidia-smi` tests: GPU minors 0 and 1, the first with a
/// UUID as a profile gives it, the second the placeholder; no graphics stack or
/// device nodes, which these tests do not look at.
fn smi_root(merged_usr: bool) -> (tempfile::TempDir, DriverRoot, [String; 2]) {
    let uuid = "GPU-5e2f8c1a-7b3d-4e9f-a1c2-3d4e5f6a7b8c";
    let (dir, root) = build(
        Layout::Debian,
        &Options {
            gpu_minors: vec![0, 1],
            cuda_gpus: vec![CudaGpu {
                minor: 0,
                uuid: uuid.into(),
                name: "NVIDIA H100 80GB HBM3".into(),
            }],
            merged_usr,
            device_nodes: false,
            graphics: false,
            ..Options::default()
        },
    );
    (dir, root, [uuid.into(), CudaGpu::placeholder(1).uuid])
}

/// Runs `exe` with `args` and nothing in its environment, as the real tool's
/// callers may.
fn run_smi(exe: &Path, args: &[&str]) -> std::process::Output {
    Command::new(exe)
        .args(args)
        .env_clear()
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", exe.display()))
}

fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap()
}

#[test]
fn nvidia_smi_prints_its_banner_for_what_it_does_not_implement() {
    let options = Options::default();
    let (_dir, root) = build(Layout::Debian, &options);
    let smi = root.host_path("/usr/bin/nvidia-smi");
    let banner = binary_message("nvidia-smi", R570_VERSION, &options);
    let uuid = CudaGpu::placeholder(0).uuid;
    for args in [
        &[][..],
        &["-L"],
        &["compute-policy"],
        &["compute-policy", "-l"],
        // No -i: the real tool would set every GPU; the stand-in does not.
        &["compute-policy", "--set-timeslice", "1"],
        &["compute-policy", "-i", &uuid],
        &["compute-policy", "-i", &uuid, "--set-timeslice"],
        &[
            "compute-policy",
            "-i",
            &uuid,
            "-i",
            &uuid,
            "--set-timeslice",
            "1",
        ],
        &["compute-policy", "-i", &uuid, "--set-timeslice", "1", "-l"],
        &["-i", &uuid, "compute-policy", "--set-timeslice", "1"],
    ] {
        let out = run_smi(&smi, args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        assert_eq!(text(&out.stdout), banner, "{args:?}");
        assert!(out.stderr.is_empty(), "{args:?}: {out:?}");
    }
    assert_eq!(root.nvidia_smi_calls().unwrap(), Vec::<String>::new());
    assert!(!nvidia_smi_calls_path(&root.root).exists());
    assert!(root.host_path("/var/log").is_dir());

    // Static and libc-free: no interpreter to find, no libraries to load.
    let data = std::fs::read(&smi).unwrap();
    let elf: ElfFile64<'_> = ElfFile64::parse(&*data).unwrap();
    for section in [".interp", ".dynamic"] {
        assert!(
            object::Object::section_by_name(&elf, section).is_none(),
            "{section}"
        );
    }
}

#[test]
fn nvidia_smi_records_a_time_slice() {
    let (dir, root, [h100, placeholder]) = smi_root(true);
    let smi = root.host_path("/usr/bin/nvidia-smi");
    // NVIDIA's DRA driver's command line, word for word.
    let out = run_smi(
        &smi,
        &["compute-policy", "-i", &h100, "--set-timeslice", "1"],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        text(&out.stdout),
        format!("Set timeslice to SHORT for GPU {h100}.\n")
    );
    assert!(out.stderr.is_empty(), "{out:?}");
    let line = format!("compute-policy -i {h100} --set-timeslice 1");
    assert_eq!(set_timeslice_call(&h100, 1), line);
    assert_eq!(
        root.nvidia_smi_calls().unwrap(),
        std::slice::from_ref(&line)
    );
    assert_eq!(
        std::fs::read_to_string(root.root.join(NVIDIA_SMI_CALLS)).unwrap(),
        format!("{line}\n"),
        "exactly one line"
    );

    // The `=` spellings, in the other order: recorded in the one spelling.
    let out = run_smi(
        &smi,
        &[
            "compute-policy",
            "--set-timeslice=3",
            &format!("--id={placeholder}"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        text(&out.stdout),
        format!("Set timeslice to LONG for GPU {placeholder}.\n")
    );
    // Through the merged /usr's bin link and a link from elsewhere: the
    // program finds its root from where the kernel says it is, not from argv[0].
    let elsewhere = dir.path().join("smi-link");
    symlink(&smi, &elsewhere).unwrap();
    for (exe, args) in [
        (
            root.host_path("/bin/nvidia-smi"),
            &["compute-policy", "--id", &h100, "--set-timeslice=0"][..],
        ),
        (
            elsewhere,
            &["compute-policy", "--set-timeslice", "2", "-i", &placeholder],
        ),
    ] {
        let out = run_smi(&exe, args);
        assert_eq!(out.status.code(), Some(0), "{}: {out:?}", exe.display());
    }
    let want = [
        line,
        set_timeslice_call(&placeholder, 3),
        set_timeslice_call(&h100, 0),
        set_timeslice_call(&placeholder, 2),
    ];
    assert_eq!(root.nvidia_smi_calls().unwrap(), want);
    assert_eq!(nvidia_smi_calls(&root.root).unwrap(), want);

    // A rebuilt root is a fresh install: no calls yet.
    let again = DriverRoot::build(
        &root.root,
        Layout::Debian,
        R570_VERSION,
        &Options::default(),
    )
    .unwrap();
    assert_eq!(again.nvidia_smi_calls().unwrap(), Vec::<String>::new());
}

#[test]
fn nvidia_smi_refuses_unknown_gpus_and_values() {
    let (_dir, root, [h100, placeholder]) = smi_root(true);
    let smi = root.host_path("/usr/bin/nvidia-smi");
    let set = |id: &str, value: &str| {
        run_smi(
            &smi,
            &["compute-policy", "-i", id, "--set-timeslice", value],
        )
    };
    // Exit 6, "A query to find an object was unsuccessful" (nvidia-smi(1)).
    for id in [
        "GPU-00000000-1111-2222-3333-444444444444",
        "0",
        "00000000:18:00.0",
        "MIG-5e2f8c1a-7b3d-4e9f-a1c2-3d4e5f6a7b8c",
        &format!("{h100},{placeholder}"),
        "",
    ] {
        let out = set(id, "1");
        assert_eq!(out.status.code(), Some(6), "{id:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{id:?}: {out:?}");
        assert!(text(&out.stderr).contains(id), "{id:?}: {out:?}");
    }
    // Exit 2, "A supplied argument or flag is invalid".
    for value in ["4", "-1", "", "01", "1.0", "SHORT", "10"] {
        let out = set(&h100, value);
        assert_eq!(out.status.code(), Some(2), "{value:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{value:?}: {out:?}");
        assert!(
            text(&out.stderr).contains("0=DEFAULT, 1=SHORT, 2=MEDIUM, 3=LONG"),
            "{value:?}: {out:?}"
        );
    }
    assert_eq!(root.nvidia_smi_calls().unwrap(), Vec::<String>::new());
    assert!(!nvidia_smi_calls_path(&root.root).exists());
}

/// Runs started together, as a plugin preparing several claims at once would
/// start them: every call is recorded, each on its own line.
#[test]
fn nvidia_smi_concurrent_calls_keep_their_lines() {
    let (_dir, root, uuids) = smi_root(false);
    let smi = root.host_path("/usr/bin/nvidia-smi");
    let runs: Vec<(String, u32)> = (0..16u32)
        .map(|i| (uuids[(i % 2) as usize].clone(), i % 4))
        .collect();
    let children: Vec<_> = runs
        .iter()
        .map(|(uuid, value)| {
            Command::new(&smi)
                .args(["compute-policy", "-i", uuid, "--set-timeslice"])
                .arg(value.to_string())
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let mut got = root.nvidia_smi_calls().unwrap();
    let mut want: Vec<String> = runs
        .iter()
        .map(|(uuid, value)| set_timeslice_call(uuid, *value))
        .collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
}

/// Without a root around it there is nowhere to record: the call fails rather
/// than report a change no test could see, and the banner still prints.
#[test]
fn nvidia_smi_outside_a_root_cannot_record() {
    let (dir, root, [h100, _]) = smi_root(true);
    let copy = dir.path().join("opt/nvidia-smi");
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    std::fs::copy(root.host_path("/usr/bin/nvidia-smi"), &copy).unwrap();
    let out = run_smi(
        &copy,
        &["compute-policy", "-i", &h100, "--set-timeslice", "1"],
    );
    assert_eq!(out.status.code(), Some(255), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert!(text(&out.stderr).contains("usr/bin/nvidia-smi"), "{out:?}");
    let out = run_smi(&copy, &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text(&out.stdout).starts_with("NVIDIA-SMI "), "{out:?}");
    assert_eq!(root.nvidia_smi_calls().unwrap(), Vec::<String>::new());
}

/// A root for the `nvidia-cuda-mps-control` tests, and the program's path in it.
fn mps_root() -> (tempfile::TempDir, DriverRoot, PathBuf) {
    let (dir, root) = build(
        Layout::Debian,
        &Options {
            device_nodes: false,
            graphics: false,
            ..Options::default()
        },
    );
    let exe = root.host_path("/usr/bin/nvidia-cuda-mps-control");
    (dir, root, exe)
}

/// State and parent of a process, from `/proc/<pid>/stat`: `None` once it is
/// gone or a zombie (a daemon's new parent may be slow to reap it, or, in a
/// container whose init does not reap, never).
fn proc_stat(pid: u32) -> Option<(char, u32, u32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid pgrp session ...: comm may hold spaces.
    let rest = &text[text.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let _pgrp = fields.next()?;
    let session = fields.next()?.parse().ok()?;
    (state != 'Z' && state != 'X').then_some((state, ppid, session))
}

fn alive(pid: u32) -> bool {
    proc_stat(pid).is_some()
}

/// Waits up to 10 s for the daemon `pid` to be gone.
fn wait_gone(pid: u32) -> bool {
    for _ in 0..1000 {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}

/// The daemons a test started through `exe`, killed when the test ends however
/// it ends, so that no process outlives `cargo test`. Each pipe directory's PID
/// file is read again at the end, for a daemon started after it was noted; a
/// PID is killed only while it is still this program, never a process that
/// took a reused PID.
struct Daemons {
    exe: PathBuf,
    pipes: Vec<PathBuf>,
    pids: Vec<u32>,
}

impl Daemons {
    fn new(exe: &Path) -> Self {
        Self {
            exe: std::fs::canonicalize(exe).unwrap(),
            pipes: Vec::new(),
            pids: Vec::new(),
        }
    }

    /// Runs `-d` with only these variables set (`None`: unset) and, when it
    /// succeeds, notes the daemon it started.
    fn start(
        &mut self,
        pipe: &Path,
        log: Option<&Path>,
        visible: Option<&str>,
    ) -> (std::process::Output, u32) {
        self.pipes.push(pipe.to_owned());
        let mut cmd = Command::new(&self.exe);
        cmd.arg("-d")
            .env_clear()
            .env(MPS_PIPE_DIRECTORY_ENV, pipe)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(log) = log {
            cmd.env(MPS_LOG_DIRECTORY_ENV, log);
        }
        if let Some(v) = visible {
            cmd.env("CUDA_VISIBLE_DEVICES", v);
        }
        let child = cmd.spawn().unwrap();
        let starter = child.id();
        let out = child.wait_with_output().unwrap();
        if out.status.success()
            && let Some(pid) = mps_daemon_pid(pipe).unwrap()
        {
            self.pids.push(pid);
        }
        (out, starter)
    }

    fn is_ours(&self, pid: u32) -> bool {
        std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| p == self.exe)
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        let late = self
            .pipes
            .iter()
            .filter_map(|p| mps_daemon_pid(p).ok().flatten());
        let pids: Vec<u32> = self.pids.iter().copied().chain(late).collect();
        for pid in pids {
            if self.is_ours(pid)
                && let Ok(pid) = libc::pid_t::try_from(pid)
            {
                // SAFETY: plain system call on a PID that is this test's daemon.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// `printf <input> | nvidia-cuda-mps-control` with `CUDA_MPS_PIPE_DIRECTORY`.
fn mps_client(exe: &Path, pipe: &Path, input: &str) -> std::process::Output {
    let mut child = Command::new(exe)
        .env_clear()
        .env(MPS_PIPE_DIRECTORY_ENV, pipe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// The plugin's sequence on one GPU: `-d` returns at once while the daemon runs
/// on in a session of its own, with its FIFO, PID file and log; a second `-d`
/// on the same pipe directory is refused; `echo quit |` stops it and removes
/// its files, and the record holds both ends.
#[test]
fn mps_control_daemon_starts_and_quits() {
    let (dir, root, exe) = mps_root();
    let mut daemons = Daemons::new(&exe);
    // Neither directory exists yet: the daemon makes them.
    let pipe = dir.path().join("mps/GPU-0/pipe");
    let log = dir.path().join("mps/GPU-0/log");
    let uuid = CudaGpu::placeholder(0).uuid;

    let (out, starter) = daemons.start(&pipe, Some(&log), Some(&uuid));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    let pid = mps_daemon_pid(&pipe).unwrap().expect("a PID file");
    let (_, ppid, session) = proc_stat(pid).expect("the daemon outlives -d");
    assert_ne!(ppid, starter, "-d's process has exited");
    assert_ne!(ppid, std::process::id());
    assert_eq!(session, pid, "setsid: a session of its own");
    assert!(daemons.is_ours(pid));
    let fifo = pipe.join(MPS_CONTROL_PIPE);
    assert!(
        std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo()
    );
    assert_eq!(
        std::fs::read_to_string(pipe.join(MPS_PID_FILE)).unwrap(),
        format!("{pid}\n")
    );
    let control_log = std::fs::read_to_string(log.join(MPS_CONTROL_LOG)).unwrap();
    assert_eq!(control_log.lines().count(), 1, "{control_log}");
    assert!(control_log.contains(&uuid), "{control_log}");
    let start = mps_start_call(&pipe, &log, &uuid);
    assert_eq!(
        start,
        format!(
            "start pipe={} log={} visible={uuid}",
            pipe.display(),
            log.display()
        )
    );
    assert_eq!(
        root.mps_control_calls().unwrap(),
        std::slice::from_ref(&start)
    );

    // One daemon per pipe directory, whatever the other variables say.
    let other_log = dir.path().join("other-log");
    let (again, _) = daemons.start(&pipe, Some(&other_log), Some("GPU-other"));
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    assert!(
        text(&again.stderr).contains("An instance of this daemon is already running"),
        "{again:?}"
    );
    assert_eq!(mps_daemon_pid(&pipe).unwrap(), Some(pid));
    assert!(alive(pid));
    assert_eq!(
        root.mps_control_calls().unwrap(),
        std::slice::from_ref(&start)
    );

    // A command the stand-in does not implement is logged and ignored.
    let out = mps_client(&exe, &pipe, "get_server_list\n");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = mps_client(&exe, &pipe, "quit\n");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    // The client returns once the daemon removed its FIFO, its last act.
    assert!(!fifo.exists());
    assert!(!pipe.join(MPS_PID_FILE).exists());
    assert_eq!(mps_daemon_pid(&pipe).unwrap(), None);
    assert!(wait_gone(pid), "the daemon exits after quit");
    let quit = mps_quit_call(&pipe);
    assert_eq!(quit, format!("quit pipe={}", pipe.display()));
    assert_eq!(root.mps_control_calls().unwrap(), [start, quit]);
    assert_eq!(mps_control_calls(&root.root).unwrap().len(), 2);
    let control_log = std::fs::read_to_string(log.join(MPS_CONTROL_LOG)).unwrap();
    assert_eq!(control_log.lines().count(), 3, "{control_log}");
    assert!(control_log.contains("get_server_list"), "{control_log}");

    // A rebuilt root is a fresh install: no calls yet.
    let again = DriverRoot::build(
        &root.root,
        Layout::Debian,
        R570_VERSION,
        &Options {
            device_nodes: false,
            graphics: false,
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(again.mps_control_calls().unwrap(), Vec::<String>::new());
}

/// The client with no daemon to talk to fails as the real one does, whether
/// the pipe is missing or left behind by a daemon that died; with nothing to
/// send, and with arguments it does not implement, it prints the banner.
#[test]
fn mps_control_client_without_a_daemon_fails() {
    let (dir, root, exe) = mps_root();
    let pipe = dir.path().join("pipe");
    for input in ["quit\n", "get_server_list"] {
        let out = mps_client(&exe, &pipe, input);
        assert_eq!(out.status.code(), Some(1), "{input:?}: {out:?}");
        assert!(
            text(&out.stderr).contains("Cannot find MPS control daemon process"),
            "{out:?}"
        );
        assert!(out.stdout.is_empty(), "{out:?}");
    }
    // A FIFO nobody reads: the non-blocking open answers ENXIO.
    std::fs::create_dir_all(&pipe).unwrap();
    mknod(&pipe.join(MPS_CONTROL_PIPE), libc::S_IFIFO | 0o600, 0).unwrap();
    let out = mps_client(&exe, &pipe, "quit\n");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        text(&out.stderr).contains("Cannot find MPS control daemon process"),
        "{out:?}"
    );

    let banner = binary_message("nvidia-cuda-mps-control", R570_VERSION, &Options::default());
    for input in ["", "\n  \n"] {
        let out = mps_client(&exe, &pipe, input);
        assert_eq!(out.status.code(), Some(0), "{input:?}: {out:?}");
        assert_eq!(text(&out.stdout), banner, "{input:?}");
    }
    for args in [&["-h"][..], &["-d", "-f"], &["-f"], &["quit"]] {
        let out = Command::new(&exe)
            .args(args)
            .env_clear()
            .env(MPS_PIPE_DIRECTORY_ENV, dir.path().join("unused"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        assert_eq!(text(&out.stdout), banner, "{args:?}");
    }
    assert!(!dir.path().join("unused").exists(), "nothing was started");

    // Outside a driver root there is nowhere to record: -d starts nothing.
    let copy = dir.path().join("opt/nvidia-cuda-mps-control");
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    std::fs::copy(&exe, &copy).unwrap();
    let mut daemons = Daemons::new(&copy);
    let elsewhere = dir.path().join("elsewhere");
    let (out, _) = daemons.start(&elsewhere, Some(&dir.path().join("log")), None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        text(&out.stderr).contains("usr/bin/nvidia-cuda-mps-control"),
        "{out:?}"
    );
    assert!(!elsewhere.join(MPS_CONTROL_PIPE).exists());
    assert_eq!(mps_daemon_pid(&elsewhere).unwrap(), None);
    assert_eq!(root.mps_control_calls().unwrap(), Vec::<String>::new());
}

/// One daemon per GPU: daemons on two pipe directories run side by side and
/// quit one at a time; `-d` run at once on one directory starts one daemon.
#[test]
fn mps_control_daemons_on_two_pipe_dirs_coexist() {
    let (dir, root, exe) = mps_root();
    let mut daemons = Daemons::new(&exe);
    let uuids = [CudaGpu::placeholder(0).uuid, CudaGpu::placeholder(1).uuid];
    let pipes = [dir.path().join("pipe-0"), dir.path().join("pipe-1")];
    let log = dir.path().join("log");
    let mut pids = Vec::new();
    for (pipe, uuid) in pipes.iter().zip(&uuids) {
        let (out, _) = daemons.start(pipe, Some(&log), Some(uuid));
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        pids.push(mps_daemon_pid(pipe).unwrap().unwrap());
    }
    assert_ne!(pids[0], pids[1]);
    assert!(pids.iter().all(|&p| alive(p)));

    let out = mps_client(&exe, &pipes[0], "quit\n");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(wait_gone(pids[0]));
    assert!(alive(pids[1]), "the other GPU's daemon runs on");
    assert!(pipes[1].join(MPS_CONTROL_PIPE).exists());
    let out = mps_client(&exe, &pipes[1], "quit\n");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(wait_gone(pids[1]));
    assert_eq!(
        root.mps_control_calls().unwrap(),
        [
            mps_start_call(&pipes[0], &log, &uuids[0]),
            mps_start_call(&pipes[1], &log, &uuids[1]),
            mps_quit_call(&pipes[0]),
            mps_quit_call(&pipes[1]),
        ]
    );
    // Both daemons logged to the one control.log, a line at a time.
    let control_log = std::fs::read_to_string(log.join(MPS_CONTROL_LOG)).unwrap();
    assert_eq!(control_log.lines().count(), 4, "{control_log}");

    // Started together on one directory: exactly one wins.
    let racy = dir.path().join("racy");
    std::fs::create_dir_all(&racy).unwrap();
    daemons.pipes.push(racy.clone());
    let children: Vec<_> = (0..6)
        .map(|_| {
            Command::new(&exe)
                .arg("-d")
                .env_clear()
                .env(MPS_PIPE_DIRECTORY_ENV, &racy)
                .env(MPS_LOG_DIRECTORY_ENV, &log)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let won = children
        .into_iter()
        .map(|mut c| c.wait().unwrap().success())
        .filter(|&ok| ok)
        .count();
    assert_eq!(won, 1);
    let pid = mps_daemon_pid(&racy).unwrap().unwrap();
    assert!(alive(pid));
    let out = mps_client(&exe, &racy, "quit\n");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(wait_gone(pid));
}

/// A daemon killed without `quit` leaves its FIFO and PID file; the next `-d`
/// takes the directory over. `CUDA_VISIBLE_DEVICES` unset or empty is recorded
/// as `visible=`; a last command needs no newline.
#[test]
fn mps_control_takes_over_after_a_killed_daemon() {
    let (dir, root, exe) = mps_root();
    let mut daemons = Daemons::new(&exe);
    let pipe = dir.path().join("pipe");
    let log = dir.path().join("log");
    let (out, _) = daemons.start(&pipe, Some(&log), None);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let first = mps_daemon_pid(&pipe).unwrap().unwrap();
    // SAFETY: plain system call on the daemon this test started.
    unsafe { libc::kill(libc::pid_t::try_from(first).unwrap(), libc::SIGKILL) };
    assert!(wait_gone(first));
    assert!(pipe.join(MPS_CONTROL_PIPE).exists(), "left behind");

    let (out, _) = daemons.start(&pipe, Some(&log), Some(""));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let second = mps_daemon_pid(&pipe).unwrap().unwrap();
    assert_ne!(second, first);
    assert!(alive(second));
    let out = mps_client(&exe, &pipe, "quit");
    assert_eq!(out.status.code(), Some(0), "{out:?}: no newline needed");
    assert!(wait_gone(second));
    let start = mps_start_call(&pipe, &log, "");
    assert_eq!(
        root.mps_control_calls().unwrap(),
        [start.clone(), start, mps_quit_call(&pipe)]
    );
    assert!(root.mps_control_calls().unwrap()[0].ends_with(" visible="));
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
