//! The opaque device config API (`gpu.topodra.dev`) and its strict decoder.
//!
//! DeviceClasses and ResourceClaims carry `config: [{requests, opaque: {driver,
//! parameters}}]`; the allocation result repeats them with a `source`. For the entries
//! whose `driver` is ours, `parameters` is a versioned, Kubernetes-style object:
//!
//! ```json
//! {
//!   "apiVersion": "gpu.topodra.dev/v1alpha1",
//!   "kind": "GpuConfig",
//!   "sharing": {"strategy": "TimeSlicing"},
//!   "numa": {"exportHints": true, "requireAligned": false}
//! }
//! ```
//!
//! `sharing.strategy` is `Exclusive` (default), `TimeSlicing` (with an optional
//! `timeSlicing: {interval: Default | Short | Medium | Long}`) or `MPS` (with an
//! optional `mps` block); only the block that matches the strategy may be present.
//! MPS and an interval other than `Default` decode, so configs written for this
//! schema keep their shape, but a claim cannot have them: a GPU's sharing mode is
//! the device the scheduler allocates (MPS: the class `mps.<domain>`) and its interval
//! is the node's. Converting to `EffectiveConfig` refuses them, naming the field and
//! what to do instead (and the chart's admission policy refuses them at `kubectl
//! apply`).
//!
//! Decoding is strict: an unknown field, a wrong type, an unserved apiVersion or kind,
//! or a value out of range refuses the claim with a message that names the field
//! path. A typo that was silently ignored would leave a workload running with a
//! configuration nobody asked for, which is harder to notice than a claim that does
//! not start. Configs for other drivers are skipped, not judged.
//!
//! `decode` dispatches on `apiVersion` and `kind` to a versioned type (today only
//! [`v1alpha1`]); every version converts into `EffectiveConfig`, which is all the
//! rest of the driver sees. Adding `v1beta1` means a new module, a new [`GpuConfig`]
//! variant, one arm in the dispatch, and its conversion. The API group stays
//! `gpu.topodra.dev` even when the driver runs under another name: it names the schema,
//! not the deployment.
//!
//! `effective_configs` combines the class and claim configs of an allocation into one
//! `EffectiveConfig` per request. Everything here is pure: no I/O, no logging, so a
//! caller can decode as often as it likes and put the error into that claim's
//! response.
//!
#![doc = include_str!("examples.md")]

mod effective;
mod error;
mod quantity;
mod strict;
pub mod v1alpha1;

use k8s_openapi::api::resource::v1::OpaqueDeviceConfiguration;
use serde::Serialize;
use serde_json::{Map, Value};

pub use error::ConfigError;
pub use quantity::{MemoryQuantity, QuantityError};

#[cfg(test)]
pub(crate) use effective::SOURCE_FROM_CLAIM;
pub use effective::{EffectiveConfig, NumaPolicy, SharingPolicy, effective_configs};

/// The API group of the config types.
#[cfg(test)]
pub(crate) const GROUP: &str = "gpu.topodra.dev";

/// The most `parameters` may take, serialized as compact JSON.
///
/// This is the API server's own limit on opaque parameters, so nothing that went
/// through its validation is refused. Anything larger came from somewhere that skipped
/// it (a version-skewed server, a test), and bounding it bounds the work, memory and
/// error-message size of a prepare call that runs inside the kubelet's deadline.
/// Re-serialization is compact, so it is no longer than the text the server measured,
/// except for number spellings such as `1e5`, which no valid config contains.
pub(crate) const MAX_PARAMETERS_BYTES: usize = 10 * 1024;

/// The apiVersions this driver serves, each with its kinds, for error messages.
const SERVED: &[(&str, &[&str])] = &[(v1alpha1::API_VERSION, &[v1alpha1::GPU_CONFIG_KIND])];

/// A decoded config in the version it was written in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum GpuConfig {
    /// `gpu.topodra.dev/v1alpha1`, kind `GpuConfig`.
    V1alpha1(v1alpha1::GpuConfig),
}

impl GpuConfig {
    /// The `apiVersion` it was written in.
    #[cfg(test)]
    pub(crate) fn api_version(&self) -> &'static str {
        match self {
            Self::V1alpha1(_) => v1alpha1::API_VERSION,
        }
    }

    /// The normalized form the driver acts on.
    pub fn to_effective(&self) -> Result<EffectiveConfig, ConfigError> {
        match self {
            Self::V1alpha1(config) => config.to_effective(),
        }
    }
}

impl From<v1alpha1::GpuConfig> for GpuConfig {
    fn from(config: v1alpha1::GpuConfig) -> Self {
        Self::V1alpha1(config)
    }
}

/// Decodes one opaque config.
///
/// `Ok(None)` when `opaque.driver` is not `driver_name`: that config belongs to another
/// driver on the same claim and is not ours to judge.
pub fn decode(
    driver_name: &str,
    opaque: &OpaqueDeviceConfiguration,
) -> Result<Option<GpuConfig>, ConfigError> {
    if opaque.driver != driver_name {
        return Ok(None);
    }
    decode_parameters(&opaque.parameters.0).map(Some)
}

/// Decodes `parameters` of an opaque config that is known to be ours.
pub fn decode_parameters(parameters: &Value) -> Result<GpuConfig, ConfigError> {
    if exceeds(parameters, MAX_PARAMETERS_BYTES) {
        return Err(ConfigError::TooLarge {
            limit: MAX_PARAMETERS_BYTES,
        });
    }
    let Value::Object(object) = parameters else {
        return Err(ConfigError::NotAnObject {
            found: json_type(parameters),
        });
    };
    let api_version = type_field(object, "apiVersion")?;
    let kind = type_field(object, "kind")?;
    match (api_version, kind) {
        (v1alpha1::API_VERSION, v1alpha1::GPU_CONFIG_KIND) => {
            let config: v1alpha1::GpuConfig = typed(parameters)?;
            config.validate()?;
            Ok(config.into())
        }
        _ => Err(match SERVED.iter().find(|(v, _)| *v == api_version) {
            Some((_, kinds)) => ConfigError::UnsupportedKind {
                api_version: api_version.to_owned(),
                kind: kind.to_owned(),
                expected: kinds.join(", "),
            },
            None => ConfigError::UnsupportedApiVersion {
                api_version: api_version.to_owned(),
                accepted: accepted(),
            },
        }),
    }
}

fn accepted() -> String {
    let served: Vec<String> = SERVED
        .iter()
        .map(|(version, kinds)| format!("{version} (kind {})", kinds.join(", ")))
        .collect();
    format!("this driver accepts apiVersion {}", served.join("; "))
}

fn type_field<'a>(
    object: &'a Map<String, Value>,
    field: &'static str,
) -> Result<&'a str, ConfigError> {
    match object.get(field) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(ConfigError::MissingTypeField {
            field,
            accepted: accepted(),
        }),
        Some(other) => Err(ConfigError::invalid(
            field,
            format!("invalid type: {}, expected a string", json_type(other)),
        )),
    }
}

fn typed<'a, T: serde::Deserialize<'a>>(parameters: &'a Value) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(parameters).map_err(|err| {
        let path = err.path().to_string();
        // The library writes the root as "."; "parameters" tells the user where that is.
        let path = if path == "." {
            "parameters".to_owned()
        } else {
            path
        };
        ConfigError::invalid(path, err.into_inner().to_string())
    })
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Whether `value` serializes to more than `limit` bytes; stops writing at the limit
/// instead of building the whole text.
fn exceeds(value: &Value, limit: usize) -> bool {
    struct Budget(usize);

    impl std::io::Write for Budget {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self
                .0
                .checked_sub(buf.len())
                .ok_or_else(|| std::io::Error::other("over budget"))?;
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    // Serializing a Value fails only when the writer does.
    serde_json::to_writer(Budget(limit), value).is_err()
}

#[cfg(test)]
mod tests;
