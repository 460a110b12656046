//! The smallest DRA kubelet plugin: one device, `dev-0`, published in a
//! ResourceSlice for this node. Preparing a claim writes a CDI spec that sets
//! `MINIMAL_DEVICE=dev-0` in the container; unpreparing removes it.
//!
//! ```text
//! cargo run -p dra-kubeletplugin --example minimal -- --node-name "$(hostname)"
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::{fs, io};

use anyhow::Context;
use clap::Parser;
use dra_kubeletplugin::claims::{ApiClaims, ReadPolicy};
use dra_kubeletplugin::publish::{DesiredPool, Publisher, PublisherConfig};
use dra_kubeletplugin::uds::PluginSockets;
use dra_kubeletplugin::{ClaimError, ClaimRef, Driver, PluginBuilder, PreparedDevice};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};

const DRIVER: &str = "minimal.example.com";

#[derive(Debug, Parser)]
struct Args {
    /// This node's name: the pool name and the slice's nodeName.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// Holds the kubelet's plugins_registry/ and plugins/ directories.
    #[arg(long, env = "KUBELET_DIR", default_value = "/var/lib/kubelet")]
    kubelet_dir: PathBuf,
    /// Where the container runtime reads CDI specs.
    #[arg(long, env = "CDI_DIR", default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
}

#[derive(Debug)]
struct Minimal {
    cdi_dir: PathBuf,
}

impl Minimal {
    /// One CDI spec file per claim, so unprepare removes just that claim's.
    fn spec_path(&self, claim: &ClaimRef) -> PathBuf {
        let file = format!("minimal-example-com-{}.json", claim.uid);
        self.cdi_dir.join(file)
    }
}

impl Driver for Minimal {
    fn prepare(
        &self,
        claim: &ClaimRef,
        object: &ResourceClaim,
    ) -> Result<Vec<PreparedDevice>, ClaimError> {
        let allocated = object.status.as_ref().and_then(|s| s.allocation.as_ref());
        let results = allocated
            .and_then(|a| a.devices.as_ref()?.results.as_ref())
            .ok_or_else(|| ClaimError::new("not_allocated", "the claim is not allocated"))?;
        let ours: Vec<_> = results.iter().filter(|r| r.driver == DRIVER).collect();
        // CDI device names are unique per kind (vendor/class): prefix the claim's UID.
        let cdi_name = |device: &str| format!("{}-{device}", claim.uid);
        let devices: Vec<_> = ours
            .iter()
            .map(|r| {
                json!({
                    "name": cdi_name(&r.device),
                    "containerEdits": { "env": [format!("MINIMAL_DEVICE={}", r.device)] },
                })
            })
            .collect();
        let spec = json!({ "cdiVersion": "0.6.0", "kind": format!("{DRIVER}/device"), "devices": devices });
        fs::write(self.spec_path(claim), spec.to_string())
            .map_err(|e| ClaimError::new("cdi_write", format!("writing the CDI spec: {e}")))?;
        Ok(ours
            .into_iter()
            .map(|r| PreparedDevice {
                requests: vec![r.request.clone()],
                pool: r.pool.clone(),
                device: r.device.clone(),
                cdi_device_ids: vec![format!("{DRIVER}/device={}", cdi_name(&r.device))],
                share_id: None,
            })
            .collect())
    }

    fn unprepare(&self, claim: &ClaimRef) -> Result<(), ClaimError> {
        match fs::remove_file(self.spec_path(claim)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(ClaimError::new(
                "cdi_remove",
                format!("removing the CDI spec: {e}"),
            )),
            _ => Ok(()),
        }
    }
}

/// The node's pool: one slice with one device. The publisher names the slice, sets
/// the pool generation and makes the Node own it.
fn pool(node: &str) -> serde_json::Result<DesiredPool> {
    let slice: ResourceSlice = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": { "name": node, "generation": 0, "resourceSliceCount": 1 },
            "devices": [{ "name": "dev-0" }],
        },
    }))?;
    Ok(DesiredPool::new(vec![slice]))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt::init(); // RUST_LOG=info shows the publisher's work
    let args = Args::parse();
    let client = kube::Client::try_default().await?;
    fs::create_dir_all(&args.cdi_dir).context("creating the CDI directory")?;
    let registry = args.kubelet_dir.join("plugins_registry");
    let sockets = PluginSockets::new(&registry, &args.kubelet_dir.join("plugins"), DRIVER, None);
    let driver = Arc::new(Minimal {
        cdi_dir: args.cdi_dir,
    });
    let claims = Arc::new(ApiClaims::new(client.clone(), ReadPolicy::default()));
    let mut plugin =
        PluginBuilder::new(DRIVER, &args.node_name, sockets, driver, claims).start()?;

    // Publish until SIGINT or SIGTERM, while the plugin serves the kubelet on its own
    // tasks. The pool never changes here: a real driver sends new ones on `_pool`.
    let (_pool, desired) = tokio::sync::watch::channel(pool(&args.node_name)?);
    let config = PublisherConfig::new(DRIVER, &args.node_name);
    let publisher = Publisher::new(client, config, desired);
    let mut term = signal(SignalKind::terminate())?;
    publisher
        .run(async {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        })
        .await;
    plugin.unregister().await;
    plugin.stop().await;
    Ok(())
}
