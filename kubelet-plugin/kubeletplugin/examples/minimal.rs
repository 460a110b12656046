//! The smallest DRA kubelet plugin: one device, `dev-0`, published in a
//! ResourceSlice for this node; preparing a claim writes nothing and answers the
//! CDI id `<driver>/device=dev-0` (a real driver writes that CDI spec first).
//!
//! ```text
//! cargo run -p dra-kubeletplugin --example minimal -- --node-name "$(hostname)"
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use dra_kubeletplugin::claims::{ApiClaims, ReadPolicy};
use dra_kubeletplugin::uds::PluginSockets;
use dra_kubeletplugin::{ClaimError, ClaimRef, Driver, PluginBuilder, PreparedDevice};
use k8s_openapi::api::resource::v1::{
    Device, ResourceClaim, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use kube::api::{ObjectMeta, Patch, PatchParams};

#[derive(Debug, Parser)]
struct Args {
    /// This node's name: the pool name and the slice's nodeName.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    #[arg(long, env = "DRIVER_NAME", default_value = "minimal.example.com")]
    driver_name: String,
    #[arg(
        long,
        env = "KUBELET_REGISTRY_DIR",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    kubelet_registry_dir: PathBuf,
    #[arg(
        long,
        env = "KUBELET_PLUGINS_DIR",
        default_value = "/var/lib/kubelet/plugins"
    )]
    kubelet_plugins_dir: PathBuf,
}

const DEVICE: &str = "dev-0";

#[derive(Debug)]
struct Minimal {
    driver_name: String,
}

impl Driver for Minimal {
    fn prepare(
        &self,
        _claim: &ClaimRef,
        object: &ResourceClaim,
    ) -> Result<Vec<PreparedDevice>, ClaimError> {
        let results = object
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .ok_or_else(|| ClaimError::new("not_allocated", "the claim is not allocated"))?;
        Ok(results
            .iter()
            .filter(|r| r.driver == self.driver_name)
            .map(|r| PreparedDevice {
                requests: vec![r.request.clone()],
                pool: r.pool.clone(),
                device: r.device.clone(),
                cdi_device_ids: vec![format!("{}/device={}", self.driver_name, r.device)],
                share_id: None,
            })
            .collect())
    }

    fn unprepare(&self, _claim: &ClaimRef) -> Result<(), ClaimError> {
        Ok(())
    }
}

/// One slice, one device, written with server-side apply.
// TODO: use `dra_kubeletplugin::publish` once ResourceSlice publishing lands in the
// crate; it keeps the slice in sync and retries, which this one-shot apply does not.
async fn publish(client: kube::Client, args: &Args) -> anyhow::Result<()> {
    let name = format!("{}-{}", args.node_name, args.driver_name.replace('.', "-"));
    let slice = ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: args.driver_name.clone(),
            node_name: Some(args.node_name.clone()),
            pool: ResourcePool {
                name: args.node_name.clone(),
                generation: 1,
                resource_slice_count: 1,
            },
            devices: Some(vec![Device {
                name: DEVICE.to_owned(),
                ..Device::default()
            }]),
            ..ResourceSliceSpec::default()
        },
    };
    kube::Api::<ResourceSlice>::all(client)
        .patch(
            &name,
            &PatchParams::apply(&args.driver_name).force(),
            &Patch::Apply(&slice),
        )
        .await
        .context("publishing the ResourceSlice")?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = kube::Client::try_default()
        .await
        .context("finding the API server")?;
    let sockets = PluginSockets::new(
        &args.kubelet_registry_dir,
        &args.kubelet_plugins_dir,
        &args.driver_name,
        None,
    );
    let driver = Arc::new(Minimal {
        driver_name: args.driver_name.clone(),
    });
    let claims = Arc::new(ApiClaims::new(client.clone(), ReadPolicy::default()));
    let mut plugin =
        PluginBuilder::new(&args.driver_name, &args.node_name, sockets, driver, claims).start()?;
    publish(client, &args).await?;
    tokio::signal::ctrl_c().await?;
    plugin.unregister().await;
    plugin.stop().await;
    Ok(())
}
