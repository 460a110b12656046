//! Multi-node NVLink membership (GB200 NVL72) from `nvmlDeviceGetGpuFabricInfo*`.
//!
//! The fabric manager registers each GPU of an NVLink-connected rack in a cluster
//! (a UUID) and a clique (a number) inside it; GPUs of one clique reach each other
//! over NVLink across compute trays. NVML answers NOT_SUPPORTED on GPUs outside such
//! fabrics, and a state other than "completed" while registration is still going on.

use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::*;

/// nvml.h's `NVML_STRUCT_VERSION(GpuFabricInfo, 3)`: the struct size, version in the
/// top byte.
fn v3_version() -> u32 {
    (std::mem::size_of::<nvmlGpuFabricInfo_v3_t>() as u32) | (3 << 24)
}

/// Cluster UUID, clique id, registration state and its status, from whichever of
/// the two calls this driver has.
struct Raw {
    cluster_uuid: [u8; NVML_GPU_FABRIC_UUID_LEN as usize],
    clique_id: u32,
    state: u32,
    status: nvmlReturn_t,
}

fn read_v(nvml: &Nvml, device: &Device<'_>) -> Result<Raw, NvmlError> {
    let f = nvml_sym(nvml.lib().nvmlDeviceGetGpuFabricInfoV.as_ref())?;
    // SAFETY: plain integers and byte arrays; all-zero is a valid value.
    let mut info: nvmlGpuFabricInfoV_t = unsafe { std::mem::zeroed() };
    info.version = v3_version();
    // SAFETY: the handle comes from this NVML instance; `info` is the versioned
    // struct the version field announces.
    nvml_try(unsafe { f(device.handle(), &mut info) })?;
    Ok(Raw {
        cluster_uuid: info.clusterUuid,
        clique_id: info.cliqueId,
        state: u32::from(info.state),
        status: info.status,
    })
}

fn read_v1(nvml: &Nvml, device: &Device<'_>) -> Result<Raw, NvmlError> {
    let f = nvml_sym(nvml.lib().nvmlDeviceGetGpuFabricInfo.as_ref())?;
    // SAFETY: as above.
    let mut info: nvmlGpuFabricInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above, for the unversioned struct.
    nvml_try(unsafe { f(device.handle(), &mut info) })?;
    Ok(Raw {
        cluster_uuid: info.clusterUuid,
        clique_id: info.cliqueId,
        state: u32::from(info.state),
        status: info.status,
    })
}

/// `<clusterUUID>.<cliqueId>` of a GPU whose fabric registration completed; `None`
/// for a GPU outside any multi-node fabric or not registered (yet). Only a lost GPU
/// is an error.
pub(super) fn clique(nvml: &Nvml, device: &Device<'_>) -> Result<Option<String>, NvmlError> {
    let raw = match read_v(nvml, device) {
        Err(e) if wants_v1(&e) => read_v1(nvml, device),
        other => other,
    };
    let raw = match raw {
        Ok(r) => r,
        Err(NvmlError::GpuLost) => return Err(NvmlError::GpuLost),
        Err(e) => {
            tracing::debug!(error = %e, "no GPU fabric info");
            return Ok(None);
        }
    };
    Ok(registered(&raw))
}

/// Whether the versioned call failed because this driver predates it or version 3
/// of its struct, so the unversioned call may still answer. nvml-wrapper has no
/// variant for ARGUMENT_VERSION_MISMATCH and hands back its raw code.
fn wants_v1(e: &NvmlError) -> bool {
    match e {
        NvmlError::FailedToLoadSymbol(_) | NvmlError::InvalidArg | NvmlError::Unknown => true,
        NvmlError::UnexpectedVariant(code) => {
            *code == nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        }
        _ => false,
    }
}

fn registered(raw: &Raw) -> Option<String> {
    if raw.state != NVML_GPU_FABRIC_STATE_COMPLETED || raw.status != nvmlReturn_enum_NVML_SUCCESS {
        tracing::debug!(
            state = raw.state,
            status = raw.status,
            "GPU fabric registration not complete; no clique published"
        );
        return None;
    }
    if raw.cluster_uuid.iter().all(|b| *b == 0) {
        return None;
    }
    Some(format!(
        "{}.{}",
        uuid_string(&raw.cluster_uuid),
        raw.clique_id
    ))
}

/// The usual 8-4-4-4-12 spelling of a 16-byte UUID.
fn uuid_string(b: &[u8; 16]) -> String {
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(state: u32, status: nvmlReturn_t, first: u8) -> Raw {
        let mut cluster_uuid = [0u8; 16];
        cluster_uuid[0] = first;
        cluster_uuid[15] = 0xab;
        Raw {
            cluster_uuid,
            clique_id: 32766,
            state,
            status,
        }
    }

    #[test]
    fn only_completed_registrations_name_a_clique() {
        let ok = nvmlReturn_enum_NVML_SUCCESS;
        assert_eq!(
            registered(&raw(NVML_GPU_FABRIC_STATE_COMPLETED, ok, 0x12)).as_deref(),
            Some("12000000-0000-0000-0000-0000000000ab.32766")
        );
        assert_eq!(
            registered(&raw(NVML_GPU_FABRIC_STATE_IN_PROGRESS, ok, 1)),
            None
        );
        assert_eq!(
            registered(&raw(
                NVML_GPU_FABRIC_STATE_COMPLETED,
                nvmlReturn_enum_NVML_ERROR_UNKNOWN,
                1
            )),
            None
        );
        let mut zero = raw(NVML_GPU_FABRIC_STATE_COMPLETED, ok, 0);
        zero.cluster_uuid = [0; 16];
        assert_eq!(registered(&zero), None);
    }

    #[test]
    fn an_older_driver_falls_back_to_the_unversioned_call() {
        let mismatch = NvmlError::from(nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        assert!(wants_v1(&mismatch), "{mismatch:?}");
        assert!(wants_v1(&NvmlError::FailedToLoadSymbol("x".into())));
        assert!(!wants_v1(&NvmlError::NotSupported));
        assert!(!wants_v1(&NvmlError::GpuLost));
    }

    #[test]
    fn the_version_names_struct_v3() {
        assert_eq!(v3_version() >> 24, 3);
        assert_eq!(
            (v3_version() & 0xff_ffff) as usize,
            std::mem::size_of::<nvmlGpuFabricInfo_v3_t>()
        );
    }
}
