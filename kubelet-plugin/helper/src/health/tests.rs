//! The health services over a real unix socket with a tonic client, as the kubelet
//! subscribes.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use tokio::net::UnixListener;
use tokio::sync::{oneshot, watch};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tonic::transport::server::Router;

use super::{DeviceHealth, HealthService, HealthStatus as Status, NodeHealth as HealthState};

fn serve(router: Router, dir: &std::path::Path) -> (PathBuf, oneshot::Sender<()>) {
    let path = dir.join("health.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let (stop, stop_rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        router
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stop_rx.await;
            })
            .await
            .unwrap();
    });
    (path, stop)
}

/// Dials the health server at `$path` and opens NodeWatchResources in API version
/// `$v` (the two versions' types are distinct but alike).
macro_rules! watch_resources {
    ($v:ident, $path:expr) => {{
        use topodra_proto::health::$v::NodeWatchResourcesRequest;
        use topodra_proto::health::$v::dra_resource_health_client::DraResourceHealthClient;
        let channel = crate::uds::connect(&$path).await.unwrap();
        DraResourceHealthClient::new(channel)
            .node_watch_resources(NodeWatchResourcesRequest {})
            .await
            .unwrap()
            .into_inner()
    }};
}

fn device(status: Status, reason: &str, since: u64) -> DeviceHealth {
    DeviceHealth {
        status,
        since: SystemTime::UNIX_EPOCH + Duration::from_secs(since),
        message: reason.to_owned(),
    }
}

fn initial() -> HealthState {
    HealthState {
        devices: [
            ("gpu-0".to_owned(), device(Status::Healthy, "", 100)),
            (
                "gpu-1".to_owned(),
                device(Status::Unknown, "not checked yet", 100),
            ),
        ]
        .into(),
    }
}

/// The same scenario for both API versions, whose types are distinct but alike.
macro_rules! watch_scenario {
    ($v:ident, $server:ident) => {{
        use topodra_proto::health::$v::HealthStatus;

        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = watch::channel(initial());
        let service = HealthService::new("node-a", rx).with_heartbeat(Duration::from_secs(1));
        assert_eq!(service.timeout_seconds(), 60);
        let (path, stop) = serve(Server::builder().add_service(service.$server()), dir.path());
        let mut stream = watch_resources!($v, path);
        let summary = |m: &topodra_proto::health::$v::NodeWatchResourcesResponse| {
            m.devices
                .iter()
                .map(|d| {
                    let id = d.device.as_ref().unwrap();
                    assert_eq!(id.pool_name, "node-a");
                    assert_eq!(d.health_check_timeout_seconds, 60);
                    (
                        id.device_name.clone(),
                        d.health(),
                        d.message.clone(),
                        d.last_updated_time,
                    )
                })
                .collect::<Vec<_>>()
        };

        // The full list right away.
        let first = stream.message().await.unwrap().unwrap();
        assert_eq!(
            summary(&first),
            [
                (
                    "gpu-0".to_owned(),
                    HealthStatus::Healthy,
                    String::new(),
                    100
                ),
                (
                    "gpu-1".to_owned(),
                    HealthStatus::Unknown,
                    "not checked yet".to_owned(),
                    100
                ),
            ]
        );

        // A change: the full list again, at once.
        let changed_at = Instant::now();
        tx.send_modify(|s| {
            s.devices.insert(
                "gpu-1".to_owned(),
                device(Status::Unhealthy, "XID 79: GPU has fallen off the bus", 200),
            );
        });
        let second = stream.message().await.unwrap().unwrap();
        // Well before the heartbeat would have sent it.
        assert!(changed_at.elapsed() < Duration::from_millis(800));
        let expected = vec![
            (
                "gpu-0".to_owned(),
                HealthStatus::Healthy,
                String::new(),
                100,
            ),
            (
                "gpu-1".to_owned(),
                HealthStatus::Unhealthy,
                "XID 79: GPU has fallen off the bus".to_owned(),
                200,
            ),
        ];
        assert_eq!(summary(&second), expected);

        // Nothing changes: the same list again as a heartbeat.
        let quiet_since = Instant::now();
        let third = stream.message().await.unwrap().unwrap();
        let waited = quiet_since.elapsed();
        assert!(
            waited >= Duration::from_millis(800),
            "heartbeat after {waited:?}"
        );
        assert!(
            waited < Duration::from_secs(5),
            "heartbeat after {waited:?}"
        );
        assert_eq!(summary(&third), expected);

        // The monitor stopping ends the stream.
        drop(tx);
        let end = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .unwrap()
            .unwrap();
        assert!(end.is_none());
        let _ = stop.send(());
    }};
}

#[tokio::test]
async fn v1_streams_full_list_changes_and_heartbeats() {
    watch_scenario!(v1, v1_server);
}

#[tokio::test]
async fn v1alpha1_streams_full_list_changes_and_heartbeats() {
    watch_scenario!(v1alpha1, v1alpha1_server);
}

#[tokio::test]
async fn long_reasons_are_cut_to_the_kubelet_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut state = initial();
    state.devices.insert(
        "gpu-0".to_owned(),
        device(Status::Unhealthy, &"é".repeat(2000), 1),
    );
    let (_tx, rx) = watch::channel(state);
    let (path, stop) = serve(
        Server::builder().add_service(HealthService::new("node-a", rx).v1_server()),
        dir.path(),
    );
    let mut stream = watch_resources!(v1, path);
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.devices[0].message.chars().count(), 1024);
    drop(stream);
    let _ = stop.send(());
}

#[test]
fn heartbeat_stays_inside_the_declared_timeout() {
    let (_tx, rx) = watch::channel(HealthState::default());
    let s = HealthService::new("p", rx.clone());
    assert_eq!(
        (s.heartbeat(), s.timeout_seconds()),
        (Duration::from_secs(30), 60)
    );
    let s = HealthService::new("p", rx).with_heartbeat(Duration::from_secs(45));
    assert_eq!(s.timeout_seconds(), 90);
}
