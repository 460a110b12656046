//! CUDA MPS on a shared GPU: its compute mode and its control daemon.
//!
//! One control daemon per GPU, started when the GPU's first MPS share is prepared
//! and told to quit after its last one: `nvidia-cuda-mps-control -d` from the
//! driver root, with `CUDA_VISIBLE_DEVICES` naming the GPU and the pipe and log
//! directories (`CUDA_MPS_PIPE_DIRECTORY`, `CUDA_MPS_LOG_DIRECTORY`) of its own
//! under the plugin's directory, so no two GPUs' daemons (nor the host's default
//! `/tmp/nvidia-mps`) meet. Containers get the pipe directory mounted and the
//! variable set, and reach their GPU's daemon and no other. NVIDIA's MPS
//! documentation asks for the GPU in EXCLUSIVE_PROCESS compute mode while MPS
//! runs, so only the MPS server opens contexts on it; the mode is set through NVML
//! before the daemon starts and put back after it quits.
//!
//! `-d` daemonizes (the command returns once the daemon runs), so the daemon is no
//! child of the plugin: it is started in a session of its own and keeps running
//! when the plugin process exits or is killed, and a restarted plugin finds it by
//! its pipe directory.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::ComputeMode;

use super::SharingError;
use super::host::HostNamespaces;
use super::process::{lib_dir_of, library_path, wait_within};
use topodra_model::checkpoint::ShareIntent;

/// Where a driver root keeps the MPS control program.
const CANDIDATES: &[&str] = &[
    "usr/bin/nvidia-cuda-mps-control",
    "bin/nvidia-cuda-mps-control",
];

/// The daemon starts or quits in well under a second; a hung one must not hold a
/// prepare forever.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// What `nvidia-cuda-mps-control` prints as a client when no control daemon runs
/// for its pipe directory.
const NO_DAEMON: &str = "Cannot find MPS control daemon process";

/// The file in the pipe directory where the control daemon writes its PID.
const PID_FILE: &str = "nvidia-cuda-mps-control.pid";

/// nvml.h's `NVML_COMPUTEMODE_EXCLUSIVE_PROCESS`.
pub const EXCLUSIVE_PROCESS: u32 = 3;

/// The directories of one GPU's daemon, under the plugin's MPS directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsDirs {
    /// `CUDA_MPS_PIPE_DIRECTORY`: the daemon's `control` pipe and its servers'
    /// pipes; mounted into every container of the GPU's shares.
    pub pipe: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY`: `control.log` and `server.log`.
    pub log: PathBuf,
    /// The daemon's `/dev/shm`, and every client container's: MPS clients and
    /// their server meet in shared memory as well as in the pipes, which is why
    /// guides for MPS in Kubernetes ask for `hostIPC`. A directory of its own per
    /// daemon gives them that without the host's.
    pub shm: PathBuf,
}

/// Sets compute modes and starts and stops MPS control daemons.
pub struct MpsControl {
    nvml: Nvml,
    program: PathBuf,
    lib_dir: Option<PathBuf>,
    /// The plugin's MPS directory: `<dir>/<gpu device>/{pipe,log}`.
    dir: PathBuf,
    timeout: Duration,
    /// Daemons start in the host's namespaces (the plugin in a container with
    /// `hostPID`), so they outlive the container.
    host: Option<HostNamespaces>,
}

impl std::fmt::Debug for MpsControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpsControl")
            .field("program", &self.program)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl MpsControl {
    /// The MPS control program of the driver root this process sees at `root`,
    /// run with `nvml_lib`'s directory on its library path, keeping its daemons'
    /// directories under `dir`.
    pub fn find(
        nvml: Nvml,
        root: &Path,
        nvml_lib: Option<&Path>,
        dir: PathBuf,
    ) -> Result<Self, SharingError> {
        let program = CANDIDATES
            .iter()
            .map(|c| root.join(c))
            .find(|p| p.is_file())
            .ok_or_else(|| SharingError::NoMpsControl {
                root: root.to_owned(),
            })?;
        Ok(Self {
            nvml,
            program,
            lib_dir: lib_dir_of(nvml_lib),
            dir,
            timeout: DEFAULT_TIMEOUT,
            host: None,
        })
    }

    /// The same, starting daemons in the host's namespaces ([`HostNamespaces`]):
    /// the program and its libraries by their paths on the host.
    pub fn in_host_namespaces(mut self, host: HostNamespaces) -> Result<Self, SharingError> {
        if host.host_path(&self.program).is_none() {
            return Err(SharingError::NotUnderRoot {
                path: self.program.clone(),
                root: host.local_root.clone(),
            });
        }
        self.host = Some(host);
        Ok(self)
    }

    /// The directories of GPU `gpu_device`'s daemon.
    pub fn dirs(&self, gpu_device: &str) -> MpsDirs {
        let base = self.dir.join(gpu_device);
        MpsDirs {
            pipe: base.join("pipe"),
            log: base.join("log"),
            shm: base.join("shm"),
        }
    }

    /// GPU `uuid`'s compute mode, in nvml.h's numbering.
    pub fn compute_mode(&self, uuid: &str) -> Result<u32, SharingError> {
        let gpu = self
            .nvml
            .device_by_uuid(uuid)
            .map_err(|e| SharingError::nvml(uuid, "finding the GPU", e))?;
        let mode = gpu
            .compute_mode()
            .map_err(|e| SharingError::nvml(uuid, "reading the compute mode", e))?;
        Ok(mode_number(mode))
    }

    /// Sets GPU `uuid`'s compute mode (nvml.h's numbering).
    pub fn set_compute_mode(&self, uuid: &str, mode: u32) -> Result<(), SharingError> {
        let wanted = mode_of(mode).ok_or_else(|| SharingError::BadComputeMode {
            gpu: uuid.to_owned(),
            mode,
        })?;
        let mut gpu = self
            .nvml
            .device_by_uuid(uuid)
            .map_err(|e| SharingError::nvml(uuid, "finding the GPU", e))?;
        gpu.set_compute_mode(wanted)
            .map_err(|e| SharingError::nvml(uuid, "setting the compute mode", e))?;
        tracing::info!(gpu = uuid, mode, "compute mode set");
        Ok(())
    }

    /// Starts the control daemon of GPU `gpu_device` (`uuid`), in a session of its
    /// own, and returns its directories. A daemon that still answers on them (left
    /// by a crash before its share's record was saved) is told to quit first: the
    /// directories are this plugin's, so whatever runs there is its own.
    pub fn start(&self, gpu_device: &str, uuid: &str) -> Result<MpsDirs, SharingError> {
        let dirs = self.dirs(gpu_device);
        self.stop(&dirs.pipe)?;
        for d in [&dirs.pipe, &dirs.log, &dirs.shm] {
            std::fs::create_dir_all(d).map_err(|source| SharingError::Dir {
                path: d.clone(),
                source,
            })?;
        }
        // Like /dev/shm: clients run as any user (each user gets an MPS server of
        // its own), and each may create its segments there.
        std::fs::set_permissions(&dirs.shm, std::fs::Permissions::from_mode(0o1777)).map_err(
            |source| SharingError::Dir {
                path: dirs.shm.clone(),
                source,
            },
        )?;
        let mut cmd = match &self.host {
            Some(host) => {
                let program = host.host_path(&self.program).unwrap_or_default();
                let lib_dir = self.lib_dir.as_deref().and_then(|l| host.host_path(l));
                let mut cmd = self.command_of(&program, None, &dirs.pipe)?;
                // This process's library path names its own mounts, which the host
                // does not have; the host's loader finds its driver as it does for
                // any host process.
                cmd.env_remove("LD_LIBRARY_PATH");
                if let Some(dir) = lib_dir {
                    cmd.env("LD_LIBRARY_PATH", dir);
                }
                cmd
            }
            None => self.command(&dirs.pipe)?,
        };
        cmd.arg("-d")
            .env("CUDA_VISIBLE_DEVICES", uuid)
            .env("CUDA_MPS_LOG_DIRECTORY", &dirs.log)
            .stdin(Stdio::null());
        // Held open until the command is spawned: its namespaces are entered by fd.
        let _namespaces = match &self.host {
            Some(host) => host.apply(&mut cmd).map_err(|source| SharingError::Spawn {
                program: self.program.clone(),
                source,
            })?,
            None => {
                // SAFETY: setsid is async-signal-safe and touches no memory of the
                // parent.
                unsafe {
                    cmd.pre_exec(|| {
                        libc::setsid();
                        Ok(())
                    });
                }
                Vec::new()
            }
        };
        shm_at_dev_shm(&mut cmd, &dirs.shm).map_err(|source| SharingError::Dir {
            path: dirs.shm.clone(),
            source,
        })?;
        self.run(cmd, "-d", None)?;
        tracing::info!(gpu = uuid, pipe = %dirs.pipe.display(), "MPS control daemon started");
        Ok(dirs)
    }

    /// Undoes what the first MPS share of a GPU or partition set up, as `share`
    /// records it: its daemon quits, then a GPU's compute mode goes back to what
    /// it was before MPS. Both steps are idempotent, so a retry redoes them.
    pub fn undo(&self, share: &ShareIntent) -> Result<(), SharingError> {
        if let Some(pipe) = &share.pipe_dir {
            self.stop(Path::new(pipe))?;
        }
        if let Some(prior) = share.prior_compute_mode {
            self.set_compute_mode(&share.gpu_uuid, prior)?;
        }
        Ok(())
    }

    /// Tells the daemon of `pipe` to quit. Nothing to do when no daemon made its
    /// `control` pipe there.
    pub fn stop(&self, pipe: &Path) -> Result<(), SharingError> {
        if !pipe.join("control").exists() {
            return Ok(());
        }
        let mut cmd = self.command(pipe)?;
        cmd.stdin(Stdio::piped());
        match self.run(cmd, "quit", Some(b"quit\n")) {
            Ok(()) => {
                tracing::info!(pipe = %pipe.display(), "MPS control daemon told to quit");
                Ok(())
            }
            // What the client prints when no daemon listens on the pipe directory
            // (one killed without `quit` leaves its `control` behind), or a daemon
            // that died while it was told: nothing runs there to stop.
            Err(SharingError::Failed { output, .. })
                if output.contains(NO_DAEMON) || !daemon_runs(pipe) =>
            {
                tracing::warn!(pipe = %pipe.display(), "no MPS control daemon runs there; taken as stopped");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The program with `pipe` as its pipe directory, its output going to a file
    /// beside it: not a pipe, which a daemon forked off `-d` would hold open (and
    /// a read to its end would wait for the daemon's exit).
    fn command(&self, pipe: &Path) -> Result<Command, SharingError> {
        self.command_of(&self.program, self.lib_dir.as_deref(), pipe)
    }

    /// [`MpsControl::command`] of `program`, with `lib_dir` on its library path.
    fn command_of(
        &self,
        program: &Path,
        lib_dir: Option<&Path>,
        pipe: &Path,
    ) -> Result<Command, SharingError> {
        let mut cmd = Command::new(program);
        let out = self.output_path(pipe);
        let file = |p: &Path| {
            std::fs::File::create(p).map_err(|source| SharingError::Dir {
                path: p.to_owned(),
                source,
            })
        };
        let stdout = file(&out)?;
        let stderr = stdout.try_clone().map_err(|source| SharingError::Dir {
            path: out.clone(),
            source,
        })?;
        cmd.env("CUDA_MPS_PIPE_DIRECTORY", pipe)
            .stdout(stdout)
            .stderr(stderr);
        if let Some(path) = library_path(lib_dir) {
            cmd.env("LD_LIBRARY_PATH", path);
        }
        Ok(cmd)
    }

    /// Where a call for the daemon of `pipe` writes its output.
    fn output_path(&self, pipe: &Path) -> PathBuf {
        pipe.parent().unwrap_or(&self.dir).join("mps-control.out")
    }

    /// Runs `cmd` to its end within the time limit, writing `input` to its stdin.
    fn run(&self, mut cmd: Command, what: &str, input: Option<&[u8]>) -> Result<(), SharingError> {
        let command = format!("nvidia-cuda-mps-control {what}");
        let mut child = cmd.spawn().map_err(|source| SharingError::Spawn {
            program: self.program.clone(),
            source,
        })?;
        if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
            // A client that exits early closes the pipe; its status says why.
            let _ = stdin.write_all(input);
        }
        let status = wait_within(&mut child, &self.program, &command, self.timeout)?;
        if status.success() {
            return Ok(());
        }
        let out = self.output_path(&pipe_of(&cmd));
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        Err(SharingError::Failed {
            command,
            status: status.to_string(),
            output: text
                .chars()
                .take(4096)
                .collect::<String>()
                .trim()
                .to_owned(),
        })
    }
}

/// Makes `cmd` run in a mount namespace of its own whose `/dev/shm` is `shm`, so
/// the daemon and the servers it starts share memory with the clients that get
/// the same directory (the CDI spec mounts it at their `/dev/shm`). After any
/// host namespaces are entered (pre_exec hooks run in order).
fn shm_at_dev_shm(cmd: &mut Command, shm: &Path) -> std::io::Result<()> {
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
    };
    let source = c(shm)?;
    let target = c(Path::new("/dev/shm"))?;
    let root = c(Path::new("/"))?;
    // SAFETY: only async-signal-safe calls (unshare, mount) on memory prepared
    // before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let none = std::ptr::null();
            if libc::unshare(libc::CLONE_NEWNS) != 0
                // Private, so the bind below stays in this namespace and no mount
                // event of the host reaches it.
                || libc::mount(none, root.as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, none.cast()) != 0
                || libc::mount(source.as_ptr(), target.as_ptr(), none, libc::MS_BIND, none.cast()) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

/// Whether the control daemon of `pipe` still runs: the daemon writes its PID to
/// `nvidia-cuda-mps-control.pid` in its pipe directory (NVIDIA's MPS
/// documentation). Without a readable PID it is taken as running, so a daemon
/// that may live is never forgotten. An exited process that waits to be reaped
/// counts as gone.
fn daemon_runs(pipe: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(pipe.join(PID_FILE)) else {
        return true;
    };
    let Ok(pid) = text.trim().parse::<u32>() else {
        return true;
    };
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// The pipe directory a command was given.
fn pipe_of(cmd: &Command) -> PathBuf {
    cmd.get_envs()
        .find(|(k, _)| *k == "CUDA_MPS_PIPE_DIRECTORY")
        .and_then(|(_, v)| v)
        .map(PathBuf::from)
        .unwrap_or_default()
}

fn mode_number(mode: ComputeMode) -> u32 {
    match mode {
        ComputeMode::Default => 0,
        ComputeMode::ExclusiveThread => 1,
        ComputeMode::Prohibited => 2,
        ComputeMode::ExclusiveProcess => 3,
    }
}

fn mode_of(n: u32) -> Option<ComputeMode> {
    match n {
        0 => Some(ComputeMode::Default),
        1 => Some(ComputeMode::ExclusiveThread),
        2 => Some(ComputeMode::Prohibited),
        3 => Some(ComputeMode::ExclusiveProcess),
        _ => None,
    }
}
