//! The NVIDIA user-space driver files a GPU container needs: libraries and tools,
//! bind-mounted read-only at the path they have on the host.
//!
//! They come from one of two places:
//! - our own discovery under a driver root ([`NvidiaRoot`]): `/` for a driver
//!   installed on the host, `/run/nvidia/driver` for the GPU Operator's driver
//!   container;
//! - a spec the NVIDIA Container Toolkit generated (`nvidia-ctk cdi generate`), whose
//!   claim-wide mounts, hooks and env we adopt as they are, because the toolkit
//!   knows more of the driver's files (Vulkan, EGL, firmware symlinks, ldcache hooks)
//!   than this list does. Its device nodes are not adopted: ours carry the exact
//!   majors and only the claim's GPUs.

use std::collections::{BTreeSet, VecDeque};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use super::spec::{ContainerEdits, Hook, Mount};
use super::{CdiConfig, CdiError};

/// Library directories, searched in this order; a directory that resolves to one
/// already searched (merged `/usr`: `/lib64 -> usr/lib64`) is skipped so no file is
/// mounted twice.
pub(crate) const LIB_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib64",
    "/lib",
];

/// Binary directories; the first that has a binary wins, as with `PATH`.
pub(crate) const BIN_DIRS: &[&str] = &["/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"];

/// Compute libraries, by the name before the version suffix: every
/// `<name>.<version>` file (`libcuda.so.1`, `libcuda.so.550.90.07`) is mounted.
pub(crate) const LIBRARIES: &[&str] = &[
    "libnvidia-ml.so",
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-opencl.so",
    "libnvidia-cfg.so",
    "libnvidia-allocator.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
];

/// Without these no CUDA program or NVML tool works, so their absence means the
/// driver root is wrong, not that the node lacks an optional feature.
pub(crate) const REQUIRED_LIBRARIES: &[&str] = &["libnvidia-ml.so", "libcuda.so"];

pub(crate) const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

/// Options of every driver file mount: read-only, no set-uid, no device files.
pub(crate) const MOUNT_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "rbind"];
pub(crate) const MOUNT_TYPE: &str = "bind";

/// Where the driver's files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NvidiaRoot {
    /// The root as the host (and so the container runtime) sees it; mount sources
    /// are written under it.
    pub(crate) host: PathBuf,
    /// The same directory as this process sees it, where it is scanned. It differs
    /// when the plugin runs in a container with the driver root mounted elsewhere.
    pub(crate) local: PathBuf,
}

impl NvidiaRoot {
    #[cfg(test)]
    pub(crate) fn new(host: impl Into<PathBuf>) -> Self {
        let host = host.into();
        Self {
            local: host.clone(),
            host,
        }
    }
}

/// Where the claim-wide driver edits came from; logged and recorded so that an
/// operator can tell which one a container got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvidiaFilesSource {
    Discovered { root: PathBuf },
    Toolkit { spec: PathBuf },
}

/// Claim-wide edits for the driver's user-space files: mounts, and, from a toolkit
/// spec, its hooks and env.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvidiaFiles {
    pub source: NvidiaFilesSource,
    pub edits: ContainerEdits,
}

impl NvidiaFiles {
    /// Adopts the configured toolkit spec when the file exists, and discovers under
    /// the driver root otherwise. A toolkit spec that exists but cannot be used is an
    /// error rather than a fallback: the operator asked for it, and containers would
    /// silently get a different set of files.
    pub fn load(config: &CdiConfig) -> Result<Self, CdiError> {
        if let Some(path) = &config.toolkit_spec {
            if path.exists() {
                return Self::from_toolkit_spec(path);
            }
            tracing::info!(
                spec = %path.display(),
                "toolkit CDI spec not present; discovering driver files ourselves"
            );
        }
        Self::discover(&config.driver_root())
    }

    /// Finds the driver's libraries and binaries under `root`.
    pub(crate) fn discover(root: &NvidiaRoot) -> Result<Self, CdiError> {
        let mut mounts = Vec::new();
        let mut found_libs = BTreeSet::new();

        let mut seen_dirs = BTreeSet::new();
        for dir in LIB_DIRS {
            let Some(resolved) = resolve_in(&root.local, Path::new(dir))? else {
                continue;
            };
            if !seen_dirs.insert(resolved.clone()) {
                continue;
            }
            let local_dir = reroot(&root.local, &resolved);
            if !local_dir.is_dir() {
                continue;
            }
            for name in sorted_names(&local_dir)? {
                let Some(lib) = LIBRARIES.iter().find(|l| is_versioned(&name, l)) else {
                    continue;
                };
                let container = Path::new(dir).join(&name);
                if let Some(m) = file_mount(root, &container)? {
                    found_libs.insert(*lib);
                    mounts.push(m);
                }
            }
        }

        let missing: Vec<String> = REQUIRED_LIBRARIES
            .iter()
            .filter(|l| !found_libs.contains(*l))
            .map(|l| format!("{l}.*"))
            .collect();
        if !missing.is_empty() {
            return Err(CdiError::NvidiaFilesMissing {
                root: root.local.clone(),
                missing,
            });
        }

        for bin in BINARIES {
            for dir in BIN_DIRS {
                let container = Path::new(dir).join(bin);
                if let Some(m) = file_mount(root, &container)? {
                    mounts.push(m);
                    break;
                }
            }
        }

        Ok(Self {
            source: NvidiaFilesSource::Discovered {
                root: root.host.clone(),
            },
            edits: ContainerEdits {
                mounts,
                ..Default::default()
            },
        })
    }

    /// Takes the top-level mounts, hooks and env of a toolkit-generated spec (JSON
    /// or YAML, by extension; anything else is tried as both).
    pub(crate) fn from_toolkit_spec(path: &Path) -> Result<Self, CdiError> {
        let err = |reason: String| CdiError::ToolkitSpec {
            path: path.to_owned(),
            reason,
            source: None,
        };
        let failed = |reason: String, source: Box<dyn std::error::Error + Send + Sync>| {
            CdiError::ToolkitSpec {
                path: path.to_owned(),
                reason,
                source: Some(source),
            }
        };
        let text = fs::read_to_string(path).map_err(|e| failed(e.to_string(), e.into()))?;
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        let yaml =
            |text: &str| serde_saphyr::from_str(text).map_err(|e| failed(yaml_error(&e), e.into()));
        let parsed: ToolkitSpec = match ext {
            "json" => serde_json::from_str(&text).map_err(|e| failed(e.to_string(), e.into()))?,
            "yaml" | "yml" => yaml(&text)?,
            _ => match serde_json::from_str(&text) {
                Ok(s) => s,
                Err(_) => yaml(&text)?,
            },
        };
        let edits = parsed.container_edits;
        if edits.mounts.is_empty() {
            return Err(err(
                "it has no top-level containerEdits.mounts, so containers would get no \
                 driver libraries"
                    .into(),
            ));
        }
        Ok(Self {
            source: NvidiaFilesSource::Toolkit {
                spec: path.to_owned(),
            },
            edits: ContainerEdits {
                env: edits.env,
                mounts: edits.mounts,
                hooks: edits.hooks,
                ..Default::default()
            },
        })
    }
}

/// The parts of a toolkit spec we adopt. Everything else, including fields from
/// newer CDI versions, is ignored rather than refused.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolkitSpec {
    #[serde(default)]
    container_edits: ToolkitEdits,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolkitEdits {
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    mounts: Vec<Mount>,
    #[serde(default)]
    hooks: Vec<Hook>,
}

// One line with the position: the reason ends up in the one-line error the plugin
// exits with at start, where the default display's multi-line source snippet would
// break up the message.
fn yaml_error(e: &serde_saphyr::Error) -> String {
    e.without_snippet().to_string()
}

/// `<name>.<suffix>` with a non-empty suffix: `libcuda.so.1` for `libcuda.so`, but
/// not `libcuda.so` itself (a link-time name) nor `libcudadebugger.so.1`.
fn is_versioned(file: &str, name: &str) -> bool {
    file.strip_prefix(name)
        .and_then(|rest| rest.strip_prefix('.'))
        .is_some_and(|v| !v.is_empty())
}

/// A mount for the file a container should see at `container`, if it exists under
/// the root as a regular file (through any symlinks).
///
/// The source is the resolved file, not the symlink: a symlink in a driver root
/// that is not `/` may be absolute and would resolve against the host's own `/`.
fn file_mount(root: &NvidiaRoot, container: &Path) -> Result<Option<Mount>, CdiError> {
    let Some(resolved) = resolve_in(&root.local, container)? else {
        return Ok(None);
    };
    let local = reroot(&root.local, &resolved);
    match fs::metadata(&local) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(CdiError::NvidiaRoot {
                path: local,
                source,
            });
        }
    }
    let host = reroot(&root.host, &resolved);
    let (Some(host), Some(container)) = (host.to_str(), container.to_str()) else {
        tracing::warn!(path = %container.display(), "skipping a driver file whose path is not UTF-8");
        return Ok(None);
    };
    Ok(Some(Mount {
        host_path: host.to_owned(),
        container_path: container.to_owned(),
        kind: Some(MOUNT_TYPE.to_owned()),
        options: MOUNT_OPTIONS.iter().map(|s| (*s).to_owned()).collect(),
    }))
}

fn sorted_names(dir: &Path) -> Result<Vec<String>, CdiError> {
    let entries = fs::read_dir(dir).map_err(|source| CdiError::NvidiaRoot {
        path: dir.to_owned(),
        source,
    })?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    Ok(names)
}

/// `abs` (a path inside the root) as a path on this machine under `root`.
pub(crate) fn reroot(root: &Path, abs: &Path) -> PathBuf {
    let rel = abs.strip_prefix("/").unwrap_or(abs);
    if rel.as_os_str().is_empty() {
        root.to_owned()
    } else {
        root.join(rel)
    }
}

/// Resolves `path` as if `root` were `/`: symlinks, absolute or relative, and `..`
/// never leave the root. Returns the resolved absolute path inside the root, or
/// `None` when some component does not exist.
pub(crate) fn resolve_in(root: &Path, path: &Path) -> Result<Option<PathBuf>, CdiError> {
    const MAX_LINKS: usize = 40;
    let mut pending: VecDeque<OsString> = components(path).into();
    let mut resolved = PathBuf::from("/");
    let mut links = 0;
    while let Some(part) = pending.pop_front() {
        if part == ".." {
            resolved.pop();
            continue;
        }
        let candidate = resolved.join(&part);
        let local = reroot(root, &candidate);
        let meta = match fs::symlink_metadata(&local) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return Ok(None),
            Err(source) => {
                return Err(CdiError::NvidiaRoot {
                    path: local,
                    source,
                });
            }
        };
        if !meta.file_type().is_symlink() {
            resolved = candidate;
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            return Err(CdiError::NvidiaRoot {
                path: local,
                source: io::Error::from_raw_os_error(libc::ELOOP),
            });
        }
        let target = fs::read_link(&local).map_err(|source| CdiError::NvidiaRoot {
            path: local.clone(),
            source,
        })?;
        if target.is_absolute() {
            resolved = PathBuf::from("/");
        }
        for c in components(&target).into_iter().rev() {
            pending.push_front(c);
        }
    }
    Ok(Some(resolved))
}

fn components(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests;
