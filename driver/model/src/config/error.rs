//! Why a config was refused.

/// Why an opaque config for this driver was refused.
///
/// Every message is meant to reach the claim's owner verbatim (the kubelet plugin puts
/// it into that claim's prepare response), so each names what to fix: the field path,
/// the accepted values, or the config entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `parameters` was JSON, but not an object.
    #[error("parameters must be a JSON object with apiVersion and kind, got {found}")]
    NotAnObject {
        /// The JSON type that was found instead.
        found: &'static str,
    },

    /// `parameters` serialize to more than the limit.
    #[error("parameters are larger than {limit} bytes when serialized as JSON")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },

    /// `apiVersion` or `kind` is absent.
    #[error("{field} is required; {accepted}")]
    MissingTypeField {
        /// `apiVersion` or `kind`.
        field: &'static str,
        /// What this driver accepts, for the operator to copy.
        accepted: String,
    },

    /// `apiVersion` names a group or version this driver does not serve.
    #[error("unsupported apiVersion {api_version:?}; {accepted}")]
    UnsupportedApiVersion {
        /// The apiVersion that was sent.
        api_version: String,
        /// What this driver accepts.
        accepted: String,
    },

    /// `kind` is not a kind served under that apiVersion.
    #[error("unsupported kind {kind:?} for apiVersion {api_version}; expected one of: {expected}")]
    UnsupportedKind {
        /// The apiVersion that was sent (and is served).
        api_version: String,
        /// The kind that was sent.
        kind: String,
        /// The kinds served under that apiVersion.
        expected: String,
    },

    /// A field is unknown, has the wrong type, or has a value outside what it allows.
    #[error("{path}: {message}")]
    Invalid {
        /// Dotted path from the top of `parameters`, e.g. `sharing.mps.defaultActiveThreadPercentage`.
        path: String,
        /// What is wrong and what is expected.
        message: String,
    },

    /// A field decodes, but a claim cannot set it: MPS is the device the scheduler
    /// allocates, a time-slice interval other than Default the node's setting.
    #[error("{path}: {message}")]
    NotImplemented {
        /// Dotted path from the top of `parameters`, e.g. `sharing.strategy`.
        path: String,
        /// What is not implemented and what to use instead.
        message: String,
    },

    /// An allocation config entry is not something this driver can order.
    #[error("config[{index}]: unknown source {origin:?}; expected FromClass or FromClaim")]
    UnknownSource {
        /// Index in `status.allocation.devices.config`.
        index: usize,
        /// The source that was sent.
        origin: String,
    },

    /// One entry of `status.allocation.devices.config` failed to decode.
    #[error("config[{index}] ({origin}): {error}")]
    InConfig {
        /// Index in `status.allocation.devices.config`.
        index: usize,
        /// `FromClass` or `FromClaim`, so the operator knows whether the DeviceClass or
        /// the claim has to change.
        origin: String,
        /// What is wrong with it.
        #[source]
        error: Box<ConfigError>,
    },
}

impl ConfigError {
    /// The field path the error is about, when it is about one field.
    #[cfg(test)]
    pub(crate) fn path(&self) -> Option<&str> {
        match self {
            Self::Invalid { path, .. } | Self::NotImplemented { path, .. } => Some(path),
            Self::MissingTypeField { field, .. } => Some(field),
            Self::UnsupportedApiVersion { .. } => Some("apiVersion"),
            Self::UnsupportedKind { .. } => Some("kind"),
            Self::InConfig { error, .. } => error.path(),
            Self::NotAnObject { .. } | Self::TooLarge { .. } | Self::UnknownSource { .. } => None,
        }
    }

    pub(crate) fn invalid(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            path: path.into(),
            message: message.into(),
        }
    }
}
