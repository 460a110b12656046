//! A plugin with a fake driver, over real sockets, called as the kubelet calls it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::resource::v1::ResourceClaim;
use topodra_proto::dra::{v1, v1beta1};
use topodra_proto::pluginregistration::v1::InfoRequest;
use topodra_proto::pluginregistration::v1::registration_client::RegistrationClient;

use super::PluginBuilder;
use crate::claims::{BoxFuture, ClaimReadError, ClaimReader};
use crate::driver::{ClaimError, ClaimRef, Driver, PreparedDevice};
use crate::uds::PluginSockets;
use crate::uds::connect;

/// Prepares every claim but `broken` with one device named for the claim.
#[derive(Default)]
struct Fake {
    unprepared: AtomicUsize,
}

impl Driver for Fake {
    fn prepare(
        &self,
        claim: &ClaimRef,
        _object: &ResourceClaim,
    ) -> Result<Vec<PreparedDevice>, ClaimError> {
        if claim.name == "broken" {
            return Err(ClaimError::new("config", "bad opaque config"));
        }
        Ok(vec![PreparedDevice {
            requests: vec!["gpu".to_owned()],
            pool: "node-a".to_owned(),
            device: format!("dev-{}", claim.name),
            cdi_device_ids: vec![format!("example.com/device={}", claim.name)],
            share_id: Some("s1".to_owned()),
        }])
    }

    fn unprepare(&self, _claim: &ClaimRef) -> Result<(), ClaimError> {
        self.unprepared.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Every claim exists.
struct AnyClaim;

impl ClaimReader for AnyClaim {
    fn get<'a>(
        &'a self,
        _namespace: &'a str,
        _name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, ClaimReadError>> {
        Box::pin(async { Ok(ResourceClaim::default()) })
    }
}

fn claim(name: &str) -> v1::Claim {
    v1::Claim {
        namespace: "team-a".to_owned(),
        uid: format!("uid-{name}"),
        name: name.to_owned(),
    }
}

#[tokio::test]
async fn registers_prepares_on_both_versions_and_removes_its_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let sockets = PluginSockets::new(
        &dir.path().join("registry"),
        &dir.path().join("plugins"),
        "example.com",
        Some("pod-1"),
    );
    let driver = Arc::new(Fake::default());
    let mut plugin = PluginBuilder::new(
        "example.com",
        "node-a",
        sockets.clone(),
        driver.clone(),
        Arc::new(AnyClaim),
    )
    .start()
    .unwrap();

    let info = RegistrationClient::new(connect(&sockets.registration).await.unwrap())
        .get_info(InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "example.com");
    assert_eq!(info.endpoint, sockets.dra.display().to_string());

    let dra = connect(&sockets.dra).await.unwrap();
    let answer = v1::dra_plugin_client::DraPluginClient::new(dra.clone())
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![claim("a"), claim("broken"), claim("Not/A-Name")],
        })
        .await
        .unwrap()
        .into_inner()
        .claims;
    let a = &answer["uid-a"];
    assert_eq!(a.error, "");
    assert_eq!(a.devices[0].cdi_device_ids, ["example.com/device=a"]);
    assert_eq!(a.devices[0].share_id.as_deref(), Some("s1"));
    assert_eq!(answer["uid-broken"].error, "bad opaque config");
    assert!(
        answer["uid-Not/A-Name"]
            .error
            .starts_with("invalid claim reference")
    );

    let answer = v1beta1::dra_plugin_client::DraPluginClient::new(dra.clone())
        .node_unprepare_resources(v1beta1::NodeUnprepareResourcesRequest {
            claims: vec![v1beta1::Claim {
                namespace: "team-a".to_owned(),
                uid: "uid-a".to_owned(),
                name: "a".to_owned(),
            }],
        })
        .await
        .unwrap()
        .into_inner()
        .claims;
    assert_eq!(answer["uid-a"].error, "");
    assert_eq!(driver.unprepared.load(Ordering::SeqCst), 1);

    plugin.unregister().await;
    assert!(!sockets.registration.exists());
    assert!(sockets.dra.exists());
    drop(dra);
    plugin.stop().await;
    assert!(!sockets.dra.exists());
}

/// A registration socket that cannot be bound fails the start without leaving the
/// DRA server behind, so the caller can try again later.
#[tokio::test]
async fn a_failed_start_leaves_no_server_and_can_be_tried_again() {
    let dir = tempfile::tempdir().unwrap();
    let sockets = PluginSockets::new(
        &dir.path().join("registry"),
        &dir.path().join("plugins"),
        "example.com",
        None,
    );
    std::fs::create_dir_all(&sockets.registration).unwrap();
    let start = || {
        PluginBuilder::new(
            "example.com",
            "node-a",
            sockets.clone(),
            Arc::new(Fake::default()),
            Arc::new(AnyClaim),
        )
        .start()
    };
    let err = start().unwrap_err();
    assert!(matches!(err, super::StartError::Registration(_)), "{err}");
    assert!(
        !sockets.dra.exists(),
        "the DRA socket went with the failed start"
    );
    assert!(connect(&sockets.dra).await.is_err());

    std::fs::remove_dir(&sockets.registration).unwrap();
    let plugin = start().unwrap();
    assert!(sockets.dra.exists() && sockets.registration.exists());
    plugin.stop().await;
}

/// Claim reads that wait at a gate, counting how many wait at once.
struct Gated {
    gate: tokio::sync::Semaphore,
    waiting: AtomicUsize,
    peak: AtomicUsize,
}

impl ClaimReader for Gated {
    fn get<'a>(
        &'a self,
        _namespace: &'a str,
        _name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, ClaimReadError>> {
        Box::pin(async move {
            let now = self.waiting.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(now, Ordering::SeqCst);
            let _pass = self.gate.acquire().await;
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            Ok(ResourceClaim::default())
        })
    }
}

/// One connection gets at most `MAX_CONCURRENT_STREAMS` calls in at once; grpc
/// clients queue the others, which are answered once the first are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_gets_at_most_max_concurrent_streams_calls_in() {
    use std::time::Duration;

    use crate::uds::MAX_CONCURRENT_STREAMS;

    let dir = tempfile::tempdir().unwrap();
    let sockets = PluginSockets::new(
        &dir.path().join("registry"),
        &dir.path().join("plugins"),
        "example.com",
        None,
    );
    let claims = Arc::new(Gated {
        gate: tokio::sync::Semaphore::new(0),
        waiting: AtomicUsize::new(0),
        peak: AtomicUsize::new(0),
    });
    let plugin = PluginBuilder::new(
        "example.com",
        "node-a",
        sockets.clone(),
        Arc::new(Fake::default()),
        claims.clone(),
    )
    .start()
    .unwrap();

    let dra = connect(&sockets.dra).await.unwrap();
    // A client learns the limit from the server's SETTINGS; streams it opens before
    // get REFUSED_STREAM (which grpc-go retries on its own, hyper does not). One call
    // first makes sure the client has them.
    v1::dra_plugin_client::DraPluginClient::new(dra.clone())
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![] })
        .await
        .unwrap();
    let calls = 20;
    let mut answers = tokio::task::JoinSet::new();
    for i in 0..calls {
        let mut client = v1::dra_plugin_client::DraPluginClient::new(dra.clone());
        answers.spawn(async move {
            client
                .node_prepare_resources(v1::NodePrepareResourcesRequest {
                    claims: vec![claim(&format!("c{i}"))],
                })
                .await
        });
    }
    let limit = MAX_CONCURRENT_STREAMS as usize;
    tokio::time::timeout(Duration::from_secs(3), async {
        while claims.waiting.load(Ordering::SeqCst) < limit {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the first calls arrive");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(claims.peak.load(Ordering::SeqCst), limit);

    claims.gate.add_permits(calls);
    let mut answered = 0;
    while let Some(answer) = answers.join_next().await {
        let answer = answer.unwrap().unwrap().into_inner();
        assert_eq!(answer.claims.len(), 1);
        answered += 1;
    }
    assert_eq!(answered, calls);
    drop(dra);
    plugin.stop().await;
}
