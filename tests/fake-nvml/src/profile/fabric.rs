//! GPU fabric membership as `nvmlDeviceGetGpuFabricInfo{,V}` reports it
//! (multi-node NVLink, e.g. GB200 NVL72).
//!
//! nvml.h: on Hopper-and-newer NVSwitch systems the GPU registers with the
//! fabric manager; the probe `state` is one of NOT_SUPPORTED, NOT_STARTED,
//! IN_PROGRESS, COMPLETED, `status` is an NVML return code that "must be
//! checked only if state returns complete", `clusterUuid` is
//! `NVML_GPU_FABRIC_UUID_LEN` (16) raw bytes and `cliqueId` the fabric clique.
//! v3 adds `healthSummary` (NVML_GPU_FABRIC_HEALTH_SUMMARY_*).

use serde::{Deserialize, Serialize};

use super::{ProfileError, return_code_from_name};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuFabric {
    /// Canonical UUID text ("8-4-4-4-12" hex); NVML returns its 16 bytes.
    pub cluster_uuid: String,
    pub clique_id: u32,
    pub state: FabricState,
    /// NVML return code name (with or without the `NVML_ERROR_` prefix).
    #[serde(default = "success")]
    pub status: String,
    /// `healthSummary` of the v3 struct.
    #[serde(default)]
    pub health_summary: FabricHealth,
}

fn success() -> String {
    "SUCCESS".to_owned()
}

/// `NVML_GPU_FABRIC_STATE_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FabricState {
    NotSupported,
    NotStarted,
    InProgress,
    Completed,
}

/// `NVML_GPU_FABRIC_HEALTH_SUMMARY_*`. Not-supported is what public GB200
/// reports show next to a completed probe (e.g. leptonai/gpud#1106's
/// "summary: Not Supported").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FabricHealth {
    #[default]
    NotSupported,
    Healthy,
    Unhealthy,
    LimitedCapacity,
}

impl GpuFabric {
    /// The 16 raw bytes of `cluster_uuid`.
    pub fn cluster_uuid_bytes(&self) -> Result<[u8; 16], ProfileError> {
        parse_uuid(&self.cluster_uuid)
    }

    pub(super) fn validate(&self, bus_id: &str) -> Result<(), ProfileError> {
        self.cluster_uuid_bytes()
            .map_err(|e| ProfileError(format!("GPU {bus_id}: fabric.cluster_uuid: {}", e.0)))?;
        if return_code_from_name(&self.status).is_none() {
            return Err(ProfileError(format!(
                "GPU {bus_id}: fabric.status: unknown NVML return code {:?}",
                self.status
            )));
        }
        Ok(())
    }
}

/// "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" → 16 bytes, in text order.
pub fn parse_uuid(s: &str) -> Result<[u8; 16], ProfileError> {
    let bad = || ProfileError(format!("invalid UUID {s:?} (want 8-4-4-4-12 hex digits)"));
    let groups: Vec<&str> = s.split('-').collect();
    let lens: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    if lens != [8, 4, 4, 4, 12] {
        return Err(bad());
    }
    let hex: String = groups.concat();
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        let pair = hex.get(2 * i..2 * i + 2).ok_or_else(bad)?;
        *byte = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_bytes() {
        let b = parse_uuid("00112233-4455-6677-8899-aabbccddeeff").expect("parse");
        assert_eq!(b[0], 0x00);
        assert_eq!(b[1], 0x11);
        assert_eq!(b[15], 0xff);
        assert!(parse_uuid("0011223-4455-6677-8899-aabbccddeeff0").is_err());
        assert!(parse_uuid("zz112233-4455-6677-8899-aabbccddeeff").is_err());
    }
}
