//! NVML's answers about each GPU, recorded as NVML gave them: a fixture to hold
//! the fake NVML against a real machine's NVML, and the MIG geometry (GPU instance
//! profiles and where each may be placed) that creating MIG devices on demand
//! plans from.
//!
//! Discovery ([`super::discover`]) keeps what it can use and drops the rest; a
//! record keeps everything, failures included. Each call that fails is recorded
//! as its error in place of the value ("not supported" is a fact about a GPU
//! too), and never stops the record: only an NVML that cannot be loaded or
//! initialised leaves nothing to record.
//!
//! Field names follow nvml.h (`sliceCount`, `memorySizeMB`, `pciSubSystemId`), so
//! a record reads against the NVML API reference.

use std::ffi::CStr;

use nvml_wrapper::error::{Bits, NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    NVML_GPU_INSTANCE_PROFILE_COUNT, nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_v2_t,
};
use serde::{Deserialize, Serialize};

use super::{DiscoveryError, NvmlSource};

/// How many profile indices past the compiled-in `NVML_GPU_INSTANCE_PROFILE_COUNT`
/// are asked at most. nvml.h: the profile info call "can be used to enumerate all
/// MIG profiles supported by NVML in a forward compatible way by invoking it on
/// profile values starting from 0, until the API returns
/// NVML_ERROR_INVALID_ARGUMENT"; a driver newer than the bindings (17 profiles in
/// nvml-wrapper-sys 0.10, as CUDA 13.0's nvml.h; 18 in CUDA 13.2's) has more.
pub(super) const PROFILES_PAST_COUNT: u32 = 16;

/// Everything NVML answered on one machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NvmlRecord {
    pub system: SystemRecord,
    /// `nvmlDeviceGetCount_v2`.
    pub device_count: Answer<u32>,
    /// One per NVML index below the count.
    pub devices: Vec<DeviceRecord>,
}

/// NVML's answer to one call: the value, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Answer<T> {
    Value(T),
    Failed(Failure),
}

impl<T> Answer<T> {
    fn of(r: Result<T, NvmlError>) -> Self {
        match r {
            Ok(v) => Self::Value(v),
            Err(e) => Self::Failed(Failure::of(&e)),
        }
    }

    fn map<U>(self, f: impl FnOnce(T) -> U) -> Answer<U> {
        match self {
            Self::Value(v) => Answer::Value(f(v)),
            Self::Failed(e) => Answer::Failed(e),
        }
    }

    /// The value, if NVML gave one.
    pub fn value(&self) -> Option<&T> {
        match self {
            Self::Value(v) => Some(v),
            Self::Failed(_) => None,
        }
    }
}

/// A call that failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Failure {
    /// The error as nvml-wrapper words it.
    pub error: String,
    /// nvml.h's name of the return code (`NVML_ERROR_NOT_SUPPORTED`), when the
    /// failure is one NVML returned; absent for failures on this side (a symbol the
    /// library does not export, a value nvml-wrapper does not know).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

impl Failure {
    fn of(e: &NvmlError) -> Self {
        Self {
            error: e.to_string(),
            code: return_code(e).map(str::to_owned),
        }
    }
}

/// The nvml.h name of the return code behind an error nvml-wrapper decoded.
fn return_code(e: &NvmlError) -> Option<&'static str> {
    Some(match e {
        NvmlError::Uninitialized => "NVML_ERROR_UNINITIALIZED",
        NvmlError::InvalidArg => "NVML_ERROR_INVALID_ARGUMENT",
        NvmlError::NotSupported => "NVML_ERROR_NOT_SUPPORTED",
        NvmlError::NoPermission => "NVML_ERROR_NO_PERMISSION",
        NvmlError::NotFound => "NVML_ERROR_NOT_FOUND",
        NvmlError::InsufficientSize(_) => "NVML_ERROR_INSUFFICIENT_SIZE",
        NvmlError::InsufficientPower => "NVML_ERROR_INSUFFICIENT_POWER",
        NvmlError::DriverNotLoaded => "NVML_ERROR_DRIVER_NOT_LOADED",
        NvmlError::Timeout => "NVML_ERROR_TIMEOUT",
        NvmlError::IrqIssue => "NVML_ERROR_IRQ_ISSUE",
        NvmlError::LibraryNotFound => "NVML_ERROR_LIBRARY_NOT_FOUND",
        NvmlError::FunctionNotFound => "NVML_ERROR_FUNCTION_NOT_FOUND",
        NvmlError::CorruptedInfoROM => "NVML_ERROR_CORRUPTED_INFOROM",
        NvmlError::GpuLost => "NVML_ERROR_GPU_IS_LOST",
        NvmlError::ResetRequired => "NVML_ERROR_RESET_REQUIRED",
        NvmlError::OperatingSystem => "NVML_ERROR_OPERATING_SYSTEM",
        NvmlError::LibRmVersionMismatch => "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        NvmlError::InUse => "NVML_ERROR_IN_USE",
        NvmlError::InsufficientMemory => "NVML_ERROR_MEMORY",
        NvmlError::NoData => "NVML_ERROR_NO_DATA",
        NvmlError::VgpuEccNotSupported => "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED",
        NvmlError::Unknown => "NVML_ERROR_UNKNOWN",
        _ => return None,
    })
}

/// The driver and library.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SystemRecord {
    /// `nvmlSystemGetDriverVersion`.
    pub driver_version: Answer<String>,
    /// `nvmlSystemGetNVMLVersion`.
    pub nvml_version: Answer<String>,
    /// `nvmlSystemGetCudaDriverVersion_v2`: 1000 x major + 10 x minor (13000 for
    /// CUDA 13.0).
    pub cuda_driver_version: Answer<i32>,
}

/// One NVML index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRecord {
    pub index: u32,
    /// What the GPU answered, or why `nvmlDeviceGetHandleByIndex_v2` gave no
    /// handle to ask with.
    #[serde(flatten)]
    pub answers: Answer<DeviceAnswers>,
}

/// What one GPU answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceAnswers {
    /// `nvmlDeviceGetName`.
    pub name: Answer<String>,
    /// `nvmlDeviceGetUUID`.
    pub uuid: Answer<String>,
    /// `nvmlDeviceGetMinorNumber`.
    pub minor_number: Answer<u32>,
    /// `nvmlDeviceGetPciInfo_v3`.
    pub pci: Answer<PciRecord>,
    /// `total` of `nvmlDeviceGetMemoryInfo_v2`, in bytes.
    pub memory_total_bytes: Answer<u64>,
    /// `nvmlDeviceGetNumaNodeId`.
    pub numa_node_id: Answer<u32>,
    /// `nvmlDeviceGetCudaComputeCapability`.
    pub cuda_compute_capability: Answer<ComputeCapabilityRecord>,
    /// `nvmlDeviceGetArchitecture`, as nvml-wrapper names it.
    pub architecture: Answer<String>,
    /// `nvmlDeviceGetMigMode`.
    pub mig_mode: Answer<MigModeRecord>,
    /// `nvmlDeviceGetMaxMigDeviceCount` (nvml.h: zero "if MIG is not supported or
    /// enabled").
    pub max_mig_device_count: Answer<u32>,
    /// `nvmlDeviceGetSupportedEventTypes`: the bitmask of `nvmlEventType*`, bits
    /// nvml-wrapper does not know included.
    pub supported_event_types: Answer<Hex>,
    /// Every `NVML_GPU_INSTANCE_PROFILE_*` index from 0, in order.
    pub gpu_instance_profiles: Vec<GpuInstanceProfileRecord>,
}

/// `nvmlPciInfo_t`, the fields that identify the function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PciRecord {
    /// `busId`, e.g. `00000000:07:00.0`.
    pub bus_id: String,
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    /// Device id in the high 16 bits, vendor id in the low (`0x20b010de`).
    pub pci_device_id: Hex,
    /// Subsystem device id high, subsystem vendor id low.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_sub_system_id: Option<Hex>,
}

/// A number written as `0x`-prefixed hex, as lspci and nvidia-smi print PCI ids
/// and as nvml.h defines the event type bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Hex(pub u64);

impl From<Hex> for String {
    fn from(h: Hex) -> Self {
        format!("{:#x}", h.0)
    }
}

impl TryFrom<String> for Hex {
    type Error = std::num::ParseIntError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        let digits = s
            .strip_prefix("0x")
            .or_else(|| s.strip_prefix("0X"))
            .unwrap_or(&s);
        u64::from_str_radix(digits, 16).map(Hex)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeCapabilityRecord {
    pub major: i32,
    pub minor: i32,
}

/// `NVML_DEVICE_MIG_ENABLE` (1) or `_DISABLE` (0), as NVML answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigModeRecord {
    pub current: u32,
    pub pending: u32,
}

/// One GPU instance profile index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInstanceProfileRecord {
    /// The `NVML_GPU_INSTANCE_PROFILE_*` index asked for (0 is `1_SLICE`), not
    /// the profile's id.
    pub profile: u32,
    /// `nvmlDeviceGetGpuInstanceProfileInfoV` (version 2, with the name) when it
    /// answered, else `nvmlDeviceGetGpuInstanceProfileInfo`.
    pub info: Answer<GpuInstanceProfileInfo>,
    /// Why the versioned call did not answer, when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info_v_failure: Option<Failure>,
    /// `nvmlDeviceGetGpuInstancePossiblePlacements_v2` for the profile's `id`;
    /// absent when no profile info gave an id to ask with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub possible_placements: Option<Answer<Vec<Placement>>>,
}

/// `nvmlGpuInstanceProfileInfo_t`, and the name version 2 adds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInstanceProfileInfo {
    /// nvml.h: "Unique profile ID within the device": what the placements call
    /// and GPU instance creation take (19 for an A100's 1g.5gb).
    pub id: u32,
    #[serde(rename = "isP2pSupported")]
    pub is_p2p_supported: bool,
    pub slice_count: u32,
    pub instance_count: u32,
    pub multiprocessor_count: u32,
    pub copy_engine_count: u32,
    pub decoder_count: u32,
    pub encoder_count: u32,
    pub jpeg_count: u32,
    pub ofa_count: u32,
    #[serde(rename = "memorySizeMB")]
    pub memory_size_mb: u64,
    /// Only the versioned call has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// nvml.h: `start` "Index of first occupied memory slice", `size` "Number of
/// memory slices occupied".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub start: u32,
    pub size: u32,
}

impl NvmlSource {
    /// Loads NVML and records what it answers ([`record`]).
    pub fn record(&self) -> Result<NvmlRecord, DiscoveryError> {
        Ok(record(&self.open()?))
    }
}

/// Asks an initialised NVML about the system and every GPU it counts.
pub fn record(nvml: &Nvml) -> NvmlRecord {
    let device_count = Answer::of(nvml.device_count());
    let devices = match &device_count {
        Answer::Value(n) => (0..*n)
            .map(|index| DeviceRecord {
                index,
                answers: Answer::of(nvml.device_by_index(index)).map(|d| device(nvml, &d)),
            })
            .collect(),
        Answer::Failed(_) => Vec::new(),
    };
    NvmlRecord {
        system: SystemRecord {
            driver_version: Answer::of(nvml.sys_driver_version()),
            nvml_version: Answer::of(nvml.sys_nvml_version()),
            cuda_driver_version: Answer::of(nvml.sys_cuda_driver_version()),
        },
        device_count,
        devices,
    }
}

fn device(nvml: &Nvml, d: &Device<'_>) -> DeviceAnswers {
    DeviceAnswers {
        name: Answer::of(d.name()),
        uuid: Answer::of(d.uuid()),
        minor_number: Answer::of(d.minor_number()),
        pci: Answer::of(d.pci_info()).map(|p| PciRecord {
            bus_id: p.bus_id,
            domain: p.domain,
            bus: p.bus,
            device: p.device,
            pci_device_id: Hex(p.pci_device_id.into()),
            pci_sub_system_id: p.pci_sub_system_id.map(|v| Hex(v.into())),
        }),
        memory_total_bytes: Answer::of(d.memory_info()).map(|m| m.total),
        numa_node_id: Answer::of(d.numa_node_id()),
        cuda_compute_capability: Answer::of(d.cuda_compute_capability()).map(|c| {
            ComputeCapabilityRecord {
                major: c.major,
                minor: c.minor,
            }
        }),
        architecture: Answer::of(d.architecture()).map(|a| a.to_string()),
        mig_mode: Answer::of(d.mig_mode()).map(|m| MigModeRecord {
            current: m.current,
            pending: m.pending,
        }),
        max_mig_device_count: Answer::of(d.mig_device_count()),
        supported_event_types: Answer::of(match d.supported_event_types_strict() {
            Ok(t) => Ok(Hex(t.bits())),
            // The strict call fails on bits it has no flag for, and carries them.
            Err(NvmlError::IncorrectBits(Bits::U64(raw))) => Ok(Hex(raw)),
            Err(e) => Err(e),
        }),
        gpu_instance_profiles: gpu_instance_profiles(nvml, d),
    }
}

/// Every profile index below `NVML_GPU_INSTANCE_PROFILE_COUNT`, then on past it
/// while NVML keeps answering, up to [`PROFILES_PAST_COUNT`] more; the first index
/// past the count that does not answer is recorded too, so the record shows how
/// the driver ends the enumeration.
fn gpu_instance_profiles(nvml: &Nvml, d: &Device<'_>) -> Vec<GpuInstanceProfileRecord> {
    let mut out: Vec<_> = (0..NVML_GPU_INSTANCE_PROFILE_COUNT)
        .map(|p| gpu_instance_profile(nvml, d, p))
        .collect();
    for p in NVML_GPU_INSTANCE_PROFILE_COUNT..NVML_GPU_INSTANCE_PROFILE_COUNT + PROFILES_PAST_COUNT
    {
        let r = gpu_instance_profile(nvml, d, p);
        let answered = r.info.value().is_some();
        out.push(r);
        if !answered {
            break;
        }
    }
    out
}

fn gpu_instance_profile(nvml: &Nvml, d: &Device<'_>, profile: u32) -> GpuInstanceProfileRecord {
    let (info, info_v_failure) = match profile_info_v(nvml, d, profile) {
        Ok(info) => (Answer::Value(info), None),
        Err(e) => (
            Answer::of(d.profile_info(profile)).map(|p| GpuInstanceProfileInfo {
                id: p.id,
                is_p2p_supported: p.is_p2p_supported,
                slice_count: p.slice_count,
                instance_count: p.instance_count,
                multiprocessor_count: p.multiprocessor_count,
                copy_engine_count: p.copy_engine_count,
                decoder_count: p.decoder_count,
                encoder_count: p.encoder_count,
                jpeg_count: p.jpeg_count,
                ofa_count: p.ofa_count,
                memory_size_mb: p.memory_size_mb,
                name: None,
            }),
            Some(Failure::of(&e)),
        ),
    };
    let possible_placements = info
        .value()
        .map(|i| Answer::of(possible_placements(nvml, d, i.id)));
    GpuInstanceProfileRecord {
        profile,
        info,
        info_v_failure,
        possible_placements,
    }
}

/// nvml.h's `NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2)`: the struct's size,
/// the version in the top byte.
fn v2_version() -> u32 {
    u32::try_from(std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>()).unwrap_or(u32::MAX)
        | (2 << 24)
}

/// `nvmlDeviceGetGpuInstanceProfileInfoV` with the version 2 struct, the one that
/// carries the profile's name. nvml-wrapper 0.13 wraps only the unversioned call
/// (`Device::profile_info`), so this goes through the raw binding.
pub(super) fn profile_info_v(
    nvml: &Nvml,
    d: &Device<'_>,
    profile: u32,
) -> Result<GpuInstanceProfileInfo, NvmlError> {
    let f = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceProfileInfoV.as_ref())?;
    let mut info = nvmlGpuInstanceProfileInfo_v2_t {
        version: v2_version(),
        id: 0,
        isP2pSupported: 0,
        sliceCount: 0,
        instanceCount: 0,
        multiprocessorCount: 0,
        copyEngineCount: 0,
        decoderCount: 0,
        encoderCount: 0,
        jpegCount: 0,
        ofaCount: 0,
        memorySizeMB: 0,
        name: [0; 96],
    };
    // SAFETY: the handle comes from this NVML instance, and `info` is the version 2
    // struct its `version` field announces (nvml.h: "The caller must set the
    // nvmlGpuInstanceProfileInfo_v2_t.version field").
    nvml_try(unsafe { f(d.handle(), profile, &mut info) })?;
    let name: Vec<u8> = info.name.iter().map(|c| c.to_ne_bytes()[0]).collect();
    let name = CStr::from_bytes_until_nul(&name)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&name).into_owned());
    Ok(GpuInstanceProfileInfo {
        id: info.id,
        is_p2p_supported: info.isP2pSupported != 0,
        slice_count: info.sliceCount,
        instance_count: info.instanceCount,
        multiprocessor_count: info.multiprocessorCount,
        copy_engine_count: info.copyEngineCount,
        decoder_count: info.decoderCount,
        encoder_count: info.encoderCount,
        jpeg_count: info.jpegCount,
        ofa_count: info.ofaCount,
        memory_size_mb: info.memorySizeMB,
        name: Some(name),
    })
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2` for a profile id, through the
/// raw binding: nvml-wrapper 0.13's `Device::possible_placements` reserves room
/// for the placements but never sets the vector's length after NVML fills it, so
/// it always returns an empty list.
///
/// The two calls nvml.h describes: `placements` "Can be NULL to discover number
/// of allowed placements for this profile. If non-NULL must be large enough to
/// accommodate the placements supported by the profile"; `count` "Returns number
/// of allowed placements for the profile". nvml.h: "Requires privileged user",
/// so an unprivileged record may hold NVML_ERROR_NO_PERMISSION here.
pub(super) fn possible_placements(
    nvml: &Nvml,
    d: &Device<'_>,
    profile_id: u32,
) -> Result<Vec<Placement>, NvmlError> {
    let f = nvml_sym(
        nvml.lib()
            .nvmlDeviceGetGpuInstancePossiblePlacements_v2
            .as_ref(),
    )?;
    let mut count = 0;
    // SAFETY: the handle comes from this NVML instance; a null array asks for the
    // count only, and `count` is a valid out pointer.
    nvml_try(unsafe { f(d.handle(), profile_id, std::ptr::null_mut(), &mut count) })?;
    let len = usize::try_from(count).unwrap_or(0);
    if len == 0 {
        return Ok(Vec::new());
    }
    let mut buf = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; len];
    // SAFETY: as above, with an array of as many placements as NVML just counted
    // for this profile.
    nvml_try(unsafe { f(d.handle(), profile_id, buf.as_mut_ptr(), &mut count) })?;
    buf.truncate(usize::try_from(count).unwrap_or(len));
    Ok(buf
        .iter()
        .map(|p| Placement {
            start: p.start,
            size: p.size,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The record reads back as written: values and failures keep their shape
    /// through the untagged answers and the flattened device.
    #[test]
    fn a_record_round_trips_through_json() {
        let not_supported = Failure {
            error: "the requested operation is not available on the target device".into(),
            code: Some("NVML_ERROR_NOT_SUPPORTED".into()),
        };
        let info = GpuInstanceProfileInfo {
            id: 19,
            is_p2p_supported: false,
            slice_count: 1,
            instance_count: 7,
            multiprocessor_count: 14,
            copy_engine_count: 1,
            decoder_count: 0,
            encoder_count: 0,
            jpeg_count: 0,
            ofa_count: 0,
            memory_size_mb: 4864,
            name: Some("MIG 1g.5gb".into()),
        };
        let gpu = DeviceAnswers {
            name: Answer::Value("NVIDIA A100-SXM4-40GB".into()),
            uuid: Answer::Value("GPU-1".into()),
            minor_number: Answer::Value(0),
            pci: Answer::Value(PciRecord {
                bus_id: "00000000:07:00.0".into(),
                domain: 0,
                bus: 7,
                device: 0,
                pci_device_id: Hex(0x20b0_10de),
                pci_sub_system_id: Some(Hex(0x134f_10de)),
            }),
            memory_total_bytes: Answer::Value(40960 << 20),
            numa_node_id: Answer::Failed(not_supported.clone()),
            cuda_compute_capability: Answer::Value(ComputeCapabilityRecord { major: 8, minor: 0 }),
            architecture: Answer::Value("Ampere".into()),
            mig_mode: Answer::Value(MigModeRecord {
                current: 1,
                pending: 1,
            }),
            max_mig_device_count: Answer::Value(7),
            supported_event_types: Answer::Value(Hex(0x1f)),
            gpu_instance_profiles: vec![
                GpuInstanceProfileRecord {
                    profile: 0,
                    info: Answer::Value(info),
                    info_v_failure: None,
                    possible_placements: Some(Answer::Value(vec![Placement { start: 0, size: 1 }])),
                },
                GpuInstanceProfileRecord {
                    profile: 5,
                    info: Answer::Failed(not_supported.clone()),
                    info_v_failure: Some(not_supported.clone()),
                    possible_placements: None,
                },
            ],
        };
        let record = NvmlRecord {
            system: SystemRecord {
                driver_version: Answer::Value("580.159.04".into()),
                nvml_version: Answer::Value("13.580.159.04".into()),
                cuda_driver_version: Answer::Value(13000),
            },
            device_count: Answer::Value(2),
            devices: vec![
                DeviceRecord {
                    index: 0,
                    answers: Answer::Value(gpu),
                },
                DeviceRecord {
                    index: 1,
                    answers: Answer::Failed(Failure {
                        error: "device fell off the bus".into(),
                        code: Some("NVML_ERROR_GPU_IS_LOST".into()),
                    }),
                },
            ],
        };
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["devices"][1]["code"], "NVML_ERROR_GPU_IS_LOST");
        assert_eq!(json["devices"][0]["name"], "NVIDIA A100-SXM4-40GB");
        assert_eq!(
            json["devices"][0]["numaNodeId"]["code"],
            "NVML_ERROR_NOT_SUPPORTED"
        );
        let p = &json["devices"][0]["gpuInstanceProfiles"][0];
        assert_eq!(p["info"]["memorySizeMB"], 4864);
        assert_eq!(p["info"]["isP2pSupported"], false);
        assert_eq!(p["possiblePlacements"][0]["size"], 1);
        assert_eq!(json["devices"][0]["pci"]["pciDeviceId"], "0x20b010de");
        assert_eq!(json["devices"][0]["supportedEventTypes"], "0x1f");
        let back: NvmlRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back, record);
    }

    #[test]
    fn failures_name_the_return_code() {
        let f = Failure::of(&NvmlError::NotSupported);
        assert_eq!(f.code.as_deref(), Some("NVML_ERROR_NOT_SUPPORTED"));
        let f = Failure::of(&NvmlError::FailedToLoadSymbol("x".into()));
        assert_eq!(f.code, None);
        assert!(f.error.contains('x'));
    }
}
