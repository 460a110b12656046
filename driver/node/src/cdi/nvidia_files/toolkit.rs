//! Adopting the NVIDIA Container Toolkit's own spec, for nodes where an operator
//! keeps one (`--toolkit-cdi-spec`).

use std::fs;
use std::path::Path;

use serde::Deserialize;

use super::{CdiError, Content, NvidiaFiles, NvidiaFilesSource, Witness};
use crate::cdi::spec::{ContainerEdits, Hook, Mount};

impl NvidiaFiles {
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
        // The witness is taken before the read, so a rewrite during it is seen as
        // a change next time rather than lost.
        let witness = Witness::of(path);
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
            content: Content::Fixed(ContainerEdits {
                env: edits.env,
                mounts: edits.mounts,
                hooks: edits.hooks,
                ..Default::default()
            }),
            witness: Some(witness),
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
