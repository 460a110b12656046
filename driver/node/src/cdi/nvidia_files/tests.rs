use std::os::unix::fs::symlink;
use std::process::Command;

use super::*;
use crate::cdi::DriverCapability;
use crate::cdi::hooks::hook_name;
use discover::is_driver_version;

const VERSION: &str = "550.90.07";
const LIB: &str = "/usr/lib/x86_64-linux-gnu";
const HOOK: &str = "/var/lib/kubelet/plugins/gpu.topodra.dev/nvidia-cdi-hook";

/// A shared library with `soname`, built with `cc` (present wherever Rust builds,
/// since rustc links through it); an empty file where it cannot build one, which
/// discovery still mounts but reads no soname from.
fn stub_library(path: &Path, soname: Option<&str>) {
    let src = path.with_extension("stub.c");
    fs::write(&src, "int stub(void) { return 0; }\n").unwrap();
    let mut cc = Command::new("cc");
    cc.args(["-shared", "-fPIC", "-o"]).arg(path).arg(&src);
    if let Some(s) = soname {
        cc.arg(format!("-Wl,-soname,{s}"));
    }
    if !cc.status().is_ok_and(|s| s.success()) {
        fs::write(path, "").unwrap();
    }
    fs::remove_file(&src).unwrap();
}

/// Whether `cc` built real libraries here (the soname assertions need them).
fn has_elf(root: &Path) -> bool {
    fs::metadata(root.join("usr/lib/x86_64-linux-gnu/libcuda.so.550.90.07"))
        .is_ok_and(|m| m.len() > 0)
}

/// A driver root laid out like a Debian-style install with merged `/usr`, as the
/// NVIDIA installer lays out an R550 driver: versioned files, soname links, `.so`
/// links for the libraries it ships them for.
pub(crate) fn fake_driver_root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    let lib = r.join("usr/lib/x86_64-linux-gnu");
    fs::create_dir_all(lib.join("vdpau")).unwrap();
    fs::create_dir_all(r.join("usr/bin")).unwrap();
    for (name, soname) in [
        ("libcuda", "libcuda.so.1"),
        ("libnvidia-ml", "libnvidia-ml.so.1"),
        ("libnvidia-ptxjitcompiler", "libnvidia-ptxjitcompiler.so.1"),
        ("libcudadebugger", "libcudadebugger.so.1"),
        ("libnvidia-encode", "libnvidia-encode.so.1"),
        ("libGLX_nvidia", "libGLX_nvidia.so.0"),
        ("libnvidia-glcore", "libnvidia-glcore.so.550.90.07"),
    ] {
        stub_library(&lib.join(format!("{name}.so.{VERSION}")), Some(soname));
    }
    stub_library(
        &lib.join(format!("vdpau/libvdpau_nvidia.so.{VERSION}")),
        Some("libvdpau_nvidia.so.1"),
    );
    stub_library(
        &lib.join("libnvidia-nvvm70.so.4"),
        Some("libnvidia-nvvm70.so.4"),
    );
    // Not the driver's: another version, and the C library.
    fs::write(lib.join("libnvidia-unrelated.so.1"), "").unwrap();
    fs::write(lib.join("libc.so.6"), "").unwrap();
    symlink("libcuda.so.550.90.07", lib.join("libcuda.so.1")).unwrap();
    symlink("libcuda.so.1", lib.join("libcuda.so")).unwrap();
    // An absolute link, as some installers write: must resolve inside the root.
    symlink(
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.90.07",
        lib.join("libnvidia-ml.so.1"),
    )
    .unwrap();
    symlink("libnvidia-ml.so.1", lib.join("libnvidia-ml.so")).unwrap();
    symlink("libGLX_nvidia.so.550.90.07", lib.join("libGLX_nvidia.so.0")).unwrap();
    // No soname link for the encoder: the container gets none either.
    fs::write(r.join("usr/bin/nvidia-smi"), "").unwrap();
    fs::write(r.join("usr/bin/nvidia-persistenced"), "").unwrap();
    symlink("usr/lib", r.join("lib")).unwrap();
    let fw = r.join(format!("usr/lib/firmware/nvidia/{VERSION}"));
    fs::create_dir_all(&fw).unwrap();
    fs::write(fw.join("gsp_ga10x.bin"), "").unwrap();
    fs::write(fw.join("gsp_tu10x.bin"), "").unwrap();
    fs::write(fw.join("README"), "").unwrap();
    for config in [
        "usr/share/glvnd/egl_vendor.d/10_nvidia.json",
        "usr/share/vulkan/icd.d/nvidia_icd.json",
        "etc/OpenCL/vendors/nvidia.icd",
    ] {
        fs::create_dir_all(r.join(config).parent().unwrap()).unwrap();
        fs::write(r.join(config), "{}").unwrap();
    }
    fs::create_dir_all(r.join("tmp/nvidia-mps")).unwrap();
    fs::create_dir_all(r.join("run/nvidia-persistenced")).unwrap();
    std::os::unix::net::UnixListener::bind(r.join("run/nvidia-persistenced/socket")).unwrap();
    dir
}

fn discover(root: &NvidiaRoot) -> Result<NvidiaFiles, CdiError> {
    NvidiaFiles::discover(root, Path::new(HOOK))
}

fn paths(edits: &ContainerEdits) -> Vec<(&str, &str)> {
    edits
        .mounts
        .iter()
        .map(|m| (m.host_path.as_str(), m.container_path.as_str()))
        .collect()
}

fn hook_args<'a>(edits: &'a ContainerEdits, name: &str) -> Option<&'a [String]> {
    edits
        .hooks
        .iter()
        .find(|h| hook_name(h) == Some(name))
        .map(|h| &h.args[2..])
}

#[test]
fn discovers_the_driver_file_set_under_a_root() {
    let dir = fake_driver_root();
    let root = NvidiaRoot {
        host: PathBuf::from("/run/nvidia/driver"),
        local: dir.path().to_owned(),
    };
    let files = discover(&root).unwrap();
    assert_eq!(files.driver_version(), Some(VERSION));
    let edits = files.edits(&DriverCapabilities::all());
    let host = "/run/nvidia/driver";
    let mut want: Vec<(String, String)> = [
        "libGLX_nvidia.so.550.90.07",
        "libcuda.so.550.90.07",
        "libcudadebugger.so.550.90.07",
        "libnvidia-encode.so.550.90.07",
        "libnvidia-glcore.so.550.90.07",
        "libnvidia-ml.so.550.90.07",
        "libnvidia-nvvm70.so.4",
        "libnvidia-ptxjitcompiler.so.550.90.07",
        "vdpau/libvdpau_nvidia.so.550.90.07",
    ]
    .iter()
    .map(|f| (format!("{host}{LIB}/{f}"), format!("{LIB}/{f}")))
    .collect();
    // Firmware under /lib, which is a link to usr/lib here: the source is resolved.
    for f in ["gsp_ga10x.bin", "gsp_tu10x.bin"] {
        want.push((
            format!("{host}/usr/lib/firmware/nvidia/{VERSION}/{f}"),
            format!("/lib/firmware/nvidia/{VERSION}/{f}"),
        ));
    }
    for (h, c) in [
        // Loader configs go where the image's loaders look, wherever the host has them.
        (
            "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
            "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
        ),
        (
            "/usr/share/vulkan/icd.d/nvidia_icd.json",
            "/etc/vulkan/icd.d/nvidia_icd.json",
        ),
        (
            "/etc/OpenCL/vendors/nvidia.icd",
            "/etc/OpenCL/vendors/nvidia.icd",
        ),
        (
            "/run/nvidia-persistenced/socket",
            "/run/nvidia-persistenced/socket",
        ),
        ("/tmp/nvidia-mps", "/tmp/nvidia-mps"),
        ("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi"),
        (
            "/usr/bin/nvidia-persistenced",
            "/usr/bin/nvidia-persistenced",
        ),
    ] {
        want.push((format!("{host}{h}"), c.to_owned()));
    }
    let mut got: Vec<(String, String)> = paths(&edits)
        .into_iter()
        .map(|(h, c)| (h.to_owned(), c.to_owned()))
        .collect();
    want.sort();
    got.sort();
    assert_eq!(got, want);
    for m in &edits.mounts {
        let ipc = m.container_path.contains("nvidia-mps") || m.container_path.ends_with("socket");
        let want: &[&str] = if ipc {
            &["nosuid", "nodev", "rbind", "rprivate", "noexec"]
        } else {
            &["ro", "nosuid", "nodev", "rbind", "rprivate"]
        };
        assert_eq!(m.options, want, "{}", m.container_path);
        assert_eq!(m.kind.as_deref(), Some("bind"));
    }
    assert_eq!(
        edits.env,
        ["NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu"]
    );
}

#[test]
fn hooks_in_the_toolkit_order_with_links_where_the_host_has_them() {
    let dir = fake_driver_root();
    let files = discover(&NvidiaRoot::new(dir.path())).unwrap();
    let edits = files.edits(&DriverCapabilities::all());
    let names: Vec<_> = edits.hooks.iter().filter_map(hook_name).collect();
    assert_eq!(
        names,
        [
            "create-symlinks",
            "enable-cuda-compat",
            "update-ldcache",
            "disable-device-node-modification",
            "update-application-profile"
        ]
    );
    assert!(
        edits
            .hooks
            .iter()
            .all(|h| h.path == HOOK && h.hook_name == "createContainer")
    );
    assert_eq!(
        hook_args(&edits, "update-ldcache").unwrap(),
        [
            "--folder",
            LIB,
            "--folder",
            "/usr/lib/x86_64-linux-gnu/vdpau"
        ]
    );
    assert_eq!(
        hook_args(&edits, "enable-cuda-compat").unwrap(),
        ["--host-driver-version=550.90.07"]
    );
    let links: Vec<&str> = hook_args(&edits, "create-symlinks")
        .unwrap()
        .iter()
        .filter(|a| *a != "--link")
        .map(String::as_str)
        .collect();
    assert!(
        links.contains(&"libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so"),
        "{links:?}"
    );
    assert!(
        links.contains(
            &"libGLX_nvidia.so.550.90.07::/usr/lib/x86_64-linux-gnu/libGLX_indirect.so.0"
        ),
        "{links:?}"
    );
    if !has_elf(dir.path()) {
        eprintln!("skipping the soname links: cc could not build shared objects here");
        return;
    }
    let mut want = vec![
        "libGLX_nvidia.so.550.90.07::/usr/lib/x86_64-linux-gnu/libGLX_indirect.so.0",
        "libGLX_nvidia.so.550.90.07::/usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.0",
        "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
        "libcuda.so.550.90.07::/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "libnvidia-ml.so.1::/usr/lib/x86_64-linux-gnu/libnvidia-ml.so",
        "libnvidia-ml.so.550.90.07::/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    ];
    want.sort_unstable();
    let mut got = links.clone();
    got.sort_unstable();
    assert_eq!(got, want);
}

#[test]
fn capabilities_narrow_files_and_hooks() {
    let dir = fake_driver_root();
    let files = discover(&NvidiaRoot::new(dir.path())).unwrap();
    let utility = DriverCapabilities::new([DriverCapability::Utility]).unwrap();
    let edits = files.edits(&utility);
    let containers: Vec<&str> = edits
        .mounts
        .iter()
        .map(|m| m.container_path.as_str())
        .collect();
    assert!(
        containers.contains(&"/usr/bin/nvidia-smi"),
        "{containers:?}"
    );
    assert!(
        containers.iter().any(|c| c.contains("libnvidia-ml.so")),
        "{containers:?}"
    );
    assert!(
        !containers.iter().any(|c| c.contains("libcuda")),
        "{containers:?}"
    );
    assert!(
        !containers.iter().any(|c| c.contains("vdpau")),
        "{containers:?}"
    );
    // Firmware and sockets belong to no class.
    assert!(
        containers.iter().any(|c| c.ends_with("gsp_ga10x.bin")),
        "{containers:?}"
    );
    assert!(
        containers.contains(&"/run/nvidia-persistenced/socket"),
        "{containers:?}"
    );
    // No libcuda: no compat hook and no libcuda env; the cache covers what is left.
    assert!(hook_args(&edits, "enable-cuda-compat").is_none());
    assert!(edits.env.is_empty());
    assert_eq!(
        hook_args(&edits, "update-ldcache").unwrap(),
        ["--folder", LIB]
    );
}

#[test]
fn host_root_slash_gives_plain_host_paths() {
    let dir = fake_driver_root();
    let root = NvidiaRoot {
        host: PathBuf::from("/"),
        local: dir.path().to_owned(),
    };
    let edits = discover(&root).unwrap().edits(&DriverCapabilities::all());
    assert!(
        paths(&edits).contains(&("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi")),
        "{:?}",
        paths(&edits)
    );
}

#[test]
fn a_root_without_a_versioned_driver_is_an_error_naming_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("usr/lib64");
    fs::create_dir_all(&lib).unwrap();
    // Sonames only: no file says which driver version this is.
    fs::write(lib.join("libnvidia-ml.so.1"), "").unwrap();
    fs::write(lib.join("libcuda.so.1"), "").unwrap();
    let err = discover(&NvidiaRoot::new(dir.path())).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("libcuda.so.<version>"), "{msg}");
    assert!(msg.contains("libnvidia-ml.so.<version>"), "{msg}");
}

#[test]
fn the_version_comes_from_nvml_when_cuda_is_absent() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("usr/lib64");
    fs::create_dir_all(&lib).unwrap();
    fs::write(lib.join("libnvidia-ml.so.570.172.08"), "").unwrap();
    let files = discover(&NvidiaRoot::new(dir.path())).unwrap();
    assert_eq!(files.driver_version(), Some("570.172.08"));
}

#[test]
fn driver_versions() {
    assert!(is_driver_version("570.172.08"));
    assert!(is_driver_version("550.90"));
    assert!(!is_driver_version("1"));
    assert!(!is_driver_version("1."));
    assert!(!is_driver_version("570.x"));
    assert!(!is_driver_version(""));
}

#[test]
fn reloads_when_the_driver_is_upgraded() {
    let dir = fake_driver_root();
    let config = CdiConfig {
        driver_root: dir.path().to_owned(),
        hook_path: HOOK.into(),
        ..CdiConfig::default()
    };
    let files = DriverFiles::load(&config).unwrap();
    let first = files.current().unwrap();
    assert_eq!(first.driver_version(), Some(VERSION));
    assert!(
        Arc::ptr_eq(&first, &files.current().unwrap()),
        "unchanged: no reload"
    );

    // The upgrade: the old versioned files go, new ones come.
    let lib = dir.path().join("usr/lib/x86_64-linux-gnu");
    for f in ["libcuda", "libnvidia-ml"] {
        fs::remove_file(lib.join(format!("{f}.so.{VERSION}"))).unwrap();
        fs::write(lib.join(format!("{f}.so.570.172.08")), "").unwrap();
    }
    let now = files.current().unwrap();
    assert_eq!(now.driver_version(), Some("570.172.08"));

    // Mid-upgrade, no driver at all: an error, not the stale files; then it heals.
    for f in ["libcuda", "libnvidia-ml"] {
        fs::remove_file(lib.join(format!("{f}.so.570.172.08"))).unwrap();
    }
    assert!(files.current().is_err());
    fs::write(lib.join("libcuda.so.575.51.02"), "").unwrap();
    assert_eq!(files.current().unwrap().driver_version(), Some("575.51.02"));
}

#[test]
fn reloads_when_the_toolkit_spec_changes_appears_or_goes() {
    let drv = fake_driver_root();
    let dir = tempfile::tempdir().unwrap();
    let toolkit = dir.path().join("nvidia.yaml");
    let config = CdiConfig {
        driver_root: drv.path().to_owned(),
        toolkit_spec: Some(toolkit.clone()),
        ..CdiConfig::default()
    };
    let files = DriverFiles::load(&config).unwrap();
    assert!(matches!(
        files.current().unwrap().source,
        NvidiaFilesSource::Discovered { .. }
    ));

    fs::write(&toolkit, TOOLKIT_YAML).unwrap();
    let adopted = files.current().unwrap();
    assert!(matches!(adopted.source, NvidiaFilesSource::Toolkit { .. }));
    let mounts = |f: &NvidiaFiles| f.edits(&DriverCapabilities::all()).mounts;
    assert_eq!(mounts(&adopted).len(), 1);

    // The toolkit rewrites it after a driver upgrade (a new file, renamed in).
    let upgraded = TOOLKIT_YAML.replace("550.90.07", "570.172.08");
    let tmp = dir.path().join(".nvidia.yaml.tmp");
    fs::write(&tmp, upgraded).unwrap();
    fs::rename(&tmp, &toolkit).unwrap();
    let now = files.current().unwrap();
    assert!(mounts(&now)[0].host_path.contains("570.172.08"));

    fs::remove_file(&toolkit).unwrap();
    assert!(matches!(
        files.current().unwrap().source,
        NvidiaFilesSource::Discovered { .. }
    ));
}

#[test]
fn resolution_stays_inside_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    fs::create_dir_all(r.join("a/b")).unwrap();
    fs::write(r.join("a/b/f"), "").unwrap();
    symlink("/a/b", r.join("abs")).unwrap();
    symlink("../../../../a/b/f", r.join("a/up")).unwrap();
    symlink("loop2", r.join("loop1")).unwrap();
    symlink("loop1", r.join("loop2")).unwrap();
    let res = |p: &str| resolve_in(r, Path::new(p));
    assert_eq!(res("/abs/f").unwrap(), Some(PathBuf::from("/a/b/f")));
    assert_eq!(res("/a/up").unwrap(), Some(PathBuf::from("/a/b/f")));
    assert_eq!(res("/a/b/missing").unwrap(), None);
    assert_eq!(res("/a/b/f/below-a-file").unwrap(), None);
    assert!(res("/loop1").is_err());
}

const TOOLKIT_YAML: &str = r#"---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args:
    - nvidia-cdi-hook
    - update-ldcache
    - --folder
    - /usr/lib/x86_64-linux-gnu
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.90.07
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.90.07
    options:
    - ro
    - nosuid
    - nodev
    - bind
  futureField: ignored
"#;

/// A host install's driver root and hook.
fn on_host() -> toolkit::Allowed<'static> {
    toolkit::Allowed {
        driver_root: Path::new("/"),
        hook_path: Path::new("/usr/bin/nvidia-cdi-hook"),
    }
}

#[test]
fn adopts_toolkit_mounts_hooks_and_env_but_not_its_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("nvidia.yaml");
    fs::write(&yaml, TOOLKIT_YAML).unwrap();
    let files = NvidiaFiles::from_toolkit_spec(&yaml, &on_host()).unwrap();
    let edits = files.edits(&DriverCapabilities::all());
    assert_eq!(edits.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
    assert_eq!(edits.hooks.len(), 1);
    assert_eq!(edits.hooks[0].args[1], "update-ldcache");
    assert_eq!(edits.mounts.len(), 1);
    assert!(edits.device_nodes.is_empty());
    // A toolkit spec is adopted whole: capabilities do not narrow it.
    let compute = DriverCapabilities::new([DriverCapability::Utility]).unwrap();
    assert_eq!(files.edits(&compute), edits);

    // The same spec as JSON, under a name without a telling extension.
    let value: serde_json::Value = serde_saphyr::from_str(TOOLKIT_YAML).unwrap();
    let json = dir.path().join("nvidia.spec");
    fs::write(&json, serde_json::to_string(&value).unwrap()).unwrap();
    let from_json = NvidiaFiles::from_toolkit_spec(&json, &on_host()).unwrap();
    assert_eq!(from_json.edits(&DriverCapabilities::all()), edits);
}

#[test]
fn load_prefers_an_existing_toolkit_spec() {
    let drv = fake_driver_root();
    let dir = tempfile::tempdir().unwrap();
    let toolkit = dir.path().join("nvidia.yaml");
    let config = CdiConfig {
        driver_root: "/".into(),
        driver_root_local: Some(drv.path().to_owned()),
        toolkit_spec: Some(toolkit.clone()),
        ..CdiConfig::default()
    };
    let discovered = NvidiaFiles::load(&config).unwrap();
    assert!(matches!(
        discovered.source,
        NvidiaFilesSource::Discovered { .. }
    ));

    fs::write(&toolkit, TOOLKIT_YAML).unwrap();
    let adopted = NvidiaFiles::load(&config).unwrap();
    assert_eq!(
        adopted.source,
        NvidiaFilesSource::Toolkit {
            spec: toolkit.clone()
        }
    );

    fs::write(&toolkit, "containerEdits: [not, a, map]").unwrap();
    let err = NvidiaFiles::load(&config).unwrap_err();
    assert!(err.to_string().contains("nvidia.yaml"), "{err}");

    fs::write(&toolkit, "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n").unwrap();
    let err = NvidiaFiles::load(&config).unwrap_err();
    assert!(err.to_string().contains("no top-level"), "{err}");
}

/// Issue 42, case 4: the spec was read whole: a FIFO there blocked every prepare, a
/// link to /dev/zero grew the plugin by gigabytes, a huge file became every claim's
/// spec. Each is now refused at once, naming what it is; without the bound this
/// test would block on the FIFO or exhaust memory on the device.
#[test]
fn a_toolkit_spec_that_is_not_a_small_regular_file_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |p: &Path| {
        NvidiaFiles::from_toolkit_spec(p, &on_host())
            .unwrap_err()
            .to_string()
    };
    let fifo = dir.path().join("fifo.yaml");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    assert!(
        refused(&fifo).contains("it is a FIFO"),
        "{}",
        refused(&fifo)
    );

    let zero = dir.path().join("zero.yaml");
    symlink("/dev/zero", &zero).unwrap();
    assert!(
        refused(&zero).contains("it is a device"),
        "{}",
        refused(&zero)
    );

    let sub = dir.path().join("dir.yaml");
    fs::create_dir(&sub).unwrap();
    assert!(
        refused(&sub).contains("it is a directory"),
        "{}",
        refused(&sub)
    );

    let big = dir.path().join("big.yaml");
    fs::write(&big, TOOLKIT_YAML).unwrap();
    fs::File::options()
        .write(true)
        .open(&big)
        .unwrap()
        .set_len(toolkit::MAX_SPEC_BYTES + 1)
        .unwrap();
    assert!(
        refused(&big).contains("more than the 1048576"),
        "{}",
        refused(&big)
    );
}

#[test]
fn a_toolkit_spec_is_adopted_only_as_far_as_driver_files_go() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("nvidia.yaml");
    let hostile = TOOLKIT_YAML
        .replace(
            "  env:\n  - NVIDIA_VISIBLE_DEVICES=void\n",
            "  env:\n  - NVIDIA_VISIBLE_DEVICES=void\n  - LD_PRELOAD=/tmp/x.so\n",
        )
        .replace(
            "  mounts:\n",
            "  mounts:\n  - hostPath: /etc/shadow\n    containerPath: /etc/shadow\n    options: [ro, bind]\n",
        );
    fs::write(&yaml, hostile).unwrap();
    let files = NvidiaFiles::from_toolkit_spec(&yaml, &on_host()).unwrap();
    let edits = files.edits(&DriverCapabilities::all());
    assert_eq!(edits.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
    assert_eq!(edits.mounts.len(), 1);
    assert_eq!(files.dropped().len(), 2, "{:?}", files.dropped());
    assert!(
        files.dropped()[0].contains("/etc/shadow"),
        "{:?}",
        files.dropped()
    );
    assert!(
        files.dropped()[1].contains("LD_PRELOAD"),
        "{:?}",
        files.dropped()
    );

    // Nothing left to adopt is an error that says what was dropped.
    fs::write(
        &yaml,
        "containerEdits:\n  mounts:\n  - hostPath: /\n    containerPath: /\n    options: [rw, rbind]\n",
    )
    .unwrap();
    let e = NvidiaFiles::from_toolkit_spec(&yaml, &on_host())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("that can be adopted") && e.contains("not a place driver files are"),
        "{e}"
    );
}
