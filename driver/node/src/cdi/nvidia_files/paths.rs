//! Paths inside a driver root: where they are on this machine, and how they resolve
//! through the root's own symlinks without escaping it.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use super::CdiError;

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
