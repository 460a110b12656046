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
        // Only `<driver>-<pod UID>-reg.sock` is a rolling-update name of ours:
        // `gpu.example.com-canary-reg.sock` is the socket of another driver, one
        // whose name starts with ours, and must be left alone.
        let registration = |n: &str| {
            n == registration_name
                || n.strip_prefix(&prefix)
                    .and_then(|rest| rest.strip_suffix("-reg.sock"))
                    .is_some_and(is_pod_uid)
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

/// Whether `s` has the form of a pod UID: a UUID in its 36-character text form, as
/// the API server assigns them.
fn is_pod_uid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_uuid_shaped_names_are_pod_uids() {
        assert!(is_pod_uid("0b5e7a8c-3f7d-4d3e-9a61-1c2b3d4e5f60"));
        for not in [
            "canary",
            "",
            "0b5e7a8c-3f7d-4d3e-9a61-1c2b3d4e5f6",
            "0b5e7a8c-3f7d-4d3e-9a61-1c2b3d4e5f600",
            "0b5e7a8c+3f7d-4d3e-9a61-1c2b3d4e5f60",
            "0b5e7a8c-3f7d-4d3e-9a61-1c2b3d4e5fzz",
            "canary-0b5e7a8c-3f7d-4d3e-9a61-1c2b3d4e5f60",
        ] {
            assert!(!is_pod_uid(not), "{not:?}");
        }
    }

    #[tokio::test]
    async fn leftovers_are_only_this_drivers_sockets() {
        let dir = tempfile::tempdir().unwrap();
        let (reg, plugins) = (dir.path().join("registry"), dir.path().join("plugins"));
        let own = "0b5e7a8c-3f7d-4d3e-9a61-1c2b3d4e5f60";
        let s = PluginSockets::new(&reg, &plugins, "gpu.x", Some(own));
        std::fs::create_dir_all(&reg).unwrap();
        let bind = |name: &str| {
            drop(std::os::unix::net::UnixListener::bind(reg.join(name)).unwrap());
        };
        let killed = "gpu.x-11111111-2222-3333-4444-555555555555-reg.sock";
        for name in [
            killed,
            "gpu.x-reg.sock",
            "gpu.x-canary-reg.sock",
            "gpu.x-canary-11111111-2222-3333-4444-555555555555-reg.sock",
            "gpu.xy-reg.sock",
        ] {
            bind(name);
        }
        let mut removed: Vec<String> = s
            .remove_leftovers("gpu.x")
            .await
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        removed.sort();
        assert_eq!(removed, [killed, "gpu.x-reg.sock"]);
        assert!(reg.join("gpu.x-canary-reg.sock").exists());
        assert!(reg.join("gpu.xy-reg.sock").exists());
    }

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
