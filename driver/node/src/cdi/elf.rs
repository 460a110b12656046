//! The one thing CDI generation needs from a driver library's ELF headers: its
//! `DT_SONAME`, the name the dynamic loader looks for (`libcuda.so.1` for
//! `libcuda.so.570.172.08`). The container gets a link by that name, as the driver's
//! installer makes on the host and as the NVIDIA Container Toolkit's spec creates.

use std::fs::File;
use std::io;
use std::path::Path;

use object::Endianness;
use object::elf::{DT_SONAME, FileHeader64};
use object::read::ReadCache;
use object::read::elf::{Dyn, FileHeader};

/// Why a library's soname could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SonameError {
    #[error("{0}")]
    Open(#[from] io::Error),
    #[error("not a 64-bit ELF shared object: {0}")]
    Elf(#[from] object::read::Error),
    #[error("its DT_SONAME is not UTF-8")]
    NotUtf8,
    #[error("its DT_SONAME points outside the dynamic string table")]
    BadString,
}

/// The library's `DT_SONAME`, or `None` when it has none. Only the headers and the
/// dynamic section are read (libraries such as `libnvidia-rtcore` are 100 MB).
pub(crate) fn soname(path: &Path) -> Result<Option<String>, SonameError> {
    let file = File::open(path)?;
    let data = ReadCache::new(file);
    let header = FileHeader64::<Endianness>::parse(&data)?;
    let endian = header.endian()?;
    let sections = header.sections(endian, &data)?;
    let table = sections.dynamic_table(endian, &data)?;
    for entry in table.dynamics() {
        if entry.d_tag(endian) == DT_SONAME {
            let offset = u32::try_from(entry.d_val(endian)).map_err(|_| SonameError::BadString)?;
            let name = table
                .strings()
                .get(offset)
                .map_err(|()| SonameError::BadString)?;
            return String::from_utf8(name.to_vec())
                .map(Some)
                .map_err(|_| SonameError::NotUtf8);
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Builds a shared object with `cc`, which every machine that builds Rust has
    /// (rustc links through it).
    fn build_lib(dir: &Path, name: &str, soname: Option<&str>) -> Option<std::path::PathBuf> {
        let src = dir.join("stub.c");
        std::fs::write(&src, "int stub(void) { return 0; }\n").unwrap();
        let out = dir.join(name);
        let mut cc = Command::new("cc");
        cc.args(["-shared", "-fPIC", "-o"]).arg(&out).arg(&src);
        if let Some(s) = soname {
            cc.arg(format!("-Wl,-soname,{s}"));
        }
        match cc.status() {
            Ok(s) if s.success() => Some(out),
            _ => {
                eprintln!("skipping: cc cannot build a shared object here");
                None
            }
        }
    }

    #[test]
    fn reads_the_soname_a_linker_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let Some(lib) = build_lib(dir.path(), "libcuda.so.570.172.08", Some("libcuda.so.1")) else {
            return;
        };
        assert_eq!(soname(&lib).unwrap().as_deref(), Some("libcuda.so.1"));
        let Some(bare) = build_lib(dir.path(), "libbare.so.1.2", None) else {
            return;
        };
        assert_eq!(soname(&bare).unwrap(), None);
    }

    #[test]
    fn refuses_what_is_not_elf() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("libcuda.so.1");
        std::fs::write(&empty, b"").unwrap();
        assert!(matches!(soname(&empty), Err(SonameError::Elf(_))));
        std::fs::write(&empty, b"\x7fELF garbage that is far too short").unwrap();
        assert!(soname(&empty).is_err());
        assert!(matches!(
            soname(&dir.path().join("missing")),
            Err(SonameError::Open(_))
        ));
    }
}
