//! What the release image relies on in the binary itself: `--version` names the crate
//! version and the commit (deploy/image/build.sh compares it with the image labels),
//! and the RPATH that keeps the image's glibc ahead of the host libraries on
//! LD_LIBRARY_PATH (build.rs).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_topodra-kubelet-plugin");

#[test]
fn version_names_crate_version_and_commit() {
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text.trim_end();
    let revision = line
        .strip_prefix(concat!(
            "topodra-kubelet-plugin ",
            env!("CARGO_PKG_VERSION"),
            " ("
        ))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("--version printed {line:?}"));
    let commit = revision.strip_suffix("-dirty").unwrap_or(revision);
    assert!(
        revision == "unknown"
            || (commit.len() == 40 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "revision {revision:?} is neither a commit nor \"unknown\""
    );
    // The test is built in the same cargo run as the binary, with the same environment.
    match option_env!("TOPODRA_REVISION") {
        Some(r) if !r.is_empty() => assert_eq!(revision, r),
        _ => assert_eq!(revision, "unknown"),
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu", target_arch = "x86_64"))]
#[test]
fn rpath_points_at_the_image_library_directory() {
    let Ok(out) = Command::new("readelf").args(["-d", BIN]).output() else {
        eprintln!("readelf not found: skipped");
        return;
    };
    let dynamic = String::from_utf8_lossy(&out.stdout);
    let rpath = dynamic
        .lines()
        .find(|l| l.contains("(RPATH)") || l.contains("(RUNPATH)"))
        .unwrap_or_else(|| panic!("no RPATH in {BIN}:\n{dynamic}"));
    // RPATH, not RUNPATH: only DT_RPATH is searched before LD_LIBRARY_PATH.
    assert!(rpath.contains("(RPATH)"), "{rpath}");
    assert!(
        rpath.contains("[$ORIGIN/../lib/x86_64-linux-gnu]"),
        "{rpath}"
    );
}
