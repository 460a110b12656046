//! Extra attribute names for a device's NUMA node (`--numa-node-aliases`).
//!
//! `matchAttribute` aligns devices of different drivers only when they publish the
//! same attribute name. The standard one is `resource.kubernetes.io/numaNode`, which
//! topodra publishes; the released CPU and NIC drivers (`dra-driver-cpu` v0.2.0,
//! `dranet` v1.4.0) publish theirs as `dra.net/numaNode`. An alias publishes the
//! same value under such a name too, so one constraint spans both drivers. It is a
//! bridge: once the neighbours publish the standard name, the alias can go.

use std::fmt;
use std::str::FromStr;

use super::attributes::{NUMA_NODE, PCI_BUS_ID, PCIE_ROOT};
use super::validate::{MAX_ATTRIBUTES, qualified_name};

/// The most attributes and capacities a device of ours carries without aliases: a
/// MIG device's 21 attributes plus its memory and multiprocessors (the test
/// `the_fullest_device_leaves_room_for_the_aliases` counts them).
pub(crate) const MAX_OWN_ENTRIES: usize = 23;

/// How many aliases fit in the API server's 32 attributes and capacities per device.
pub const MAX_NUMA_NODE_ALIASES: usize = MAX_ATTRIBUTES - MAX_OWN_ENTRIES;

/// One extra name for the NUMA node attribute: a qualified name (`domain/name`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NumaNodeAlias(String);

impl NumaNodeAlias {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn domain(&self) -> &str {
        self.0.split_once('/').map_or("", |(d, _)| d)
    }
}

impl fmt::Display for NumaNodeAlias {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a NUMA node alias, or a list of them, is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NumaNodeAliasError {
    #[error("NUMA node alias {name:?} is not a valid attribute name: {reason}")]
    Invalid { name: String, reason: &'static str },
    #[error(
        "NUMA node alias {0:?} has no domain: give the qualified name another driver \
         publishes, such as dra.net/numaNode (an unqualified name would be read as \
         <driver>/{0})"
    )]
    Unqualified(String),
    #[error(
        "NUMA node alias {name:?} is in this driver's own domain {driver:?}; an alias \
         is for another driver's name"
    )]
    OwnDomain { name: String, driver: String },
    #[error(
        "NUMA node alias {0:?} is a name topodra already publishes, or another standard \
         name in resource.kubernetes.io; only other domains can be aliases"
    )]
    Standard(String),
    #[error("NUMA node alias {0:?} is given twice")]
    Duplicate(String),
    #[error(
        "{count} NUMA node aliases: at most {max} fit beside a device's own attributes \
         within the API server's limit of 32 per device"
    )]
    TooMany { count: usize, max: usize },
}

impl FromStr for NumaNodeAlias {
    type Err = NumaNodeAliasError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim();
        qualified_name(name).map_err(|reason| NumaNodeAliasError::Invalid {
            name: name.to_owned(),
            reason,
        })?;
        if !name.contains('/') {
            return Err(NumaNodeAliasError::Unqualified(name.to_owned()));
        }
        let alias = Self(name.to_owned());
        // The standard domain belongs to Kubernetes: its names mean what KEP-4817
        // and KEP-5491 say, and `numaNode` is published already.
        if alias.domain() == "resource.kubernetes.io"
            || [NUMA_NODE, PCI_BUS_ID, PCIE_ROOT].contains(&name)
        {
            return Err(NumaNodeAliasError::Standard(name.to_owned()));
        }
        Ok(alias)
    }
}

/// Checks a list of aliases against the driver they are published by.
pub fn check_numa_node_aliases(
    aliases: &[NumaNodeAlias],
    driver: &str,
) -> Result<(), NumaNodeAliasError> {
    if aliases.len() > MAX_NUMA_NODE_ALIASES {
        return Err(NumaNodeAliasError::TooMany {
            count: aliases.len(),
            max: MAX_NUMA_NODE_ALIASES,
        });
    }
    let mut seen = std::collections::BTreeSet::new();
    for a in aliases {
        // The API server reads an unqualified attribute as `<driver>/<name>`, so a
        // name in our own domain could collide with one of our attributes.
        if a.domain() == driver {
            return Err(NumaNodeAliasError::OwnDomain {
                name: a.0.clone(),
                driver: driver.to_owned(),
            });
        }
        if !seen.insert(a.as_str()) {
            return Err(NumaNodeAliasError::Duplicate(a.0.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<NumaNodeAlias, NumaNodeAliasError> {
        s.parse()
    }

    #[test]
    fn the_cpu_and_nic_drivers_name_is_accepted() {
        let a = parse(" dra.net/numaNode ").unwrap();
        assert_eq!(a.as_str(), "dra.net/numaNode");
        assert!(check_numa_node_aliases(&[a], "gpu.topodra.dev").is_ok());
    }

    #[test]
    fn names_that_would_mislead_are_refused() {
        assert!(matches!(
            parse("numaNode"),
            Err(NumaNodeAliasError::Unqualified(_))
        ));
        assert!(matches!(
            parse("resource.kubernetes.io/numaNode"),
            Err(NumaNodeAliasError::Standard(_))
        ));
        assert!(matches!(
            parse("resource.kubernetes.io/numaNodes"),
            Err(NumaNodeAliasError::Standard(_))
        ));
        for bad in ["", "dra.net/", "dra.net/9node", "Dra_Net/numaNode", "a/b/c"] {
            assert!(
                matches!(parse(bad), Err(NumaNodeAliasError::Invalid { .. })),
                "{bad:?}"
            );
        }
        let own = parse("gpu.topodra.dev/numa").unwrap();
        assert!(matches!(
            check_numa_node_aliases(&[own], "gpu.topodra.dev"),
            Err(NumaNodeAliasError::OwnDomain { .. })
        ));
        let a = parse("dra.net/numaNode").unwrap();
        assert!(matches!(
            check_numa_node_aliases(&[a.clone(), a], "gpu.topodra.dev"),
            Err(NumaNodeAliasError::Duplicate(_))
        ));
    }

    #[test]
    fn no_more_aliases_than_fit_in_a_device() {
        let many: Vec<NumaNodeAlias> = (0..=MAX_NUMA_NODE_ALIASES)
            .map(|i| parse(&format!("example.com/numa{i}")).unwrap())
            .collect();
        assert_eq!(
            check_numa_node_aliases(&many, "gpu.topodra.dev"),
            Err(NumaNodeAliasError::TooMany {
                count: MAX_NUMA_NODE_ALIASES + 1,
                max: MAX_NUMA_NODE_ALIASES
            })
        );
        assert!(check_numa_node_aliases(&many[1..], "gpu.topodra.dev").is_ok());
    }
}
