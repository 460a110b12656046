//! Starting a process in the host's namespaces from the plugin's container.
//!
//! An MPS control daemon must outlive the plugin's container: a rolling update
//! replaces the container while the daemon's clients run. The runtime ends a
//! container by its PID namespace and its cgroup, so a daemon started inside both
//! dies with it. With the pod in the host's PID namespace (`hostPID`), a process
//! the plugin forks can enter the mount and cgroup namespaces of PID 1 (the host's
//! init), move itself into a cgroup of its own outside the pod's (cgroup v2), and
//! start a new session: then nothing of the container holds it. It runs the
//! program by its path on the host, since it sees the host's file system.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The cgroup (v2) the daemons move into, under the host's cgroup root: their
/// own, so that no pod's cgroup holds them and their use is visible apart.
pub const DAEMON_CGROUP: &str = "topodra-mps";

/// How to start a process in the host's namespaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostNamespaces {
    /// The driver root as the host sees it (`--driver-root`).
    pub host_root: PathBuf,
    /// Where this process sees it (`--driver-root-local`, or the same path).
    pub local_root: PathBuf,
}

impl HostNamespaces {
    /// `local` (a path under the local driver root) as the host sees it; `None`
    /// for a path outside the driver root.
    pub fn host_path(&self, local: &Path) -> Option<PathBuf> {
        let rel = local.strip_prefix(&self.local_root).ok()?;
        Some(self.host_root.join(rel))
    }

    /// Makes `cmd` enter PID 1's cgroup and mount namespaces, move into
    /// [`DAEMON_CGROUP`] where the host uses cgroup v2, and start a session of its
    /// own, before it runs. The returned files must stay open until `cmd` is
    /// spawned.
    pub fn apply(&self, cmd: &mut Command) -> io::Result<Vec<File>> {
        let cgroup_ns = File::open("/proc/1/ns/cgroup")?;
        let mount_ns = File::open("/proc/1/ns/mnt")?;
        let (cgroup_fd, mount_fd) = (cgroup_ns.as_raw_fd(), mount_ns.as_raw_fd());
        // Decided here, where allocating is allowed: cgroup v2 has
        // cgroup.controllers at its root; with v1 the process stays where it is.
        let v2 = Path::new("/proc/1/root/sys/fs/cgroup/cgroup.controllers").exists();
        let dir = Path::new("/sys/fs/cgroup").join(DAEMON_CGROUP);
        let cgroup = if v2 {
            Some((c_path(&dir)?, c_path(&dir.join("cgroup.procs"))?))
        } else {
            None
        };
        let root = c_path(Path::new("/"))?;
        // SAFETY: only async-signal-safe calls (setns, chdir, mkdir, open, write,
        // close, setsid) on memory prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(cgroup_fd, libc::CLONE_NEWCGROUP) != 0
                    || libc::setns(mount_fd, libc::CLONE_NEWNS) != 0
                    || libc::chdir(root.as_ptr()) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                if let Some((dir, procs)) = &cgroup {
                    if libc::mkdir(dir.as_ptr(), 0o755) != 0
                        && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
                    {
                        return Err(io::Error::last_os_error());
                    }
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                    if written != 1 {
                        return Err(io::Error::last_os_error());
                    }
                }
                libc::setsid();
                Ok(())
            });
        }
        Ok(vec![cgroup_ns, mount_ns])
    }
}

fn c_path(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_under_the_local_root_map_to_the_host_root() {
        let h = HostNamespaces {
            host_root: "/run/nvidia/driver".into(),
            local_root: "/driver-root".into(),
        };
        assert_eq!(
            h.host_path(Path::new("/driver-root/usr/bin/nvidia-cuda-mps-control")),
            Some(PathBuf::from(
                "/run/nvidia/driver/usr/bin/nvidia-cuda-mps-control"
            ))
        );
        assert_eq!(h.host_path(Path::new("/usr/lib/libnvidia-ml.so.1")), None);
        let same = HostNamespaces {
            host_root: "/".into(),
            local_root: "/".into(),
        };
        assert_eq!(
            same.host_path(Path::new("/usr/bin/x")),
            Some(PathBuf::from("/usr/bin/x"))
        );
    }
}
