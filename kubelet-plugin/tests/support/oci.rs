//! A real OCI runtime (runc or crun) running containers from specs that `cdi-check`
//! (the CDI Go library runtimes use) built from a claim's CDI ids: the runtime, a
//! busybox bundle, and the private mount namespace the CDI library runs in.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Value, json};

use super::NodeDirs;
use super::cdi::{cdi_check, cdi_check_command, tools_required};

/// The busybox applets the containers' scripts call, linked in the rootfs as an
/// image would have them.
pub const APPLETS: &[&str] = &[
    "sh", "find", "sort", "stat", "env", "grep", "readlink", "ls", "cat",
];

/// A runtime binary and the state directory its containers are recorded in.
pub struct Runtime {
    pub bin: PathBuf,
    state: tempfile::TempDir,
}

impl Runtime {
    pub fn new(bin: PathBuf) -> Self {
        Self {
            bin,
            state: tempfile::tempdir().unwrap(),
        }
    }

    pub fn name(&self) -> String {
        self.bin.file_name().unwrap().to_string_lossy().into_owned()
    }

    /// Writes the runtime's own default `config.json` into `bundle`.
    pub fn default_spec(&self, bundle: &Path) -> Result<Value, String> {
        let out = Command::new(&self.bin)
            .arg("spec")
            .arg("--bundle")
            .arg(bundle)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.bin.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} spec: {}: {}",
                self.bin.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let path = bundle.join("config.json");
        let spec = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        std::fs::remove_file(path).unwrap();
        Ok(spec)
    }

    /// Runs the container of `bundle` in the foreground and removes it, whatever
    /// happened: `timeout` ends a hung run, and `delete --force` whatever it left.
    pub fn run(&self, bundle: &Path) -> Output {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let id = format!(
            "topodra-oci-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let out = Command::new("timeout")
            .args(["--kill-after=10", "60"])
            .arg(&self.bin)
            .arg("--root")
            .arg(self.state.path())
            .arg("run")
            .arg("--bundle")
            .arg(bundle)
            .arg(&id)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let _ = Command::new(&self.bin)
            .arg("--root")
            .arg(self.state.path())
            .args(["delete", "--force", &id])
            .output();
        out
    }
}

/// `name` as an executable on PATH or in the sbin directories, which a root shell has
/// on PATH but a test's environment may not.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Whether an ELF executable has no program interpreter: the container's rootfs holds
/// only busybox, so a dynamically linked one could not start.
pub fn is_static_elf(path: &Path) -> io::Result<bool> {
    let data = std::fs::read(path)?;
    let u16_at = |o: usize| u16::from_le_bytes([data[o], data[o + 1]]) as usize;
    // 64-bit little-endian ELF only: the runtimes here run on x86_64 and arm64.
    if data.len() < 64 || &data[..4] != b"\x7fELF" || data[4] != 2 || data[5] != 1 {
        return Ok(false);
    }
    let phoff = u64::from_le_bytes(data[0x20..0x28].try_into().unwrap()) as usize;
    let (entsize, count) = (u16_at(0x36), u16_at(0x38));
    const PT_INTERP: u32 = 3;
    Ok((0..count).all(|i| {
        let at = phoff + i * entsize;
        data.get(at..at + 4)
            .is_some_and(|t| u32::from_le_bytes(t.try_into().unwrap()) != PT_INTERP)
    }))
}

pub fn static_busybox() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("TOPODRA_BUSYBOX") {
        let path = PathBuf::from(path);
        assert!(
            is_static_elf(&path).unwrap_or(false),
            "TOPODRA_BUSYBOX={} is not a statically linked executable",
            path.display()
        );
        return Ok(path);
    }
    let found = find_program("busybox").ok_or("busybox is not installed")?;
    if is_static_elf(&found).unwrap_or(false) {
        Ok(found)
    } else {
        Err(format!(
            "{} is dynamically linked (the busybox-static package has a static one)",
            found.display()
        ))
    }
}

pub fn runtime_binaries() -> Result<Vec<PathBuf>, String> {
    if let Some(path) = std::env::var_os("TOPODRA_OCI_RUNTIME") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "TOPODRA_OCI_RUNTIME={} is not a file",
            path.display()
        );
        return Ok(vec![path]);
    }
    let found: Vec<PathBuf> = ["runc", "crun"]
        .into_iter()
        .filter_map(find_program)
        .collect();
    if found.is_empty() {
        return Err("neither runc nor crun is installed".into());
    }
    Ok(found)
}

/// A bundle directory with a rootfs of busybox and its applet links.
pub fn make_bundle(dir: &Path, busybox: &Path) -> PathBuf {
    let bin = dir.join("rootfs/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(busybox, bin.join("busybox")).unwrap();
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    dir.to_owned()
}

/// The runtime's default spec for `bundle`, running `script` with no terminal.
pub fn base_spec(runtime: &Runtime, bundle: &Path, script: &str) -> Result<Value, String> {
    let mut spec = runtime.default_spec(bundle)?;
    spec["process"]["terminal"] = json!(false);
    spec["process"]["args"] = json!(["/bin/sh", "-c", script]);
    Ok(spec)
}

/// Whether `runtime` runs a bare busybox container here; the error says why not.
pub fn probe(runtime: &Runtime, busybox: &Path) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let bundle = make_bundle(dir.path(), busybox);
    let spec = base_spec(runtime, &bundle, "echo topodra-probe")?;
    std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
    let out = runtime.run(&bundle);
    if out.status.success() && String::from_utf8_lossy(&out.stdout).contains("topodra-probe") {
        return Ok(());
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    Err(format!(
        "{} run of a bare busybox container: {}: {}{}{}",
        runtime.bin.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim(),
        if stdout.trim().is_empty() {
            ""
        } else {
            "\nstdout: "
        },
        stdout.trim()
    ))
}

pub struct Tools {
    pub cdi_check: PathBuf,
    pub busybox: PathBuf,
    pub runtime: Runtime,
}

/// The tools, or `None` after printing why the test skips.
pub fn tools() -> Option<Tools> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "SKIPPED: running a container needs root (device nodes, namespaces, cgroups); \
             run this test as root"
        );
        return None;
    }
    let cdi_check = cdi_check()?;
    let found = static_busybox().and_then(|b| Ok((b, runtime_binaries()?)));
    let (busybox, binaries) = match found {
        Ok(found) => found,
        Err(why) if tools_required() => {
            panic!("an OCI runtime and busybox are required (TOPODRA_REQUIRE_TOOLS=1): {why}")
        }
        Err(why) => {
            eprintln!(
                "SKIPPED: the OCI runtime test needs runc or crun and a static busybox: {why}\n\
                 (tests/scripts/setup.sh installs runc and busybox-static; \
                 TOPODRA_REQUIRE_TOOLS=1 turns this skip into a failure)"
            );
            return None;
        }
    };
    // The tools are there; a runtime that cannot run even a bare container is this
    // machine's limit, which installing cannot fix, so it skips even when required.
    let mut why_not = Vec::new();
    for bin in binaries {
        let runtime = Runtime::new(bin);
        match probe(&runtime, &busybox) {
            Ok(()) => {
                return Some(Tools {
                    cdi_check,
                    busybox,
                    runtime,
                });
            }
            Err(why) => why_not.push(why),
        }
    }
    eprintln!(
        "SKIPPED: no OCI runtime can run a container on this machine:\n{}",
        why_not.join("\n")
    );
    None
}

/// Runs `cmd` in a private mount namespace whose `/dev` is `dev`: the CDI library
/// stats each node's host path (the container path, as our specs name no other) for
/// its mode, and that is where the fake nodes must be, without touching the host's.
pub fn with_dev(cmd: &mut Command, dev: &Path) {
    let source = CString::new(dev.as_os_str().as_bytes()).unwrap();
    // SAFETY: between fork and exec the closure makes only system calls, on strings
    // allocated before the fork, and builds errors that do not allocate.
    unsafe {
        cmd.pre_exec(move || {
            let check = |rc: libc::c_int| {
                if rc == 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            };
            check(libc::unshare(libc::CLONE_NEWNS))?;
            // Nothing mounted from here on may propagate back to the host.
            check(libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                source.as_ptr(),
                c"/dev".as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ))
        });
    }
}

/// A character device node at `path` with exactly `mode` (the umask may not take
/// bits off), as the driver makes its nodes under `/dev`.
pub fn mknod(path: &Path, major: u64, minor: u64, mode: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let rdev = libc::makedev(major as u32, minor as u32);
    // SAFETY: c_path is a valid NUL-terminated path that outlives the call.
    let rc = unsafe { libc::mknod(c_path.as_ptr(), libc::S_IFCHR | mode, rdev) };
    assert_eq!(
        rc,
        0,
        "mknod {}: {}",
        path.display(),
        io::Error::last_os_error()
    );
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// What the kubelet and runtime do with a claim's CDI ids: `cdi-check` applies them
/// to the runtime's base `spec`, seeing the node's fake `/dev` where a runtime sees
/// the host's, and writes the bundle's `config.json`. Returns its path.
pub fn inject_into_bundle(
    cdi_check: &Path,
    node: &NodeDirs,
    bundle: &Path,
    spec: &Value,
    ids: &[String],
) -> PathBuf {
    let base = bundle.join("base.json");
    std::fs::write(&base, serde_json::to_vec_pretty(spec).unwrap()).unwrap();
    let config = bundle.join("config.json");
    let mut args = vec![
        "--oci-spec".to_owned(),
        base.display().to_string(),
        "--oci-spec-out".to_owned(),
        config.display().to_string(),
    ];
    args.extend(ids.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cmd = cdi_check_command(cdi_check, node, &args);
    with_dev(&mut cmd, &node.sim.dev_root.join("dev"));
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "cdi-check failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    config
}
