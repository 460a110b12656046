//! The kubelet's DRA health service (`v1` and `v1alpha1`): one server stream per
//! kubelet subscription, carrying the full device list on every change and again as
//! a heartbeat.
//!
//! Timing as the kubelet applies it (pkg/kubelet/cm/dra/healthinfo.go): it stamps
//! each device with its own receive time, not our `last_updated_time`, and shows a
//! device as Unknown once nothing about it arrived for `health_check_timeout_seconds`
//! (30 s when zero). So the heartbeat must come well inside that timeout; we send
//! the full list every 30 s and declare 60 s. `last_updated_time` carries when the
//! device's health last changed, in unix seconds, for operators.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use futures::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status as GrpcStatus};
use topodra_proto::health::{v1, v1alpha1};

#[cfg(test)]
mod tests;

/// Health of one device, in the terms of the kubelet's DRA health API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthStatus {
    Healthy,
    Unhealthy,
    /// Not determined (yet).
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealth {
    pub status: HealthStatus,
    /// When `status` last changed; the kubelet shows it to operators.
    pub since: SystemTime,
    /// Why, for operators (cut to the kubelet's 1024 characters).
    pub message: String,
}

/// Health of every device of the plugin's pool, keyed by ResourceSlice device name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeHealth {
    pub devices: BTreeMap<String, DeviceHealth>,
}

const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(30);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// The kubelet truncates longer messages.
const MAX_MESSAGE_CHARS: usize = 1024;

/// Serves health from the driver's `watch` channel. Streams end when the client
/// goes away or when the driver stops sending (its sender is dropped).
#[derive(Debug, Clone)]
pub struct HealthService {
    pool_name: String,
    rx: watch::Receiver<NodeHealth>,
    heartbeat: Duration,
    timeout_seconds: i64,
}

impl HealthService {
    pub fn new(pool_name: impl Into<String>, rx: watch::Receiver<NodeHealth>) -> Self {
        Self {
            pool_name: pool_name.into(),
            rx,
            heartbeat: DEFAULT_HEARTBEAT,
            timeout_seconds: secs(DEFAULT_TIMEOUT),
        }
    }

    /// Sets the heartbeat; the declared timeout grows to at least twice the
    /// heartbeat, so one late heartbeat never turns a device Unknown.
    #[cfg(test)]
    pub(crate) fn with_heartbeat(mut self, heartbeat: Duration) -> Self {
        let heartbeat = heartbeat.max(Duration::from_millis(1));
        self.heartbeat = heartbeat;
        self.timeout_seconds = self.timeout_seconds.max(secs(heartbeat * 2).max(1));
        self
    }

    #[cfg(test)]
    pub(crate) fn heartbeat(&self) -> Duration {
        self.heartbeat
    }

    #[cfg(test)]
    pub(crate) fn timeout_seconds(&self) -> i64 {
        self.timeout_seconds
    }

    pub fn v1_server(self) -> v1::dra_resource_health_server::DraResourceHealthServer<Self> {
        v1::dra_resource_health_server::DraResourceHealthServer::new(self)
    }

    pub fn v1alpha1_server(
        self,
    ) -> v1alpha1::dra_resource_health_server::DraResourceHealthServer<Self> {
        v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(self)
    }

    /// The full list now, then again on each change or after `heartbeat` of silence.
    fn stream<M: Send + 'static>(
        &self,
        build: impl Fn(&NodeHealth) -> M + Send + 'static,
    ) -> BoxStream<M> {
        let heartbeat = self.heartbeat;
        let mut rx = self.rx.clone();
        rx.mark_changed();
        Box::pin(futures::stream::unfold(
            (rx, build),
            move |(mut rx, build)| async move {
                tokio::select! {
                    changed = rx.changed() => changed.ok()?,
                    () = tokio::time::sleep(heartbeat) => {}
                }
                let message = build(&rx.borrow_and_update());
                Some((Ok(message), (rx, build)))
            },
        ))
    }
}

type BoxStream<M> = Pin<Box<dyn Stream<Item = Result<M, GrpcStatus>> + Send + 'static>>;

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

fn unix_seconds(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(secs)
        .unwrap_or(0)
}

fn message(h: &DeviceHealth) -> String {
    h.message.chars().take(MAX_MESSAGE_CHARS).collect()
}

/// The two API versions are field-for-field identical; one body serves both.
macro_rules! health_api {
    ($v:ident) => {
        impl HealthService {
            fn $v(&self) -> impl Fn(&NodeHealth) -> $v::NodeWatchResourcesResponse + use<> {
                let pool_name = self.pool_name.clone();
                let timeout = self.timeout_seconds;
                move |state| $v::NodeWatchResourcesResponse {
                    devices: state
                        .devices
                        .iter()
                        .map(|(name, h)| $v::DeviceHealth {
                            device: Some($v::DeviceIdentifier {
                                pool_name: pool_name.clone(),
                                device_name: name.clone(),
                            }),
                            health: match h.status {
                                HealthStatus::Healthy => $v::HealthStatus::Healthy,
                                HealthStatus::Unhealthy => $v::HealthStatus::Unhealthy,
                                HealthStatus::Unknown => $v::HealthStatus::Unknown,
                            }
                            .into(),
                            last_updated_time: unix_seconds(h.since),
                            health_check_timeout_seconds: timeout,
                            message: message(h),
                        })
                        .collect(),
                }
            }
        }

        #[tonic::async_trait]
        impl $v::dra_resource_health_server::DraResourceHealth for HealthService {
            type NodeWatchResourcesStream = BoxStream<$v::NodeWatchResourcesResponse>;

            async fn node_watch_resources(
                &self,
                _request: Request<$v::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, GrpcStatus> {
                Ok(Response::new(self.stream(self.$v())))
            }
        }
    };
}

health_api!(v1);
health_api!(v1alpha1);
