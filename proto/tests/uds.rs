//! Generated servers and clients talking over a real Unix socket, the way the
//! kubelet and a plugin do.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::Router;
use tonic::transport::{Channel, Endpoint, Server, Uri};
use tonic::{Request, Response, Status};
use topodra_proto::{DRA_PLUGIN_TYPE, DRA_SUPPORTED_SERVICES, dra, health, pluginregistration};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Serves `router` on a fresh socket in `dir`; the returned sender stops it.
fn serve(
    router: Router,
    dir: &Path,
) -> Result<(PathBuf, oneshot::Sender<()>, JoinHandle<()>), BoxError> {
    let path = dir.join("plugin.sock");
    let listener = UnixListener::bind(&path)?;
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        router
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stop_rx.await;
            })
            .await
            .expect("server");
    });
    Ok((path, stop_tx, task))
}

/// A channel that ignores the URI and dials the socket (the URI only feeds
/// the `:authority` header).
async fn connect(path: PathBuf) -> Result<Channel, BoxError> {
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await?;
    Ok(channel)
}

// ---- registration -------------------------------------------------------

#[derive(Debug)]
struct Registrar {
    notified: tokio::sync::mpsc::UnboundedSender<(bool, String)>,
}

#[tonic::async_trait]
impl pluginregistration::v1::registration_server::Registration for Registrar {
    async fn get_info(
        &self,
        _request: Request<pluginregistration::v1::InfoRequest>,
    ) -> Result<Response<pluginregistration::v1::PluginInfo>, Status> {
        Ok(Response::new(pluginregistration::v1::PluginInfo {
            r#type: DRA_PLUGIN_TYPE.to_string(),
            name: "gpu.topodra.dev".to_string(),
            endpoint: "/var/lib/kubelet/plugins/gpu.topodra.dev/dra.sock".to_string(),
            supported_versions: DRA_SUPPORTED_SERVICES
                .iter()
                .map(|s| s.to_string())
                .collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<pluginregistration::v1::RegistrationStatus>,
    ) -> Result<Response<pluginregistration::v1::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let _ = self.notified.send((status.plugin_registered, status.error));
        Ok(Response::new(
            pluginregistration::v1::RegistrationStatusResponse {},
        ))
    }
}

#[tokio::test]
async fn registration_over_unix_socket() -> Result<(), BoxError> {
    use pluginregistration::v1::registration_client::RegistrationClient;
    use pluginregistration::v1::registration_server::RegistrationServer;
    use pluginregistration::v1::{InfoRequest, RegistrationStatus};

    let dir = tempfile::tempdir()?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let router = Server::builder().add_service(RegistrationServer::new(Registrar { notified: tx }));
    let (path, stop, task) = serve(router, dir.path())?;

    let mut client = RegistrationClient::new(connect(path).await?);
    let info = client.get_info(InfoRequest {}).await?.into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.topodra.dev");
    assert_eq!(
        info.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth"
        ]
    );

    client
        .notify_registration_status(RegistrationStatus {
            plugin_registered: false,
            error: "nope".to_string(),
        })
        .await?;
    assert_eq!(rx.recv().await, Some((false, "nope".to_string())));

    let _ = stop.send(());
    task.await?;
    Ok(())
}

// ---- DRA v1 -------------------------------------------------------------

#[derive(Debug)]
struct Dra;

#[tonic::async_trait]
impl dra::v1::dra_plugin_server::DraPlugin for Dra {
    async fn node_prepare_resources(
        &self,
        request: Request<dra::v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra::v1::NodePrepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(|c| {
                let answer = if c.namespace == "bad" {
                    dra::v1::NodePrepareResourceResponse {
                        devices: vec![],
                        error: format!("claim {} refused", c.name),
                    }
                } else {
                    dra::v1::NodePrepareResourceResponse {
                        devices: vec![dra::v1::Device {
                            request_names: vec!["gpu".to_string()],
                            pool_name: "node-a".to_string(),
                            device_name: "gpu-0".to_string(),
                            cdi_device_ids: vec![format!(
                                "k8s.gpu.topodra.dev/claim={}-gpu-0",
                                c.uid
                            )],
                            share_id: None,
                        }],
                        error: String::new(),
                    }
                };
                (c.uid, answer)
            })
            .collect();
        Ok(Response::new(dra::v1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<dra::v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra::v1::NodeUnprepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(|c| (c.uid, dra::v1::NodeUnprepareResourceResponse::default()))
            .collect();
        Ok(Response::new(dra::v1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

#[tokio::test]
async fn dra_v1_over_unix_socket() -> Result<(), BoxError> {
    use dra::v1::dra_plugin_client::DraPluginClient;
    use dra::v1::dra_plugin_server::DraPluginServer;
    use dra::v1::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};

    let dir = tempfile::tempdir()?;
    let (path, stop, task) = serve(
        Server::builder().add_service(DraPluginServer::new(Dra)),
        dir.path(),
    )?;
    let mut client = DraPluginClient::new(connect(path).await?);

    let claims = vec![
        Claim {
            namespace: "ns".to_string(),
            uid: "uid-1".to_string(),
            name: "one".to_string(),
        },
        Claim {
            namespace: "bad".to_string(),
            uid: "uid-2".to_string(),
            name: "two".to_string(),
        },
    ];
    let prepared = client
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: claims.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(prepared.claims.len(), 2);
    let ok = &prepared.claims["uid-1"];
    assert_eq!(ok.error, "");
    assert_eq!(
        ok.devices[0].cdi_device_ids,
        ["k8s.gpu.topodra.dev/claim=uid-1-gpu-0"]
    );
    assert_eq!(prepared.claims["uid-2"].error, "claim two refused");

    let unprepared = client
        .node_unprepare_resources(NodeUnprepareResourcesRequest { claims })
        .await?
        .into_inner();
    let keys: HashMap<_, _> = unprepared.claims.into_iter().collect();
    assert!(keys.contains_key("uid-1") && keys.contains_key("uid-2"));

    let _ = stop.send(());
    task.await?;
    Ok(())
}

// ---- DRA health v1 (server streaming) -----------------------------------

#[derive(Debug)]
struct Health;

#[tonic::async_trait]
impl health::v1::dra_resource_health_server::DraResourceHealth for Health {
    type NodeWatchResourcesStream = tokio_stream::Iter<
        std::vec::IntoIter<Result<health::v1::NodeWatchResourcesResponse, Status>>,
    >;

    async fn node_watch_resources(
        &self,
        _request: Request<health::v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        use health::v1::{
            DeviceHealth, DeviceIdentifier, HealthStatus, NodeWatchResourcesResponse,
        };
        let report = |status: HealthStatus, at: i64| {
            Ok(NodeWatchResourcesResponse {
                devices: vec![DeviceHealth {
                    device: Some(DeviceIdentifier {
                        pool_name: "node-a".to_string(),
                        device_name: "gpu-0".to_string(),
                    }),
                    health: status.into(),
                    last_updated_time: at,
                    health_check_timeout_seconds: 60,
                    message: String::new(),
                }],
            })
        };
        Ok(Response::new(tokio_stream::iter(vec![
            report(HealthStatus::Healthy, 1),
            report(HealthStatus::Unhealthy, 2),
        ])))
    }
}

#[tokio::test]
async fn health_v1_stream_over_unix_socket() -> Result<(), BoxError> {
    use health::v1::dra_resource_health_client::DraResourceHealthClient;
    use health::v1::dra_resource_health_server::DraResourceHealthServer;
    use health::v1::{HealthStatus, NodeWatchResourcesRequest};

    let dir = tempfile::tempdir()?;
    let (path, stop, task) = serve(
        Server::builder().add_service(DraResourceHealthServer::new(Health)),
        dir.path(),
    )?;
    let mut client = DraResourceHealthClient::new(connect(path).await?);
    let mut stream = client
        .node_watch_resources(NodeWatchResourcesRequest {})
        .await?
        .into_inner();
    let mut seen = Vec::new();
    while let Some(msg) = stream.message().await? {
        seen.push((msg.devices[0].health(), msg.devices[0].last_updated_time));
    }
    assert_eq!(
        seen,
        [(HealthStatus::Healthy, 1), (HealthStatus::Unhealthy, 2)]
    );

    let _ = stop.send(());
    task.await?;
    Ok(())
}
