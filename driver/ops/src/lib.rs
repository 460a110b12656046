//! What every topodra binary runs beside its job: structured logs ([`logging`]), the
//! HTTP endpoint for metrics, liveness and readiness ([`endpoint`], served by
//! [`http`]), a count of every request it sends to the API server ([`requests`]), the
//! metrics registry those start ([`metrics`]), the capped, jittered backoff of its
//! retries ([`backoff`]), the signal that ends it ([`signal`]), the version it
//! reports ([`version`]), and the decoding of API objects whose depth their writer
//! chooses ([`bounded`]).
//!
//! The kubelet plugin and the controller share these so that operators meet the same
//! flags, the same endpoint hardening and the same request metrics in both.

#![forbid(unsafe_code)]

pub mod backoff;
pub mod bounded;
pub mod endpoint;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod requests;
pub mod signal;
pub mod version;
