//! What the release image and `make release` rely on in the two binaries themselves:
//! `--version` names the crate version and the commit (deploy/image/build.sh compares
//! it with the image labels; deploy/image/release.sh checks kubectl-topodra's before
//! packing it for krew). As integration tests, these also make `cargo test` build both
//! binaries, which the e2e tests and the demo run from target/debug.

use std::process::Command;

fn revision_of(bin: &str, name: &str) -> String {
    let out = match Command::new(bin).arg("--version").output() {
        Ok(out) => out,
        Err(e) => panic!("{name} --version: {e}"),
    };
    assert!(out.status.success(), "{name} --version failed");
    let line = String::from_utf8_lossy(&out.stdout).trim_end().to_owned();
    line.strip_prefix(&format!("{name} {} (", env!("CARGO_PKG_VERSION")))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{name} --version printed {line:?}"))
        .to_owned()
}

fn check(bin: &str, name: &str) {
    let revision = revision_of(bin, name);
    let commit = revision.strip_suffix("-dirty").unwrap_or(&revision);
    assert!(
        revision == "unknown"
            || (commit.len() == 40 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{name}: revision {revision:?} is neither a commit nor \"unknown\""
    );
    // The test is built in the same cargo run as the binary, with the same environment.
    match option_env!("TOPODRA_REVISION") {
        Some(r) if !r.is_empty() => assert_eq!(revision, r),
        _ => assert_eq!(revision, "unknown"),
    }
}

#[test]
fn controller_version_names_crate_version_and_commit() {
    check(
        env!("CARGO_BIN_EXE_topodra-controller"),
        "topodra-controller",
    );
}

#[test]
fn kubectl_plugin_version_names_crate_version_and_commit() {
    check(env!("CARGO_BIN_EXE_kubectl-topodra"), "kubectl-topodra");
}
