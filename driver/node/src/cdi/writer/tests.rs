use super::*;
use crate::cdi::spec::{ContainerEdits, Device, DeviceNode};

const UID: &str = "0b7c2f4e-3c1d-4a5e-9f60-1d2e3f4a5b6c";

fn spec(device: &str) -> Spec {
    Spec {
        cdi_version: "0.5.0".into(),
        kind: "k8s.gpu.topodra.dev/claim".into(),
        devices: vec![Device {
            name: format!("{UID}-{device}"),
            container_edits: ContainerEdits {
                device_nodes: vec![DeviceNode {
                    path: "/dev/nvidia0".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn file_name(uid: &str) -> String {
    format!("k8s.gpu.topodra.dev-claim_{uid}.json")
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn writes_replaces_and_removes() {
    let dir = tempfile::tempdir().unwrap();
    let w = SpecWriter::new(dir.path().join("cdi"), CdiKind::default());
    let path = w.write(UID, &spec("gpu-0")).unwrap();
    assert_eq!(
        path.file_name().unwrap().to_str().unwrap(),
        format!("k8s.gpu.topodra.dev-claim_{UID}.json")
    );
    let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644);
    let back: Spec = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(back, spec("gpu-0"));

    w.write(UID, &spec("gpu-1")).unwrap();
    let back: Spec = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(back, spec("gpu-1"));
    assert_eq!(names(w.dir()).len(), 1);

    w.remove(UID).unwrap();
    w.remove(UID).unwrap();
    assert!(names(w.dir()).is_empty());
}

#[test]
fn lists_only_our_own_files() {
    let dir = tempfile::tempdir().unwrap();
    let w = SpecWriter::new(dir.path(), CdiKind::default());
    assert!(
        SpecWriter::new(dir.path().join("absent"), CdiKind::default())
            .list_owned()
            .unwrap()
            .is_empty()
    );
    w.write(UID, &spec("gpu-0")).unwrap();
    w.write("uid-2", &spec("gpu-0")).unwrap();
    for other in [
        "nvidia.yaml",
        "nvidia.com-gpu.json",
        "k8s.gpu.nvidia.com-claim_abc.json",
        "k8s.gpu.topodra.dev-claim_.json",
        "k8s.gpu.topodra.dev-claim_abc.yaml",
        "k8s.gpu.topodra.dev-claim_a b.json",
    ] {
        fs::write(dir.path().join(other), "{}").unwrap();
    }
    assert_eq!(w.list_owned().unwrap(), [UID, "uid-2"]);

    // Another installation (another driver name) in the same directory: neither
    // lists, nor cleans up, the other's specs.
    let canary = SpecWriter::new(dir.path(), CdiKind::for_driver("canary.topodra.dev"));
    canary.write("uid-3", &spec("gpu-0")).unwrap();
    fs::write(
        dir.path()
            .join(format!(".k8s.canary.topodra.dev-claim_x{TEMP_MARKER}1-1")),
        "",
    )
    .unwrap();
    assert_eq!(canary.list_owned().unwrap(), ["uid-3"]);
    assert_eq!(w.list_owned().unwrap(), [UID, "uid-2"]);
    assert_eq!(w.remove_stale_temp_files().unwrap(), 0);
    assert_eq!(canary.remove_stale_temp_files().unwrap(), 1);
}

/// A writer that fails like a full disk after some bytes went through.
struct DiskFull<'a>(&'a File, usize);

impl Write for DiskFull<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.1 == 0 {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let n = buf.len().min(self.1);
        self.1 -= n;
        self.0.write(&buf[..n])
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn disk_full_leaves_the_old_spec_and_no_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let w = SpecWriter::new(dir.path(), CdiKind::default());
    let path = w.write(UID, &spec("gpu-0")).unwrap();
    let before = fs::read(&path).unwrap();

    let err = w
        .write_with(UID, &spec("gpu-1"), |f| Box::new(DiskFull(f, 10)))
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(dir.path().to_str().unwrap()), "{msg}");
    match &err {
        CdiError::Io { source, .. } => assert_eq!(source.raw_os_error(), Some(libc::ENOSPC)),
        other => panic!("{other}"),
    }
    assert_eq!(names(dir.path()), [file_name(UID)]);
    assert_eq!(fs::read(&path).unwrap(), before);

    // A first write that fails leaves nothing at all.
    w.write_with("uid-new", &spec("gpu-0"), |f| Box::new(DiskFull(f, 0)))
        .unwrap_err();
    assert_eq!(names(dir.path()), [file_name(UID)]);
}

#[test]
fn dev_full_write_fails_with_enospc() {
    // The real thing, where available: the kernel's always-full device.
    fn dev_full(_: &File) -> Box<dyn Write + '_> {
        Box::new(OpenOptions::new().write(true).open("/dev/full").unwrap())
    }
    if OpenOptions::new().write(true).open("/dev/full").is_err() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let w = SpecWriter::new(dir.path(), CdiKind::default());
    let err = w.write_with(UID, &spec("gpu-0"), dev_full).unwrap_err();
    match err {
        CdiError::Io { source, .. } => assert_eq!(source.raw_os_error(), Some(libc::ENOSPC)),
        other => panic!("{other}"),
    }
    assert!(names(dir.path()).is_empty());
}

#[test]
fn refuses_invalid_specs_and_uids() {
    let dir = tempfile::tempdir().unwrap();
    let w = SpecWriter::new(dir.path(), CdiKind::default());
    let mut bad = spec("gpu-0");
    bad.kind = "nope".into();
    assert!(matches!(
        w.write(UID, &bad).unwrap_err(),
        CdiError::InvalidSpec { .. }
    ));
    assert!(matches!(
        w.write("../x", &spec("gpu-0")).unwrap_err(),
        CdiError::InvalidClaimUid { .. }
    ));
    assert!(w.remove("../x").is_err());
    assert!(names(dir.path()).is_empty());
}

#[test]
fn stale_temp_files_are_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let w = SpecWriter::new(dir.path(), CdiKind::default());
    fs::write(dir.path().join(w.temp_name(UID)), "{").unwrap();
    fs::write(dir.path().join(".other-vendor.tmp-1"), "").unwrap();
    assert_eq!(w.remove_stale_temp_files().unwrap(), 1);
    assert_eq!(names(dir.path()), [".other-vendor.tmp-1"]);
}
