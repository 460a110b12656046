//! The exported NVML C ABI.
//!
//! Every entry point runs inside [`guard`] so a bug here surfaces as
//! `NVML_ERROR_UNKNOWN` instead of unwinding into C. State lives in leaked
//! allocations: a device handle is a pointer into the machine loaded at
//! init, and stays dereferenceable even after shutdown (callers holding stale
//! handles get an error, never a dangling read).
//!
//! Choices where real NVML is loosely specified:
//! - no profile found at init: `NVML_ERROR_DRIVER_NOT_LOADED`, what a node
//!   without the NVIDIA driver reports; a profile that fails to parse:
//!   `NVML_ERROR_UNKNOWN` with the reason printed to stderr once;
//! - a handle that is not one of this instance's devices:
//!   `NVML_ERROR_INVALID_ARGUMENT`;
//! - NVLink: a GPU without NVLink gives `NVML_ERROR_NOT_SUPPORTED` for any
//!   link; a link number at or past the GPU's slot count (or past
//!   `NVML_NVLINK_MAX_LINKS`) gives `NVML_ERROR_INVALID_ARGUMENT`; a slot
//!   with no cable reports `NVML_FEATURE_DISABLED` and `NOT_SUPPORTED` for
//!   its remote end.
//! - lost GPUs (profile `lost`, `lost_after_ms`, `recovered_after_ms`, on a
//!   clock that starts at the first `nvmlInit` of the loaded library): handle
//!   lookups answer `NVML_ERROR_GPU_IS_LOST` (nvml.h documents it for each
//!   lookup; `nvidia-smi` on such a node prints "Unable to determine the
//!   device handle for GPU …: GPU is lost"). A handle obtained before the
//!   loss keeps answering the identity queries (index, minor, UUID, name,
//!   brand, architecture, compute capability, PCI info): go-gpuallocator
//!   builds each device from its UUID and PCI info before it reads the NVLink
//!   state, and NVIDIA/go-gpuallocator#66 reports that NVLink state query,
//!   not the earlier ones, answering GPU_IS_LOST on a broken GPU. That the
//!   other identity queries answer too is this library's assumption. Live
//!   queries (memory, MIG mode and devices, NUMA node, NVLink, fabric,
//!   events) answer GPU_IS_LOST.
//! - MIG handles (see [`mig`]): queries nvml.h documents for MIG handles
//!   (index, UUID, name, memory, attributes, GPU/compute instance ids,
//!   parent) answer for the MIG device; the other device queries answer
//!   `NVML_ERROR_NOT_SUPPORTED`, matching consumers such as NVIDIA's
//!   k8s-device-plugin, which asks the parent GPU for minor number, compute
//!   capability and PCI/NUMA data of a MIG device.

// The safety contract of each function is NVML's documented C API; repeating
// it on ~40 functions would add nothing.
#![allow(clippy::missing_safety_doc)]
// Matching on bindgen's constant names keeps the mapping readable against nvml.h.
#![allow(non_upper_case_globals)]

use std::collections::BTreeMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings::*;

use crate::profile::{
    Architecture, BusId, Gpu, MigDevice, Profile, RemoteType, ResolvedLink, SwitchRemotePci,
};

pub mod fabric;
pub mod mig;

/// File the library looks for next to itself when the env var is unset.
pub const PROFILE_FILE_NAME: &str = "nvml-profile.yaml";
/// Env var naming the profile YAML; wins over the file next to the library.
pub const PROFILE_ENV: &str = "TOPODRA_FAKE_NVML_PROFILE";

const SUCCESS: nvmlReturn_t = nvmlReturn_enum_NVML_SUCCESS;
const UNINITIALIZED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
const INVALID_ARGUMENT: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const NOT_FOUND: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const INSUFFICIENT_SIZE: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const DRIVER_NOT_LOADED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
const TIMEOUT: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_TIMEOUT;
const GPU_IS_LOST: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
const VERSION_MISMATCH: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
const UNKNOWN: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// Event types every fake GPU supports (what datacenter GPUs report).
const SUPPORTED_EVENTS: c_ulonglong = (nvmlEventTypeSingleBitEccError
    | nvmlEventTypeDoubleBitEccError
    | nvmlEventTypePState
    | nvmlEventTypeXidCriticalError
    | nvmlEventTypeClock) as c_ulonglong;

type Ret<T> = Result<T, nvmlReturn_t>;

#[derive(Debug)]
struct FakeGpu {
    gpu: Gpu,
    bus: BusId,
    links: Vec<ResolvedLink>,
    slots: u32,
    link_version: u32,
}

/// A MIG device a handle was handed out for: one per (GPU, MIG UUID), kept for
/// the life of the process so the handle stays a valid pointer. Whether the
/// device still exists is asked of the state file on each use ([`mig`]).
#[derive(Debug)]
struct FakeMig {
    gpu: &'static FakeGpu,
    dev: MigDevice,
}

static MIG_HANDLES: Mutex<Vec<&'static FakeMig>> = Mutex::new(Vec::new());

/// The handle of MIG device `dev` of `gpu`, the same for every call.
fn mig_handle(gpu: &'static FakeGpu, dev: &MigDevice) -> nvmlDevice_t {
    let mut all = lock(&MIG_HANDLES);
    let m = match all
        .iter()
        .find(|m| std::ptr::eq(m.gpu, gpu) && m.dev.uuid == dev.uuid)
    {
        Some(m) => *m,
        None => {
            let m: &'static FakeMig = Box::leak(Box::new(FakeMig {
                gpu,
                dev: dev.clone(),
            }));
            all.push(m);
            m
        }
    };
    handle_of(m)
}

/// What a handle points at: a whole GPU, or a MIG device and its parent.
#[derive(Debug, Clone, Copy)]
enum Dev {
    Gpu(&'static FakeGpu),
    Mig(&'static FakeGpu, &'static FakeMig),
}

impl Dev {
    /// The physical GPU: the device itself or the MIG device's parent.
    fn gpu(self) -> &'static FakeGpu {
        match self {
            Self::Gpu(g) | Self::Mig(g, _) => g,
        }
    }
}

impl FakeGpu {
    fn new(profile: &Profile, g: &Gpu) -> Option<Self> {
        Some(Self {
            gpu: g.clone(),
            bus: BusId::parse(&g.bus_id).ok()?,
            links: profile.links_of(g),
            slots: profile.nvlink_slots(g),
            link_version: profile.nvlink_version(g),
        })
    }
}

#[derive(Debug)]
struct Machine {
    profile: Profile,
    /// NVML-visible GPUs, position = NVML index.
    gpus: Box<[FakeGpu]>,
    /// The driver's MIG state ([`mig::state`]); `None` when the library can
    /// tell neither where it lives nor where it was loaded from.
    state_path: Option<PathBuf>,
}

/// A stable handle value for a leaked device struct.
fn handle_of<T>(v: &T) -> nvmlDevice_t {
    std::ptr::from_ref(v).cast_mut().cast()
}

fn is_handle_of<T>(v: &T, handle: nvmlDevice_t) -> bool {
    std::ptr::eq(std::ptr::from_ref(v).cast(), handle.cast_const())
}

impl Machine {
    fn new(profile: Profile) -> Self {
        let gpus = profile
            .nvml_gpus()
            .into_iter()
            .filter_map(|g| FakeGpu::new(&profile, g))
            .collect();
        Self {
            profile,
            gpus,
            state_path: mig::state::path(own_dir().as_deref()),
        }
    }

    fn handle(&self, i: usize) -> nvmlDevice_t {
        handle_of(&self.gpus[i])
    }

    /// Resolves a GPU or MIG handle of this machine.
    fn device(&'static self, handle: nvmlDevice_t) -> Ret<Dev> {
        for g in &self.gpus {
            if is_handle_of(g, handle) {
                return Ok(Dev::Gpu(g));
            }
        }
        let mig = *lock(&MIG_HANDLES)
            .iter()
            .find(|m| is_handle_of(**m, handle))
            .ok_or(INVALID_ARGUMENT)?;
        let g = self
            .gpus
            .iter()
            .find(|g| std::ptr::eq(*g, mig.gpu))
            .ok_or(INVALID_ARGUMENT)?;
        // A MIG device destroyed since its handle was handed out: nvml.h has
        // no code for it; this library answers as for any foreign handle.
        if !mig::instances::mig_devices(self, g)?
            .iter()
            .any(|d| d.uuid == mig.dev.uuid)
        {
            return Err(INVALID_ARGUMENT);
        }
        Ok(Dev::Mig(g, mig))
    }

    /// What `nvmlDeviceGetNvLinkRemotePciInfo_v2` answers for a link.
    fn remote_pci_info(&self, l: &ResolvedLink) -> nvmlPciInfo_t {
        match (l.kind, self.profile.switch_remote_pci()) {
            (RemoteType::Switch, SwitchRemotePci::Placeholder) => placeholder_pci_info(),
            _ => self.pci_info_of(l.remote),
        }
    }

    fn pci_info_of(&self, bus: BusId) -> nvmlPciInfo_t {
        let (device_id, subsys) = match self.profile.gpu_by_bus_id(bus) {
            Some(g) => (g.pci_device_id, g.pci_subsystem_id),
            None => self.profile.pci_devices().get(&bus).map_or((0, 0), |d| {
                (
                    u32::from(d.device_id) << 16 | u32::from(d.vendor),
                    u32::from(d.subdevice) << 16 | u32::from(d.subvendor),
                )
            }),
        };
        // SAFETY: nvmlPciInfo_t is plain integers and char arrays.
        let mut info: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
        fill(&mut info.busIdLegacy, &bus.nvml_legacy());
        fill(&mut info.busId, &bus.nvml());
        info.domain = bus.domain;
        info.bus = u32::from(bus.bus);
        info.device = u32::from(bus.device);
        info.pciDeviceId = device_id;
        info.pciSubSystemId = subsys;
        info
    }
}

/// The remote PCI info of an NVLink whose far end is an NVSwitch NVML does
/// not expose by address. The all-ones bus id `FFFFFFFF:FF:FF.0` is what
/// public GB200 and virtualised HGX reports show for every NVSwitch link
/// (`nvidia-smi nvlink -R`, NVIDIA/k8s-test-infra#371), and what NCCL's
/// topology code treats as "remote NVLink device is not visible: assume
/// NVSwitch" (src/graph/xml.cc; its topology dumps show the same address as
/// `fffffff:ff:ff.0` after NCCL's own bus id conversion). domain/bus/device
/// follow the string. This library's choices where nothing public shows the
/// value: `busIdLegacy` "FFFF:FF:FF.0" (the 4-digit-domain form) and
/// `pciDeviceId` 0; `pciSubSystemId` is "not filled" per nvml.h.
fn placeholder_pci_info() -> nvmlPciInfo_t {
    // SAFETY: nvmlPciInfo_t is plain integers and char arrays.
    let mut info: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
    fill(&mut info.busId, "FFFFFFFF:FF:FF.0");
    fill(&mut info.busIdLegacy, "FFFF:FF:FF.0");
    info.domain = 0xFFFF_FFFF;
    info.bus = 0xFF;
    info.device = 0xFF;
    info
}

/// Copies `s` NUL-terminated into a fixed array, truncating if needed.
fn fill(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
    if let Some(last) = dst.get_mut(n) {
        *last = 0;
    }
}

#[derive(Debug)]
struct Global {
    refcount: u32,
    machine: Option<&'static Machine>,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global {
    refcount: 0,
    machine: None,
});
static REPORTED: AtomicBool = AtomicBool::new(false);
/// First successful `nvmlInit` of this copy of the library: the zero of the
/// profile's `lost_after_ms` / `recovered_after_ms` clock. Not reset by
/// shutdown, so a consumer that re-initialises sees the same timeline.
static EPOCH: OnceLock<Instant> = OnceLock::new();

fn elapsed_ms() -> u64 {
    EPOCH.get().map_or(0, |t| {
        u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)
    })
}

/// Whether the GPU is off the bus right now.
fn is_lost(g: &FakeGpu) -> bool {
    g.gpu.lost_at(elapsed_ms())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn machine() -> Ret<&'static Machine> {
    let g = lock(&GLOBAL);
    match (g.refcount, g.machine) {
        (n, Some(m)) if n > 0 => Ok(m),
        _ => Err(UNINITIALIZED),
    }
}

fn guard(f: impl FnOnce() -> Ret<()>) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => UNKNOWN,
    }
}

/// Resolves a GPU or MIG handle. Identity queries stop here: they answer
/// even for a lost GPU (module docs).
fn resolve(handle: nvmlDevice_t) -> Ret<(&'static Machine, Dev)> {
    let m = machine()?;
    Ok((m, m.device(handle)?))
}

/// A whole-GPU handle for an identity query; MIG handles are NOT_SUPPORTED.
fn whole_gpu(handle: nvmlDevice_t) -> Ret<(&'static Machine, &'static FakeGpu)> {
    match resolve(handle)? {
        (m, Dev::Gpu(g)) => Ok((m, g)),
        (_, Dev::Mig(..)) => Err(NOT_SUPPORTED),
    }
}

/// Fails with GPU_IS_LOST when the device's GPU is off the bus.
fn live(d: Dev) -> Ret<Dev> {
    if is_lost(d.gpu()) {
        return Err(GPU_IS_LOST);
    }
    Ok(d)
}

/// A whole-GPU handle for a live query.
fn live_gpu(handle: nvmlDevice_t) -> Ret<(&'static Machine, &'static FakeGpu)> {
    let (m, g) = whole_gpu(handle)?;
    live(Dev::Gpu(g))?;
    Ok((m, g))
}

/// Writes through a caller's out-pointer.
///
/// # Safety
/// `ptr` must be null or valid for a write of `T`.
unsafe fn put<T>(ptr: *mut T, v: T) -> Ret<()> {
    if ptr.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and valid per the caller's contract; NVML callers
    // pass plain C locals, alignment is not guaranteed across every binding.
    unsafe { ptr.write_unaligned(v) };
    Ok(())
}

/// Copies a string into a caller's buffer of `len` bytes.
///
/// # Safety
/// `buf` must be null or valid for `len` bytes.
unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Ret<()> {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    if s.len() + 1 > len as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` holds at least `s.len() + 1` bytes per the check above.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

/// Reads a caller's C string.
///
/// # Safety
/// `s` must be null or a valid NUL-terminated string.
unsafe fn get_str<'a>(s: *const c_char) -> Ret<&'a str> {
    if s.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: per the caller's contract.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| INVALID_ARGUMENT)
}

/// The file this copy of the library was loaded from, as the loader knows it.
fn own_path() -> Option<std::ffi::CString> {
    // SAFETY: Dl_info is plain pointers; dladdr fills it or returns 0.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let addr = own_path as fn() -> Option<std::ffi::CString> as *const libc::c_void;
    // SAFETY: `addr` is a code address inside this object; `info` is valid.
    let rc = unsafe { libc::dladdr(addr, &mut info) };
    if rc == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr returned a NUL-terminated path owned by the loader.
    Some(unsafe { CStr::from_ptr(info.dli_fname) }.to_owned())
}

/// Where this copy of the library was loaded from.
fn own_dir() -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let name = own_path()?;
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(name.to_bytes()));
    path.parent().map(std::path::Path::to_path_buf)
}

/// Keeps this copy loaded for the rest of the process. The simulated
/// machine outlives NVML sessions the way the real driver state does: a
/// consumer that drops its last `dlopen` handle and loads NVML again must
/// find the same lost-GPU timeline, not a fresh library.
fn pin_in_memory() {
    let Some(path) = own_path() else {
        return;
    };
    // SAFETY: RTLD_NOLOAD only takes another reference to an object that is
    // already loaded (this one); RTLD_NODELETE keeps it mapped. The handle
    // is deliberately never closed.
    let _ = unsafe {
        libc::dlopen(
            path.as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD | libc::RTLD_NODELETE,
        )
    };
}

fn load_profile() -> Ret<Profile> {
    let path = match std::env::var_os(PROFILE_ENV) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => {
            let p = own_dir().ok_or(DRIVER_NOT_LOADED)?.join(PROFILE_FILE_NAME);
            if !p.exists() {
                return Err(DRIVER_NOT_LOADED);
            }
            p
        }
    };
    Profile::load(&path).map_err(|e| {
        if !REPORTED.swap(true, Ordering::Relaxed) {
            eprintln!("topodra-fake-nvml: {e}");
        }
        UNKNOWN
    })
}

fn init() -> Ret<()> {
    let mut g = lock(&GLOBAL);
    if g.refcount > 0 {
        g.refcount += 1;
        return Ok(());
    }
    let profile = load_profile()?;
    if let Some(code) = profile
        .init_error
        .as_deref()
        .and_then(crate::profile::return_code_from_name)
    {
        return Err(code);
    }
    EPOCH.get_or_init(|| {
        pin_in_memory();
        Instant::now()
    });
    // Leaked on purpose: handles must outlive shutdown (see module docs).
    g.machine = Some(Box::leak(Box::new(Machine::new(profile))));
    g.refcount = 1;
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    guard(init)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit() -> nvmlReturn_t {
    guard(init)
}

/// Flags only relax real NVML's failure modes (no GPUs, no attach), which
/// this library never has, so they are accepted and ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    guard(init)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guard(|| {
        let mut g = lock(&GLOBAL);
        if g.refcount == 0 {
            return Err(UNINITIALIZED);
        }
        g.refcount -= 1;
        if g.refcount == 0 {
            g.machine = None;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static CStr = match result {
        nvmlReturn_enum_NVML_SUCCESS => c"Success",
        nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => c"Insufficient Permissions",
        nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED => c"Already Initialized",
        nvmlReturn_enum_NVML_ERROR_NOT_FOUND => c"Not Found",
        nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER => c"Insufficient External Power",
        nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        nvmlReturn_enum_NVML_ERROR_TIMEOUT => c"Timeout",
        nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE => c"Interrupt Request Issue",
        nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND => c"NVML Shared Library Not Found",
        nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND => c"Function Not Found",
        nvmlReturn_enum_NVML_ERROR_CORRUPTED_INFOROM => c"Corrupted infoROM",
        nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => c"GPU is lost",
        nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED => c"GPU requires restart",
        nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM => {
            c"The operating system has blocked the request"
        }
        nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH => {
            c"RM has detected an NVML/RM version mismatch"
        }
        nvmlReturn_enum_NVML_ERROR_IN_USE => c"In use by another client",
        nvmlReturn_enum_NVML_ERROR_MEMORY => c"Insufficient Memory",
        nvmlReturn_enum_NVML_ERROR_NO_DATA => c"No data",
        nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        nvmlReturn_enum_NVML_ERROR_NOT_READY => c"Not ready",
        nvmlReturn_enum_NVML_ERROR_GPU_NOT_FOUND => c"GPU not found",
        nvmlReturn_enum_NVML_ERROR_INVALID_STATE => c"Invalid state",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    guard(|| unsafe { put_str(version, length, &machine()?.profile.driver_version) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    guard(|| unsafe { put_str(version, length, &machine()?.profile.nvml_version()) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    guard(|| unsafe { put(version, machine()?.profile.cuda_driver_version) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    guard(|| unsafe { put(version, machine()?.profile.cuda_driver_version) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    guard(|| {
        let n = c_uint::try_from(machine()?.gpus.len()).map_err(|_| UNKNOWN)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(count, n) }
    })
}

/// Hands out the handle of the GPU at `pos`; a GPU off the bus has none
/// (nvml.h: GPU_IS_LOST "if the target GPU has fallen off the bus").
fn hand_out(m: &Machine, pos: usize, out: *mut nvmlDevice_t) -> Ret<()> {
    if is_lost(&m.gpus[pos]) {
        return Err(GPU_IS_LOST);
    }
    // SAFETY: `out` comes straight from the NVML caller.
    unsafe { put(out, m.handle(pos)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        let m = machine()?;
        let pos = m
            .gpus
            .iter()
            .position(|g| g.gpu.index == index)
            .ok_or(INVALID_ARGUMENT)?;
        hand_out(m, pos, device)
    })
}

/// nvml.h: the UUID lookup accepts GPU and MIG UUIDs, "may initialize
/// additional GPUs as it searches for the target GPU" and answers
/// GPU_IS_LOST "if any GPU has fallen off the bus". Searching in NVML index
/// order, and failing only when the search reaches a lost GPU, is this
/// library's reading of that.
fn find_uuid(m: &'static Machine, uuid: &str) -> Ret<nvmlDevice_t> {
    for g in &m.gpus {
        if is_lost(g) {
            return Err(GPU_IS_LOST);
        }
        if g.gpu.uuid == uuid {
            return Ok(handle_of(g));
        }
        if let Some(d) = mig::instances::mig_devices(m, g)?
            .iter()
            .find(|d| d.uuid == uuid)
        {
            return Ok(mig_handle(g, d));
        }
    }
    Err(NOT_FOUND)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        // SAFETY: forwarded caller contract.
        let uuid = unsafe { get_str(uuid) }?;
        let handle = find_uuid(machine()?, uuid)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(device, handle) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        // SAFETY: forwarded caller contract.
        let s = unsafe { get_str(bus_id) }?;
        let bus = BusId::parse(s).map_err(|_| INVALID_ARGUMENT)?;
        let m = machine()?;
        let pos = m.gpus.iter().position(|g| g.bus == bus).ok_or(NOT_FOUND)?;
        hand_out(m, pos, device)
    })
}

/// Runs a whole-GPU identity query whose only output is one value.
fn query<T>(handle: nvmlDevice_t, out: *mut T, f: impl FnOnce(&FakeGpu) -> Ret<T>) -> nvmlReturn_t {
    guard(|| {
        let (_, g) = whole_gpu(handle)?;
        let v = f(g)?;
        // SAFETY: `out` comes straight from the NVML caller.
        unsafe { put(out, v) }
    })
}

/// Runs a whole-GPU live query (GPU_IS_LOST once the GPU is off the bus).
fn query_live<T>(
    handle: nvmlDevice_t,
    out: *mut T,
    f: impl FnOnce(&'static Machine, &'static FakeGpu) -> Ret<T>,
) -> nvmlReturn_t {
    guard(|| {
        let (m, g) = live_gpu(handle)?;
        let v = f(m, g)?;
        // SAFETY: `out` comes straight from the NVML caller.
        unsafe { put(out, v) }
    })
}

/// nvml.h: "When used with MIG device handles this API returns indices that
/// can be passed to nvmlDeviceGetMigDeviceHandleByIndex".
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let v = match resolve(device)? {
            (_, Dev::Gpu(g)) => g.gpu.index,
            (m, Dev::Mig(g, d)) => mig::instances::mig_devices(m, g)?
                .iter()
                .position(|x| x.uuid == d.dev.uuid)
                .and_then(|i| u32::try_from(i).ok())
                .ok_or(INVALID_ARGUMENT)?,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(index, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor: *mut c_uint,
) -> nvmlReturn_t {
    query(device, minor, |g| Ok(g.gpu.minor))
}

/// nvml.h: with MIG handles the API "returns globally unique UUIDs".
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let v = match resolve(device)?.1 {
            Dev::Gpu(g) => &g.gpu.uuid,
            Dev::Mig(_, m) => &m.dev.uuid,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put_str(uuid, length, v) }
    })
}

/// nvml.h: with MIG handles the API "returns MIG device names". Their form,
/// "<GPU name> MIG <profile>" (e.g. "NVIDIA A100-SXM4-40GB MIG 1g.5gb"), is
/// what NVML-based tools print for MIG devices, e.g. the example output in
/// HTCondor's condor_gpu_discovery manual.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let v = match resolve(device)?.1 {
            Dev::Gpu(g) => g.gpu.name.clone(),
            Dev::Mig(g, m) => format!("{} MIG {}", g.gpu.name, m.dev.profile),
        };
        // SAFETY: forwarded caller contract.
        unsafe { put_str(name, length, &v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(
    device: nvmlDevice_t,
    brand: *mut nvmlBrandType_t,
) -> nvmlReturn_t {
    query(device, brand, |g| {
        crate::profile::brand_from_name(&g.gpu.brand).ok_or(UNKNOWN)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: nvmlDevice_t,
    arch: *mut nvmlDeviceArchitecture_t,
) -> nvmlReturn_t {
    query(device, arch, |g| {
        Ok(match g.gpu.architecture {
            Architecture::Kepler => NVML_DEVICE_ARCH_KEPLER,
            Architecture::Maxwell => NVML_DEVICE_ARCH_MAXWELL,
            Architecture::Pascal => NVML_DEVICE_ARCH_PASCAL,
            Architecture::Volta => NVML_DEVICE_ARCH_VOLTA,
            Architecture::Turing => NVML_DEVICE_ARCH_TURING,
            Architecture::Ampere => NVML_DEVICE_ARCH_AMPERE,
            Architecture::Ada => NVML_DEVICE_ARCH_ADA,
            Architecture::Hopper => NVML_DEVICE_ARCH_HOPPER,
            Architecture::Blackwell => NVML_DEVICE_ARCH_BLACKWELL,
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    guard(|| {
        let (_, g) = whole_gpu(device)?;
        if major.is_null() || minor.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let (a, b) =
            crate::profile::parse_compute_capability(&g.gpu.compute_capability).ok_or(UNKNOWN)?;
        // SAFETY: forwarded caller contract.
        unsafe {
            put(major, a)?;
            put(minor, b)
        }
    })
}

/// Framebuffer of the device: the whole GPU's, or the MIG device's GPU
/// instance (nvml.h: "Per-instance information can be queried by using
/// specific MIG device handles").
fn memory_bytes(d: Dev) -> u64 {
    let mib = match d {
        Dev::Gpu(g) => g.gpu.memory_mib,
        Dev::Mig(_, m) => m.dev.memory_mib,
    };
    mib.saturating_mul(1 << 20)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    guard(|| {
        let d = live(resolve(device)?.1)?;
        let total = memory_bytes(d);
        let v = nvmlMemory_t {
            total,
            free: total,
            used: 0,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(memory, v) }
    })
}

/// nvml.h: `NVML_STRUCT_VERSION(data, ver)` = `sizeof(nvml<data>_v<ver>_t) |
/// ver << 24`.
fn struct_version<T>(ver: u32) -> u32 {
    u32::try_from(std::mem::size_of::<T>()).unwrap_or(u32::MAX) | (ver << 24)
}

/// Reads the leading `version` field of a caller's versioned struct.
///
/// # Safety
/// `ptr` must be null or valid for reading a `u32`.
unsafe fn read_version<T>(ptr: *mut T) -> Ret<u32> {
    if ptr.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null and, per the caller's contract, starts with a u32.
    Ok(unsafe { ptr.cast::<u32>().read_unaligned() })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    guard(|| {
        let d = resolve(device)?.1;
        // SAFETY: forwarded caller contract.
        let version = unsafe { read_version(memory) }?;
        if version != struct_version::<nvmlMemory_v2_t>(2) {
            return Err(VERSION_MISMATCH);
        }
        let total = memory_bytes(live(d)?);
        let v = nvmlMemory_v2_t {
            version,
            total,
            reserved: 0,
            free: total,
            used: 0,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(memory, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        let (m, g) = whole_gpu(device)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(pci, m.pci_info_of(g.bus)) }
    })
}

/// nvml.h: the virtualization mode of the GPU (bare metal, pass-through to a VM,
/// vGPU). NVIDIA's DRA driver asks it before offering dynamic MIG.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVirtualizationMode(
    device: nvmlDevice_t,
    mode: *mut nvmlGpuVirtualizationMode_t,
) -> nvmlReturn_t {
    guard(|| {
        let (_, g) = live_gpu(device)?;
        let v = match g.gpu.virtualization {
            crate::profile::Virtualization::None => {
                nvmlGpuVirtualizationMode_NVML_GPU_VIRTUALIZATION_MODE_NONE
            }
            crate::profile::Virtualization::Passthrough => {
                nvmlGpuVirtualizationMode_NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH
            }
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(mode, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (m, g) = live_gpu(device)?;
        let mig = mig::instances::mig_mode(m, g)?.ok_or(NOT_SUPPORTED)?;
        if current.is_null() || pending.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let v = |on: bool| {
            if on {
                NVML_DEVICE_MIG_ENABLE
            } else {
                NVML_DEVICE_MIG_DISABLE
            }
        };
        // SAFETY: forwarded caller contract.
        unsafe {
            put(current, v(mig.current))?;
            put(pending, v(mig.pending))
        }
    })
}

/// nvml.h: "Retrieves the current compute mode for the device". The mode lives
/// in the state file ([`mig::state`]), so a mode one process set is what every
/// other process sees, until it is set again or the file goes (a reboot: "Under
/// Linux it is not persistent across reboots and always resets to Default").
/// Errors as nvml.h lists them: INVALID_ARGUMENT for a null `mode`, GPU_IS_LOST
/// off the bus. On a MIG handle, NOT_SUPPORTED, as for the other whole-GPU
/// queries here (module docs); recent nvml.h also documents MIG device handles
/// for this call and its setter, which this library does not model.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    device: nvmlDevice_t,
    mode: *mut nvmlComputeMode_t,
) -> nvmlReturn_t {
    query_live(device, mode, mig::instances::compute_mode)
}

/// nvml.h: "Set the compute mode for the device", effective at once, with
/// NVML_ERROR_INVALID_ARGUMENT "if device is invalid or mode is invalid" and
/// NVML_ERROR_NOT_SUPPORTED "if the device does not support this feature".
/// - DEFAULT (0), PROHIBITED (2) and EXCLUSIVE_PROCESS (3) are set; a value at
///   or past `NVML_COMPUTEMODE_COUNT` is INVALID_ARGUMENT;
/// - EXCLUSIVE_THREAD (1): nvml.h marks it "Support Removed" and
///   `nvidia-smi -c 1` answers "Exclusive_Thread was deprecated! Setting
///   Exclusive_Process instead" (quoted in NVIDIA/cudf#8465), swapping the value
///   itself before it calls NVML. What NVML answers when given 1 is not
///   documented; this library answers NOT_SUPPORTED, its choice, and sets
///   nothing;
/// - a GPU with MIG mode enabled (`current`) refuses any mode but DEFAULT with
///   NOT_SUPPORTED: `nvidia-smi -c 3` on a MIG-enabled GPU prints "Setting compute
///   mode to EXCLUSIVE_PROCESS is not supported on a MIG-enabled device" and
///   "Unable to set the compute mode for GPU ...: Not Supported", NVML's error
///   string (NVIDIA/go-nvml#61, NVIDIA/DCGM#82). Setting DEFAULT there succeeds
///   and changes nothing (this library's reading);
/// - "Requires root/admin permissions": permissions are not modelled;
/// - MIG handles: NOT_SUPPORTED, as for [`nvmlDeviceGetComputeMode`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetComputeMode(
    device: nvmlDevice_t,
    mode: nvmlComputeMode_t,
) -> nvmlReturn_t {
    guard(|| {
        let (m, g) = live_gpu(device)?;
        match mode {
            nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT
            | nvmlComputeMode_enum_NVML_COMPUTEMODE_PROHIBITED
            | nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS => {}
            nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_THREAD => return Err(NOT_SUPPORTED),
            _ => return Err(INVALID_ARGUMENT),
        }
        if mode != nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT
            && mig::instances::mig_enabled(m, g)?
        {
            return Err(NOT_SUPPORTED);
        }
        mig::instances::set_compute_mode(m, g, mode)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(
    device: nvmlDevice_t,
    node: *mut c_uint,
) -> nvmlReturn_t {
    query_live(device, node, |_, g| g.gpu.numa_node_id.ok_or(NOT_SUPPORTED))
}

/// Resolves a link number to its slot: `Ok(None)` is a slot with no cable.
fn link_of(g: &FakeGpu, link: c_uint) -> Ret<Option<&ResolvedLink>> {
    if g.slots == 0 {
        return Err(NOT_SUPPORTED);
    }
    if link >= g.slots || link >= NVML_NVLINK_MAX_LINKS {
        return Err(INVALID_ARGUMENT);
    }
    Ok(g.links.iter().find(|l| l.link == link))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    is_active: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    query_live(device, is_active, |_, g| {
        Ok(match link_of(g, link)? {
            Some(l) if l.active => nvmlEnableState_enum_NVML_FEATURE_ENABLED,
            _ => nvmlEnableState_enum_NVML_FEATURE_DISABLED,
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkVersion(
    device: nvmlDevice_t,
    link: c_uint,
    version: *mut c_uint,
) -> nvmlReturn_t {
    query_live(device, version, |_, g| {
        link_of(g, link)?;
        Ok(g.link_version)
    })
}

/// NVSwitch links answer the switch's address or, with
/// `nvlink.switch_remote_pci: placeholder`, [`placeholder_pci_info`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nvmlDevice_t,
    link: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    query_live(device, pci, |m, g| {
        let l = link_of(g, link)?.ok_or(NOT_SUPPORTED)?;
        Ok(m.remote_pci_info(l))
    })
}

/// The link's far end by kind, whatever its PCI info says: NVSwitch links
/// stay `NVML_NVLINK_DEVICE_TYPE_SWITCH` with the placeholder address, which
/// is how consumers recognise NVSwitch fabrics (e.g. HAMi's and vgpu-manager's
/// "detect NVLink through NVSwitch" fixes read this call).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: nvmlDevice_t,
    link: c_uint,
    kind: *mut nvmlIntNvLinkDeviceType_t,
) -> nvmlReturn_t {
    query_live(device, kind, |_, g| {
        let l = link_of(g, link)?.ok_or(NOT_SUPPORTED)?;
        Ok(match l.kind {
            RemoteType::Gpu => nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU,
            RemoteType::Switch => nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH,
            RemoteType::Ibmnpu => nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_IBMNPU,
        })
    })
}

// ---- events ----

#[derive(Debug)]
struct Registration {
    gpu_index: u32,
    mask: c_ulonglong,
    at: Instant,
}

#[derive(Debug)]
struct EventSet {
    machine: &'static Machine,
    regs: Mutex<Vec<Registration>>,
    /// Indices into the profile's `xid_events` already delivered.
    delivered: Mutex<Vec<usize>>,
}

/// Live sets by handle value. Handles are opaque ids rather than pointers so
/// a double free or a stale handle is an error, not memory corruption.
static EVENT_SETS: Mutex<BTreeMap<usize, Arc<EventSet>>> = Mutex::new(BTreeMap::new());
static NEXT_SET: Mutex<usize> = Mutex::new(0x1000);

fn event_set(set: nvmlEventSet_t) -> Ret<Arc<EventSet>> {
    lock(&EVENT_SETS)
        .get(&(set as usize))
        .cloned()
        .ok_or(INVALID_ARGUMENT)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    guard(|| {
        let m = machine()?;
        if set.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let id = {
            let mut n = lock(&NEXT_SET);
            *n += 0x10;
            *n
        };
        lock(&EVENT_SETS).insert(
            id,
            Arc::new(EventSet {
                machine: m,
                regs: Mutex::new(Vec::new()),
                delivered: Mutex::new(Vec::new()),
            }),
        );
        // SAFETY: forwarded caller contract.
        unsafe { put(set, id as nvmlEventSet_t) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    guard(|| {
        machine()?;
        lock(&EVENT_SETS)
            .remove(&(set as usize))
            .map(|_| ())
            .ok_or(INVALID_ARGUMENT)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> nvmlReturn_t {
    // nvml.h: no per-instance event reporting through MIG handles.
    query_live(device, types, |_, _| Ok(SUPPORTED_EVENTS))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    guard(|| {
        let (_, g) = live_gpu(device)?;
        let s = event_set(set)?;
        if types & !SUPPORTED_EVENTS != 0 {
            return Err(NOT_SUPPORTED);
        }
        lock(&s.regs).push(Registration {
            gpu_index: g.gpu.index,
            mask: types,
            at: Instant::now(),
        });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeoutms: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        machine()?;
        let s = event_set(set)?;
        if data.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeoutms));
        loop {
            let next = next_event(&s);
            let now = Instant::now();
            match next {
                Some((due, i)) if due <= now => {
                    let mut delivered = lock(&s.delivered);
                    if delivered.contains(&i) {
                        // Another waiter on the same set took it.
                        continue;
                    }
                    delivered.push(i);
                    drop(delivered);
                    let ev = &s.machine.profile.xid_events[i];
                    let pos = s
                        .machine
                        .gpus
                        .iter()
                        .position(|g| g.gpu.index == ev.gpu_index)
                        .ok_or(UNKNOWN)?;
                    let out = nvmlEventData_t {
                        device: s.machine.handle(pos),
                        eventType: nvmlEventTypeXidCriticalError as c_ulonglong,
                        eventData: ev.xid,
                        // nvml.h: 0xFFFFFFFF when not attributable to a MIG
                        // instance. A GPU instance's error is not a compute
                        // instance's: the compute id stays unset.
                        gpuInstanceId: ev.gpu_instance.unwrap_or(u32::MAX),
                        computeInstanceId: u32::MAX,
                    };
                    // SAFETY: forwarded caller contract.
                    return unsafe { put(data, out) };
                }
                _ if now >= deadline => return Err(TIMEOUT),
                Some((due, _)) => std::thread::sleep(due.min(deadline) - now),
                None => std::thread::sleep(deadline - now),
            }
        }
    })
}

/// The earliest undelivered XID event this set is registered for.
fn next_event(s: &EventSet) -> Option<(Instant, usize)> {
    let regs = lock(&s.regs);
    let delivered = lock(&s.delivered);
    s.machine
        .profile
        .xid_events
        .iter()
        .enumerate()
        .filter(|(i, _)| !delivered.contains(i))
        .filter_map(|(i, ev)| {
            let reg = regs.iter().find(|r| {
                r.gpu_index == ev.gpu_index
                    && r.mask & nvmlEventTypeXidCriticalError as c_ulonglong != 0
            })?;
            Some((reg.at + Duration::from_millis(ev.after_ms), i))
        })
        .min()
}
