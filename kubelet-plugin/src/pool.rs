//! The topodra side of publishing: this node's inventory and health taints, built
//! into the ResourceSlices that [`dra_kubeletplugin::publish`] keeps published.
//!
//! The slices are built here, once per change, with `topodra_model::slice`, which
//! also checks them against the API server's rules: a pool it refuses is handed over
//! as [`DesiredPool::Invalid`], so the publisher writes nothing and says why. The
//! publisher's requests are counted by the layer `topodra_ops::requests` adds to the
//! client it is given.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::DeviceTaint;
use topodra_model::Inventory;
use topodra_model::slice::{
    AttributeSet, DynamicMig, NumaNodeAlias, NumaNodeFormat, SliceOptions, build_slices,
};

use dra_kubeletplugin::publish::DesiredPool;

/// Builds this node's pool from the inventory and the devices' taints.
#[derive(Debug, Clone)]
pub(crate) struct PoolBuilder {
    inventory: Arc<Inventory>,
    options: SliceOptions,
}

impl PoolBuilder {
    pub(crate) fn new(
        inventory: Arc<Inventory>,
        driver_name: &str,
        node_name: &str,
        numa_node_format: NumaNodeFormat,
        numa_node_aliases: Vec<NumaNodeAlias>,
    ) -> Self {
        Self {
            inventory,
            options: {
                let mut options = SliceOptions::new(node_name);
                options.driver_name = driver_name.to_owned();
                options.numa_node_format = numa_node_format;
                options.numa_node_aliases = numa_node_aliases;
                options
            },
        }
    }

    /// Publishes the attributes of `set` (`--attributes`).
    pub(crate) fn with_attributes(mut self, set: AttributeSet) -> Self {
        self.options.attributes = set;
        self
    }

    /// Publishes the MIG partitions of the GPUs in MIG mode (`--dynamic-mig`);
    /// `own` are the instances the plugin made, as the preparer found them at
    /// start (`Preparer::own_mig_instances`).
    pub(crate) fn with_dynamic_mig(mut self, own: BTreeSet<(String, u32, u32)>) -> Self {
        self.options.dynamic_mig = DynamicMig::All;
        self.options.own_mig_instances = own;
        self
    }

    /// Publishes the shared devices `sharing` asks for (`--time-slicing`).
    pub(crate) fn with_sharing(mut self, sharing: topodra_model::slice::Sharing) -> Self {
        self.options.sharing = sharing;
        self
    }

    /// The pool with these taints (by device name, `gpu-3`). Generation and owner
    /// are the publisher's to set.
    pub(crate) fn build(&self, device_taints: BTreeMap<String, Vec<DeviceTaint>>) -> DesiredPool {
        let mut options = self.options.clone();
        options.device_taints = device_taints;
        match build_slices(&self.inventory, &options) {
            Ok(slices) => DesiredPool::new(slices),
            Err(e) => DesiredPool::Invalid(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use dra_kubeletplugin::publish::{PublishStatus, Publisher, PublisherConfig};
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use tokio::sync::watch;
    use topodra_mock_apiserver::MockApi;
    use topodra_model::Gpu;
    use topodra_ops::requests::{RequestCounter, Verb};
    use tower::Layer;

    use super::*;

    const NODE: &str = "dgx-01";
    const DRIVER: &str = "gpu.topodra.dev";

    fn inventory(gpus: u32) -> Arc<Inventory> {
        let mut inv = Inventory::default();
        for i in 0..gpus {
            let mut g = Gpu::at(format!("0000:{:02x}:00.0", 0x18 + i).parse().unwrap());
            g.minor = Some(i);
            g.index = Some(i);
            inv.gpus.push(g);
        }
        Arc::new(inv)
    }

    #[test]
    fn taints_go_on_their_devices_and_an_invalid_pool_says_why() {
        let pool = PoolBuilder::new(inventory(2), DRIVER, NODE, NumaNodeFormat::Int, Vec::new());
        let taint = DeviceTaint {
            key: "gpu.topodra.dev/unhealthy".to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Default::default()
        };
        let DesiredPool::Slices(slices) =
            pool.build(BTreeMap::from([("gpu-1".to_owned(), vec![taint.clone()])]))
        else {
            panic!("expected slices");
        };
        let devices = slices[0].spec.devices.as_ref().unwrap();
        let gpu1 = devices.iter().find(|d| d.name == "gpu-1").unwrap();
        assert_eq!(gpu1.taints.as_deref(), Some(&[taint][..]));
        assert!(slices.iter().all(|s| s.metadata.owner_references.is_none()));

        let bad = PoolBuilder::new(
            inventory(2),
            "Not A Driver",
            NODE,
            NumaNodeFormat::Int,
            Vec::new(),
        );
        assert!(matches!(bad.build(BTreeMap::new()), DesiredPool::Invalid(e) if !e.is_empty()));
    }

    #[test]
    fn the_attribute_set_reaches_the_slices() {
        let mut inv = (*inventory(1)).clone();
        inv.gpus[0].brand = Some("NVIDIA".to_owned());
        inv.gpus[0].product_name = Some("NVIDIA H100 80GB HBM3".to_owned());
        let pool = PoolBuilder::new(Arc::new(inv), DRIVER, NODE, NumaNodeFormat::Int, Vec::new());
        let attrs = |pool: &PoolBuilder| {
            let DesiredPool::Slices(slices) = pool.build(BTreeMap::new()) else {
                panic!("expected slices");
            };
            slices[0].spec.devices.as_ref().unwrap()[0]
                .attributes
                .clone()
                .unwrap()
        };
        let lean = attrs(&pool);
        assert!(lean.contains_key("productName") && !lean.contains_key("brand"));
        let full = attrs(&pool.with_attributes(AttributeSet::Full));
        assert!(full.contains_key("productName") && full.contains_key("brand"));
    }

    /// The client the plugin hands the publisher is counted, so the publisher's
    /// requests show in `topodra_api_requests_total`: one GET, one WATCHLIST, the
    /// creates, and in steady state only resumed watches.
    #[tokio::test(start_paused = true)]
    async fn the_publishers_requests_are_counted() {
        let mock = MockApi::new();
        mock.add_node(NODE, "uid-1");
        let counter = RequestCounter::new();
        let client = kube::Client::new(counter.layer().layer(mock.service()), "default");
        let pool = PoolBuilder::new(inventory(8), DRIVER, NODE, NumaNodeFormat::Int, Vec::new());
        let (_desired, rx) = watch::channel(pool.build(BTreeMap::new()));
        let publisher = Publisher::new(client, PublisherConfig::new(DRIVER, NODE), rx);
        let mut status = publisher.status();
        let task = tokio::spawn(publisher.run(std::future::pending()));
        status.wait_for(PublishStatus::is_in_sync).await.unwrap();
        tokio::time::sleep(Duration::from_secs(600)).await;

        let slices: Vec<ResourceSlice> = mock
            .slices()
            .into_iter()
            .map(|v| serde_json::from_value(v).unwrap())
            .collect();
        // New slices are created (the API server names them), not applied.
        let creates = u64::try_from(slices.len()).unwrap();
        let counts = BTreeMap::from([
            ((Verb::Get, "nodes".to_owned()), 1),
            ((Verb::WatchList, "resourceslices".to_owned()), 1),
            ((Verb::Create, "resourceslices".to_owned()), creates),
            ((Verb::Watch, "resourceslices".to_owned()), 2),
        ]);
        assert_eq!(counter.snapshot(), counts);
        assert_eq!(counter.get(Verb::List, "resourceslices"), 0);
        task.abort();
    }
}
