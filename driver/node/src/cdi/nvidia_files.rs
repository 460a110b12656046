//! The NVIDIA user-space driver files a GPU container needs (libraries, tools,
//! firmware, IPC sockets), bind-mounted read-only at the path they have on the host,
//! and the hooks that make them usable inside any image.
//!
//! They come from one of two places:
//! - our own discovery under a driver root ([`NvidiaRoot`], see `discover`): `/` for
//!   a driver installed on the host, `/run/nvidia/driver` for the GPU Operator's
//!   driver container. It finds what the NVIDIA Container Toolkit's `nvcdi` finds and
//!   builds the same hooks, with our installed `nvidia-cdi-hook`;
//! - a spec the NVIDIA Container Toolkit generated (`nvidia-ctk cdi generate`), whose
//!   claim-wide mounts, hooks and env we adopt as they are. Its device nodes are not
//!   adopted: ours carry the exact majors and only the claim's GPUs.
//!
//! Either way the files can go stale: a driver upgrade replaces the versioned
//! libraries, and the toolkit rewrites its spec. [`NvidiaFiles::is_current`] tells
//! when to load again.

mod discover;
mod paths;
mod toolkit;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use super::capabilities::{DriverCapabilities, DriverCapability};
use super::hooks::{HookBinary, Link};
use super::spec::{ContainerEdits, Hook};
use super::{CdiConfig, CdiError};
pub(crate) use discover::{DriverFile, FileKind};
pub(crate) use paths::{reroot, resolve_in};

/// The env var the toolkit's specs carry with the directories of `libcuda.so`
/// (`:`-separated), which CUDA forward-compatibility setups read.
const ENV_LIBCUDA_DIR: &str = "NVIDIA_CTK_LIBCUDA_DIR";

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

/// Claim-wide edits for the driver's user-space files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvidiaFiles {
    pub source: NvidiaFilesSource,
    content: Content,
    /// What was read, to tell when it changed.
    witness: Option<Witness>,
    /// What of a toolkit spec was not adopted, one line each (what and why).
    dropped: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Content {
    /// Our discovery, filtered per claim by its capabilities.
    Discovered {
        version: String,
        files: Vec<DriverFile>,
        hook: HookBinary,
    },
    /// Used as they are: a toolkit spec's edits, or fixed edits (tests).
    Fixed(ContainerEdits),
}

/// Identity of the file a load depended on: the toolkit spec, or the versioned
/// `libcuda` a discovery found. A change of any field (a rewrite, an upgrade that
/// removed the file) means the load is stale.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Witness {
    path: PathBuf,
    stamp: Option<(u64, u64, i64, i64, u64)>,
}

impl Witness {
    fn of(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            stamp: stamp(path),
        }
    }
}

fn stamp(path: &Path) -> Option<(u64, u64, i64, i64, u64)> {
    fs::metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.len()))
}

impl NvidiaFiles {
    /// Adopts the configured toolkit spec when the file exists, and discovers under
    /// the driver root otherwise. A toolkit spec that exists but cannot be used is an
    /// error rather than a fallback: the operator asked for it, and containers would
    /// silently get a different set of files.
    pub fn load(config: &CdiConfig) -> Result<Self, CdiError> {
        if let Some(path) = &config.toolkit_spec {
            if path.exists() {
                let root = config.driver_root();
                let allowed = toolkit::Allowed {
                    driver_root: &root.host,
                    hook_path: &config.hook_path,
                };
                return Self::from_toolkit_spec(path, &allowed);
            }
            tracing::info!(
                spec = %path.display(),
                "toolkit CDI spec not present; discovering driver files ourselves"
            );
        }
        Self::discover(&config.driver_root(), &config.hook_path)
    }

    /// Whether a [`NvidiaFiles::load`] now would read the same thing: the toolkit
    /// spec (or its absence) is unchanged, and the discovered driver's `libcuda`
    /// is still the file it was. One or two `stat`s, cheap enough for every prepare.
    pub fn is_current(&self, config: &CdiConfig) -> bool {
        let toolkit_now = config.toolkit_spec.as_deref().filter(|p| p.exists());
        match (&self.source, toolkit_now) {
            (NvidiaFilesSource::Toolkit { spec }, Some(now)) if spec == now => {}
            (NvidiaFilesSource::Discovered { .. }, None) => {}
            _ => return false,
        }
        self.witness
            .as_ref()
            .is_none_or(|w| stamp(&w.path) == w.stamp)
    }

    /// Edits used as they are for every claim, whatever its capabilities (tests and
    /// fuzzing build claims without a driver root).
    pub fn fixed(source: NvidiaFilesSource, edits: ContainerEdits) -> Self {
        Self {
            source,
            content: Content::Fixed(edits),
            witness: None,
            dropped: Vec::new(),
        }
    }

    /// What of a toolkit spec was not adopted, one line each naming it and why;
    /// empty for discovered files.
    pub fn dropped(&self) -> &[String] {
        &self.dropped
    }

    /// The hook binary the claim-wide hooks run (a toolkit spec's own), for the
    /// per-device hooks; `None` for a toolkit spec without hooks.
    pub(crate) fn hook(&self) -> Option<HookBinary> {
        match &self.content {
            Content::Discovered { hook, .. } => Some(hook.clone()),
            Content::Fixed(edits) => edits
                .hooks
                .first()
                .map(|h| HookBinary::new(Path::new(&h.path))),
        }
    }

    /// The driver root as the host sees it, when our discovery found the files.
    pub(crate) fn host_root(&self) -> Option<&Path> {
        match (&self.source, &self.content) {
            (NvidiaFilesSource::Discovered { root }, Content::Discovered { .. }) => Some(root),
            _ => None,
        }
    }

    /// The driver version, when our discovery found the files.
    pub fn driver_version(&self) -> Option<&str> {
        match &self.content {
            Content::Discovered { version, .. } => Some(version),
            Content::Fixed(_) => None,
        }
    }

    /// How many files a container with every capability gets.
    pub fn file_count(&self) -> usize {
        match &self.content {
            Content::Discovered { files, .. } => files.len(),
            Content::Fixed(edits) => edits.mounts.len(),
        }
    }

    /// Finds the driver's files under `root`; specs run `hook` for their hooks.
    pub(crate) fn discover(root: &NvidiaRoot, hook: &Path) -> Result<Self, CdiError> {
        let found = discover::discover(root)?;
        let witness = found
            .files
            .iter()
            .find(|f| {
                matches!(f.kind, FileKind::Library { .. })
                    && Path::new(&f.mount.container_path)
                        .file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("libcuda.so."))
            })
            .or_else(|| {
                found
                    .files
                    .iter()
                    .find(|f| matches!(f.kind, FileKind::Library { .. }))
            })
            .map(|f| {
                let rel = Path::new(&f.mount.host_path)
                    .strip_prefix(&root.host)
                    .map(Path::to_owned)
                    .unwrap_or_default();
                Witness::of(&reroot(&root.local, &Path::new("/").join(rel)))
            });
        Ok(Self {
            source: NvidiaFilesSource::Discovered {
                root: root.host.clone(),
            },
            content: Content::Discovered {
                version: found.version,
                files: found.files,
                hook: HookBinary::new(hook),
            },
            witness,
            dropped: Vec::new(),
        })
    }

    /// The claim-wide edits for containers with `caps`: mounts, hooks, env.
    pub fn edits(&self, caps: &DriverCapabilities) -> ContainerEdits {
        let (version, files, hook) = match &self.content {
            Content::Fixed(edits) => return edits.clone(),
            Content::Discovered {
                version,
                files,
                hook,
            } => (version, files, hook),
        };
        let files: Vec<&DriverFile> = files.iter().filter(|f| caps.admits(f.class)).collect();

        let mut links: Vec<Link> = Vec::new();
        let mut lib_dirs: Vec<String> = Vec::new();
        let mut libcuda_dirs: Vec<String> = Vec::new();
        for f in &files {
            let own = match &f.kind {
                FileKind::Library { links } | FileKind::XorgModule { links } => links,
                _ => continue,
            };
            for l in own {
                if !links.iter().any(|have| have.link == l.link) {
                    links.push(l.clone());
                }
            }
            if !matches!(f.kind, FileKind::Library { .. }) {
                continue;
            }
            let dir = f.container_dir().to_owned();
            let name = f
                .mount
                .container_path
                .rsplit('/')
                .next()
                .unwrap_or_default();
            if name.starts_with("libcuda.so.") && !libcuda_dirs.contains(&dir) {
                libcuda_dirs.push(dir.clone());
            }
            if !lib_dirs.contains(&dir) {
                lib_dirs.push(dir);
            }
        }
        links.sort();

        // The toolkit's order: links first (ldconfig then sees them), the compat
        // libraries' directory before the cache is rebuilt, the cache, and last the
        // switch that keeps the driver from creating nodes.
        let mut hooks: Vec<Hook> = Vec::new();
        hooks.extend(hook.create_symlinks(&links));
        if !libcuda_dirs.is_empty() {
            hooks.push(hook.enable_cuda_compat(version));
        }
        hooks.extend(hook.update_ldcache(&lib_dirs));
        hooks.push(hook.disable_device_node_modification());
        if caps.contains(DriverCapability::Graphics) {
            hooks.push(hook.update_application_profile());
        }

        let mut env = Vec::new();
        if !libcuda_dirs.is_empty() {
            env.push(format!("{ENV_LIBCUDA_DIR}={}", libcuda_dirs.join(":")));
        }
        ContainerEdits {
            env,
            hooks,
            mounts: files.iter().map(|f| f.mount.clone()).collect(),
            ..Default::default()
        }
    }
}

/// The driver's files as the next claim should get them: loaded again, before a
/// spec is built, when [`NvidiaFiles::is_current`] says the load is stale (a driver
/// upgrade, the toolkit rewriting its spec, a toolkit spec appearing or going).
/// Clones share one current load.
#[derive(Debug, Clone)]
pub struct DriverFiles {
    /// `None`: fixed files, never loaded again.
    config: Option<CdiConfig>,
    current: Arc<Mutex<Arc<NvidiaFiles>>>,
}

impl DriverFiles {
    /// The first load; an error here is a start-up error.
    pub fn load(config: &CdiConfig) -> Result<Self, CdiError> {
        let files = NvidiaFiles::load(config)?;
        Ok(Self {
            config: Some(config.clone()),
            current: Arc::new(Mutex::new(Arc::new(files))),
        })
    }

    /// The files as they are now, loaded again first if they changed. A failed
    /// load is returned rather than the stale files, which would name libraries
    /// an upgrade removed; the next call tries again.
    pub fn current(&self) -> Result<Arc<NvidiaFiles>, CdiError> {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(config) = &self.config else {
            return Ok(current.clone());
        };
        if current.is_current(config) {
            return Ok(current.clone());
        }
        let before = (
            current.source.clone(),
            current.driver_version().map(str::to_owned),
        );
        match NvidiaFiles::load(config) {
            Ok(files) => {
                tracing::info!(
                    was = ?before.0, was_version = ?before.1,
                    now = ?files.source, now_version = ?files.driver_version(),
                    files = files.file_count(),
                    "the driver's files changed; loaded them again for new claims"
                );
                *current = Arc::new(files);
                Ok(current.clone())
            }
            Err(e) => {
                tracing::error!(error = %e, "the driver's files changed and cannot be loaded again");
                Err(e)
            }
        }
    }
}

#[cfg(test)]
impl DriverFiles {
    /// Holds the lock a load runs under: while held, [`DriverFiles::current`] waits,
    /// as it would on a read that does not return.
    pub(crate) fn hold(&self) -> std::sync::MutexGuard<'_, Arc<NvidiaFiles>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl From<NvidiaFiles> for DriverFiles {
    /// Fixed files, used as they are for as long as the holder lives.
    fn from(files: NvidiaFiles) -> Self {
        Self {
            config: None,
            current: Arc::new(Mutex::new(Arc::new(files))),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
