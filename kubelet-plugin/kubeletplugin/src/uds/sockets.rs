//! Where a plugin's two sockets go, named so that the new pod of a rolling update
//! can register before the old one is gone.

use std::path::{Path, PathBuf};

/// The registration socket (in the kubelet's plugin registry) and the DRA socket (in
/// the driver's directory under the kubelet's plugins directory).
///
/// With a pod UID both names carry it, so two pods of one DaemonSet on a node serve
/// side by side during a rolling update (`<driver>-<uid>-reg.sock`,
/// `dra-<uid>.sock`); without one they are the fixed `<driver>-reg.sock` and
/// `dra.sock`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginSockets {
    pub registration: PathBuf,
    pub dra: PathBuf,
}

impl PluginSockets {
    pub fn new(
        registry_dir: &Path,
        plugins_dir: &Path,
        driver_name: &str,
        pod_uid: Option<&str>,
    ) -> Self {
        let plugin_dir = plugins_dir.join(driver_name);
        match pod_uid {
            Some(uid) => Self {
                registration: registry_dir.join(format!("{driver_name}-{uid}-reg.sock")),
                dra: plugin_dir.join(format!("dra-{uid}.sock")),
            },
            None => Self {
                registration: registry_dir.join(format!("{driver_name}-reg.sock")),
                dra: plugin_dir.join("dra.sock"),
            },
        }
    }

    /// Removes the registration and DRA sockets that killed instances of this
    /// driver left (pod-UID names pile up otherwise, one per killed pod). Only the
    /// owner of the node state may call this, so no other instance serves on them.
    /// Returns the paths removed.
    pub async fn remove_leftovers(&self, driver_name: &str) -> Vec<PathBuf> {
        let registration_name = format!("{driver_name}-reg.sock");
        let prefix = format!("{driver_name}-");
        let registration = |n: &str| {
            n == registration_name || (n.starts_with(&prefix) && n.ends_with("-reg.sock"))
        };
        let dra = |n: &str| n == "dra.sock" || (n.starts_with("dra-") && n.ends_with(".sock"));
        let mut removed = Vec::new();
        if let Some(dir) = self.registration.parent() {
            removed.extend(
                super::remove_leftover_sockets(dir, registration, &self.registration).await,
            );
        }
        if let Some(dir) = self.dra.parent() {
            removed.extend(super::remove_leftover_sockets(dir, dra, &self.dra).await);
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_pod_uid_when_there_is_one() {
        let s = PluginSockets::new(
            Path::new("/reg"),
            Path::new("/plugins"),
            "gpu.x",
            Some("u1"),
        );
        assert_eq!(s.registration, Path::new("/reg/gpu.x-u1-reg.sock"));
        assert_eq!(s.dra, Path::new("/plugins/gpu.x/dra-u1.sock"));
        let s = PluginSockets::new(Path::new("/reg"), Path::new("/plugins"), "gpu.x", None);
        assert_eq!(s.registration, Path::new("/reg/gpu.x-reg.sock"));
        assert_eq!(s.dra, Path::new("/plugins/gpu.x/dra.sock"));
    }
}
