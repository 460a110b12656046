//! The driver's files for graphics: the loaders' config files, the EGL platform
//! libraries (versioned on their own) and the X server's modules.

use super::*;

/// The driver's config files for graphics loaders (GLVND's EGL vendor list, EGL
/// external platforms, Vulkan ICDs, OptiX, X11), and OpenCL's ICD: each at the
/// standard place in the container, wherever the host has it, so that the image's
/// loaders find it. Found in `/etc` and the XDG data directories, in that order.
/// (The toolkit's graphics discovery; its X server module files are left out: no
/// container runs the host's X server.)
const CONFIG_FILES: &[(&str, &str, Option<DriverCapability>)] = &[
    (
        "glvnd/egl_vendor.d/10_nvidia.json",
        "/usr/share",
        Some(DriverCapability::Graphics),
    ),
    (
        "egl/egl_external_platform.d/15_nvidia_gbm.json",
        "/usr/share",
        Some(DriverCapability::Graphics),
    ),
    (
        "egl/egl_external_platform.d/10_nvidia_wayland.json",
        "/usr/share",
        Some(DriverCapability::Graphics),
    ),
    (
        "egl/egl_external_platform.d/09_nvidia_wayland2.json",
        "/usr/share",
        Some(DriverCapability::Graphics),
    ),
    (
        "egl/egl_external_platform.d/20_nvidia_xcb.json",
        "/usr/share",
        Some(DriverCapability::Graphics),
    ),
    (
        "egl/egl_external_platform.d/20_nvidia_xlib.json",
        "/usr/share",
        Some(DriverCapability::Graphics),
    ),
    (
        "nvidia/nvoptix.bin",
        "/usr/share",
        Some(DriverCapability::Graphics),
    ),
    (
        "X11/xorg.conf.d/10-nvidia.conf",
        "/usr/share",
        Some(DriverCapability::Graphics),
    ),
    (
        "X11/xorg.conf.d/nvidia-drm-outputclass.conf",
        "/usr/share",
        Some(DriverCapability::Graphics),
    ),
    (
        "OpenCL/vendors/nvidia.icd",
        "/etc",
        Some(DriverCapability::Compute),
    ),
    (
        "vulkan/icd.d/nvidia_icd.json",
        "/etc",
        Some(DriverCapability::Graphics),
    ),
    (
        "vulkan/icd.d/nvidia_layers.json",
        "/etc",
        Some(DriverCapability::Graphics),
    ),
    (
        "vulkan/implicit_layer.d/nvidia_layers.json",
        "/etc",
        Some(DriverCapability::Graphics),
    ),
    // RPM packages name the ICD by architecture.
    (
        "vulkan/icd.d/nvidia_icd.x86_64.json",
        "/etc",
        Some(DriverCapability::Graphics),
    ),
    (
        "vulkan/icd.d/nvidia_icd.aarch64.json",
        "/etc",
        Some(DriverCapability::Graphics),
    ),
];

/// Where config files are looked for: `/etc`, then the XDG data directories'
/// defaults. Vulkan files are also looked for at the root itself (GKE's driver
/// installer puts them in `<root>/vulkan`).
const CONFIG_DIRS: &[&str] = &["/etc", "/usr/local/share", "/usr/share"];

/// The driver's config files, each from the first directory that has it.
pub(super) fn config_files(root: &NvidiaRoot) -> Result<Vec<DriverFile>, CdiError> {
    let mut out = Vec::new();
    let mut sources = BTreeSet::new();
    for (target, container_root, class) in CONFIG_FILES {
        let vulkan = target.starts_with("vulkan/");
        let dirs = CONFIG_DIRS.iter().copied().chain(vulkan.then_some("/"));
        for dir in dirs {
            let Some(mut mount) =
                file_mount(root, &Path::new(dir).join(target), FILE_OPTIONS, Want::File)?
            else {
                continue;
            };
            if sources.insert(mount.host_path.clone()) {
                mount.container_path = format!("{container_root}/{target}");
                out.push(DriverFile {
                    mount,
                    kind: FileKind::Config,
                    class: *class,
                });
            }
            break;
        }
    }
    Ok(out)
}

/// The EGL platform libraries, which carry versions of their own
/// (`libnvidia-egl-wayland.so.1.1.17`): the first of each in the library
/// directories.
const GRAPHICS_LIBRARIES: &[&str] = &[
    "libnvidia-egl-gbm.so.",
    "libnvidia-egl-wayland.so.",
    "libnvidia-egl-wayland2.so.",
    "libnvidia-egl-xcb.so.",
    "libnvidia-egl-xlib.so.",
];

pub(super) fn graphics_libraries(
    root: &NvidiaRoot,
    dirs: &[LibDir],
    version: &str,
    seen: &mut BTreeSet<String>,
) -> Result<Vec<DriverFile>, CdiError> {
    let mut out = Vec::new();
    for prefix in GRAPHICS_LIBRARIES {
        'dirs: for dir in dirs {
            let local = reroot(&root.local, &dir.resolved);
            for name in names_in(&local)? {
                // `<prefix>*.*`, as the toolkit matches them: a version with a dot.
                let versioned = name
                    .strip_prefix(prefix)
                    .is_some_and(|v| v.contains('.') && !v.starts_with('.') && v != version);
                if !versioned {
                    continue;
                }
                let container = dir.container.join(&name);
                let Some(mount) = file_mount(root, &container, FILE_OPTIONS, Want::File)? else {
                    continue;
                };
                if seen.insert(mount.container_path.clone()) {
                    out.push(DriverFile {
                        mount,
                        kind: FileKind::Library { links: Vec::new() },
                        class: Some(DriverCapability::Graphics),
                    });
                }
                break 'dirs;
            }
        }
    }
    Ok(out)
}

/// The X server's NVIDIA modules, for containers that run their own X server
/// (virtual desktops): the first place each is found, next to the driver's
/// libraries or in the X server's module directories.
pub(super) fn xorg_modules(
    root: &NvidiaRoot,
    driver_dirs: &[PathBuf],
    version: &str,
) -> Result<Vec<DriverFile>, CdiError> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let module_dirs = |base: &Path| -> Vec<PathBuf> {
        ["drivers", "extensions"]
            .into_iter()
            .flat_map(|kind| {
                [
                    base.join("modules").join(kind),
                    base.join("modules/updates").join(kind),
                ]
            })
            .collect()
    };
    for lib in driver_dirs {
        dirs.push(lib.join("nvidia/xorg"));
        dirs.extend(module_dirs(&lib.join("xorg")));
    }
    for base in [
        "/usr/lib/xorg",
        "/usr/lib64/xorg",
        "/usr/X11R6/lib",
        "/usr/X11R6/lib64",
    ] {
        dirs.extend(module_dirs(Path::new(base)));
    }
    let glx = format!("libglxserver_nvidia.so.{version}");
    let mut out = Vec::new();
    for name in ["nvidia_drv.so", glx.as_str()] {
        for dir in &dirs {
            let container = dir.join(name);
            let Some(mount) = file_mount(root, &container, FILE_OPTIONS, Want::File)? else {
                continue;
            };
            let mut links = Vec::new();
            if name == glx {
                links.push(Link {
                    target: name.to_owned(),
                    link: dir
                        .join("libglxserver_nvidia.so")
                        .to_string_lossy()
                        .into_owned(),
                });
            }
            out.push(DriverFile {
                mount,
                kind: FileKind::XorgModule { links },
                class: Some(DriverCapability::Graphics),
            });
            break;
        }
    }
    Ok(out)
}
