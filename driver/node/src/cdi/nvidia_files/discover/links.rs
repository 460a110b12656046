//! The links a container gets for each driver library, as the toolkit makes them.

use super::*;

/// The links for library `name` in `container_dir`, as the toolkit makes them:
/// - `libcuda.so -> libcuda.so.1` (applications dlopen the unversioned name),
///   `libGLX_indirect.so.0` for GLVND, and the missing
///   `libnvidia-opticalflow.so`;
/// - `<soname> -> <file>` and `<name>.so -> <soname>`, each only where the host
///   has that link too;
/// - GBM's `gbm/nvidia-drm_gbm.so` and Vulkan's `libnvidia-vulkan-producer.so`.
pub(super) fn library_links(
    local_dir: &Path,
    container_dir: &Path,
    name: &str,
    version: &str,
) -> Vec<Link> {
    let at = |link: &str| container_dir.join(link).to_string_lossy().into_owned();
    let mut links = Vec::new();
    let versioned = |lib: &str| name == format!("{lib}.{version}");
    if versioned("libcuda.so") {
        links.push(Link {
            target: "libcuda.so.1".into(),
            link: at("libcuda.so"),
        });
    } else if versioned("libGLX_nvidia.so") {
        links.push(Link {
            target: name.into(),
            link: at("libGLX_indirect.so.0"),
        });
    } else if versioned("libnvidia-opticalflow.so") {
        links.push(Link {
            target: "libnvidia-opticalflow.so.1".into(),
            link: at("libnvidia-opticalflow.so"),
        });
    } else if versioned("libnvidia-allocator.so") {
        // GBM looks its backends up by name in gbm/.
        links.push(Link {
            target: "../libnvidia-allocator.so.1".into(),
            link: at("gbm/nvidia-drm_gbm.so"),
        });
    } else if versioned("libnvidia-vulkan-producer.so") {
        links.push(Link {
            target: name.into(),
            link: at("libnvidia-vulkan-producer.so"),
        });
    }
    let soname = match elf::soname(&local_dir.join(name)) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(library = %local_dir.join(name).display(), error = %e,
                "cannot read the library's soname; the container gets no soname link for it");
            None
        }
    };
    if let Some(soname) = soname.as_deref().filter(|s| *s != name)
        && is_symlink(&local_dir.join(soname))
    {
        links.push(Link {
            target: name.into(),
            link: at(soname),
        });
    }
    let so_target = soname.as_deref().unwrap_or(name);
    if let Some(dev_link) = so_target.find(".so").map(|i| &so_target[..i + 3])
        && dev_link != so_target
        && is_symlink(&local_dir.join(dev_link))
    {
        links.push(Link {
            target: so_target.into(),
            link: at(dev_link),
        });
    }
    links
}

fn is_symlink(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}
