use std::os::unix::fs::symlink;

use super::*;

/// A driver root laid out like a Debian-style install with merged `/usr`.
pub(crate) fn fake_driver_root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    let lib = r.join("usr/lib/x86_64-linux-gnu");
    fs::create_dir_all(&lib).unwrap();
    fs::create_dir_all(r.join("usr/bin")).unwrap();
    for f in [
        "libcuda.so.550.90.07",
        "libnvidia-ml.so.550.90.07",
        "libnvidia-ptxjitcompiler.so.550.90.07",
        "libcudadebugger.so.550.90.07",
        "libnvidia-unrelated.so.1",
        "libc.so.6",
    ] {
        fs::write(lib.join(f), "").unwrap();
    }
    symlink("libcuda.so.550.90.07", lib.join("libcuda.so.1")).unwrap();
    symlink("libcuda.so.1", lib.join("libcuda.so")).unwrap();
    // An absolute link, as some installers write: must resolve inside the root.
    symlink(
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.90.07",
        lib.join("libnvidia-ml.so.1"),
    )
    .unwrap();
    // A dangling link is not a driver file.
    symlink("libnvidia-nvvm.so.4.0.0", lib.join("libnvidia-nvvm.so.4")).unwrap();
    fs::write(r.join("usr/bin/nvidia-smi"), "").unwrap();
    fs::write(r.join("usr/bin/nvidia-persistenced"), "").unwrap();
    symlink("usr/lib", r.join("lib")).unwrap();
    dir
}

fn paths(files: &NvidiaFiles) -> Vec<(&str, &str)> {
    files
        .edits
        .mounts
        .iter()
        .map(|m| (m.host_path.as_str(), m.container_path.as_str()))
        .collect()
}

#[test]
fn discovers_libraries_and_binaries_under_a_root() {
    let dir = fake_driver_root();
    let root = NvidiaRoot {
        host: PathBuf::from("/run/nvidia/driver"),
        local: dir.path().to_owned(),
    };
    let files = NvidiaFiles::discover(&root).unwrap();
    let lib = "/usr/lib/x86_64-linux-gnu";
    let host = "/run/nvidia/driver/usr/lib/x86_64-linux-gnu";
    let want: Vec<(String, String)> = [
        ("libcuda.so.550.90.07", "libcuda.so.1"),
        ("libcuda.so.550.90.07", "libcuda.so.550.90.07"),
        (
            "libcudadebugger.so.550.90.07",
            "libcudadebugger.so.550.90.07",
        ),
        ("libnvidia-ml.so.550.90.07", "libnvidia-ml.so.1"),
        ("libnvidia-ml.so.550.90.07", "libnvidia-ml.so.550.90.07"),
        (
            "libnvidia-ptxjitcompiler.so.550.90.07",
            "libnvidia-ptxjitcompiler.so.550.90.07",
        ),
    ]
    .iter()
    .map(|(h, c)| (format!("{host}/{h}"), format!("{lib}/{c}")))
    .chain([
        (
            "/run/nvidia/driver/usr/bin/nvidia-smi".into(),
            "/usr/bin/nvidia-smi".into(),
        ),
        (
            "/run/nvidia/driver/usr/bin/nvidia-persistenced".into(),
            "/usr/bin/nvidia-persistenced".into(),
        ),
    ])
    .collect();
    let got: Vec<(String, String)> = paths(&files)
        .into_iter()
        .map(|(h, c)| (h.to_owned(), c.to_owned()))
        .collect();
    assert_eq!(got, want);
    for m in &files.edits.mounts {
        assert_eq!(m.kind.as_deref(), Some("bind"));
        assert_eq!(m.options, ["ro", "nosuid", "nodev", "rbind"]);
    }
    assert_eq!(
        files.source,
        NvidiaFilesSource::Discovered {
            root: "/run/nvidia/driver".into()
        }
    );
}

#[test]
fn host_root_slash_gives_plain_host_paths() {
    let dir = fake_driver_root();
    let root = NvidiaRoot {
        host: PathBuf::from("/"),
        local: dir.path().to_owned(),
    };
    let files = NvidiaFiles::discover(&root).unwrap();
    assert!(
        paths(&files).contains(&("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi")),
        "{:?}",
        paths(&files)
    );
}

#[test]
fn a_root_without_cuda_is_an_error_naming_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("usr/lib64");
    fs::create_dir_all(&lib).unwrap();
    fs::write(lib.join("libnvidia-ml.so.1"), "").unwrap();
    let err = NvidiaFiles::discover(&NvidiaRoot::new(dir.path())).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("libcuda.so.*"), "{msg}");
    assert!(!msg.contains("libnvidia-ml"), "{msg}");
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

#[test]
fn versioned_names() {
    assert!(is_versioned("libcuda.so.1", "libcuda.so"));
    assert!(!is_versioned("libcuda.so", "libcuda.so"));
    assert!(!is_versioned("libcuda.so.", "libcuda.so"));
    assert!(!is_versioned("libcudadebugger.so.1", "libcuda.so"));
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

#[test]
fn adopts_toolkit_mounts_hooks_and_env_but_not_its_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("nvidia.yaml");
    fs::write(&yaml, TOOLKIT_YAML).unwrap();
    let files = NvidiaFiles::from_toolkit_spec(&yaml).unwrap();
    assert_eq!(files.edits.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
    assert_eq!(files.edits.hooks.len(), 1);
    assert_eq!(files.edits.hooks[0].args[1], "update-ldcache");
    assert_eq!(files.edits.mounts.len(), 1);
    assert!(files.edits.device_nodes.is_empty());

    // The same spec as JSON, under a name without a telling extension.
    let value: serde_json::Value = serde_saphyr::from_str(TOOLKIT_YAML).unwrap();
    let json = dir.path().join("nvidia.spec");
    fs::write(&json, serde_json::to_string(&value).unwrap()).unwrap();
    let from_json = NvidiaFiles::from_toolkit_spec(&json).unwrap();
    assert_eq!(from_json.edits, files.edits);
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
