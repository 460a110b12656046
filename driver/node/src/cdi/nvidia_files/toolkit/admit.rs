//! What of a toolkit spec's edits is taken: only what driver files can be.
//!
//! The spec is host root's file, so this is defence in depth, but whatever is adopted
//! goes into every claim's container. `nvidia-ctk cdi generate` (nvcdi) writes
//! read-only bind mounts of the driver's libraries, binaries, firmware and IPC
//! sockets at the path they have on the host (below the driver root when there is
//! one), `createContainer` hooks that run its `nvidia-cdi-hook` (or `nvidia-ctk
//! hook`) with one of a few subcommands, and `NVIDIA_CTK_*` variables. Anything else
//! (a mount of `/etc/shadow` or of `/`, a writable mount, one over topodra's own
//! `void` device list, `LD_PRELOAD`, any other binary as a hook) is dropped and
//! named, so the operator sees it in the log and an Event.

use std::path::{Component, Path};

use crate::cdi::claim::{ENV_VISIBLE_DEVICES_VOID, VOID_DEVICE_LIST_MOUNT};
use crate::cdi::hooks::{self, CREATE_CONTAINER};
use crate::cdi::spec::{ContainerEdits, Hook, Mount};

/// Directories the driver's files live in on a host (or below a driver root), as the
/// toolkit finds them: libraries and firmware, binaries, IPC sockets, and the data and
/// config files of the graphics and Vulkan capabilities. A mount must lie strictly
/// below one of them.
const DRIVER_LOCATIONS: &[&str] = &[
    "/usr/lib",
    "/usr/lib32",
    "/usr/lib64",
    "/lib",
    "/lib32",
    "/lib64",
    "/usr/local/lib",
    "/usr/local/nvidia",
    "/usr/bin",
    "/usr/sbin",
    "/bin",
    "/sbin",
    "/usr/local/bin",
    "/run/nvidia-persistenced",
    "/var/run/nvidia-persistenced",
    "/run/nvidia-fabricmanager",
    "/var/run/nvidia-fabricmanager",
    "/tmp/nvidia-mps",
    "/usr/share/nvidia",
    "/usr/share/vulkan",
    "/usr/share/egl",
    "/usr/share/glvnd",
    "/usr/share/X11",
    "/etc/vulkan",
    "/etc/OpenCL/vendors",
    "/etc/nvidia",
];

/// Where the driver's daemons keep their sockets, which nvcdi mounts without `ro`.
const IPC_LOCATIONS: &[&str] = &[
    "/run/nvidia-persistenced",
    "/var/run/nvidia-persistenced",
    "/run/nvidia-fabricmanager",
    "/var/run/nvidia-fabricmanager",
    "/tmp/nvidia-mps",
];

/// The mount options nvcdi writes; a mount with any other (`rw`, `exec`, `dev`,
/// `suid`, ...) is dropped.
const MOUNT_OPTIONS: &[&str] = &[
    "ro", "nosuid", "nodev", "noexec", "bind", "rbind", "private", "rprivate", "slave", "rslave",
];

/// The hook subcommands the toolkit's specs run.
const HOOK_SUBCOMMANDS: &[&str] = &[
    hooks::CREATE_SYMLINKS,
    hooks::UPDATE_LDCACHE,
    hooks::ENABLE_CUDA_COMPAT,
    hooks::DISABLE_DEVICE_NODE_MODIFICATION,
    hooks::UPDATE_APPLICATION_PROFILE,
    "chmod",
];

/// At most this many mounts, hooks and variables are taken (a real spec has a few
/// hundred mounts and a handful of the others); the rest is dropped, so one spec
/// cannot make every claim's spec huge.
pub(super) const MAX_MOUNTS: usize = 2048;
pub(super) const MAX_HOOKS: usize = 64;
pub(super) const MAX_ENV: usize = 64;

/// Where a hook binary may be: the driver locations, the driver root, or the hook
/// the plugin installed.
#[derive(Debug)]
pub(crate) struct Allowed<'a> {
    /// The driver root as the host sees it (`/` for a host install).
    pub(crate) driver_root: &'a Path,
    /// The `nvidia-cdi-hook` the plugin installed.
    pub(crate) hook_path: &'a Path,
}

/// Where the GPU Operator's driver container puts the driver's root on the host.
const GPU_OPERATOR_DRIVER_ROOT: &str = "/run/nvidia/driver";

impl Allowed<'_> {
    /// The roots a toolkit spec's host paths may be below.
    fn roots(&self) -> impl Iterator<Item = &Path> {
        [
            self.driver_root,
            Path::new("/"),
            Path::new(GPU_OPERATOR_DRIVER_ROOT),
        ]
        .into_iter()
    }

    /// Whether a host path lies below one of the roots, in a place driver files are.
    fn is_driver_file(&self, host: &Path) -> bool {
        self.roots().any(|root| {
            host.strip_prefix(root)
                .is_ok_and(|rel| in_driver_location(&Path::new("/").join(rel)))
        })
    }
}

/// The edits taken, and one line per thing dropped, naming it and why.
pub(super) fn admit(
    env: Vec<String>,
    mounts: Vec<Mount>,
    hook_list: Vec<Hook>,
    allowed: &Allowed<'_>,
) -> (ContainerEdits, Vec<String>) {
    let mut dropped = Vec::new();
    let edits = ContainerEdits {
        mounts: take(
            mounts.into_iter().filter(|m| !is_own_void_mount(m)),
            MAX_MOUNTS,
            "mounts",
            |m| mount_problem(m, allowed),
            |m| format!("mount {:?} -> {:?}", m.host_path, m.container_path),
            &mut dropped,
        ),
        hooks: take(
            hook_list,
            MAX_HOOKS,
            "hooks",
            |h| hook_problem(h, allowed),
            |h| format!("hook {:?} {:?}", h.path, h.args),
            &mut dropped,
        ),
        env: take(
            env,
            MAX_ENV,
            "variables",
            |e| env_problem(e),
            |e| format!("env {:?}", key_of(e)),
            &mut dropped,
        ),
        ..ContainerEdits::default()
    };
    (edits, dropped)
}

/// The items without a `problem`, at most `max` of them; each other one is named in
/// `dropped` with why.
fn take<T>(
    items: impl IntoIterator<Item = T>,
    max: usize,
    plural: &str,
    problem: impl Fn(&T) -> Option<&'static str>,
    name: impl Fn(&T) -> String,
    dropped: &mut Vec<String>,
) -> Vec<T> {
    let mut taken = Vec::new();
    for item in items {
        match problem(&item) {
            Some(why) => dropped.push(format!("{}: {why}", name(&item))),
            None if taken.len() >= max => {
                dropped.push(format!("{}: more than {max} {plural}", name(&item)));
            }
            None => taken.push(item),
        }
    }
    taken
}

/// An absolute path with only plain components: no `.`, `..` or empty ones, so that
/// what it names is what the prefix checks see.
fn is_plain_absolute(p: &str) -> bool {
    let path = Path::new(p);
    p.starts_with('/')
        && !p.contains("//")
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && !p.ends_with("/.")
}

/// Strictly below one of the driver locations.
fn in_driver_location(p: &Path) -> bool {
    below(DRIVER_LOCATIONS, p)
}

/// Strictly below one of `locations`.
fn below(locations: &[&str], p: &Path) -> bool {
    locations.iter().any(|loc| {
        p.strip_prefix(loc)
            .is_ok_and(|rest| !rest.as_os_str().is_empty())
    })
}

/// The toolkit's own `/dev/null` over the device list, which topodra's claim spec
/// already mounts the same way: left out without a word.
fn is_own_void_mount(m: &Mount) -> bool {
    m.host_path == "/dev/null" && m.container_path == VOID_DEVICE_LIST_MOUNT
}

fn mount_problem(m: &Mount, allowed: &Allowed<'_>) -> Option<&'static str> {
    if !is_plain_absolute(&m.host_path) || !is_plain_absolute(&m.container_path) {
        return Some("not a plain absolute path");
    }
    let container = Path::new(&m.container_path);
    let void = Path::new(VOID_DEVICE_LIST_MOUNT);
    if container.starts_with(void.parent().unwrap_or(void)) {
        return Some("it would replace topodra's device list mount");
    }
    if !in_driver_location(container) {
        return Some("not a place driver files are");
    }
    // The source is a driver file below a root: the configured driver root, the
    // host's, or the GPU Operator's driver container's (a toolkit spec may have been
    // generated for another root than the plugin's). Usually at the container path
    // below it; not always (nvcdi mounts Vulkan's ICD files from /usr/share/vulkan at
    // /etc/vulkan).
    if !allowed.is_driver_file(Path::new(&m.host_path)) {
        return Some("the host file is not a driver file below a driver root");
    }
    if m.kind.as_deref().is_some_and(|k| k != "bind") {
        return Some("not a bind mount");
    }
    // IPC sockets are the exception nvcdi makes: a client writes to them.
    if !m.options.iter().any(|o| o == "ro") && !below(IPC_LOCATIONS, container) {
        return Some("not read-only");
    }
    if m.options
        .iter()
        .any(|o| !MOUNT_OPTIONS.contains(&o.as_str()))
    {
        return Some("an option the toolkit does not write");
    }
    None
}

fn hook_problem(h: &Hook, allowed: &Allowed<'_>) -> Option<&'static str> {
    if h.hook_name != CREATE_CONTAINER {
        return Some("not a createContainer hook");
    }
    if !is_plain_absolute(&h.path) {
        return Some("not a plain absolute path");
    }
    let path = Path::new(&h.path);
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if !matches!(name, "nvidia-cdi-hook" | "nvidia-ctk") {
        return Some("not the toolkit's hook binary");
    }
    if path != allowed.hook_path && !allowed.is_driver_file(path) {
        return Some("the hook binary is not where driver tools are");
    }
    if h.args.first().map(String::as_str) != Some(name) {
        return Some("argv[0] is not the binary's name");
    }
    if name == "nvidia-ctk" && h.args.get(1).map(String::as_str) != Some("hook") {
        return Some("not an nvidia-ctk hook");
    }
    if !hooks::hook_name(h).is_some_and(|s| HOOK_SUBCOMMANDS.contains(&s)) {
        return Some("a subcommand the toolkit's specs do not run");
    }
    if h.env.iter().any(|e| env_problem(e).is_some()) {
        return Some("an environment variable other than NVIDIA_CTK_*");
    }
    None
}

/// `NVIDIA_CTK_*` (the toolkit's own, `NVIDIA_CTK_LIBCUDA_DIR` and
/// `NVIDIA_CTK_DEBUG`), and `NVIDIA_VISIBLE_DEVICES=void`, which topodra sets anyway.
fn env_problem(e: &str) -> Option<&'static str> {
    let key = key_of(e);
    if e == ENV_VISIBLE_DEVICES_VOID {
        return None;
    }
    if key == "NVIDIA_VISIBLE_DEVICES" {
        return Some("topodra's NVIDIA_VISIBLE_DEVICES=void stays");
    }
    if !e.contains('=') {
        return Some("not KEY=VALUE");
    }
    match key.strip_prefix("NVIDIA_CTK_") {
        Some(rest)
            if !rest.is_empty()
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_') =>
        {
            None
        }
        _ => Some("not a toolkit variable (NVIDIA_CTK_*)"),
    }
}

fn key_of(e: &str) -> &str {
    e.split_once('=').map_or(e, |(k, _)| k)
}

#[cfg(test)]
mod tests;
