//! The Rust counterpart of the kubelet-plugin helper that Go DRA drivers use
//! (`k8s.io/dynamic-resource-allocation/kubeletplugin`): what every DRA kubelet
//! plugin needs, and nothing of any one driver.
//!
//! A plugin implements [`Driver`] (prepare and unprepare one claim, and optionally
//! report device health) and starts it with [`PluginBuilder`]:
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use std::path::Path;
//! # use dra_kubeletplugin::{Driver, PluginBuilder, claims::{ApiClaims, ReadPolicy}, uds::PluginSockets};
//! # async fn f(driver: Arc<dyn Driver>, client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let sockets = PluginSockets::new(
//!     Path::new("/var/lib/kubelet/plugins_registry"),
//!     Path::new("/var/lib/kubelet/plugins"),
//!     "gpu.example.com",
//!     None,
//! );
//! let claims = Arc::new(ApiClaims::new(client, ReadPolicy::default()));
//! let mut plugin = PluginBuilder::new("gpu.example.com", "node-a", sockets, driver, claims).start()?;
//! tokio::signal::ctrl_c().await?;
//! plugin.unregister().await;
//! plugin.stop().await;
//! # Ok(()) }
//! ```
//!
//! The modules, from the kubelet inwards:
//!
//! - [`uds`]: the unix sockets the kubelet dials, with the HTTP/2 `:authority` shim
//!   grpc-go clients need, and the rolling-update socket names.
//! - [`registration`]: the plugin registration service in the kubelet's registry.
//! - [`dra`]: NodePrepareResources and NodeUnprepareResources (v1 and v1beta1), each
//!   claim answered on its own, with bounded fan-out ([`dra::ClaimConcurrency`]).
//! - [`claims`]: reading a claim from the API server, with retries and typed errors.
//! - [`health`]: the kubelet's DRA health stream (v1 and v1alpha1), fed from the
//!   driver's [`health::NodeHealth`] channel.
//! - [`metrics`]: per-claim latency and errors, registered into the plugin's
//!   Prometheus registry under its prefix.
//! - [`ownership`]: one instance at a time owns the node's state; a new one (a
//!   rolling update's) takes it over from a live old one.
//! - [`publish`]: the node's ResourceSlices, kept as the driver wants them with one
//!   streaming watch and server-side apply, written only when they differ.

pub mod claims;
pub mod dra;
mod driver;
pub mod health;
pub mod metrics;
pub mod ownership;
mod plugin;
pub mod publish;
pub mod registration;
pub mod uds;

pub use driver::{ClaimError, ClaimRef, Driver, PreparedDevice};
pub use plugin::{Plugin, PluginBuilder, StartError};
