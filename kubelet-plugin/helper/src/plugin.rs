//! Starting and stopping a plugin's servers: the DRA services (and health) on the DRA
//! socket, then registration on the registry socket, and the reverse on the way out.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use topodra_proto::dra::{v1, v1beta1};
use topodra_proto::pluginregistration::v1::registration_server::RegistrationServer;

use crate::claims::ClaimReader;
use crate::dra::{ClaimConcurrency, DraService, DraServiceV1beta1};
use crate::driver::Driver;
use crate::health::HealthService;
use crate::metrics::ClaimMetrics;
use crate::registration::RegistrationService;
use crate::uds::{self, BindError, PluginSockets, SocketGuard};

/// How long a stopping server may take to finish the calls in flight.
const REGISTRATION_DRAIN: Duration = Duration::from_secs(10);
const DRA_DRAIN: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    #[error("binding the DRA socket")]
    Dra(#[source] BindError),
    #[error("binding the registration socket")]
    Registration(#[source] BindError),
}

/// What a plugin serves the kubelet; [`PluginBuilder::start`] starts it.
pub struct PluginBuilder {
    driver_name: String,
    pool_name: String,
    sockets: PluginSockets,
    driver: Arc<dyn Driver>,
    claims: Arc<dyn ClaimReader>,
    metrics: Arc<ClaimMetrics>,
    concurrency: ClaimConcurrency,
}

impl std::fmt::Debug for PluginBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginBuilder")
            .field("driver_name", &self.driver_name)
            .field("sockets", &self.sockets)
            .finish_non_exhaustive()
    }
}

impl PluginBuilder {
    /// Serves `driver` as `driver_name` on `sockets`, reading claims with `claims`;
    /// health (when the driver has it) names devices in pool `pool_name`. By default
    /// 16 claims of a call and 64 overall are worked on at once, and the metrics go
    /// to no registry.
    pub fn new(
        driver_name: impl Into<String>,
        pool_name: impl Into<String>,
        sockets: PluginSockets,
        driver: Arc<dyn Driver>,
        claims: Arc<dyn ClaimReader>,
    ) -> Self {
        Self {
            driver_name: driver_name.into(),
            pool_name: pool_name.into(),
            sockets,
            driver,
            claims,
            metrics: Arc::default(),
            concurrency: ClaimConcurrency::new(16, 64),
        }
    }

    pub fn metrics(mut self, metrics: Arc<ClaimMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn concurrency(mut self, concurrency: ClaimConcurrency) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// Binds the DRA socket and serves it, then registration: the kubelet may call
    /// the DRA socket as soon as registration succeeds. Needs a Tokio runtime.
    pub fn start(self) -> Result<Plugin, StartError> {
        let (dra_stop, dra_stopped) = watch::channel(false);
        let (reg_stop, reg_stopped) = watch::channel(false);
        let health = self
            .driver
            .health()
            .map(|rx| HealthService::new(self.pool_name, rx));
        let dra = DraService::new(self.driver, self.claims, self.metrics, self.concurrency);
        let (dra_guard, dra_incoming) =
            uds::serve_uds(&self.sockets.dra).map_err(StartError::Dra)?;
        let dra_server = tokio::spawn(
            uds::grpc_server()
                .add_service(v1::dra_plugin_server::DraPluginServer::new(dra.clone()))
                .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(
                    DraServiceV1beta1(dra),
                ))
                .add_optional_service(health.clone().map(HealthService::v1_server))
                .add_optional_service(health.map(HealthService::v1alpha1_server))
                .serve_with_incoming_shutdown(dra_incoming, stopped(dra_stopped)),
        );

        let registered = Arc::new(AtomicBool::new(false));
        let registration = RegistrationService {
            driver_name: self.driver_name,
            endpoint: self.sockets.dra.display().to_string(),
            supported_versions: topodra_proto::DRA_SUPPORTED_SERVICES
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            registered: registered.clone(),
        };
        let (reg_guard, reg_incoming) = match uds::serve_uds(&self.sockets.registration) {
            Ok(bound) => bound,
            Err(e) => {
                // The DRA server is up already, and its socket goes with its guard:
                // left running it would hold its connections for nothing, and a
                // caller that tries again would start a second one.
                let _ = dra_stop.send(true);
                dra_server.abort();
                return Err(StartError::Registration(e));
            }
        };
        let reg_server = tokio::spawn(
            uds::grpc_server()
                .add_service(RegistrationServer::new(registration))
                .serve_with_incoming_shutdown(reg_incoming, stopped(reg_stopped)),
        );
        tracing::info!(registration = %self.sockets.registration.display(), dra = %self.sockets.dra.display(), "serving the kubelet");
        Ok(Plugin {
            sockets: self.sockets,
            registered,
            dra: Server {
                stop: dra_stop,
                task: dra_server,
                guard: dra_guard,
            },
            registration: Server {
                stop: reg_stop,
                task: reg_server,
                guard: reg_guard,
            },
            unregistered: false,
        })
    }
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

#[derive(Debug)]
struct Server {
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
    guard: SocketGuard,
}

/// A running plugin. Stop it in two steps: [`Plugin::unregister`], then whatever
/// else the plugin must stop while prepares in flight finish, then [`Plugin::stop`].
#[derive(Debug)]
pub struct Plugin {
    sockets: PluginSockets,
    registered: Arc<AtomicBool>,
    dra: Server,
    registration: Server,
    unregistered: bool,
}

impl Plugin {
    pub fn sockets(&self) -> &PluginSockets {
        &self.sockets
    }

    /// Whether the kubelet's last word on the registration was success.
    pub fn registered(&self) -> Arc<AtomicBool> {
        self.registered.clone()
    }

    /// Stops registration and removes its socket: the kubelet stops sending new
    /// claims here, while prepares in flight finish on the DRA socket.
    pub async fn unregister(&mut self) {
        if std::mem::replace(&mut self.unregistered, true) {
            return;
        }
        let r = &mut self.registration;
        let _ = r.stop.send(true);
        if let Err(e) = r.guard.remove() {
            tracing::warn!(socket = %r.guard.path().display(), error = %e, "removing the registration socket");
        }
        let _ = tokio::time::timeout(REGISTRATION_DRAIN, &mut r.task).await;
    }

    /// Stops the DRA services once their calls in flight are answered (or after
    /// 20 s) and removes the DRA socket. Health streams end only when the driver's
    /// health sender is dropped, so drop it before.
    pub async fn stop(mut self) {
        self.unregister().await;
        let d = &mut self.dra;
        let _ = d.stop.send(true);
        let _ = tokio::time::timeout(DRA_DRAIN, &mut d.task).await;
        if let Err(e) = d.guard.remove() {
            tracing::warn!(socket = %d.guard.path().display(), error = %e, "removing the DRA socket");
        }
    }
}

#[cfg(test)]
mod tests;
