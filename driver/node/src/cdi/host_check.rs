//! What the host's `/dev` lacks for containers to get the NVIDIA nodes right, checked
//! once at start and reported with the command that fixes it. Nothing here is
//! written: the plugin sees the host's `/dev` read-only, and creating nodes or links
//! on the host is the driver installation's job.
//!
//! - A node the host has not created (the NVIDIA modules register their majors at
//!   load, but `/dev/nvidia-uvm` appears only once something opens it): the spec
//!   still carries its numbers, so the runtime creates it inside each container,
//!   which a user-namespaced pod cannot do, and the node has no host mode to copy.
//! - A node without its `/dev/char/<major>:<minor>` link: with the systemd cgroup
//!   driver, runc turns the container's device rules into systemd `DeviceAllow=`
//!   entries by that path; where it is missing systemd drops the rule, and after a
//!   `systemctl daemon-reload` the container loses access to the GPU ("Failed to
//!   initialize NVML: Unknown Error"). NVIDIA's `nvidia-ctk system
//!   create-dev-char-symlinks` creates the links.

use std::path::Path;

use super::nodes::{DeviceNodes, HostDeviceNodes};
use super::nvidia_files::resolve_in;

/// One thing to fix on the host, with its fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostNodeProblem {
    /// The node exists only as a registered major in `/proc/devices`.
    NotCreated { node: String },
    /// The node exists but `/dev/char/<major>:<minor>` does not point at it.
    NoCharLink { node: String, link: String },
}

impl HostNodeProblem {
    /// A sentence for logs and Events, ending with what to run on the host.
    pub fn message(&self) -> String {
        match self {
            HostNodeProblem::NotCreated { node }
                if node == "/dev/nvidia-uvm" || node == "/dev/nvidia-uvm-tools" =>
            {
                format!(
                    "{node} does not exist on the host (the nvidia-uvm module creates it only when \
                 something first opens it); containers get a node the runtime creates, which \
                 fails in user-namespaced pods. Fix on the host: `nvidia-modprobe -u -c=0`, or \
                 `nvidia-ctk system create-device-nodes --load-kernel-modules`, at boot"
                )
            }
            HostNodeProblem::NotCreated { node } => format!(
                "{node} does not exist on the host although its driver is loaded; containers \
                 get a node the runtime creates, which fails in user-namespaced pods. Fix on \
                 the host: `nvidia-ctk system create-device-nodes --control-devices`, or \
                 `nvidia-modprobe -c=<minor>`"
            ),
            HostNodeProblem::NoCharLink { node, link } => format!(
                "{link} does not link to {node}; with the systemd cgroup driver a \
                 `systemctl daemon-reload` removes running containers' access to it. Fix on \
                 the host: `nvidia-ctk system create-dev-char-symlinks --create-all` (and a \
                 udev rule or boot unit to keep them)"
            ),
        }
    }
}

/// Checks the nodes by name under `/dev` (`nvidia0`, `nvidiactl`, `nvidia-uvm`);
/// names the host has no driver for at all are not this check's business (prepare
/// fails for those with its own error).
pub fn host_node_problems(
    nodes: &HostDeviceNodes,
    dev_root: &Path,
    names: &[String],
) -> Vec<HostNodeProblem> {
    let mut out = Vec::new();
    for name in names {
        let node = format!("/dev/{name}");
        let info = match nodes.lookup(name) {
            Ok(Some(info)) => info,
            Ok(None) | Err(_) => continue,
        };
        if info.owner.is_none() {
            out.push(HostNodeProblem::NotCreated { node });
            continue;
        }
        let link = format!("/dev/char/{}:{}", info.major, info.minor);
        // Resolved as the host would: an absolute link names the host's /dev.
        let resolve = |p: &str| resolve_in(dev_root, Path::new(p)).ok().flatten();
        let points_at_node = resolve(&link).is_some_and(|l| Some(l) == resolve(&node));
        if !points_at_node {
            out.push(HostNodeProblem::NoCharLink { node, link });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    #[test]
    fn reports_missing_nodes_and_links_with_their_fix() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("dev");
        fs::create_dir_all(dev.join("char")).unwrap();
        let proc_devices = dir.path().join("devices");
        fs::write(
            &proc_devices,
            "Character devices:\n195 nvidia\n509 nvidia-uvm\n\nBlock devices:\n",
        )
        .unwrap();
        let made = std::process::Command::new("mknod")
            .arg(dev.join("nvidia0"))
            .args(["c", "195", "0"])
            .status()
            .is_ok_and(|s| s.success());
        if !made {
            eprintln!("skipping: mknod needs CAP_MKNOD");
            return;
        }
        let nodes = HostDeviceNodes::new(dir.path()).with_proc_devices(&proc_devices);
        let names = [
            "nvidia0".to_owned(),
            "nvidia-uvm".to_owned(),
            "nvidia7-unknown".to_owned(),
        ];

        let problems = host_node_problems(&nodes, dir.path(), &names);
        assert_eq!(
            problems,
            [
                HostNodeProblem::NoCharLink {
                    node: "/dev/nvidia0".into(),
                    link: "/dev/char/195:0".into()
                },
                HostNodeProblem::NotCreated {
                    node: "/dev/nvidia-uvm".into()
                },
            ]
        );
        assert!(problems[0].message().contains("create-dev-char-symlinks"));
        assert!(problems[1].message().contains("nvidia-modprobe -u -c=0"));

        // The link systemd needs, relative as nvidia-ctk writes it: fixed.
        symlink("../nvidia0", dev.join("char/195:0")).unwrap();
        let problems = host_node_problems(&nodes, dir.path(), &names);
        assert_eq!(problems.len(), 1, "{problems:?}");
    }
}
