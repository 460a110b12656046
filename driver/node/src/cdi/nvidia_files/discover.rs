//! Our own discovery of the driver's user-space files under a driver root: the set
//! the NVIDIA Container Toolkit's `nvcdi` library finds for the same root (the
//! parity test, driver/node/tests/toolkit_parity.rs, holds the two side by side).
//!
//! - The driver version is the suffix of `libcuda.so.<version>` (or, failing that,
//!   `libnvidia-ml.so.<version>`) in the library directories.
//! - The driver's library directories are those holding a `lib*.so.<version>`;
//!   every `*.so.<version>` in them and in their `vdpau/` is mounted, with the
//!   legacy `libnvidia-nvvm70.so.*`.
//! - GSP firmware `nvidia/<version>/gsp*.bin` (and `ucodes*.bin`) from the kernel's
//!   firmware directories, the driver's IPC sockets (persistenced, fabric manager,
//!   the MPS pipe directory), and its tools.
//!
//! Each library also yields the links the container needs, as the toolkit makes
//! them: soname and `.so` links where the host has them, and `libcuda.so`.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::{NvidiaRoot, reroot, resolve_in};
use crate::cdi::CdiError;
use crate::cdi::capabilities::{self, DriverCapability};
use crate::cdi::elf;
use crate::cdi::hooks::Link;
use crate::cdi::spec::Mount;

mod firmware;
mod graphics;
mod links;

use firmware::firmware;
use graphics::{config_files, graphics_libraries, xorg_modules};
use links::library_links;

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

/// The driver's tools the toolkit mounts.
pub(crate) const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
    "nvidia-xconfig",
];

/// Without one of these no CUDA program or NVML tool works, and the driver version
/// cannot be known; their absence means the driver root is wrong.
pub(crate) const VERSION_LIBRARIES: &[&str] = &["libcuda.so", "libnvidia-ml.so"];

/// The driver's IPC endpoints, each mounted from the first place it exists.
const IPC_SOCKETS: &[&[&str]] = &[
    &[
        "/run/nvidia-persistenced/socket",
        "/var/run/nvidia-persistenced/socket",
    ],
    &[
        "/run/nvidia-fabricmanager/socket",
        "/var/run/nvidia-fabricmanager/socket",
    ],
    // The MPS control daemon's pipe directory (CUDA_MPS_PIPE_DIRECTORY's default).
    &["/tmp/nvidia-mps"],
];

/// Read-only driver files: no set-uid, no device files, private propagation.
pub(crate) const FILE_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "rbind", "rprivate"];
/// IPC endpoints are written to, and nothing in them is run.
pub(crate) const IPC_OPTIONS: &[&str] = &["nosuid", "nodev", "rbind", "rprivate", "noexec"];
pub(crate) const MOUNT_TYPE: &str = "bind";

/// What a discovered file is, which decides its mount options and whether it takes
/// part in the loader hooks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// A shared library, with the links the container gets for it.
    Library {
        links: Vec<Link>,
    },
    Binary,
    Firmware,
    Ipc,
    /// A loader's config file (EGL vendor, Vulkan ICD).
    Config,
    /// A module the X server loads from its module path, not through the loader
    /// cache, with the links it is looked up by.
    XorgModule {
        links: Vec<Link>,
    },
}

/// One driver file for the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DriverFile {
    pub(crate) mount: Mount,
    pub(crate) kind: FileKind,
    pub(crate) class: Option<DriverCapability>,
}

impl DriverFile {
    /// The directory the container sees the file in.
    pub(crate) fn container_dir(&self) -> &str {
        self.mount
            .container_path
            .rsplit_once('/')
            .map_or("/", |(d, _)| if d.is_empty() { "/" } else { d })
    }
}

/// The result of a discovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Discovered {
    pub(crate) version: String,
    pub(crate) files: Vec<DriverFile>,
}

/// A library directory: the path the container sees, and where it resolved to.
struct LibDir {
    container: PathBuf,
    resolved: PathBuf,
}

pub(crate) fn discover(root: &NvidiaRoot) -> Result<Discovered, CdiError> {
    let dirs = lib_dirs(root)?;
    let version = driver_version(root, &dirs)?;
    let suffix = format!(".so.{version}");

    let mut files = Vec::new();
    let mut seen = BTreeSet::new();
    for dir in &dirs {
        let local = reroot(&root.local, &dir.resolved);
        if !names_in(&local)?.iter().any(|n| n.ends_with(&suffix)) {
            continue;
        }
        for sub in ["", "vdpau"] {
            let container_dir = dir.container.join(sub);
            let local_dir = local.join(sub);
            for name in names_in(&local_dir)? {
                let wanted = name.ends_with(&suffix) || name.starts_with("libnvidia-nvvm70.so.");
                if !wanted {
                    continue;
                }
                let container = container_dir.join(&name);
                let Some(mount) = file_mount(root, &container, FILE_OPTIONS, Want::File)? else {
                    continue;
                };
                if !seen.insert(mount.container_path.clone()) {
                    continue;
                }
                let links = library_links(&local_dir, &container_dir, &name, &version);
                files.push(DriverFile {
                    mount,
                    kind: FileKind::Library { links },
                    class: capabilities::library_class(&name),
                });
            }
        }
    }

    let driver_dirs: Vec<PathBuf> = files
        .iter()
        .map(|f: &DriverFile| PathBuf::from(f.container_dir()))
        .fold(Vec::new(), |mut v, d| {
            if !v.contains(&d) && !d.ends_with("vdpau") {
                v.push(d);
            }
            v
        });
    files.extend(graphics_libraries(root, &dirs, &version, &mut seen)?);
    files.extend(xorg_modules(root, &driver_dirs, &version)?);
    files.extend(firmware(root, &version)?);

    for candidates in IPC_SOCKETS {
        for path in *candidates {
            if let Some(mount) = file_mount(root, Path::new(path), IPC_OPTIONS, Want::Any)? {
                files.push(DriverFile {
                    mount,
                    kind: FileKind::Ipc,
                    class: None,
                });
                break;
            }
        }
    }

    files.extend(config_files(root)?);

    for bin in BINARIES {
        for dir in BIN_DIRS {
            let container = Path::new(dir).join(bin);
            if let Some(mount) = file_mount(root, &container, FILE_OPTIONS, Want::File)? {
                files.push(DriverFile {
                    mount,
                    kind: FileKind::Binary,
                    class: capabilities::binary_class(bin),
                });
                break;
            }
        }
    }

    Ok(Discovered { version, files })
}

/// The library directories that exist under the root, once each.
fn lib_dirs(root: &NvidiaRoot) -> Result<Vec<LibDir>, CdiError> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for dir in LIB_DIRS {
        let Some(resolved) = resolve_in(&root.local, Path::new(dir))? else {
            continue;
        };
        if !reroot(&root.local, &resolved).is_dir() || !seen.insert(resolved.clone()) {
            continue;
        }
        out.push(LibDir {
            container: PathBuf::from(dir),
            resolved,
        });
    }
    Ok(out)
}

/// The suffix of the first `libcuda.so.<version>` (then `libnvidia-ml.so.<version>`)
/// whose version has a dot: `libcuda.so.1` is a soname, not a version.
fn driver_version(root: &NvidiaRoot, dirs: &[LibDir]) -> Result<String, CdiError> {
    for lib in VERSION_LIBRARIES {
        let prefix = format!("{lib}.");
        for dir in dirs {
            let local = reroot(&root.local, &dir.resolved);
            for name in names_in(&local)? {
                let Some(version) = name.strip_prefix(&prefix) else {
                    continue;
                };
                if !is_driver_version(version) {
                    continue;
                }
                if fs::metadata(local.join(&name)).is_ok_and(|m| m.is_file()) {
                    return Ok(version.to_owned());
                }
            }
        }
    }
    Err(CdiError::NvidiaFilesMissing {
        root: root.local.clone(),
        missing: VERSION_LIBRARIES
            .iter()
            .map(|l| format!("{l}.<version>"))
            .collect(),
    })
}

/// `570.172.08`, `550.90`: numbers separated by dots, at least two of them.
pub(crate) fn is_driver_version(v: &str) -> bool {
    let parts: Vec<&str> = v.split('.').collect();
    parts.len() >= 2
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    /// A regular file (through symlinks).
    File,
    /// Anything that exists: a socket, a directory.
    Any,
}

/// A mount for what a container should see at `container`, if it exists under the
/// root.
///
/// The source is the resolved path, not a symlink: a symlink in a driver root that
/// is not `/` may be absolute and would resolve against the host's own `/`.
fn file_mount(
    root: &NvidiaRoot,
    container: &Path,
    options: &[&str],
    want: Want,
) -> Result<Option<Mount>, CdiError> {
    let Some(resolved) = resolve_in(&root.local, container)? else {
        return Ok(None);
    };
    let local = reroot(&root.local, &resolved);
    match fs::metadata(&local) {
        Ok(m) if want == Want::Any || m.is_file() => {}
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
        options: options.iter().map(|s| (*s).to_owned()).collect(),
    }))
}

/// The UTF-8 names in a directory, sorted; none when it does not exist.
fn names_in(dir: &Path) -> Result<Vec<String>, CdiError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(Vec::new());
        }
        Err(source) => {
            return Err(CdiError::NvidiaRoot {
                path: dir.to_owned(),
                source,
            });
        }
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    Ok(names)
}
