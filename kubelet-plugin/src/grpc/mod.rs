//! The kubelet-facing gRPC services: plugin registration and the DRA plugin API
//! (v1 and v1beta1). Health lives in `crate::health`.

pub(crate) mod claims;
pub(crate) mod dra;
pub(crate) mod registration;
