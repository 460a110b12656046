//! PCI addresses as the three sources spell them.
//!
//! NVML prints an 8-digit domain (`00000000:18:00.0`), hwloc and sysfs a 4-digit one
//! (`0000:18:00.0`), and both may use upper or lower case. Everything joins on
//! [`PciAddress`], which prints the sysfs form that `resource.kubernetes.io/pciBusID`
//! uses.

use std::fmt;
use std::str::FromStr;

/// A PCI function address: domain, bus, device, function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

/// A PCI address string that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid PCI address {input:?}: {reason}")]
pub struct PciAddressError {
    pub input: String,
    pub reason: &'static str,
}

impl PciAddress {
    pub fn new(domain: u32, bus: u8, device: u8, function: u8) -> Self {
        Self {
            domain,
            bus,
            device,
            function,
        }
    }

    /// The root complex this address would sit under if `bus` were its root bus.
    #[cfg(any(test, feature = "test-fixtures"))]
    pub fn root(&self) -> PcieRoot {
        PcieRoot {
            domain: self.domain,
            bus: self.bus,
        }
    }

    /// A DNS-label-safe spelling (`0000-18-00-0`), for names derived from the address.
    pub(crate) fn to_label(self) -> String {
        format!(
            "{:04x}-{:02x}-{:02x}-{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl FromStr for PciAddress {
    type Err = PciAddressError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason| PciAddressError {
            input: input.to_owned(),
            reason,
        };
        let s = input.trim();
        let (domain, rest) = s
            .split_once(':')
            .ok_or_else(|| err("expected domain:bus:device.function"))?;
        let (bus, rest) = rest
            .split_once(':')
            .ok_or_else(|| err("expected domain:bus:device.function"))?;
        let (device, function) = rest
            .split_once('.')
            .ok_or_else(|| err("expected device.function"))?;
        if domain.is_empty() || domain.len() > 8 {
            return Err(err("domain must have 1 to 8 hex digits"));
        }
        if bus.len() != 2 || device.len() != 2 || function.len() != 1 {
            return Err(err("bus and device need 2 hex digits, function 1"));
        }
        let hex = |v: &str| u32::from_str_radix(v, 16).map_err(|_| err("not hexadecimal"));
        let device = hex(device)?;
        let function = hex(function)?;
        if device > 0x1f || function > 7 {
            return Err(err("device must be at most 1f and function at most 7"));
        }
        Ok(Self {
            domain: hex(domain)?,
            bus: u8::try_from(hex(bus)?).map_err(|_| err("bus out of range"))?,
            device: device as u8,
            function: function as u8,
        })
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

serde_as_string!(PciAddress);

/// A PCIe root complex, named like its sysfs directory (`pci0000:15`), which is the
/// value format of `resource.kubernetes.io/pcieRoot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PcieRoot {
    pub domain: u32,
    pub bus: u8,
}

impl fmt::Display for PcieRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pci{:04x}:{:02x}", self.domain, self.bus)
    }
}

impl FromStr for PcieRoot {
    type Err = PciAddressError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason| PciAddressError {
            input: input.to_owned(),
            reason,
        };
        let rest = input
            .strip_prefix("pci")
            .ok_or_else(|| err("expected pciDDDD:BB"))?;
        let (domain, bus) = rest
            .split_once(':')
            .ok_or_else(|| err("expected pciDDDD:BB"))?;
        if domain.is_empty() || domain.len() > 8 || bus.len() != 2 {
            return Err(err("expected pciDDDD:BB"));
        }
        Ok(Self {
            domain: u32::from_str_radix(domain, 16).map_err(|_| err("not hexadecimal"))?,
            bus: u8::from_str_radix(bus, 16).map_err(|_| err("not hexadecimal"))?,
        })
    }
}

serde_as_string!(PcieRoot);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_and_sysfs_spellings_join() {
        let nvml: PciAddress = "00000000:9A:00.0".parse().unwrap();
        let sysfs: PciAddress = "0000:9a:00.0".parse().unwrap();
        assert_eq!(nvml, sysfs);
        assert_eq!(nvml.to_string(), "0000:9a:00.0");
        assert_eq!(nvml.to_label(), "0000-9a-00-0");
    }

    #[test]
    fn wide_domains_survive() {
        let a: PciAddress = "00000019:01:00.0".parse().unwrap();
        assert_eq!(a.to_string(), "0019:01:00.0");
        let a: PciAddress = "10000:01:00.0".parse().unwrap();
        assert_eq!(a.to_string(), "10000:01:00.0");
    }

    #[test]
    fn malformed_addresses_are_rejected() {
        for bad in [
            "",
            "18:00.0",
            "0000:18:00",
            "0000:1:00.0",
            "0000:18:20.0",
            "0000:zz:00.0",
            "0000:18:00.8",
        ] {
            assert!(bad.parse::<PciAddress>().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn pcie_root_round_trips() {
        let r: PcieRoot = "pci0000:15".parse().unwrap();
        assert_eq!(
            r,
            PcieRoot {
                domain: 0,
                bus: 0x15
            }
        );
        assert_eq!(r.to_string(), "pci0000:15");
        assert!("0000:15".parse::<PcieRoot>().is_err());
    }
}
