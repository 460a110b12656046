use std::os::unix::fs::PermissionsExt as _;

use std::time::Instant;

use super::*;

/// A stand-in `nvidia-smi` in `root/usr/bin` running `body` (a shell script).
fn stand_in(root: &Path, body: &str) -> PathBuf {
    let bin = root.join("usr/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let path = bin.join("nvidia-smi");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn set_runs_the_command_line_nvidias_tools_use() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls");
    stand_in(
        dir.path(),
        &format!(
            "echo \"$* LD_LIBRARY_PATH=$LD_LIBRARY_PATH\" >> {}",
            log.display()
        ),
    );
    let lib = dir.path().join("lib/x86_64-linux-gnu/libnvidia-ml.so.1");
    let slicer = TimeSlicer::find(dir.path(), Some(&lib)).unwrap();
    slicer.set("GPU-1234", 3).unwrap();
    slicer.set("GPU-1234", 0).unwrap();
    let calls = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = calls.lines().collect();
    assert_eq!(lines.len(), 2, "{calls}");
    let want_lib = lib.parent().unwrap().display().to_string();
    assert!(
        lines[0].starts_with(&format!(
            "compute-policy -i GPU-1234 --set-timeslice 3 LD_LIBRARY_PATH={want_lib}"
        )),
        "{calls}"
    );
    assert!(lines[1].starts_with("compute-policy -i GPU-1234 --set-timeslice 0 "));
}

#[test]
fn a_failure_names_the_command_and_what_it_printed() {
    let dir = tempfile::tempdir().unwrap();
    stand_in(
        dir.path(),
        "echo 'Unable to set timeslice: Insufficient Permissions' >&2; exit 4",
    );
    let err = TimeSlicer::find(dir.path(), None)
        .unwrap()
        .set("GPU-1", 1)
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("nvidia-smi compute-policy -i GPU-1 --set-timeslice 1"),
        "{msg}"
    );
    assert!(msg.contains("Insufficient Permissions"), "{msg}");
    assert!(msg.contains("exit status: 4"), "{msg}");
}

#[test]
fn a_hung_nvidia_smi_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    stand_in(dir.path(), "exec sleep 30");
    let started = Instant::now();
    let err = TimeSlicer::find(dir.path(), None)
        .unwrap()
        .with_timeout(Duration::from_millis(200))
        .set("GPU-1", 2)
        .unwrap_err();
    assert!(matches!(err, SharingError::TimedOut { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn a_root_without_nvidia_smi_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let err = TimeSlicer::find(dir.path(), None).unwrap_err();
    assert!(matches!(err, SharingError::NoNvidiaSmi { .. }), "{err}");
    // A root without merged /usr keeps it in /bin.
    std::fs::create_dir_all(dir.path().join("bin")).unwrap();
    std::fs::write(dir.path().join("bin/nvidia-smi"), "").unwrap();
    assert!(TimeSlicer::find(dir.path(), None).is_ok());
}
