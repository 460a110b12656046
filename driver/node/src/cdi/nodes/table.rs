//! Device nodes from a table instead of the host: for tests, benchmarks and the
//! fuzz targets, which have no NVIDIA devices.

use std::collections::BTreeMap;

use super::*;

/// A fixed table of nodes, for tests and dry runs.
///
/// MIG capability nodes come from `TableDeviceNodes::with_mig`: a made-up but
/// unique minor pair per MIG device, registered in the table.
#[derive(Debug, Clone, Default)]
pub struct TableDeviceNodes(pub BTreeMap<String, NodeInfo>);

/// Major the table gives MIG capability nodes (dynamic on real hosts).
#[cfg(test)]
pub(crate) const TABLE_CAPS_MAJOR: u32 = 510;

impl TableDeviceNodes {
    /// A typical node: `nvidia<minor>` for each given minor, `nvidiactl`, and UVM
    /// under `uvm_major`.
    pub fn nvidia(minors: impl IntoIterator<Item = u32>, uvm_major: u32) -> Self {
        let mut t = BTreeMap::new();
        for m in minors {
            t.insert(format!("nvidia{m}"), NodeInfo::char(NVIDIA_MAJOR, m));
        }
        t.insert(
            "nvidiactl".into(),
            NodeInfo::char(NVIDIA_MAJOR, NVIDIACTL_MINOR),
        );
        t.insert("nvidia-uvm".into(), NodeInfo::char(uvm_major, 0));
        t.insert("nvidia-uvm-tools".into(), NodeInfo::char(uvm_major, 1));
        Self(t)
    }
}

impl TableDeviceNodes {
    /// The capability minors the table uses for one MIG device.
    pub(crate) fn mig_minors(
        parent_minor: u32,
        gpu_instance: u32,
        compute_instance: u32,
    ) -> [u32; 2] {
        let gi = 1000 + parent_minor * 100 + gpu_instance * 10;
        [gi, gi + 1 + compute_instance]
    }

    /// Registers the capability nodes of the given MIG devices (parent minor, GPU
    /// instance, compute instance).
    #[cfg(test)]
    pub(crate) fn with_mig(mut self, devices: impl IntoIterator<Item = (u32, u32, u32)>) -> Self {
        for (p, g, c) in devices {
            for minor in Self::mig_minors(p, g, c) {
                self.0
                    .insert(mig_cap_node(minor), NodeInfo::char(TABLE_CAPS_MAJOR, minor));
            }
        }
        self
    }
}

impl DeviceNodes for TableDeviceNodes {
    fn lookup(&self, name: &str) -> Result<Option<NodeInfo>, CdiError> {
        Ok(self.0.get(name).copied())
    }

    fn mig_access_nodes(
        &self,
        parent_minor: u32,
        gpu_instance: u32,
        compute_instance: u32,
    ) -> Result<Vec<String>, CdiError> {
        Ok(
            Self::mig_minors(parent_minor, gpu_instance, compute_instance)
                .into_iter()
                .map(mig_cap_node)
                .collect(),
        )
    }
}
