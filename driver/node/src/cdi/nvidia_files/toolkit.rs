//! Adopting the NVIDIA Container Toolkit's own spec, for nodes where an operator
//! keeps one (`--toolkit-cdi-spec`).
//!
//! The file is read bounded: it must be a regular file of at most
//! [`MAX_SPEC_BYTES`], opened without blocking, so a FIFO, a device (a link to
//! `/dev/zero`), a directory or a huge file is refused at once with what it is,
//! in bounded time and memory, wherever the load runs (at start, or again in a
//! prepare after the file changed). Its content is then taken only as far as driver
//! files can be ([`admit`]).

mod admit;

use std::fs;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde::Deserialize;

use super::{CdiError, Content, NvidiaFiles, NvidiaFilesSource, Witness};
use crate::cdi::spec::{ContainerEdits, Hook, Mount};
pub(crate) use admit::Allowed;

/// The largest toolkit spec read. nvcdi's specs are tens of kilobytes (a few hundred
/// mounts); whatever is adopted goes into every claim's spec.
pub(crate) const MAX_SPEC_BYTES: u64 = 1 << 20;

impl NvidiaFiles {
    /// Takes the top-level mounts, hooks and env of a toolkit-generated spec (JSON
    /// or YAML, by extension; anything else is tried as both).
    pub(crate) fn from_toolkit_spec(path: &Path, allowed: &Allowed<'_>) -> Result<Self, CdiError> {
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
        // The witness is taken before the read, so a rewrite during it is seen as
        // a change next time rather than lost.
        let witness = Witness::of(path);
        let text = read_bounded(path).map_err(|e| match e {
            Bounded::Io(e) => failed(e.to_string(), e.into()),
            Bounded::Refused(reason) => err(reason),
        })?;
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
        let (edits, dropped) = admit::admit(edits.env, edits.mounts, edits.hooks, allowed);
        for what in &dropped {
            tracing::warn!(spec = %path.display(), dropped = %what, "toolkit CDI spec: not adopted");
        }
        if edits.mounts.is_empty() {
            return Err(err(format!(
                "it has no top-level containerEdits.mounts that can be adopted, so containers \
                 would get no driver libraries{}",
                if dropped.is_empty() {
                    String::new()
                } else {
                    format!(" (dropped: {})", dropped.join("; "))
                }
            )));
        }
        Ok(Self {
            source: NvidiaFilesSource::Toolkit {
                spec: path.to_owned(),
            },
            content: Content::Fixed(ContainerEdits {
                env: edits.env,
                mounts: edits.mounts,
                hooks: edits.hooks,
                ..Default::default()
            }),
            witness: Some(witness),
            dropped,
        })
    }
}

enum Bounded {
    Io(std::io::Error),
    Refused(String),
}

/// The file's text: a regular file of at most [`MAX_SPEC_BYTES`], opened with
/// `O_NONBLOCK` so that opening a FIFO returns at once (and is then refused as one).
fn read_bounded(path: &Path) -> Result<String, Bounded> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(Bounded::Io)?;
    let meta = file.metadata().map_err(Bounded::Io)?;
    if !meta.is_file() {
        let ft = meta.file_type();
        use std::os::unix::fs::FileTypeExt;
        let what = if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_char_device() || ft.is_block_device() {
            "a device"
        } else if ft.is_dir() {
            "a directory"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(Bounded::Refused(format!(
            "it is {what}, not a regular file"
        )));
    }
    if meta.len() > MAX_SPEC_BYTES {
        return Err(Bounded::Refused(format!(
            "it has {} bytes, more than the {MAX_SPEC_BYTES} a toolkit spec can have",
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    // A file that grew since the stat still stops at the bound.
    file.take(MAX_SPEC_BYTES.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(Bounded::Io)?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > MAX_SPEC_BYTES {
        return Err(Bounded::Refused(format!(
            "it grew past {MAX_SPEC_BYTES} bytes while read"
        )));
    }
    String::from_utf8(bytes).map_err(|_| Bounded::Refused("it is not UTF-8 text".into()))
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
