//! The hook here is a stand-in: a tiny shell script that answers `--version` the
//! way NVIDIA's does (one line), so that the copy and check logic is tested
//! without the real binary. The real one is exercised by the integration and
//! end-to-end tests (TOPODRA_NVIDIA_CDI_HOOK).

use std::os::unix::fs::symlink;

use super::*;

const SHORT: Duration = Duration::from_secs(5);

fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(&p, Permissions::from_mode(0o755)).unwrap();
    p
}

/// A stand-in for nvidia-cdi-hook (a shell script, not NVIDIA's binary).
fn stand_in(dir: &Path, version: &str) -> PathBuf {
    script(
        dir,
        "stand-in-hook",
        &format!("[ \"$1\" = --version ] && echo 'stand-in hook version {version}'"),
    )
}

fn setup(source: &Path, plugin_dir: &Path) -> HookSetup {
    HookSetup::Install {
        source: source.to_owned(),
        plugin_dir: plugin_dir.to_owned(),
    }
}

fn prep(s: &HookSetup) -> Result<Hook, HookError> {
    prepare_with_timeout(s, SHORT)
}

fn unusable_problem(e: HookError) -> (Role, String) {
    match e {
        HookError::Unusable { role, problem, .. } => (role, problem),
        other => panic!("want Unusable, got {other:?}"),
    }
}

#[test]
fn installs_a_copy_and_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let source = stand_in(tmp.path(), "1.0");
    let plugin_dir = tmp.path().join("plugins/gpu.topodra.dev");
    let hook = prep(&setup(&source, &plugin_dir)).unwrap();

    assert_eq!(hook.path, plugin_dir.join("nvidia-cdi-hook"));
    assert_eq!(hook.action, Action::Installed);
    assert_eq!(hook.version, "stand-in hook version 1.0");
    let bytes = fs::read(&source).unwrap();
    assert_eq!(fs::read(&hook.path).unwrap(), bytes);
    assert_eq!(hook.sha256, sha256_hex(&bytes));
    assert_eq!(hook.sha256.len(), 64);
    let mode = fs::metadata(&hook.path).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o755);
    // Nothing but the hook is left in the directory.
    let names: Vec<_> = fs::read_dir(&plugin_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["nvidia-cdi-hook"]);
}

#[test]
fn the_same_bytes_are_not_written_again() {
    let tmp = tempfile::tempdir().unwrap();
    let source = stand_in(tmp.path(), "1.0");
    let s = setup(&source, tmp.path());
    let first = prep(&s).unwrap();
    let inode = fs::metadata(&first.path).unwrap().ino();
    let again = prep(&s).unwrap();
    assert_eq!(again.action, Action::Unchanged);
    assert_eq!(again.sha256, first.sha256);
    assert_eq!(fs::metadata(&again.path).unwrap().ino(), inode);
}

#[test]
fn other_bytes_or_another_mode_are_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let source = stand_in(tmp.path(), "1.0");
    let s = setup(&source, &tmp.path().join("p"));
    let first = prep(&s).unwrap();

    // A new image brings another hook.
    stand_in(tmp.path(), "2.0");
    let second = prep(&s).unwrap();
    assert_eq!(second.action, Action::Replaced);
    assert_eq!(second.version, "stand-in hook version 2.0");
    assert_ne!(second.sha256, first.sha256);
    assert_eq!(fs::read(&second.path).unwrap(), fs::read(&source).unwrap());

    // Same bytes, but someone made the copy writable by all.
    fs::set_permissions(&second.path, Permissions::from_mode(0o777)).unwrap();
    let third = prep(&s).unwrap();
    assert_eq!(third.action, Action::Replaced);
    let mode = fs::metadata(&third.path).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o755);
}

#[test]
fn a_symlink_or_directory_in_the_way() {
    let tmp = tempfile::tempdir().unwrap();
    let source = stand_in(tmp.path(), "1.0");
    let dir = tmp.path().join("p");
    fs::create_dir_all(&dir).unwrap();
    // A link (to the very same bytes) is replaced by a file of our own.
    symlink(&source, dir.join(INSTALLED_NAME)).unwrap();
    let hook = prep(&setup(&source, &dir)).unwrap();
    assert_eq!(hook.action, Action::Replaced);
    assert!(fs::symlink_metadata(&hook.path).unwrap().is_file());

    // A directory cannot be renamed over: a clear error naming it.
    let dir2 = tmp.path().join("q");
    fs::create_dir_all(dir2.join(INSTALLED_NAME).join("x")).unwrap();
    let err = prep(&setup(&source, &dir2)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, HookError::Install { .. }), "{msg}");
    assert!(
        msg.contains(&dir2.join(INSTALLED_NAME).display().to_string()),
        "{msg}"
    );
    // And no temporary file is left behind.
    let left: Vec<_> = fs::read_dir(&dir2)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, [INSTALLED_NAME]);
}

#[test]
fn a_missing_source_is_a_start_up_error_with_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope/nvidia-cdi-hook");
    let plugin_dir = tmp.path().join("p");
    let err = prep(&setup(&missing, &plugin_dir)).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&missing.display().to_string()), "{msg}");
    assert!(msg.contains("does not exist"), "{msg}");
    assert!(msg.contains("--cdi-hook-source"), "{msg}");
    assert!(msg.contains("kubeletPlugin.cdiHook.hostPath"), "{msg}");
    assert_eq!(unusable_problem(err).0, Role::Source);
    // Nothing was installed.
    assert!(!plugin_dir.join(INSTALLED_NAME).exists());
}

#[test]
fn a_directory_or_a_non_executable_file_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (role, problem) =
        unusable_problem(prep(&setup(tmp.path(), &tmp.path().join("p"))).unwrap_err());
    assert_eq!(role, Role::Source);
    assert!(problem.contains("not a regular file"), "{problem}");

    let source = stand_in(tmp.path(), "1.0");
    fs::set_permissions(&source, Permissions::from_mode(0o644)).unwrap();
    let err = prep(&setup(&source, &tmp.path().join("p"))).unwrap_err();
    assert!(
        err.to_string().contains("not executable (mode 0644)"),
        "{err}"
    );
}

#[test]
fn a_hook_that_fails_or_says_nothing_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let failing = script(
        tmp.path(),
        "failing",
        "echo 'version `GLIBC_2.34'\"'\"' not found' >&2; exit 127",
    );
    let err = prep(&setup(&failing, &tmp.path().join("p"))).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("exit status 127"), "{msg}");
    assert!(msg.contains("GLIBC_2.34"), "{msg}");

    let silent = script(tmp.path(), "silent", "exit 0");
    let err = prep(&setup(&silent, &tmp.path().join("p"))).unwrap_err();
    assert!(err.to_string().contains("printed nothing"), "{err}");

    // A broken source does not replace a copy that works.
    let working = prep(&setup(&stand_in(tmp.path(), "1.0"), &tmp.path().join("w"))).unwrap();
    let before = fs::read(&working.path).unwrap();
    prep(&setup(&failing, &tmp.path().join("w"))).unwrap_err();
    assert_eq!(fs::read(&working.path).unwrap(), before);
}

#[test]
fn a_hook_still_open_for_writing_for_a_moment_is_started_once_it_is_closed() {
    // A writable descriptor on the file is what a child forked by another thread
    // holds until its exec; holding one here makes the kernel answer ETXTBSY.
    let tmp = tempfile::tempdir().unwrap();
    let source = stand_in(tmp.path(), "1.0");
    let writer = fs::OpenOptions::new().append(true).open(&source).unwrap();
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        drop(writer);
    });
    let version = run_version(&source, SHORT).unwrap();
    closer.join().unwrap();
    assert_eq!(version, "stand-in hook version 1.0");
}

#[test]
fn a_hook_that_hangs_is_killed_after_the_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let hanging = script(tmp.path(), "hanging", "exec sleep 30");
    let started = Instant::now();
    let err = prepare_with_timeout(
        &setup(&hanging, &tmp.path().join("p")),
        Duration::from_millis(300),
    )
    .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(err.to_string().contains("within 300 ms"), "{err}");
}

/// A hook that prints its version and leaves a child holding its output open: what
/// it printed counts, and the check does not wait for the child.
#[test]
fn a_hook_whose_child_keeps_the_output_open_is_read_in_bounded_time() {
    let tmp = tempfile::tempdir().unwrap();
    let forking = script(
        tmp.path(),
        "forking",
        "echo 'stand-in hook version 1.0'; echo 'a warning' >&2; sleep 8 &",
    );
    let started = Instant::now();
    let version = check(&forking, Role::Source, SHORT).unwrap();
    assert_eq!(version, "stand-in hook version 1.0");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "waited {:?} for the child",
        started.elapsed()
    );
}

/// `chattr +i` on a directory: read-only for root too, as a read-only mount is. On
/// a file system without the attribute the test that needs it is skipped.
struct Immutable(PathBuf);

impl Immutable {
    fn set(dir: &Path) -> Option<Self> {
        let ok = Command::new("chattr")
            .arg("+i")
            .arg(dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Self(dir.to_owned()))
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

#[test]
fn a_directory_that_cannot_take_the_copy_keeps_one_of_the_same_version() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    // What an earlier start installed: version 1.0, other bytes (another build).
    let older_build = prep(&setup(
        &script(
            tmp.path(),
            "older-build",
            "# another build\necho 'stand-in hook version 1.0'",
        ),
        &dir,
    ))
    .unwrap();
    let Some(_frozen) = Immutable::set(&dir) else {
        eprintln!("skipped: chattr +i does not work here");
        return;
    };
    let hook = prep(&setup(&stand_in(tmp.path(), "1.0"), &dir)).unwrap();
    assert_eq!(hook.action, Action::Kept);
    assert_eq!(hook.path, older_build.path);
    assert_eq!(hook.sha256, older_build.sha256);
    assert_eq!(hook.version, "stand-in hook version 1.0");

    // Another version is not kept: its hooks may not be the ones the specs use.
    let other = tmp.path().join("newer");
    fs::create_dir_all(&other).unwrap();
    let err = prep(&setup(&stand_in(&other, "2.0"), &dir)).unwrap_err();
    assert!(matches!(err, HookError::Install { .. }), "{err}");
    assert!(!err.stops_the_start(), "{err}");
    assert!(err.to_string().contains("Operation not permitted"), "{err}");
}

#[test]
fn only_a_hook_the_plugin_was_given_stops_the_start() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing");
    let source = prep(&setup(&missing, &tmp.path().join("p"))).unwrap_err();
    assert!(source.stops_the_start(), "{source}");
    let host = prep(&HookSetup::Host { path: missing }).unwrap_err();
    assert!(host.stops_the_start(), "{host}");
    // Something in the way of the copy is the node's condition, not the image's.
    let dir = tmp.path().join("q");
    fs::create_dir_all(dir.join(INSTALLED_NAME)).unwrap();
    let in_the_way = prep(&setup(&stand_in(tmp.path(), "1.0"), &dir)).unwrap_err();
    assert!(!in_the_way.stops_the_start(), "{in_the_way}");
    assert!(
        in_the_way.to_string().contains("Is a directory"),
        "{in_the_way}"
    );
}

/// A binary for another architecture: this machine's /bin/sh with another ELF
/// machine number, which the kernel refuses to load.
#[test]
fn a_binary_for_another_architecture_is_refused() {
    let Ok(mut elf) = fs::read("/bin/sh") else {
        return;
    };
    if elf.len() < 20 || &elf[..4] != b"\x7fELF" {
        return;
    }
    // e_machine (little-endian on both platforms we build for): x86-64 62,
    // AArch64 183; pick the one this machine is not.
    let other: u16 = if cfg!(target_arch = "aarch64") {
        62
    } else {
        183
    };
    elf[18..20].copy_from_slice(&other.to_le_bytes());
    let tmp = tempfile::tempdir().unwrap();
    let foreign = tmp.path().join("foreign-hook");
    fs::write(&foreign, &elf).unwrap();
    fs::set_permissions(&foreign, Permissions::from_mode(0o755)).unwrap();
    let err = prep(&setup(&foreign, &tmp.path().join("p"))).unwrap_err();
    let (role, problem) = unusable_problem(err);
    assert_eq!(role, Role::Source);
    // Refused by the kernel (ENOEXEC); a libc that retries such a file with
    // /bin/sh gets a failed run instead. Either way: not usable.
    assert!(
        problem.contains("another architecture") || problem.contains("failed to run"),
        "{problem}"
    );
}

#[test]
fn a_host_hook_is_named_as_it_is_and_nothing_is_installed() {
    let tmp = tempfile::tempdir().unwrap();
    let host = stand_in(tmp.path(), "1.20.2");
    let hook = prep(&HookSetup::Host { path: host.clone() }).unwrap();
    assert_eq!(hook.path, host);
    assert_eq!(hook.action, Action::HostHook);
    assert_eq!(hook.version, "stand-in hook version 1.20.2");
    assert_eq!(hook.sha256, sha256_hex(&fs::read(&host).unwrap()));

    let missing = tmp.path().join("usr/bin/nvidia-cdi-hook");
    let err = prep(&HookSetup::Host {
        path: missing.clone(),
    })
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&missing.display().to_string()), "{msg}");
    assert!(msg.contains("NVIDIA Container Toolkit"), "{msg}");
    assert!(msg.contains("--cdi-hook-host-path"), "{msg}");
    assert_eq!(unusable_problem(err).0, Role::Host);
}

#[test]
fn stale_temporary_files_are_removed_and_recent_ones_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    fs::create_dir_all(&dir).unwrap();
    let stale = dir.join(".nvidia-cdi-hook.1-1.tmp");
    let recent = dir.join(".nvidia-cdi-hook.1-2.tmp");
    let other = dir.join("checkpoint.json.tmp");
    for p in [&stale, &recent, &other] {
        fs::write(p, b"x").unwrap();
    }
    let old = SystemTime::now() - Duration::from_secs(2 * 3600);
    File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(old)
        .unwrap();
    File::options()
        .write(true)
        .open(&other)
        .unwrap()
        .set_modified(old)
        .unwrap();
    prep(&setup(&stand_in(tmp.path(), "1.0"), &dir)).unwrap();
    assert!(!stale.exists());
    assert!(recent.exists());
    assert!(other.exists());
}
