//! The OCI hooks of a claim's spec, run by the container runtime through NVIDIA's
//! `nvidia-cdi-hook` (NVIDIA Container Toolkit) after the container's mounts are
//! made and before its process starts.
//!
//! They are what makes bind-mounted driver libraries usable whatever the image's
//! distribution is: the loader cache learns the host's library directories, the
//! soname and `libcuda.so` links exist, an image's newer CUDA forward-compatibility
//! libraries are preferred, and the NVIDIA libraries do not create device nodes of
//! their own inside the container. Names, arguments and order are those of the
//! specs the toolkit's `nvcdi` library generates, so that the same hook binary
//! behaves the same on our specs.

use std::path::Path;

use super::spec::Hook;

/// The OCI lifecycle point: in the container's namespaces, after its mounts.
pub(crate) const CREATE_CONTAINER: &str = "createContainer";
/// In the runtime's namespaces, once the container's cgroup exists.
pub(crate) const CREATE_RUNTIME: &str = "createRuntime";

pub(crate) const CREATE_SYMLINKS: &str = "create-symlinks";
pub(crate) const ENABLE_CUDA_COMPAT: &str = "enable-cuda-compat";
pub(crate) const UPDATE_LDCACHE: &str = "update-ldcache";
pub(crate) const DISABLE_DEVICE_NODE_MODIFICATION: &str = "disable-device-node-modification";
pub(crate) const UPDATE_APPLICATION_PROFILE: &str = "update-application-profile";
pub(crate) const APPLY_CUDA_MEMORY_LIMITS: &str = "apply-cuda-memory-limits";

/// The hook binary quiet unless asked: its debug log goes to the runtime's log.
const HOOK_ENV: &str = "NVIDIA_CTK_DEBUG=false";

/// A link the `create-symlinks` hook makes in the container: `link` (absolute, in
/// the container) pointing at `target` (usually a file name in the same directory).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Link {
    pub(crate) target: String,
    pub(crate) link: String,
}

/// Builds hooks that run one `nvidia-cdi-hook` binary, given as a host path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HookBinary {
    path: String,
    /// `argv[0]`: the binary's file name. Invoked as `nvidia-ctk`, the same hooks
    /// are a subcommand (`nvidia-ctk hook <name>`), as with the toolkit's own specs.
    argv: Vec<String>,
}

impl HookBinary {
    pub(crate) fn new(path: &Path) -> Self {
        let path = path.to_string_lossy().into_owned();
        let name = Path::new(&path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.clone());
        let argv = if name == "nvidia-ctk" {
            vec![name, "hook".to_owned()]
        } else {
            vec![name]
        };
        Self { path, argv }
    }

    fn hook(&self, name: &str, args: impl IntoIterator<Item = String>) -> Hook {
        let mut argv = self.argv.clone();
        argv.push(name.to_owned());
        argv.extend(args);
        Hook {
            hook_name: CREATE_CONTAINER.to_owned(),
            path: self.path.clone(),
            args: argv,
            env: vec![HOOK_ENV.to_owned()],
            timeout: None,
        }
    }

    /// `create-symlinks --link target::link ...`; `None` without links (the hook
    /// refuses to run without one).
    pub(crate) fn create_symlinks(&self, links: &[Link]) -> Option<Hook> {
        (!links.is_empty()).then(|| {
            self.hook(
                CREATE_SYMLINKS,
                links
                    .iter()
                    .flat_map(|l| ["--link".to_owned(), format!("{}::{}", l.target, l.link)]),
            )
        })
    }

    /// `enable-cuda-compat --host-driver-version=<version>`: the hook puts the
    /// image's `/usr/local/cuda/compat` libraries first when they are newer than
    /// the host's driver.
    pub(crate) fn enable_cuda_compat(&self, driver_version: &str) -> Hook {
        self.hook(
            ENABLE_CUDA_COMPAT,
            [format!("--host-driver-version={driver_version}")],
        )
    }

    /// `update-ldcache --folder <dir> ...`: runs the image's `ldconfig` with the
    /// driver's library directories added, so `ldconfig -p` lists `libcuda` and
    /// the loader finds it outside the image's own search path.
    pub(crate) fn update_ldcache(&self, folders: &[String]) -> Option<Hook> {
        (!folders.is_empty()).then(|| {
            self.hook(
                UPDATE_LDCACHE,
                folders
                    .iter()
                    .flat_map(|f| ["--folder".to_owned(), f.clone()]),
            )
        })
    }

    /// Sets `ModifyDeviceFiles: 0` in the container's view of
    /// `/proc/driver/nvidia/params`, so the driver libraries do not create
    /// `/dev/nvidia*` nodes the claim did not get.
    pub(crate) fn disable_device_node_modification(&self) -> Hook {
        self.hook(DISABLE_DEVICE_NODE_MODIFICATION, [])
    }
}

impl HookBinary {
    /// Applies `NVIDIA_GPU_MEMORY_REQUEST` / `NVIDIA_GPU_MEMORY_LIMIT` (MiB) from the
    /// container's environment to the GPU, for the container's cgroup, through the
    /// driver's NVML under `driver_root` (a host path); a no-op when neither is set.
    pub(crate) fn apply_cuda_memory_limits(&self, driver_root: &str, gpu_uuid: &str) -> Hook {
        let mut hook = self.hook(
            APPLY_CUDA_MEMORY_LIMITS,
            [
                "--driver-root".to_owned(),
                driver_root.to_owned(),
                "--gpu-id".to_owned(),
                gpu_uuid.to_owned(),
            ],
        );
        hook.hook_name = CREATE_RUNTIME.to_owned();
        hook
    }

    /// Writes a driver application profile in the container that limits EGL and
    /// Vulkan to the container's `/dev/nvidia<N>` GPUs (`EGLVisibleDGPUDevices`),
    /// which otherwise enumerate the node's GPUs through the driver.
    pub(crate) fn update_application_profile(&self) -> Hook {
        self.hook(UPDATE_APPLICATION_PROFILE, [])
    }
}

/// The hook's subcommand name: what tests key hooks by, and what decides whether a
/// toolkit spec's hook is adopted.
pub(crate) fn hook_name(hook: &Hook) -> Option<&str> {
    let skip = if hook.args.first().is_some_and(|a| a == "nvidia-ctk") {
        2
    } else {
        1
    };
    hook.args.get(skip).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_as_the_toolkit_spells_them() {
        let bin = HookBinary::new(Path::new(
            "/var/lib/kubelet/plugins/gpu.topodra.dev/nvidia-cdi-hook",
        ));
        let links = [Link {
            target: "libcuda.so.1".into(),
            link: "/usr/lib64/libcuda.so".into(),
        }];
        let h = bin.create_symlinks(&links).unwrap();
        assert_eq!(h.hook_name, "createContainer");
        assert_eq!(
            h.args,
            [
                "nvidia-cdi-hook",
                "create-symlinks",
                "--link",
                "libcuda.so.1::/usr/lib64/libcuda.so"
            ]
        );
        assert_eq!(h.env, ["NVIDIA_CTK_DEBUG=false"]);
        assert_eq!(hook_name(&h), Some("create-symlinks"));
        assert!(bin.create_symlinks(&[]).is_none());
        assert!(bin.update_ldcache(&[]).is_none());
        assert_eq!(
            bin.update_ldcache(&["/usr/lib64".into(), "/usr/lib64/vdpau".into()])
                .unwrap()
                .args,
            [
                "nvidia-cdi-hook",
                "update-ldcache",
                "--folder",
                "/usr/lib64",
                "--folder",
                "/usr/lib64/vdpau"
            ]
        );
        assert_eq!(
            bin.enable_cuda_compat("570.172.08").args,
            [
                "nvidia-cdi-hook",
                "enable-cuda-compat",
                "--host-driver-version=570.172.08"
            ]
        );

        let ctk = HookBinary::new(Path::new("/usr/bin/nvidia-ctk"));
        let h = ctk.disable_device_node_modification();
        assert_eq!(
            h.args,
            ["nvidia-ctk", "hook", "disable-device-node-modification"]
        );
        assert_eq!(hook_name(&h), Some("disable-device-node-modification"));
    }
}
