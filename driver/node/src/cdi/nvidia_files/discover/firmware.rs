//! The driver's GSP firmware, from the kernel's firmware directories.

use super::*;

/// Kernel firmware directories, as the kernel's firmware loader searches them
/// (Documentation/driver-api/firmware/fw_search_path.rst), most specific first.
const FIRMWARE_DIRS: &[&str] = &["/lib/firmware/updates", "/lib/firmware"];

/// GSP firmware of this driver version, from the first firmware directory that has
/// it for the running kernel or for any kernel.
pub(super) fn firmware(root: &NvidiaRoot, version: &str) -> Result<Vec<DriverFile>, CdiError> {
    let release = kernel_release();
    let mut dirs = Vec::new();
    for base in FIRMWARE_DIRS {
        if let Some(r) = &release {
            dirs.push(format!("{base}/{r}"));
        }
        dirs.push((*base).to_owned());
    }
    let mut out = Vec::new();
    let mut names = BTreeSet::new();
    for dir in dirs {
        let container_dir = Path::new(&dir).join("nvidia").join(version);
        let Some(resolved) = resolve_in(&root.local, &container_dir)? else {
            continue;
        };
        let local = reroot(&root.local, &resolved);
        if !local.is_dir() {
            continue;
        }
        for name in names_in(&local)? {
            let firmware =
                (name.starts_with("gsp") || name.starts_with("ucodes")) && name.ends_with(".bin");
            if !firmware || names.contains(&name) {
                continue;
            }
            if let Some(mount) =
                file_mount(root, &container_dir.join(&name), FILE_OPTIONS, Want::File)?
            {
                names.insert(name);
                out.push(DriverFile {
                    mount,
                    kind: FileKind::Firmware,
                    class: None,
                });
            }
        }
    }
    Ok(out)
}

/// The running kernel's release (`uname -r`), which names a firmware directory.
fn kernel_release() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .map(|r| r.trim().to_owned())
        .filter(|r| !r.is_empty())
}
