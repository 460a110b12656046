//! Alignment levels: the attributes a `matchAttribute` constraint can align GPUs on.

use std::fmt;

use serde::Serialize;

use crate::slice::attributes::{NUMA_NODE, NVLINK_DOMAIN, PCIE_ROOT, PCIE_SWITCH, SOCKET};

/// A topology level that groups a node's GPUs. Each is one attribute of our slices;
/// a claim whose constraint matches on it gets its GPUs from one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Level {
    NumaNode,
    Socket,
    PcieRoot,
    PcieSwitch,
    NvlinkDomain,
}

impl Level {
    pub const ALL: [Level; 5] = [
        Level::NumaNode,
        Level::Socket,
        Level::PcieRoot,
        Level::PcieSwitch,
        Level::NvlinkDomain,
    ];

    /// The attribute's name in our slices: standard names are fully qualified, ours
    /// are in the driver's domain and published without it.
    pub(crate) fn attribute(self) -> &'static str {
        match self {
            Level::NumaNode => NUMA_NODE,
            Level::Socket => SOCKET,
            Level::PcieRoot => PCIE_ROOT,
            Level::PcieSwitch => PCIE_SWITCH,
            Level::NvlinkDomain => NVLINK_DOMAIN,
        }
    }

    /// The name a constraint or a flag uses: `numaNode`, `socket`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            Level::NumaNode => "numaNode",
            Level::Socket => "socket",
            Level::PcieRoot => "pcieRoot",
            Level::PcieSwitch => "pcieSwitch",
            Level::NvlinkDomain => "nvlinkDomain",
        }
    }

    /// The level a `matchAttribute` constraint aligns on, if it names one of ours:
    /// `resource.kubernetes.io/numaNode`, `<driver>/socket`, ...
    pub(crate) fn from_match_attribute(attribute: &str, driver: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|l| {
            let a = l.attribute();
            if a.contains('/') {
                attribute == a
            } else {
                attribute
                    .strip_prefix(driver)
                    .and_then(|r| r.strip_prefix('/'))
                    == Some(a)
            }
        })
    }

    /// "one NUMA node", for messages.
    pub(crate) fn one(self) -> &'static str {
        match self {
            Level::NumaNode => "one NUMA node",
            Level::Socket => "one socket",
            Level::PcieRoot => "one PCIe root",
            Level::PcieSwitch => "one PCIe switch",
            Level::NvlinkDomain => "one NVLink domain",
        }
    }

    /// How a group of this level is named in messages: "NUMA 1", "socket 0".
    pub(crate) fn group_name(self, key: &str) -> String {
        match self {
            Level::NumaNode => format!("NUMA {key}"),
            Level::Socket => format!("socket {key}"),
            Level::PcieRoot => format!("PCIe root {key}"),
            Level::PcieSwitch => format!("PCIe switch {key}"),
            Level::NvlinkDomain => format!("NVLink domain {key}"),
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A level name other than the five.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown alignment level {0:?}: expected numaNode, socket, pcieRoot, pcieSwitch or nvlinkDomain"
)]
pub struct LevelError(pub String);

impl std::str::FromStr for Level {
    type Err = LevelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Level::ALL
            .into_iter()
            .find(|l| l.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| LevelError(s.to_owned()))
    }
}
