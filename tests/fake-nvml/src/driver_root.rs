//! A fake NVIDIA driver root made of real files: ELF shared libraries with the
//! driver's names and sonames, executables, GSP firmware, the persistenced socket
//! and (when this process may create them) the device nodes.
//!
//! It is for anything that reads a driver root the way a container stack does:
//! topodra's own file discovery, NVIDIA Container Toolkit's `nvidia-ctk cdi
//! generate` (which reads sonames from the ELF dynamic section and dlopens the
//! root's `libnvidia-ml.so.1`), or a container that dlopens `libcuda.so.1` and
//! calls `cuInit`.
//!
//! [`DriverRoot::build`] lays out, under one directory:
//!
//! - in the [`Layout`]'s library directory, the version-suffixed libraries of an
//!   R570 datacenter driver ([`LIBRARIES`]), each a stub compiled now with
//!   `cc -shared -fPIC -Wl,-soname,<soname>`, plus the soname links and `.so`
//!   links the installer makes. `libnvidia-ml.so.<version>` is a copy of this
//!   crate's fake NVML (soname `libnvidia-ml.so.1`, see `build.rs`), so NVML
//!   callers get the node's profile; `libcuda.so.<version>` answers `cuInit`,
//!   `cuDriverGetVersion`, `cuDeviceGetCount`, `cuDeviceGet`, `cuDeviceGetName`,
//!   `cuDeviceGetUuid` and `cuDeviceGetUuid_v2` for the GPUs whose
//!   `/dev/nvidia<minor>` the process can open, as a container made from a CDI
//!   spec sees them (see [`LIBCUDA_SOURCE`]; [`CUDA_DEV_DIR_ENV`] is the tests'
//!   hook). It has no context, memory, module or launch entry points: a fake
//!   cannot run a kernel, and a program that looks them up finds them missing;
//! - in `usr/bin`, the driver's tools ([`BINARIES`]) as tiny static executables
//!   that print one line. `nvidia-smi` also carries out `compute-policy -i <GPU
//!   UUID> --set-timeslice <n>`, the call a GPU kubelet plugin makes to set time
//!   slicing, for the root's GPUs, and records it (see [`NVIDIA_SMI_SOURCE`]).
//!   `nvidia-cuda-mps-control -d` starts a stand-in MPS control daemon for the
//!   pipe directory of its environment, which `echo quit |
//!   nvidia-cuda-mps-control` stops, and both are recorded (see
//!   [`MPS_CONTROL_SOURCE`]);
//! - `var/log/`, where that `nvidia-smi` appends the calls it carried out
//!   ([`NVIDIA_SMI_CALLS`], read back with [`DriverRoot::nvidia_smi_calls`] or
//!   [`nvidia_smi_calls`]) and the MPS control daemons their starts and quits
//!   ([`MPS_CONTROL_CALLS`], [`DriverRoot::mps_control_calls`] or
//!   [`mps_control_calls`]; [`mps_daemon_pid`] finds a running daemon); a
//!   rebuild starts both empty;
//! - `lib/firmware/nvidia/<version>/gsp_ga10x.bin` and `gsp_tu10x.bin`;
//! - with [`Options::graphics`], the EGL platform libraries, the loader
//!   configuration files (EGL, Vulkan, OpenCL, X), `nvidia-xconfig`, the X driver
//!   modules and the GBM backend link;
//! - `run/nvidia-persistenced/socket` (and optionally the fabric manager's), a
//!   real unix socket with nobody listening, as after the daemon exited;
//! - `dev/nvidiactl`, `dev/nvidia<minor>`, `dev/nvidia-modeset`, `dev/nvidia-uvm`
//!   and `dev/nvidia-uvm-tools` under the dev root, as character devices, when the
//!   process has `CAP_MKNOD` (see [`DeviceNodes`]);
//! - with [`Options::merged_usr`], the merged-`/usr` links of current Debian,
//!   Ubuntu and RHEL (`lib -> usr/lib`, `bin -> usr/bin`, ...) and `var/run ->
//!   ../run`.
//!
//! No `etc/ld.so.cache` is written. The toolkit's library lookup
//! (`pkg/lookup/library.go` in nvidia-container-toolkit v1.20) tries a fixed list
//! of directories first, `/usr/lib64` and `/usr/lib/x86_64-linux-gnu` among them,
//! and falls back to the root's ldcache only for what that search misses; without a
//! cache it logs "Failed to load ldcache" and goes on. Both layouts here are on that
//! list, so a cache would change nothing the toolkit reports, and writing a real
//! one needs `ldconfig -r`, which chroots (root only). topodra's discovery does not
//! read the cache either.
//!
//! Compiled stubs are kept in `<target>/fake-driver-root/`, keyed by a hash of the
//! compiler, its arguments and the source (libcuda's source carries its GPU table
//! and version, so each set of GPUs has its own entry), so building a root costs
//! file copies after the first time; where that directory cannot be written, each
//! file is compiled in place.

use std::ffi::{CString, OsString};
use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

/// A recent R570 datacenter driver release (July 2025), the version the fixture
/// uses unless a profile names another.
pub const R570_VERSION: &str = "570.172.08";
/// The CUDA driver API version of R570 drivers, as `cuDriverGetVersion` reports
/// it: CUDA 12.8 (`nvidia-smi` prints "CUDA Version: 12.8" on 570.x), encoded
/// `1000 * major + 10 * minor` as the CUDA Driver API reference defines it.
pub const R570_CUDA_VERSION: i32 = 12080;

/// Major of `nvidia-uvm` that [`Options::default`] uses: the value the simulated
/// node's `/proc/devices` registers ([`crate::sim::materialize`]); the kernel
/// assigns it dynamically.
pub const DEFAULT_UVM_MAJOR: u32 = 509;
/// Fixed major of the NVIDIA character devices (`nvidia<N>`, `nvidiactl`,
/// `nvidia-modeset`).
pub const NVIDIA_MAJOR: u32 = 195;
/// Minor of `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u32 = 255;
/// Minor of `/dev/nvidia-modeset`.
pub const NVIDIA_MODESET_MINOR: u32 = 254;

/// Where a distribution puts the driver's 64-bit libraries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Layout {
    /// Debian and Ubuntu: the multiarch directory `usr/lib/x86_64-linux-gnu`.
    Debian,
    /// RHEL, Rocky, Fedora, SUSE: `usr/lib64`.
    Rhel,
}

impl Layout {
    /// The library directory, relative to the root.
    pub fn lib_dir(self) -> &'static str {
        match self {
            Layout::Debian => "usr/lib/x86_64-linux-gnu",
            Layout::Rhel => "usr/lib64",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Layout::Debian => "debian",
            Layout::Rhel => "rhel",
        }
    }
}

/// How a library's soname relates to its file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Soname {
    /// `<stem>.so.<n>`, a link to the file: `libcuda.so.1`.
    Major(&'static str),
    /// The file name itself, version included: the libraries only the driver's
    /// own libraries load, by exact version (`libnvidia-glcore.so.<version>`).
    FileName,
}

/// One library of the driver, as the installer puts it in the library directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LibrarySpec {
    /// Path under the library directory without the version: `libcuda.so`,
    /// `vdpau/libvdpau_nvidia.so`. The file is `<name>.<version>`, unless
    /// [`LibrarySpec::fixed_name`] gives it.
    pub name: &'static str,
    pub soname: Soname,
    /// Whether the installer also makes the link-time name `<name>` (`libcuda.so
    /// -> libcuda.so.1`).
    pub dev_link: bool,
    /// A file name that does not carry the driver version.
    pub fixed_name: Option<&'static str>,
}

const fn lib(name: &'static str, soname: Soname, dev_link: bool) -> LibrarySpec {
    LibrarySpec {
        name,
        soname,
        dev_link,
        fixed_name: None,
    }
}

/// The libraries of an R570 datacenter driver (x86_64, the `.run` installer or the
/// distribution packages built from it) that a GPU container may use.
///
/// Names: the NVIDIA driver README, chapter "Installed Components" (R5xx), which
/// lists each library as `<name>.so.<version>` and the GLVND vendor libraries by
/// their sonames (`libEGL_nvidia.so.0`, `libGLX_nvidia.so.0`,
/// `libGLESv2_nvidia.so.2`, `libGLESv1_CM_nvidia.so.1`); `libnvidia-gpucomp`: the
/// driver team's announcement "New driver component: libnvidia-gpucomp" (NVIDIA
/// developer forums, 2023), which says its soname carries the driver version, as
/// for the other libraries loaded only by the driver's own (`glcore`, `eglcore`,
/// `glsi`, `tls`, `rtcore`, `pkcs11`). Sonames `.so.1` of the compute libraries:
/// the `libcuda.so.1` and `libnvidia-ml.so.1` the CUDA and NVML documentation
/// tell programs to load, and installs such as the one in
/// NVIDIA/nvidia-container-toolkit#1479 (`libnvidia-ml.so.1 ->
/// libnvidia-ml.so.550.127.05`); `libnvidia-nvvm.so.4` follows NVVM's own major.
/// `.so` links: a `.run` install lists `libcuda.so -> libcuda.so.1` and
/// `libnvcuvid.so -> libnvcuvid.so.1` among its symlinks; the toolkit adds
/// `libnvidia-opticalflow.so` in containers because the driver does not ship it
/// (`internal/discover/symlinks.go`, "Fix missing symlink"), so it has none here.
/// The other `.so` links follow the libraries programs link against with `-l`
/// (NVML, NVENC, NVCUVID, NvFBC, `libnvidia-cfg`, NVVM, the PTX JIT) and are this
/// fixture's assumption.
///
/// Not included, on purpose: `libnvidia-sandboxutils.so.1` (the toolkit would load
/// and initialise it instead of NVML, and a stub cannot answer it), the X and
/// Vulkan ICD files, and the libraries that do not carry the driver version
/// besides `libnvidia-nvvm70.so.4`.
pub const LIBRARIES: &[LibrarySpec] = &[
    lib("libcuda.so", Soname::Major("1"), true),
    lib("libcudadebugger.so", Soname::Major("1"), false),
    lib("libnvidia-ml.so", Soname::Major("1"), true),
    lib("libnvidia-ptxjitcompiler.so", Soname::Major("1"), true),
    lib("libnvidia-nvvm.so", Soname::Major("4"), true),
    // The legacy NVVM (NVVM 7.0 IR) R570 ships beside the current one; its file
    // name has no driver version, so the toolkit looks for it by name
    // (`libnvidia-nvvm70.so.*`, pkg/nvcdi/driver-nvml.go).
    LibrarySpec {
        name: "libnvidia-nvvm70.so",
        soname: Soname::FileName,
        dev_link: false,
        fixed_name: Some("libnvidia-nvvm70.so.4"),
    },
    lib("libnvidia-gpucomp.so", Soname::FileName, false),
    lib("libnvidia-opencl.so", Soname::Major("1"), false),
    lib("libnvidia-cfg.so", Soname::Major("1"), true),
    lib("libnvidia-allocator.so", Soname::Major("1"), false),
    lib("libnvidia-pkcs11.so", Soname::FileName, false),
    lib("libnvidia-pkcs11-openssl3.so", Soname::FileName, false),
    lib("libnvidia-encode.so", Soname::Major("1"), true),
    lib("libnvcuvid.so", Soname::Major("1"), true),
    lib("libnvidia-opticalflow.so", Soname::Major("1"), false),
    lib("libnvoptix.so", Soname::Major("1"), false),
    lib("libnvidia-rtcore.so", Soname::FileName, false),
    lib("libEGL_nvidia.so", Soname::Major("0"), false),
    lib("libGLX_nvidia.so", Soname::Major("0"), false),
    lib("libGLESv2_nvidia.so", Soname::Major("2"), false),
    lib("libGLESv1_CM_nvidia.so", Soname::Major("1"), false),
    lib("libnvidia-glcore.so", Soname::FileName, false),
    lib("libnvidia-glsi.so", Soname::FileName, false),
    lib("libnvidia-tls.so", Soname::FileName, false),
    lib("libnvidia-eglcore.so", Soname::FileName, false),
    lib("libnvidia-fbc.so", Soname::Major("1"), true),
    lib("libnvidia-ngx.so", Soname::Major("1"), false),
    lib("vdpau/libvdpau_nvidia.so", Soname::Major("1"), false),
];

/// The driver's tools in `usr/bin`, the ones the toolkit mounts
/// (`newDriverBinariesDiscoverer` in pkg/nvcdi/driver-nvml.go). The IMEX daemon
/// and its control tool ship with R550 and later datacenter drivers; see
/// [`Options::imex_binaries`].
pub const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];
pub const IMEX_BINARIES: &[&str] = &["nvidia-imex", "nvidia-imex-ctl"];

/// GSP firmware files of R5xx drivers: `gsp_tu10x.bin` (Turing, Ampere GA100) and
/// `gsp_ga10x.bin` (Ampere GA10x and later), installed under
/// `/lib/firmware/nvidia/<version>/` (the README's "GSP Firmware" chapter). The
/// toolkit mounts `nvidia/<version>/gsp*.bin` from the firmware search path.
pub const GSP_FIRMWARE: &[&str] = &["gsp_ga10x.bin", "gsp_tu10x.bin"];

/// The persistence daemon's socket (`nvidia-persistenced --help`: "/var/run/
/// nvidia-persistenced/socket"; `/var/run` is a link to `/run`).
pub const PERSISTENCED_SOCKET: &str = "run/nvidia-persistenced/socket";
/// The fabric manager's socket, on NVSwitch systems.
pub const FABRICMANAGER_SOCKET: &str = "run/nvidia-fabricmanager/socket";

/// Where the root's `nvidia-smi` records the calls it carried out, relative to
/// the root: one line per call, [`set_timeslice_call`]'s text and a newline, in
/// the order they ran. A real node keeps no such file; it is how a test sees
/// what a real node's driver would have been told.
pub const NVIDIA_SMI_CALLS: &str = "var/log/nvidia-smi.calls";

/// What `nvidia-smi compute-policy --set-timeslice <n>` takes, by `n`: the list
/// `nvidia-smi compute-policy -h` prints, "0=DEFAULT, 1=SHORT, 2=MEDIUM, 3=LONG"
/// (quoted in NVIDIA/k8s-device-plugin#354).
pub const TIMESLICE_NAMES: [&str; 4] = ["DEFAULT", "SHORT", "MEDIUM", "LONG"];

/// The line [`NVIDIA_SMI_CALLS`] holds, without its newline, once the root's
/// `nvidia-smi` has set GPU `uuid`'s time slice to `value`, however the options
/// were spelt: `compute-policy -i <uuid> --set-timeslice <value>`.
pub fn set_timeslice_call(uuid: &str, value: u32) -> String {
    format!("compute-policy -i {uuid} --set-timeslice {value}")
}

/// [`NVIDIA_SMI_CALLS`] under the driver root `root` (a root built here, or the
/// `--driver-root` that `topodra-sim-node` prints).
pub fn nvidia_smi_calls_path(root: &Path) -> PathBuf {
    root.join(NVIDIA_SMI_CALLS)
}

/// The calls the `nvidia-smi` of the driver root `root` recorded, oldest first,
/// each without its newline; empty when it recorded none.
///
/// # Errors
/// Reading the file fails other than by its absence, naming the path.
pub fn nvidia_smi_calls(root: &Path) -> io::Result<Vec<String>> {
    let path = nvidia_smi_calls_path(root);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text.lines().map(str::to_owned).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(at("reading", &path, e)),
    }
}

/// Where the root's `nvidia-cuda-mps-control` records the control daemons it
/// started and stopped, relative to the root: one line per event,
/// [`mps_start_call`]'s or [`mps_quit_call`]'s text and a newline, in the order
/// they happened. A real node keeps no such file; see [`MPS_CONTROL_SOURCE`].
pub const MPS_CONTROL_CALLS: &str = "var/log/nvidia-cuda-mps-control.calls";

/// The variable naming the directory of the MPS control daemon's pipes (the MPS
/// guide, "CUDA_MPS_PIPE_DIRECTORY").
pub const MPS_PIPE_DIRECTORY_ENV: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// Its default: "The default directory for these pipes and sockets is
/// /tmp/nvidia-mps".
pub const MPS_DEFAULT_PIPE_DIRECTORY: &str = "/tmp/nvidia-mps";
/// The variable naming the directory of the daemon's `control.log` (the MPS
/// guide, "CUDA_MPS_LOG_DIRECTORY").
pub const MPS_LOG_DIRECTORY_ENV: &str = "CUDA_MPS_LOG_DIRECTORY";
/// Its default: "By default these log files are stored in the directory
/// /var/log/nvidia-mps".
pub const MPS_DEFAULT_LOG_DIRECTORY: &str = "/var/log/nvidia-mps";
/// The daemon's command pipe in the pipe directory (a FIFO here).
pub const MPS_CONTROL_PIPE: &str = "control";
/// The daemon's log in the log directory.
pub const MPS_CONTROL_LOG: &str = "control.log";
/// The file in the pipe directory that holds the daemon's PID.
pub const MPS_PID_FILE: &str = "nvidia-cuda-mps-control.pid";

/// The line [`MPS_CONTROL_CALLS`] holds, without its newline, once the root's
/// `nvidia-cuda-mps-control -d` started a daemon: `start pipe=<pipe_dir>
/// log=<log_dir> visible=<visible>`, each as the daemon's environment gave it
/// (`CUDA_MPS_PIPE_DIRECTORY`, `CUDA_MPS_LOG_DIRECTORY`, `CUDA_VISIBLE_DEVICES`;
/// the defaults for the directories, and an empty `visible`, where unset).
pub fn mps_start_call(pipe_dir: &Path, log_dir: &Path, visible: &str) -> String {
    format!(
        "start pipe={} log={} visible={visible}",
        pipe_dir.display(),
        log_dir.display()
    )
}

/// The line [`MPS_CONTROL_CALLS`] holds, without its newline, once the daemon of
/// `pipe_dir` quit: `quit pipe=<pipe_dir>`.
pub fn mps_quit_call(pipe_dir: &Path) -> String {
    format!("quit pipe={}", pipe_dir.display())
}

/// [`MPS_CONTROL_CALLS`] under the driver root `root`.
pub fn mps_control_calls_path(root: &Path) -> PathBuf {
    root.join(MPS_CONTROL_CALLS)
}

/// The starts and quits the `nvidia-cuda-mps-control` of the driver root `root`
/// recorded, oldest first, each without its newline; empty when it recorded none.
///
/// # Errors
/// Reading the file fails other than by its absence, naming the path.
pub fn mps_control_calls(root: &Path) -> io::Result<Vec<String>> {
    let path = mps_control_calls_path(root);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text.lines().map(str::to_owned).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(at("reading", &path, e)),
    }
}

/// The PID of the control daemon of `pipe_dir`, from its [`MPS_PID_FILE`]; `None`
/// when there is no such file (no daemon started there, or it quit). A daemon
/// killed without `quit` leaves the file behind: check that the process lives.
///
/// # Errors
/// The file cannot be read, or does not hold a PID, naming the path.
pub fn mps_daemon_pid(pipe_dir: &Path) -> io::Result<Option<u32>> {
    let path = pipe_dir.join(MPS_PID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse().map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {text:?} is not a PID: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(at("reading", &path, e)),
    }
}

/// The EGL external platform libraries, versioned on their own (egl-wayland and
/// egl-gbm are NVIDIA's open-source projects, shipped in the driver): the README's
/// "Installed Components" lists them as `libnvidia-egl-wayland.so.1` and
/// `libnvidia-egl-gbm.so.1`; the file versions are illustrative of R570.
pub const GRAPHICS_LIBRARIES: &[LibrarySpec] = &[
    LibrarySpec {
        name: "libnvidia-egl-wayland.so",
        soname: Soname::Major("1"),
        dev_link: false,
        fixed_name: Some("libnvidia-egl-wayland.so.1.1.17"),
    },
    LibrarySpec {
        name: "libnvidia-egl-gbm.so",
        soname: Soname::Major("1"),
        dev_link: false,
        fixed_name: Some("libnvidia-egl-gbm.so.1.1.2"),
    },
];

/// The loader configuration files of the driver's graphics stack, at the paths
/// the README's "Installed Components" gives them (GLVND's EGL vendor file, the EGL
/// external platform files beside their libraries, the Vulkan ICD and layers, the
/// OptiX cache, the X configuration snippet, the OpenCL ICD), with their contents:
/// each JSON file names the library its loader opens, `nvidia.icd` the OpenCL
/// library. Vulkan's `api_version` is illustrative.
pub const GRAPHICS_CONFIGS: &[(&str, &str)] = &[
    (
        "usr/share/glvnd/egl_vendor.d/10_nvidia.json",
        "{\"file_format_version\": \"1.0.0\", \"ICD\": {\"library_path\": \"libEGL_nvidia.so.0\"}}\n",
    ),
    (
        "usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
        "{\"file_format_version\": \"1.0.0\", \"ICD\": {\"library_path\": \"libnvidia-egl-wayland.so.1\"}}\n",
    ),
    (
        "usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
        "{\"file_format_version\": \"1.0.0\", \"ICD\": {\"library_path\": \"libnvidia-egl-gbm.so.1\"}}\n",
    ),
    (
        "usr/share/vulkan/icd.d/nvidia_icd.json",
        "{\"file_format_version\": \"1.0.1\", \"ICD\": {\"library_path\": \"libGLX_nvidia.so.0\", \"api_version\": \"1.4.303\"}}\n",
    ),
    (
        "usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
        "{\"file_format_version\": \"1.0.1\", \"layer\": {\"name\": \"VK_LAYER_NV_optimus\", \"type\": \"INSTANCE\", \"library_path\": \"libGLX_nvidia.so.0\"}}\n",
    ),
    (
        "usr/share/nvidia/nvoptix.bin",
        "topodra fake driver root: OptiX data\n",
    ),
    (
        "usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf",
        "Section \"OutputClass\"\n    Identifier \"nvidia\"\n    MatchDriver \"nvidia-drm\"\n    Driver \"nvidia\"\nEndSection\n",
    ),
    ("etc/OpenCL/vendors/nvidia.icd", "libnvidia-opencl.so.1\n"),
];

/// What to put in the root besides the libraries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Minors of the GPUs: one `dev/nvidia<minor>` each, and the GPUs the fake
    /// libcuda knows (it reports those whose node the process can open).
    pub gpu_minors: Vec<u32>,
    /// What libcuda says of the GPU of each minor of [`Options::gpu_minors`]
    /// (`cuDeviceGetUuid`, `cuDeviceGetName`); a minor without an entry gets
    /// [`CudaGpu::placeholder`], entries for other minors are ignored. Fill it
    /// with [`CudaGpu::from_profile`] where a profile is at hand.
    pub cuda_gpus: Vec<CudaGpu>,
    /// What `cuDriverGetVersion` reports.
    pub cuda_driver_version: i32,
    /// A built `libtopodra_fake_nvml.so` to install as the root's NVML; `None`:
    /// [`crate::cdylib_path`].
    pub nvml_lib: Option<PathBuf>,
    /// Profile YAML written as `nvml-profile.yaml` beside the root's NVML, which
    /// it reads when `TOPODRA_FAKE_NVML_PROFILE` is unset.
    pub nvml_profile: Option<String>,
    /// The MIG state file of the node's own NVML: linked beside the root's
    /// NVML, so a process loading the root's copy sees the same instances
    /// (real MIG instances belong to the driver, not to one library copy).
    pub nvml_state: Option<PathBuf>,
    /// Where `dev/` goes; `None`: the driver root itself.
    pub dev_root: Option<PathBuf>,
    /// Create the device nodes (skipped, not failed, without `CAP_MKNOD`).
    pub device_nodes: bool,
    /// Permission bits of the device nodes: `0o666` is what the driver's
    /// `NVreg_DeviceFileMode` defaults to (`crw-rw-rw-` in `ls -l /dev/nvidia*`).
    pub device_mode: u32,
    /// Major of `nvidia-uvm` and `nvidia-uvm-tools`.
    pub uvm_major: u32,
    /// Merged `/usr`: `bin`, `sbin`, `lib` and `lib64` are links into `usr/`.
    pub merged_usr: bool,
    pub persistenced_socket: bool,
    pub fabricmanager_socket: bool,
    /// Install `nvidia-imex` and `nvidia-imex-ctl` too.
    pub imex_binaries: bool,
    /// The graphics stack's extra files: [`GRAPHICS_LIBRARIES`],
    /// [`GRAPHICS_CONFIGS`], `nvidia-xconfig`, the X driver and GLX module under
    /// `<libdir>/../xorg/modules` (`usr/lib/xorg` on Debian, `usr/lib64/xorg` on
    /// RHEL), and the GBM backend link `gbm/nvidia-drm_gbm.so ->
    /// ../libnvidia-allocator.so.1`.
    pub graphics: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            gpu_minors: vec![0, 1],
            cuda_gpus: Vec::new(),
            cuda_driver_version: R570_CUDA_VERSION,
            nvml_lib: None,
            nvml_profile: None,
            nvml_state: None,
            dev_root: None,
            device_nodes: true,
            device_mode: 0o666,
            uvm_major: DEFAULT_UVM_MAJOR,
            merged_usr: true,
            persistenced_socket: true,
            fabricmanager_socket: false,
            imex_binaries: true,
            graphics: true,
        }
    }
}

/// One GPU as the fake libcuda describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaGpu {
    /// Minor of its device node, `/dev/nvidia<minor>`.
    pub minor: u32,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as `nvidia-smi -L` prints it;
    /// `cuDeviceGetUuid` answers its 16 bytes in that order.
    pub uuid: String,
    /// `cuDeviceGetName`, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
}

impl CudaGpu {
    /// The GPUs of `profile` the driver enumerates: all but `nvml_hidden` ones
    /// (not bound by the driver, so neither NVML nor CUDA sees them).
    pub fn from_profile(profile: &crate::Profile) -> Vec<Self> {
        profile
            .gpus
            .iter()
            .filter(|g| !g.nvml_hidden)
            .map(|g| Self {
                minor: g.minor,
                uuid: g.uuid.clone(),
                name: g.name.clone(),
            })
            .collect()
    }

    /// What the root's libcuda says of a GPU [`Options::cuda_gpus`] does not
    /// describe: a UUID that carries the minor in its last group
    /// (`GPU-746f706f-6472-6100-0000-<minor, 12 hex digits>`, "topodra" in ASCII
    /// first) and the name `topodra fake GPU`, neither of them a real board's.
    pub fn placeholder(minor: u32) -> Self {
        Self {
            minor,
            uuid: format!("GPU-746f706f-6472-6100-0000-{minor:012x}"),
            name: "topodra fake GPU".into(),
        }
    }
}

/// One installed library, with paths as a container sees them (absolute, inside
/// the root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Library {
    /// The regular file: `/usr/lib64/libcuda.so.570.172.08`.
    pub path: String,
    /// Its `DT_SONAME`.
    pub soname: String,
    /// Symlinks made for it, each `(link, target)` with the target relative to the
    /// link's directory, as the installer writes them.
    pub links: Vec<(String, String)>,
}

/// One device node made under the dev root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    /// `/dev/nvidia0`.
    pub path: String,
    pub major: u32,
    pub minor: u32,
    pub mode: u32,
}

/// Whether the device nodes exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceNodes {
    Created(Vec<DeviceNode>),
    /// `mknod` was refused (no `CAP_MKNOD`): the reason, for a test's skip message.
    Skipped {
        reason: String,
    },
    /// [`Options::device_nodes`] was off.
    NotRequested,
}

/// A built fake driver root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverRoot {
    pub root: PathBuf,
    /// The directory holding `dev/`.
    pub dev_root: PathBuf,
    pub layout: Layout,
    pub version: String,
    pub libraries: Vec<Library>,
    /// `/usr/bin/nvidia-smi`, ...
    pub binaries: Vec<String>,
    /// `/lib/firmware/nvidia/<version>/gsp_ga10x.bin`, ...
    pub firmware: Vec<String>,
    /// `/run/nvidia-persistenced/socket`, ...
    pub sockets: Vec<String>,
    /// With [`Options::graphics`]: the config files, X modules and the GBM link,
    /// `/usr/share/glvnd/egl_vendor.d/10_nvidia.json`, ...
    pub graphics_files: Vec<String>,
    pub device_nodes: DeviceNodes,
}

impl DriverRoot {
    /// Lays out a driver root of `layout` for driver `version` in `dir` (created if
    /// missing; files already there are replaced).
    ///
    /// # Errors
    /// I/O errors, and a compiler (`$CC`, else `cc`) that is missing or fails,
    /// each naming the path or command.
    pub fn build(dir: &Path, layout: Layout, version: &str, options: &Options) -> io::Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| at("creating", dir, e))?;
        let root = dir.to_path_buf();
        if options.merged_usr {
            merged_usr_links(&root)?;
        }
        let lib_dir = root.join(layout.lib_dir());
        mkdir(&lib_dir)?;

        let mut libraries = Vec::with_capacity(LIBRARIES.len());
        let graphics_libs = if options.graphics {
            GRAPHICS_LIBRARIES
        } else {
            &[]
        };
        for spec in LIBRARIES.iter().chain(graphics_libs) {
            libraries.push(install_library(&root, layout, version, spec, options)?);
        }
        if let Some(yaml) = &options.nvml_profile {
            let p = lib_dir.join(crate::ffi::PROFILE_FILE_NAME);
            std::fs::write(&p, yaml).map_err(|e| at("writing", &p, e))?;
        }
        if let Some(state) = &options.nvml_state {
            let p = lib_dir.join(crate::ffi::mig::state::STATE_FILE_NAME);
            std::os::unix::fs::symlink(state, &p).map_err(|e| at("linking", &p, e))?;
        }

        let mut binaries = Vec::new();
        let imex = if options.imex_binaries {
            IMEX_BINARIES
        } else {
            &[]
        };
        let xconfig: &[&str] = if options.graphics {
            &["nvidia-xconfig"]
        } else {
            &[]
        };
        for name in BINARIES.iter().chain(imex).chain(xconfig) {
            let rel = format!("usr/bin/{name}");
            install_binary(&root.join(&rel), name, version, options)?;
            binaries.push(format!("/{rel}"));
        }
        // nvidia-smi and nvidia-cuda-mps-control open their records with
        // O_CREAT, which makes the file but not its directory. A rebuilt root is
        // a fresh install, so the calls made to the one it replaces go with it.
        for calls in [nvidia_smi_calls_path(&root), mps_control_calls_path(&root)] {
            if let Some(dir) = calls.parent() {
                mkdir(dir)?;
            }
            match std::fs::remove_file(&calls) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(at("replacing", &calls, e)),
            }
        }

        let mut firmware = Vec::new();
        // Through the `lib` link when /usr is merged, so the files are in usr/lib.
        let fw_dir = root.join(format!("lib/firmware/nvidia/{version}"));
        mkdir(&fw_dir)?;
        for name in GSP_FIRMWARE {
            let p = fw_dir.join(name);
            std::fs::write(&p, firmware_bytes(name, version)).map_err(|e| at("writing", &p, e))?;
            firmware.push(format!("/lib/firmware/nvidia/{version}/{name}"));
        }

        let mut sockets = Vec::new();
        for (on, rel) in [
            (options.persistenced_socket, PERSISTENCED_SOCKET),
            (options.fabricmanager_socket, FABRICMANAGER_SOCKET),
        ] {
            if on {
                make_socket(&root.join(rel))?;
                sockets.push(format!("/{rel}"));
            }
        }

        let graphics_files = if options.graphics {
            install_graphics(&root, layout, version)?
        } else {
            Vec::new()
        };

        let dev_root = options.dev_root.clone().unwrap_or_else(|| root.clone());
        let device_nodes = if options.device_nodes {
            make_device_nodes(&dev_root, options)?
        } else {
            DeviceNodes::NotRequested
        };

        Ok(Self {
            root,
            dev_root,
            layout,
            version: version.to_owned(),
            libraries,
            binaries,
            firmware,
            sockets,
            graphics_files,
            device_nodes,
        })
    }

    /// The library directory on this machine.
    pub fn lib_dir(&self) -> PathBuf {
        self.root.join(self.layout.lib_dir())
    }

    /// `path` (absolute, as a container sees it) on this machine.
    pub fn host_path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// What this root's `nvidia-smi` has recorded: [`nvidia_smi_calls`].
    ///
    /// # Errors
    /// As [`nvidia_smi_calls`].
    pub fn nvidia_smi_calls(&self) -> io::Result<Vec<String>> {
        nvidia_smi_calls(&self.root)
    }

    /// What this root's `nvidia-cuda-mps-control` has recorded:
    /// [`mps_control_calls`].
    ///
    /// # Errors
    /// As [`mps_control_calls`].
    pub fn mps_control_calls(&self) -> io::Result<Vec<String>> {
        mps_control_calls(&self.root)
    }

    /// The installed library whose file name starts with `name` (`libcuda.so`).
    pub fn library(&self, name: &str) -> Option<&Library> {
        self.libraries.iter().find(|l| {
            Path::new(&l.path)
                .file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| f.starts_with(&format!("{name}.")))
        })
    }
}

fn at(op: &str, path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{op} {}: {e}", path.display()))
}

fn mkdir(p: &Path) -> io::Result<()> {
    std::fs::create_dir_all(p).map_err(|e| at("creating", p, e))
}

/// Replaces whatever is at `link` with a symlink to `target`.
fn relink(target: &str, link: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(link) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(link),
        Ok(_) => std::fs::remove_file(link),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
    .map_err(|e| at("replacing", link, e))?;
    symlink(target, link).map_err(|e| at("linking", link, e))
}

/// The links of a merged `/usr` (Debian 12, Ubuntu 22.04 and RHEL 9 install
/// this way): `bin`, `sbin`, `lib`, `lib64` point into `usr/`, and `var/run` at
/// `../run` (FHS 3.0: "/var/run ... may be a symbolic link to /run").
/// Debian's `lib64` holds only the dynamic loader's link, RHEL's is the library
/// directory; both are merged into `usr/`.
fn merged_usr_links(root: &Path) -> io::Result<()> {
    for dir in ["usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "run", "var"] {
        mkdir(&root.join(dir))?;
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("var/run", "../run"),
    ] {
        relink(target, &root.join(link))?;
    }
    Ok(())
}

fn install_library(
    root: &Path,
    layout: Layout,
    version: &str,
    spec: &LibrarySpec,
    options: &Options,
) -> io::Result<Library> {
    let rel = Path::new(spec.name);
    let dir_rel = Path::new(layout.lib_dir()).join(rel.parent().unwrap_or(Path::new("")));
    let dir = root.join(&dir_rel);
    mkdir(&dir)?;
    let stem = rel
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or(spec.name);
    let file = spec
        .fixed_name
        .map(str::to_owned)
        .unwrap_or_else(|| format!("{stem}.{version}"));
    let soname = match spec.soname {
        Soname::Major(n) => format!("{stem}.{n}"),
        Soname::FileName => file.clone(),
    };
    let dest = dir.join(&file);
    if stem == "libnvidia-ml.so" {
        let src = match &options.nvml_lib {
            Some(p) => p.clone(),
            None => crate::cdylib_path(),
        };
        std::fs::copy(&src, &dest)
            .map_err(|e| at(&format!("copying {} to", src.display()), &dest, e))?;
    } else {
        let source = if stem == "libcuda.so" {
            libcuda_source(options)?
        } else {
            stub_source(stem)
        };
        let soname_arg = format!("-Wl,-soname,{soname}");
        compile(&dest, &source, &["-shared", "-fPIC", &soname_arg])?;
    }

    let in_root = |name: &str| format!("/{}", dir_rel.join(name).display());
    let mut links = Vec::new();
    if soname != file {
        relink(&file, &dir.join(&soname))?;
        links.push((in_root(&soname), file.clone()));
    }
    if spec.dev_link {
        relink(&soname, &dir.join(stem))?;
        links.push((in_root(stem), soname.clone()));
    }
    Ok(Library {
        path: in_root(&file),
        soname,
        links,
    })
}

/// The graphics extras of [`Options::graphics`].
fn install_graphics(root: &Path, layout: Layout, version: &str) -> io::Result<Vec<String>> {
    let mut out = Vec::new();
    for (rel, text) in GRAPHICS_CONFIGS {
        let p = root.join(rel);
        if let Some(dir) = p.parent() {
            mkdir(dir)?;
        }
        std::fs::write(&p, text).map_err(|e| at("writing", &p, e))?;
        out.push(format!("/{rel}"));
    }
    // The X driver and the GLX server module, where the distribution's X server
    // looks for modules (README: /usr/lib/xorg/modules/drivers/nvidia_drv.so and
    // .../extensions/libglxserver_nvidia.so.<version>; RHEL's X server uses
    // /usr/lib64/xorg/modules).
    let xorg = match layout {
        Layout::Debian => "usr/lib/xorg/modules",
        Layout::Rhel => "usr/lib64/xorg/modules",
    };
    let glx = format!("libglxserver_nvidia.so.{version}");
    for (dir, file, soname) in [
        ("drivers", "nvidia_drv.so", None),
        ("extensions", glx.as_str(), Some(glx.as_str())),
    ] {
        let d = root.join(xorg).join(dir);
        mkdir(&d)?;
        let mut args = vec!["-shared", "-fPIC"];
        let soname_arg = soname.map(|s| format!("-Wl,-soname,{s}"));
        if let Some(a) = &soname_arg {
            args.push(a);
        }
        compile(&d.join(file), &stub_source(file), &args)?;
        out.push(format!("/{xorg}/{dir}/{file}"));
    }
    let ext = root.join(xorg).join("extensions");
    relink(&glx, &ext.join("libglxserver_nvidia.so"))?;
    out.push(format!("/{xorg}/extensions/libglxserver_nvidia.so"));
    // GBM loads its NVIDIA backend from `<libdir>/gbm/<driver>_gbm.so`; the driver
    // installs it as a link to libnvidia-allocator (README: "/usr/lib/gbm/
    // nvidia-drm_gbm.so" with the allocator library).
    let gbm = root.join(layout.lib_dir()).join("gbm");
    mkdir(&gbm)?;
    relink(
        "../libnvidia-allocator.so.1",
        &gbm.join("nvidia-drm_gbm.so"),
    )?;
    out.push(format!("/{}/gbm/nvidia-drm_gbm.so", layout.lib_dir()));
    Ok(out)
}

/// A library with one exported function, so it is a well-formed shared object
/// with a dynamic symbol table.
fn stub_source(stem: &str) -> String {
    let ident: String = stem
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!(
        "/* topodra fake driver root: stub of {stem}. */\n\
         int topodra_fake_{ident}(void) {{ return 0; }}\n"
    )
}

/// Environment variable the fake libcuda reads at `cuInit` for the directory
/// that holds the device nodes, `/dev` when unset or empty. A test hook, so that a
/// test can show the stub which GPUs a process "can see" without making nodes in
/// the host's `/dev`; the real driver has no such variable.
pub const CUDA_DEV_DIR_ENV: &str = "TOPODRA_FAKE_CUDA_DEV_DIR";

/// The C source of the fake `libcuda`. Compile it with `-DTOPODRA_CUDA_VERSION=<n>`
/// (required) and `-DTOPODRA_GPUS=<rows>` from [`libcuda_gpu_table`] (default: no
/// GPUs); [`DriverRoot::build`] prepends both as `#define`s.
///
/// What the real driver does, and so the stub: the CUDA Driver API reference
/// (<https://docs.nvidia.com/cuda/cuda-driver-api/>, cuda.h: `CUresult` 0 is
/// `CUDA_SUCCESS`, 1 `CUDA_ERROR_INVALID_VALUE`, 3 `CUDA_ERROR_NOT_INITIALIZED`,
/// 101 `CUDA_ERROR_INVALID_DEVICE`, "the device ordinal supplied by the user does
/// not correspond to a valid CUDA device"):
/// - `cuInit(Flags)` (Initialization): "Currently, the Flags parameter must be
///   0", else INVALID_VALUE. It enumerates the GPUs once, as the driver does at
///   initialisation: a GPU of the table counts when `<dir>/nvidia<minor>` exists
///   and this process may open it read-write (`access(2)`; `<dir>` is `/dev`, or
///   [`CUDA_DEV_DIR_ENV`]). The stub does not open the node: on a host without the
///   kernel module (CI) a node answers ENXIO, which the real driver would take as
///   a fault, not as an absent GPU. Why nodes decide: in a container the GPUs a
///   process can use are those whose nodes it was given ("By using device
///   whitelisting in Docker, you can restrict which GPUs a container will be able
///   to access. For instance, container A is granted access to /dev/nvidia0 while
///   container B is granted access to /dev/nvidia1", NVIDIA/nvidia-docker wiki,
///   "GPU isolation (version 1.0)"), and a container made from a CDI spec holds
///   only the claim's nodes, so CUDA in it enumerates only the injected GPUs. On a
///   bare host the real user-space driver would run `nvidia-modprobe` to create a
///   missing node ("used by user-space NVIDIA driver components to make sure ...
///   the NVIDIA character device files are present", nvidia-modprobe(1)); a
///   container has neither the tool nor the privilege, so the stub models the
///   container. The count includes only visible GPUs, as with
///   `CUDA_VISIBLE_DEVICES` ("The device count returned by the
///   cudaGetDeviceCount() API includes only the visible devices", CUDA
///   Programming Guide, "CUDA Environment Variables").
///   Not modelled: `/dev/nvidiactl` and the UVM nodes (the real driver fails
///   without them), `CUDA_VISIBLE_DEVICES`, and `CUDA_ERROR_NO_DEVICE` from
///   `cuInit` when nothing is visible (the stub succeeds and counts 0, the
///   reference's "If there is no such device, cuDeviceGetCount() returns 0");
/// - `cuDriverGetVersion(int *)` (Version Management): the version;
///   INVALID_VALUE "if the driverVersion argument is NULL". It works before
///   `cuInit` (the runtime calls it to explain a failed init);
/// - every other call answers NOT_INITIALIZED before `cuInit` ("If cuInit() has
///   not been called, any function from the driver API will return
///   CUDA_ERROR_NOT_INITIALIZED") and INVALID_VALUE for a NULL output;
/// - `cuDeviceGetCount(int *)` (Device Management): the number of visible GPUs;
/// - `cuDeviceGet(CUdevice *, int ordinal)`: "a device handle given an ordinal in
///   the range [0, cuDeviceGetCount()-1]", INVALID_DEVICE outside it. Ordinal `i`
///   is the `i`-th visible GPU in ascending minor order, and the handle is the
///   ordinal. The real driver orders by its own heuristic unless
///   `CUDA_DEVICE_ORDER=PCI_BUS_ID`; minor order stands in for bus order, which
///   the minors follow on the profiles' machines;
/// - `cuDeviceGetName(char *, int len, CUdevice)`: the table's name, cut to
///   `len - 1` bytes and NUL-terminated ("len specifies the maximum length of the
///   string that may be returned"); INVALID_VALUE for `len <= 0`, INVALID_DEVICE
///   for a handle that is not a visible ordinal;
/// - `cuDeviceGetUuid(CUuuid *, CUdevice)` and `cuDeviceGetUuid_v2`: the
///   table's 16 bytes (`CUuuid` is `char bytes[16]`). The two differ only for a
///   MIG device (`_v2`: "If the device is in MIG mode, returns its MIG UUID");
///   the stub knows whole GPUs only and answers the GPU's UUID to both.
///
/// Module loading, memory, contexts and kernel launch are absent on purpose: a
/// fake cannot JIT and run PTX, so a probe that resolves them (tests/gpu/
/// cuda_probe.c) reports them missing rather than a fake success.
pub const LIBCUDA_SOURCE: &str = r#"/* topodra fake driver root: libcuda that enumerates GPUs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef TOPODRA_CUDA_VERSION
#error "define TOPODRA_CUDA_VERSION (cuDriverGetVersion's answer)"
#endif
/* Rows {minor, {16 UUID bytes}, "name"}, each followed by a comma, in ascending
 * minor order. */
#ifndef TOPODRA_GPUS
#define TOPODRA_GPUS
#endif

typedef struct { unsigned char bytes[16]; } CUuuid;
struct topodra_gpu { unsigned int minor; unsigned char uuid[16]; const char *name; };
/* The last row (no name) only ends the table. */
static const struct topodra_gpu topodra_gpus[] = { TOPODRA_GPUS { 0, { 0 }, 0 } };
#define TOPODRA_ROWS (sizeof topodra_gpus / sizeof topodra_gpus[0] - 1)

static int initialized;
static int visible_count;
static const struct topodra_gpu *visible[TOPODRA_ROWS + 1];

int cuInit(unsigned int flags) {
    if (flags != 0) return 1;
    if (initialized) return 0;
    const char *dir = getenv("TOPODRA_FAKE_CUDA_DEV_DIR");
    if (!dir || !*dir) dir = "/dev";
    for (size_t i = 0; i < TOPODRA_ROWS; i++) {
        char path[4096];
        int n = snprintf(path, sizeof path, "%s/nvidia%u", dir, topodra_gpus[i].minor);
        if (n > 0 && (size_t)n < sizeof path && access(path, R_OK | W_OK) == 0)
            visible[visible_count++] = &topodra_gpus[i];
    }
    initialized = 1;
    return 0;
}
int cuDriverGetVersion(int *version) {
    if (!version) return 1;
    *version = TOPODRA_CUDA_VERSION;
    return 0;
}
int cuDeviceGetCount(int *count) {
    if (!initialized) return 3;
    if (!count) return 1;
    *count = visible_count;
    return 0;
}
int cuDeviceGet(int *device, int ordinal) {
    if (!initialized) return 3;
    if (!device) return 1;
    if (ordinal < 0 || ordinal >= visible_count) return 101;
    *device = ordinal;
    return 0;
}
int cuDeviceGetName(char *name, int len, int dev) {
    if (!initialized) return 3;
    if (!name || len <= 0) return 1;
    if (dev < 0 || dev >= visible_count) return 101;
    strncpy(name, visible[dev]->name, (size_t)len - 1);
    name[len - 1] = 0;
    return 0;
}
int cuDeviceGetUuid(CUuuid *uuid, int dev) {
    if (!initialized) return 3;
    if (!uuid) return 1;
    if (dev < 0 || dev >= visible_count) return 101;
    memcpy(uuid->bytes, visible[dev]->uuid, sizeof uuid->bytes);
    return 0;
}
int cuDeviceGetUuid_v2(CUuuid *uuid, int dev) {
    return cuDeviceGetUuid(uuid, dev);
}
"#;

/// The rows of libcuda's GPU table (`TOPODRA_GPUS` of [`LIBCUDA_SOURCE`]) for
/// `gpus`, in ascending minor order (the first entry of a minor wins): a C
/// initializer list, one `{minor, {bytes}, "name"},` per GPU, to `#define` or to
/// pass as `-DTOPODRA_GPUS=<rows>`.
///
/// # Errors
/// `InvalidInput` for a UUID that is not `GPU-` and 32 hex digits grouped 8-4-4-4-12.
pub fn libcuda_gpu_table(gpus: &[CudaGpu]) -> io::Result<String> {
    let mut sorted: Vec<&CudaGpu> = gpus.iter().collect();
    sorted.sort_by_key(|g| g.minor);
    sorted.dedup_by_key(|g| g.minor);
    let mut rows = String::new();
    for g in sorted {
        let bytes = uuid_bytes(&g.uuid).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "GPU minor {}: UUID {:?} is not GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
                    g.minor, g.uuid
                ),
            )
        })?;
        let hex: Vec<String> = bytes.iter().map(|b| format!("0x{b:02x}")).collect();
        let _ = write!(
            rows,
            "{{{}, {{{}}}, {}}}, ",
            g.minor,
            hex.join(", "),
            c_string(&g.name)
        );
    }
    Ok(rows)
}

/// The 16 bytes of `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (hex, either case).
fn uuid_bytes(uuid: &str) -> Option<[u8; 16]> {
    let rest = uuid.strip_prefix("GPU-")?;
    let groups: Vec<&str> = rest.split('-').collect();
    let lens: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    if lens != [8, 4, 4, 4, 12] {
        return None;
    }
    let digits: String = groups.concat();
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(digits.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// `s` as a C string literal: printable ASCII as is, the rest (and `"`, `\`) as
/// three-digit octal escapes, which cannot swallow the character after them.
fn c_string(s: &str) -> String {
    let mut out = String::from("\"");
    for b in s.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "\\{b:03o}");
        }
    }
    out.push('"');
    out
}

/// libcuda's GPUs: each minor of [`Options::gpu_minors`], described by
/// [`Options::cuda_gpus`] or [`CudaGpu::placeholder`].
fn libcuda_gpus(options: &Options) -> Vec<CudaGpu> {
    options
        .gpu_minors
        .iter()
        .map(|&m| {
            options
                .cuda_gpus
                .iter()
                .find(|g| g.minor == m)
                .cloned()
                .unwrap_or_else(|| CudaGpu::placeholder(m))
        })
        .collect()
}

fn libcuda_source(options: &Options) -> io::Result<String> {
    Ok(format!(
        "#define TOPODRA_CUDA_VERSION {}\n#define TOPODRA_GPUS {}\n{LIBCUDA_SOURCE}",
        options.cuda_driver_version,
        libcuda_gpu_table(&libcuda_gpus(options))?
    ))
}

/// What each tool prints: `nvidia-smi` its banner line (driver and CUDA
/// versions, as the real header shows them), the others their name.
fn binary_message(name: &str, version: &str, options: &Options) -> String {
    if name == "nvidia-smi" {
        let cuda = options.cuda_driver_version;
        format!(
            "NVIDIA-SMI {version}  Driver Version: {version}  CUDA Version: {}.{}  \
             (topodra fake driver root, {} GPUs)\n",
            cuda / 1000,
            (cuda % 1000) / 10,
            options.gpu_minors.len()
        )
    } else {
        format!("{name} {version} (topodra fake driver root)\n")
    }
}

/// A static executable without libc that writes `message` to stdout and exits
/// 0, so it runs in any container of the same architecture.
fn tiny_program(message: &str) -> String {
    let mut lit = String::new();
    for b in message.bytes() {
        let _ = write!(lit, "\\x{b:02x}");
    }
    format!(
        r#"/* topodra fake driver root: prints one line. */
static const char msg[] = "{lit}";
#if defined(__x86_64__)
static long sys3(long n, long a, long b, long c) {{
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}}
#define NR_WRITE 1
#define NR_EXIT 60
#elif defined(__aarch64__)
static long sys3(long n, long a, long b, long c) {{
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    __asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2) : "memory");
    return x0;
}}
#define NR_WRITE 64
#define NR_EXIT 93
#else
#error "no syscall stub for this architecture"
#endif
void _start(void) {{
    sys3(NR_WRITE, 1, (long)msg, sizeof msg - 1);
    sys3(NR_EXIT, 0, 0, 0);
    for (;;) {{}}
}}
"#
    )
}

/// The C source of the root's `nvidia-smi`. [`DriverRoot::build`] prepends
/// `#define`s of its banner (`TOPODRA_BANNER`), the record's path in the root
/// (`TOPODRA_CALLS`, [`NVIDIA_SMI_CALLS`]), the root's GPU UUIDs
/// (`TOPODRA_GPU_UUIDS`) and [`TIMESLICE_NAMES`] (`TOPODRA_TIMESLICE_NAMES`,
/// `TOPODRA_TIMESLICE_LIST`), so the compile cache keys each set of GPUs apart.
///
/// It stands in for the one command line a GPU kubelet plugin runs on a node:
/// NVIDIA's DRA driver sets a GPU's time slice by running the driver root's
/// `nvidia-smi compute-policy -i <GPU UUID> --set-timeslice <n>`, one GPU per
/// run (sigs.k8s.io/dra-driver-nvidia-gpu v0.4.1,
/// cmd/gpu-kubelet-plugin/nvlib.go, `setTimeSlice`). What it does:
/// - without arguments, or with any it does not implement, it prints the banner
///   and exits 0, as before it knew any command: containers run a bare
///   `nvidia-smi` and read its first line;
/// - it implements `compute-policy` followed by exactly one GPU id (`-i <id>`,
///   `--id <id>` or `--id=<id>`) and one time slice (`--set-timeslice <n>` or
///   `--set-timeslice=<n>`), in either order. Anything else after
///   `compute-policy` is not implemented, so prints the banner: `-l`, an option
///   given twice, or no `-i` (the real tool would then set every GPU);
/// - `<n>` must be one digit of 0..=3 (the DRA driver formats it with `%d`),
///   else exit 2; `<id>` must be one of the root's GPU UUIDs (the GPUs the
///   root's libcuda knows: each of [`Options::gpu_minors`], named by
///   [`Options::cuda_gpus`]), else exit 6. The real tool also takes a GPU's
///   index, serial or PCI bus id and comma-separated lists; the stand-in refuses
///   them as unknown GPUs, since the root knows its GPUs by minor and UUID, not
///   by NVML index (the profile's own numbering), and the DRA driver passes
///   UUIDs. The codes are what the RETURN VALUE list of nvidia-smi(1)
///   (<https://docs.nvidia.com/deploy/nvidia-smi/>) gives those failures ("2 - A
///   supplied argument or flag is invalid", "6 - A query to find an object was
///   unsuccessful"); the messages on stderr and the
///   confirmation on stdout (`Set timeslice to SHORT for GPU <uuid>.`) are
///   illustrative, not the real tool's words;
/// - on success it appends [`set_timeslice_call`]'s line to
///   `<root>/`[`NVIDIA_SMI_CALLS`] with one `write(2)` on an `O_APPEND`
///   descriptor, so concurrent runs never interleave within a line. It finds
///   `<root>` by stripping `usr/bin/nvidia-smi` from `/proc/self/exe`, which the
///   kernel has already resolved through a merged `/usr`'s `bin` link or any
///   other symlink. Run in a container that mounts the root's files at `/`, it
///   records in that container's `/var/log`. Where it cannot record (a copy
///   outside a root, a read-only `var/log`) it exits 255, "Other error", rather
///   than report a change no test could see;
/// - unlike the real tool it neither needs root nor loads NVML (the DRA driver
///   sets `LD_PRELOAD` to the root's NVML, which a static program ignores).
///
/// x86_64 and aarch64 only; elsewhere the root's `nvidia-smi` is the banner
/// script the other tools get, which implements no command.
pub const NVIDIA_SMI_SOURCE: &str = r#"/* topodra fake driver root: nvidia-smi. Prints its banner, or carries out and
 * records `compute-policy -i <uuid> --set-timeslice <n>`. Static, without libc:
 * raw system calls, so it runs in any container of the same architecture. */
#ifndef TOPODRA_BANNER
#error "define TOPODRA_BANNER (the line printed without arguments)"
#endif
/* Where the calls are recorded, relative to the root. */
#ifndef TOPODRA_CALLS
#error "define TOPODRA_CALLS (the record's path in the root)"
#endif
/* The root's GPU UUIDs, each followed by a comma. */
#ifndef TOPODRA_GPU_UUIDS
#define TOPODRA_GPU_UUIDS
#endif
/* The names of --set-timeslice 0, 1, ..., each followed by a comma, and the
 * list as the help text gives it. */
#if !defined(TOPODRA_TIMESLICE_NAMES) || !defined(TOPODRA_TIMESLICE_LIST)
#error "define TOPODRA_TIMESLICE_NAMES and TOPODRA_TIMESLICE_LIST"
#endif

static const char banner[] = TOPODRA_BANNER;
static const char *const gpus[] = { TOPODRA_GPU_UUIDS 0 };
static const char *const timeslices[] = { TOPODRA_TIMESLICE_NAMES 0 };
/* This program's path relative to the root, which is how it finds the root. */
#define SELF "usr/bin/nvidia-smi"

/* Exit codes from the RETURN VALUE list of nvidia-smi(1), for the failures they
 * name. The messages printed with them, and the confirmation, are illustrative:
 * this fixture does not copy the real tool's wording. */
#define EXIT_INVALID_ARGUMENT 2 /* "A supplied argument or flag is invalid" */
#define EXIT_NOT_FOUND 6        /* "A query to find an object was unsuccessful" */
#define EXIT_OTHER 255          /* "Other error or internal driver error occurred" */

#define AT_FDCWD (-100)
/* asm-generic/fcntl.h; x86_64 and aarch64 use these values. */
#define O_WRONLY 01
#define O_CREAT 0100
#define O_APPEND 02000
#define O_CLOEXEC 02000000

#if defined(__x86_64__)
#define NR_WRITE 1
#define NR_CLOSE 3
#define NR_OPENAT 257
#define NR_READLINKAT 267
#define NR_EXIT_GROUP 231
static long sys4(long n, long a, long b, long c, long d) {
    register long r10 __asm__("r10") = d;
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
    return r;
}
/* The kernel starts the program with argc at the stack pointer and argv above
 * it; a C function's prologue would move the stack first, so the entry point is
 * assembly that hands that address on, with the stack aligned as calls expect. */
__asm__(".text\n.global _start\n_start:\n"
        "  xor %ebp, %ebp\n"
        "  mov %rsp, %rdi\n"
        "  and $-16, %rsp\n"
        "  call smi_main\n"
        "  hlt\n");
#elif defined(__aarch64__)
#define NR_READLINKAT 78
#define NR_OPENAT 56
#define NR_CLOSE 57
#define NR_WRITE 64
#define NR_EXIT_GROUP 94
static long sys4(long n, long a, long b, long c, long d) {
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    __asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
    return x0;
}
/* As above; the kernel leaves sp 16-byte aligned here, as the ABI wants it. */
__asm__(".text\n.global _start\n_start:\n"
        "  mov x29, #0\n"
        "  mov x30, #0\n"
        "  mov x0, sp\n"
        "  bl smi_main\n"
        "  brk #0\n");
#else
#error "no syscall stub for this architecture"
#endif

static unsigned long len(const char *s) {
    unsigned long n = 0;
    while (s[n]) n++;
    return n;
}

static int same(const char *a, const char *b) {
    while (*a && *a == *b) { a++; b++; }
    return *a == *b;
}

/* What follows PREFIX in S, or 0 when S does not start with it. */
static const char *after(const char *s, const char *prefix) {
    while (*prefix)
        if (*s++ != *prefix++) return 0;
    return s;
}

/* A message is built whole and written with one call, so that concurrent
 * writers to the same file cannot interleave inside it. Copies stop at the NUL
 * rather than count bytes, which keeps compilers from turning them into memcpy
 * calls that nothing here could link. */
struct buf { char b[4200]; unsigned long n; int overflow; };

static void add(struct buf *o, const char *s) {
    while (*s) {
        if (o->n + 1 >= sizeof o->b) { o->overflow = 1; return; }
        o->b[o->n++] = *s++;
    }
    o->b[o->n] = 0;
}

__attribute__((noreturn)) static void leave(int code) {
    for (;;) sys4(NR_EXIT_GROUP, code, 0, 0, 0);
}

__attribute__((noreturn)) static void fail(int code, const char *a, const char *b, const char *c) {
    struct buf o;
    o.n = 0;
    o.overflow = 0;
    add(&o, a);
    add(&o, b);
    add(&o, c);
    add(&o, "\n");
    sys4(NR_WRITE, 2, (long)o.b, (long)o.n, 0);
    leave(code);
}

__attribute__((noreturn, used)) void smi_main(long *sp) {
    long argc = sp[0];
    char **argv = (char **)(sp + 1);
    const char *id = 0, *value = 0, *v;

    /* The one command line implemented: compute-policy with exactly one GPU id
     * and one time slice, each option spelt with a separate value or with `=`. */
    int implemented = argc >= 2 && same(argv[1], "compute-policy");
    for (long i = 2; implemented && i < argc; i++) {
        const char *a = argv[i];
        const char **slot = 0;
        v = 0;
        if (same(a, "-i") || same(a, "--id"))
            slot = &id;
        else if (same(a, "--set-timeslice"))
            slot = &value;
        if (slot) {
            if (i + 1 < argc) v = argv[++i];
        } else if ((v = after(a, "--id="))) {
            slot = &id;
        } else if ((v = after(a, "--set-timeslice="))) {
            slot = &value;
        }
        /* An option given twice is not implemented either. */
        implemented = slot && v && !*slot;
        if (implemented) *slot = v;
    }
    if (!implemented || !id || !value) {
        sys4(NR_WRITE, 1, (long)banner, sizeof banner - 1, 0);
        leave(0);
    }

    long n = -1;
    for (long k = 0; timeslices[k]; k++)
        if (value[0] == '0' + k && value[1] == 0) n = k;
    if (n < 0)
        fail(EXIT_INVALID_ARGUMENT, "Invalid timeslice value \"", value,
             "\"; valid values: " TOPODRA_TIMESLICE_LIST);
    int known = 0;
    for (long k = 0; gpus[k]; k++)
        if (same(gpus[k], id)) known = 1;
    if (!known)
        fail(EXIT_NOT_FOUND, "No GPU with UUID \"", id,
             "\" in this driver root (the stand-in takes GPU UUIDs only)");

    /* The root is where the kernel says this program is, less SELF: through a
     * merged /usr's bin link the path is already resolved to usr/bin. */
    struct buf path;
    long got = sys4(NR_READLINKAT, AT_FDCWD, (long)"/proc/self/exe", (long)path.b, sizeof path.b - 64);
    if (got <= 0 || got >= (long)sizeof path.b - 64)
        fail(EXIT_OTHER, "topodra fake nvidia-smi: ", "cannot read /proc/self/exe", "");
    path.b[got] = 0;
    unsigned long self_len = len(SELF);
    if ((unsigned long)got <= self_len || path.b[got - self_len - 1] != '/' ||
        !same(path.b + got - self_len, SELF))
        fail(EXIT_OTHER, "topodra fake nvidia-smi: no driver root to record in: ", path.b,
             " is not <root>/" SELF);
    path.n = (unsigned long)got - self_len;
    path.overflow = 0;
    add(&path, TOPODRA_CALLS);

    struct buf line;
    line.n = 0;
    line.overflow = 0;
    add(&line, "compute-policy -i ");
    add(&line, id);
    add(&line, " --set-timeslice ");
    add(&line, value);
    add(&line, "\n");
    if (path.overflow || line.overflow)
        fail(EXIT_OTHER, "topodra fake nvidia-smi: record too long for ", path.b, "");

    long fd = sys4(NR_OPENAT, AT_FDCWD, (long)path.b, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        fail(EXIT_OTHER, "topodra fake nvidia-smi: cannot open ", path.b, " to record the call");
    /* O_APPEND and one write: the line lands whole at the end of the file. */
    long wrote = sys4(NR_WRITE, fd, (long)line.b, (long)line.n, 0);
    sys4(NR_CLOSE, fd, 0, 0, 0);
    if (wrote != (long)line.n)
        fail(EXIT_OTHER, "topodra fake nvidia-smi: cannot write ", path.b, "");

    struct buf out;
    out.n = 0;
    out.overflow = 0;
    add(&out, "Set timeslice to ");
    add(&out, timeslices[n]);
    add(&out, " for GPU ");
    add(&out, id);
    add(&out, ".\n");
    sys4(NR_WRITE, 1, (long)out.b, (long)out.n, 0);
    leave(0);
}
"#;

/// [`NVIDIA_SMI_SOURCE`] with its `#define`s: `banner` and the UUIDs of
/// libcuda's GPUs.
fn nvidia_smi_source(banner: &str, options: &Options) -> String {
    let uuids: String = libcuda_gpus(options)
        .iter()
        .map(|g| format!("{}, ", c_string(&g.uuid)))
        .collect();
    let names: String = TIMESLICE_NAMES
        .iter()
        .map(|n| format!("{}, ", c_string(n)))
        .collect();
    let list: Vec<String> = TIMESLICE_NAMES
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{i}={n}"))
        .collect();
    format!(
        "#define TOPODRA_BANNER {}\n#define TOPODRA_CALLS {}\n\
         #define TOPODRA_GPU_UUIDS {uuids}\n#define TOPODRA_TIMESLICE_NAMES {names}\n\
         #define TOPODRA_TIMESLICE_LIST {}\n{NVIDIA_SMI_SOURCE}",
        c_string(banner),
        c_string(NVIDIA_SMI_CALLS),
        c_string(&list.join(", ")),
    )
}

/// The C source of the root's `nvidia-cuda-mps-control`. [`DriverRoot::build`]
/// prepends `#define`s of its banner (`TOPODRA_BANNER`), the record's path in the
/// root (`TOPODRA_CALLS`, [`MPS_CONTROL_CALLS`]), the directories' defaults
/// (`TOPODRA_PIPE_DEFAULT`, `TOPODRA_LOG_DEFAULT`) and the names of the files in
/// them (`TOPODRA_CONTROL`, `TOPODRA_CONTROL_LOG`, `TOPODRA_PID_FILE`).
///
/// It stands in for what a GPU kubelet plugin runs to share a GPU through CUDA
/// MPS: `nvidia-cuda-mps-control -d` from the driver root with
/// `CUDA_VISIBLE_DEVICES=<GPU UUID>`, `CUDA_MPS_PIPE_DIRECTORY` and
/// `CUDA_MPS_LOG_DIRECTORY` in its environment to start one control daemon per
/// GPU, and `echo quit | nvidia-cuda-mps-control` with the same pipe directory to
/// stop it. NVIDIA's Multi-Process Service guide
/// (<https://docs.nvidia.com/deploy/mps/>), "Appendix: Tools and Interface
/// Reference", documents what it follows: `-d` starts the daemon "in background
/// process", `echo quit | nvidia-cuda-mps-control` shuts it down; the daemon and
/// its clients talk through named pipes in `CUDA_MPS_PIPE_DIRECTORY`, default
/// `/tmp/nvidia-mps`; the daemon keeps `control.log` in `CUDA_MPS_LOG_DIRECTORY`,
/// default `/var/log/nvidia-mps`, "set in the MPS control daemon's environment";
/// it "creates a nvidia-cuda-mps-control.pid file that contains the PID of the
/// control daemon process in the CUDA_MPS_PIPE_DIRECTORY". What it does:
/// - `-d` (alone): checks, makes the daemon's files, forks, and exits 0 once the
///   daemon is set up and recorded; the child calls `setsid`, puts its stdio on
///   `/dev/null`, closes every other descriptor it inherited, and lives on. The
///   daemon creates in the pipe directory (made, with its parents, if missing) a
///   FIFO named `control` and the PID file (`<pid>` and a newline), appends a
///   start line to `control.log` in the log directory, and appends
///   [`mps_start_call`]'s line to `<root>/`[`MPS_CONTROL_CALLS`]. An unset or
///   empty variable takes the documented default, and `CUDA_VISIBLE_DEVICES`
///   unset is recorded as `visible=`. Then it reads commands from the FIFO, which
///   it holds open for reading and writing, so a client closing its end is no end
///   of file. On a line `quit` it appends [`mps_quit_call`]'s line to the record
///   and a line to `control.log`, removes the PID file and then the FIFO, and
///   exits 0; other lines are logged to `control.log` and ignored (the real
///   daemon has more commands, e.g. `get_server_list`);
/// - one daemon per pipe directory: a second `-d` while one runs prints "An
///   instance of this daemon is already running" on stderr and exits 1, the
///   words and status public scripts check for from the real tool (where the
///   real tool prints them is not documented). The stand-in knows a running
///   daemon by an exclusive `flock` on the pipe directory that the daemon holds
///   for its life, rather than by the PID file naming a live process: the kernel
///   drops the lock however the daemon ends, a reused PID cannot fool it, and two
///   `-d` run at once cannot both win. A daemon killed without `quit` leaves its
///   FIFO and PID file behind; the next `-d` takes them over, as is reported of
///   the real one;
/// - no arguments: a client. It sends each non-blank line of stdin to
///   `<CUDA_MPS_PIPE_DIRECTORY>/control` (a write-only, non-blocking open: with
///   no daemon the FIFO is missing or nobody reads it, ENXIO). Without a daemon
///   it prints "Cannot find MPS control daemon process" on stderr and exits 1,
///   as the real client does. After `quit` it waits (up to 10 s) until the daemon
///   has removed its FIFO, so that the daemon's record is complete when `echo
///   quit | nvidia-cuda-mps-control` returns; whether the real client waits for
///   the daemon to go is not documented. With nothing on stdin (a container
///   running it bare, stdin at end of file) it prints the banner and exits 0, as
///   before it knew any command;
/// - any other arguments print the banner and exit 0;
/// - illustrative, not the real tool's: the FIFO (the real daemon's `control` is
///   a named pipe or, in recent releases, a unix socket, and its protocol is its
///   own), the contents of `control.log` (the guide's "MPS Logging Format" has
///   timestamps this program cannot read), the other messages and the exit
///   status 1 for this program's own failures. It starts no MPS server, so CUDA
///   clients never connect to it, and it needs no privilege;
/// - the record: one `write(2)` per line on an `O_APPEND` descriptor, so daemons
///   of several GPUs never interleave within a line. `<root>` is `/proc/self/exe`
///   less `usr/bin/nvidia-cuda-mps-control`, as for [`NVIDIA_SMI_SOURCE`]; where
///   it cannot record (a copy outside a root, a read-only `var/log`) `-d` exits 1
///   and starts nothing.
///
/// x86_64 and aarch64 only; elsewhere the root's `nvidia-cuda-mps-control` is the
/// banner script the other tools get, which implements no command.
pub const MPS_CONTROL_SOURCE: &str = r#"/* topodra fake driver root: nvidia-cuda-mps-control. With -d it starts a control
 * daemon for CUDA_MPS_PIPE_DIRECTORY that records its start and its quit; with no
 * arguments it sends each line of stdin to that daemon. Static, without libc: raw
 * system calls, so it runs in any container of the same architecture. */
#ifndef TOPODRA_BANNER
#error "define TOPODRA_BANNER (the line printed for what is not implemented)"
#endif
/* Where the starts and quits are recorded, relative to the root. */
#ifndef TOPODRA_CALLS
#error "define TOPODRA_CALLS (the record's path in the root)"
#endif
/* The defaults of CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY, and the
 * names of the files the daemon keeps in them. */
#if !defined(TOPODRA_PIPE_DEFAULT) || !defined(TOPODRA_LOG_DEFAULT)
#error "define TOPODRA_PIPE_DEFAULT and TOPODRA_LOG_DEFAULT"
#endif
#if !defined(TOPODRA_CONTROL) || !defined(TOPODRA_CONTROL_LOG) || !defined(TOPODRA_PID_FILE)
#error "define TOPODRA_CONTROL, TOPODRA_CONTROL_LOG and TOPODRA_PID_FILE"
#endif

static const char banner[] = TOPODRA_BANNER;
/* This program's path relative to the root, which is how it finds the root. */
#define SELF "usr/bin/nvidia-cuda-mps-control"
#define ME "topodra fake nvidia-cuda-mps-control: "

/* What the real tool prints, and its exit status 1, where public callers match
 * on it: a second -d on a pipe directory whose daemon runs, and a client with no
 * daemon to talk to. The other messages are illustrative. */
#define ALREADY_RUNNING "An instance of this daemon is already running"
#define NO_DAEMON "Cannot find MPS control daemon process"

#define AT_FDCWD (-100)
/* asm-generic/fcntl.h; x86_64 and aarch64 share these values (not O_DIRECTORY,
 * which is why it is not used). */
#define O_RDONLY 0
#define O_WRONLY 01
#define O_RDWR 02
#define O_CREAT 0100
#define O_TRUNC 01000
#define O_APPEND 02000
#define O_NONBLOCK 04000
#define O_CLOEXEC 02000000
#define S_IFIFO 0010000
#define LOCK_EX 2
#define LOCK_NB 4
#define SIGKILL 9
#define SIGCHLD 17
#define F_OK 0
#define ENOENT 2
#define EINTR 4
#define EAGAIN 11

#if defined(__x86_64__)
#define NR_READ 0
#define NR_WRITE 1
#define NR_CLOSE 3
#define NR_NANOSLEEP 35
#define NR_GETPID 39
#define NR_CLONE 56
#define NR_KILL 62
#define NR_FLOCK 73
#define NR_GETPPID 110
#define NR_SETSID 112
#define NR_GETSID 124
#define NR_EXIT_GROUP 231
#define NR_OPENAT 257
#define NR_MKDIRAT 258
#define NR_MKNODAT 259
#define NR_UNLINKAT 263
#define NR_READLINKAT 267
#define NR_FACCESSAT 269
#define NR_DUP3 292
static long sys4(long n, long a, long b, long c, long d) {
    register long r10 __asm__("r10") = d;
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
    return r;
}
/* The kernel starts the program with argc at the stack pointer, argv and the
 * environment above it; a C function's prologue would move the stack first, so
 * the entry point is assembly that hands that address on, aligned. */
__asm__(".text\n.global _start\n_start:\n"
        "  xor %ebp, %ebp\n"
        "  mov %rsp, %rdi\n"
        "  and $-16, %rsp\n"
        "  call mps_main\n"
        "  hlt\n");
#elif defined(__aarch64__)
#define NR_DUP3 24
#define NR_FLOCK 32
#define NR_MKNODAT 33
#define NR_MKDIRAT 34
#define NR_UNLINKAT 35
#define NR_FACCESSAT 48
#define NR_OPENAT 56
#define NR_CLOSE 57
#define NR_READ 63
#define NR_WRITE 64
#define NR_READLINKAT 78
#define NR_EXIT_GROUP 94
#define NR_NANOSLEEP 101
#define NR_KILL 129
#define NR_GETSID 156
#define NR_SETSID 157
#define NR_GETPID 172
#define NR_GETPPID 173
#define NR_CLONE 220
static long sys4(long n, long a, long b, long c, long d) {
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    __asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
    return x0;
}
/* As above; the kernel leaves sp 16-byte aligned here, as the ABI wants it. */
__asm__(".text\n.global _start\n_start:\n"
        "  mov x29, #0\n"
        "  mov x30, #0\n"
        "  mov x0, sp\n"
        "  bl mps_main\n"
        "  brk #0\n");
#else
#error "no syscall stub for this architecture"
#endif

static unsigned long len(const char *s) {
    unsigned long n = 0;
    while (s[n]) n++;
    return n;
}

static int same(const char *a, const char *b) {
    while (*a && *a == *b) { a++; b++; }
    return *a == *b;
}

/* A line or path is built whole and written with one call, so that concurrent
 * writers to the same file cannot interleave inside it. Copies stop at the NUL
 * rather than count bytes, which keeps compilers from turning them into memcpy
 * calls that nothing here could link. */
struct buf { char b[4200]; unsigned long n; int overflow; };

static void clear(struct buf *o) {
    o->n = 0;
    o->overflow = 0;
    o->b[0] = 0;
}

static void add(struct buf *o, const char *s) {
    while (*s) {
        if (o->n + 1 >= sizeof o->b) { o->overflow = 1; return; }
        o->b[o->n++] = *s++;
    }
    o->b[o->n] = 0;
}

static void add_num(struct buf *o, unsigned long v) {
    char digits[24];
    int i = (int)sizeof digits - 1;
    digits[i] = 0;
    do { digits[--i] = (char)('0' + v % 10); v /= 10; } while (v && i > 0);
    add(o, digits + i);
}

/* DIR/NAME. */
static void join(struct buf *o, const char *dir, const char *name) {
    clear(o);
    add(o, dir);
    if (o->n == 0 || o->b[o->n - 1] != '/') add(o, "/");
    add(o, name);
}

__attribute__((noreturn)) static void leave(int code) {
    for (;;) sys4(NR_EXIT_GROUP, code, 0, 0, 0);
}

static void say(long fd, const char *a, const char *b, const char *c) {
    struct buf o;
    clear(&o);
    add(&o, a);
    add(&o, b);
    add(&o, c);
    add(&o, "\n");
    sys4(NR_WRITE, fd, (long)o.b, (long)o.n, 0);
}

__attribute__((noreturn)) static void fail(const char *a, const char *b, const char *c) {
    say(2, a, b, c);
    leave(1);
}

static void nap_ms(long ms) {
    long ts[2] = { ms / 1000, (ms % 1000) * 1000000 };
    sys4(NR_NANOSLEEP, (long)ts, 0, 0, 0);
}

static long unlink_path(const char *path) {
    return sys4(NR_UNLINKAT, AT_FDCWD, (long)path, 0, 0);
}

/* Appends LINE to PATH with one write on an O_APPEND descriptor, so concurrent
 * writers never interleave within a line. 0, or a negative errno. */
static long append(const char *path, const struct buf *line) {
    long fd = sys4(NR_OPENAT, AT_FDCWD, (long)path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return fd;
    long wrote = sys4(NR_WRITE, fd, (long)line->b, (long)line->n, 0);
    sys4(NR_CLOSE, fd, 0, 0, 0);
    if (wrote < 0) return wrote;
    return wrote == (long)line->n ? 0 : -EAGAIN;
}

/* The value of NAME in the environment; unset and empty are the same here. */
static const char *env(char **envp, const char *name) {
    for (; *envp; envp++) {
        const char *e = *envp, *n = name;
        while (*n && *e == *n) { e++; n++; }
        if (!*n && *e == '=') return e[1] ? e + 1 : 0;
    }
    return 0;
}

/* Creates DIR and its missing parents, as `mkdir -p`; failures show later, when
 * the files in it cannot be made. */
static void make_dirs(const char *dir) {
    struct buf p;
    clear(&p);
    add(&p, dir);
    for (unsigned long i = 1; i < p.n; i++) {
        if (p.b[i] != '/') continue;
        p.b[i] = 0;
        sys4(NR_MKDIRAT, AT_FDCWD, (long)p.b, 0755, 0);
        p.b[i] = '/';
    }
    sys4(NR_MKDIRAT, AT_FDCWD, (long)p.b, 0755, 0);
}

/* The record's path: the root is where the kernel says this program is, less
 * SELF (through a merged /usr's bin link the path is already resolved). */
static void record_path(struct buf *path) {
    long got = sys4(NR_READLINKAT, AT_FDCWD, (long)"/proc/self/exe", (long)path->b, sizeof path->b - 64);
    if (got <= 0 || got >= (long)sizeof path->b - 64)
        fail(ME, "cannot read /proc/self/exe", "");
    path->b[got] = 0;
    unsigned long self_len = len(SELF);
    if ((unsigned long)got <= self_len || path->b[got - self_len - 1] != '/' ||
        !same(path->b + got - self_len, SELF))
        fail(ME "no driver root to record in: ", path->b, " is not <root>/" SELF);
    path->n = (unsigned long)got - self_len;
    path->overflow = 0;
    add(path, TOPODRA_CALLS);
}

/* One command the daemon read, without its newline or surrounding blanks. */
static char *trim(char *s, unsigned long n) {
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
    s[n] = 0;
    while (*s == ' ' || *s == '\t') s++;
    return s;
}

/* The daemon: reads commands from the control pipe until `quit`. It holds the
 * pipe open for reading and writing, so a client closing its end is never an
 * end of file, and the pipe directory's lock, which ends with the process. */
__attribute__((noreturn)) static void serve(long fifo_fd, const char *pipe_dir,
                                            const struct buf *fifo, const struct buf *pid_file,
                                            const struct buf *control_log, const struct buf *calls) {
    unsigned long pid = (unsigned long)sys4(NR_GETPID, 0, 0, 0, 0);
    char in[4096];
    struct buf cmd, out;
    clear(&cmd);
    for (;;) {
        long n = sys4(NR_READ, fifo_fd, (long)in, sizeof in, 0);
        if (n == -EINTR) continue;
        if (n <= 0) leave(1);
        for (long i = 0; i < n; i++) {
            if (in[i] != '\n') {
                if (cmd.n + 1 < sizeof cmd.b) cmd.b[cmd.n++] = in[i];
                else cmd.overflow = 1;
                continue;
            }
            char *c = trim(cmd.b, cmd.n);
            int overflow = cmd.overflow;
            clear(&out);
            add(&out, "[Control ");
            add_num(&out, pid);
            add(&out, "] ");
            if (overflow) {
                add(&out, "command too long, ignored\n");
                append(control_log->b, &out);
            } else if (same(c, "quit")) {
                /* The record first, the pipe last: a client waits for the pipe to
                 * go, and then finds everything else done. */
                struct buf line;
                clear(&line);
                add(&line, "quit pipe=");
                add(&line, pipe_dir);
                add(&line, "\n");
                append(calls->b, &line);
                add(&out, "quit: control daemon exiting\n");
                append(control_log->b, &out);
                unlink_path(pid_file->b);
                unlink_path(fifo->b);
                leave(0);
            } else if (*c) {
                add(&out, "command not implemented by this stand-in, ignored: ");
                add(&out, c);
                add(&out, "\n");
                append(control_log->b, &out);
            }
            clear(&cmd);
        }
    }
}

/* `-d`: check, make the pipe, fork, and return 0 once the daemon is recorded. */
__attribute__((noreturn)) static void start(char **envp) {
    const char *pipe_dir = env(envp, "CUDA_MPS_PIPE_DIRECTORY");
    const char *log_dir = env(envp, "CUDA_MPS_LOG_DIRECTORY");
    const char *visible = env(envp, "CUDA_VISIBLE_DEVICES");
    if (!pipe_dir) pipe_dir = TOPODRA_PIPE_DEFAULT;
    if (!log_dir) log_dir = TOPODRA_LOG_DEFAULT;
    if (!visible) visible = "";

    static struct buf calls, fifo, pid_file, control_log, line;
    record_path(&calls);
    join(&fifo, pipe_dir, TOPODRA_CONTROL);
    join(&pid_file, pipe_dir, TOPODRA_PID_FILE);
    join(&control_log, log_dir, TOPODRA_CONTROL_LOG);
    clear(&line);
    add(&line, "start pipe=");
    add(&line, pipe_dir);
    add(&line, " log=");
    add(&line, log_dir);
    add(&line, " visible=");
    add(&line, visible);
    add(&line, "\n");
    if (calls.overflow || fifo.overflow || pid_file.overflow || control_log.overflow || line.overflow)
        fail(ME, "path too long", "");

    make_dirs(pipe_dir);
    make_dirs(log_dir);
    /* The files written once the daemon runs are opened first, so that a place
     * this cannot write fails -d before anything was made. */
    long calls_fd = sys4(NR_OPENAT, AT_FDCWD, (long)calls.b, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (calls_fd < 0) fail(ME "cannot open ", calls.b, " to record the start");
    long log_fd = sys4(NR_OPENAT, AT_FDCWD, (long)control_log.b, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (log_fd < 0) fail(ME "cannot open ", control_log.b, "");
    /* One daemon per pipe directory: an exclusive lock on the directory, held by
     * the daemon for its life and released by the kernel however it ends. A
     * daemon that died without `quit` leaves its pipe and PID file behind and no
     * lock, so the next one takes the directory over. */
    long dir_fd = sys4(NR_OPENAT, AT_FDCWD, (long)pipe_dir, O_RDONLY | O_CLOEXEC, 0);
    if (dir_fd < 0) fail(ME "cannot open the pipe directory ", pipe_dir, "");
    if (sys4(NR_FLOCK, dir_fd, LOCK_EX | LOCK_NB, 0, 0) != 0) fail(ALREADY_RUNNING, "", "");
    unlink_path(fifo.b);
    unlink_path(pid_file.b);
    if (sys4(NR_MKNODAT, AT_FDCWD, (long)fifo.b, S_IFIFO | 0600, 0) != 0)
        fail(ME "cannot make the control pipe ", fifo.b, "");
    long fifo_fd = sys4(NR_OPENAT, AT_FDCWD, (long)fifo.b, O_RDWR | O_CLOEXEC, 0);
    if (fifo_fd < 0) {
        unlink_path(fifo.b);
        fail(ME "cannot open the control pipe ", fifo.b, "");
    }

    long parent = sys4(NR_GETPID, 0, 0, 0, 0);
    /* fork(): clone with only the exit signal, on a copy of this stack. */
    long child = sys4(NR_CLONE, SIGCHLD, 0, 0, 0);
    if (child < 0) {
        unlink_path(fifo.b);
        fail(ME, "cannot fork the daemon", "");
    }
    if (child == 0) {
        /* The daemon: its own session, no terminal, stdio on /dev/null so that
         * whoever ran -d and reads its output is not kept waiting. */
        sys4(NR_SETSID, 0, 0, 0, 0);
        long null_fd = sys4(NR_OPENAT, AT_FDCWD, (long)"/dev/null", O_RDWR | O_CLOEXEC, 0);
        for (long fd = 0; fd < 3; fd++) {
            if (null_fd >= 0) sys4(NR_DUP3, null_fd, fd, 0, 0);
            else sys4(NR_CLOSE, fd, 0, 0, 0);
        }
        /* Nor any other descriptor it was started with (a caller's pipe passed
         * down without close-on-exec), but the pipe and the directory's lock. */
        for (long fd = 3; fd < 1024; fd++)
            if (fd != fifo_fd && fd != dir_fd) sys4(NR_CLOSE, fd, 0, 0, 0);
        /* Serve once the parent has recorded the start and left, so that the
         * record's start line always comes before the quit line. */
        while (sys4(NR_GETPPID, 0, 0, 0, 0) == parent) nap_ms(1);
        serve(fifo_fd, pipe_dir, &fifo, &pid_file, &control_log, &calls);
    }

    /* Return once the daemon is on its own, a session leader (it lets go of
     * the caller's descriptors right after). */
    for (int tries = 0; sys4(NR_GETSID, child, 0, 0, 0) != child; tries++) {
        if (tries == 5000) {
            sys4(NR_KILL, child, SIGKILL, 0, 0);
            unlink_path(fifo.b);
            fail(ME, "the daemon did not start", "");
        }
        nap_ms(1);
    }

    struct buf pid_text, log_line;
    clear(&pid_text);
    add_num(&pid_text, (unsigned long)child);
    add(&pid_text, "\n");
    clear(&log_line);
    add(&log_line, "[Control ");
    add_num(&log_line, (unsigned long)child);
    add(&log_line, "] starting control daemon on ");
    add(&log_line, fifo.b);
    add(&log_line, " for CUDA_VISIBLE_DEVICES=");
    add(&log_line, visible);
    add(&log_line, "\n");
    long pid_fd = sys4(NR_OPENAT, AT_FDCWD, (long)pid_file.b, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    long wrote = pid_fd < 0 ? pid_fd : sys4(NR_WRITE, pid_fd, (long)pid_text.b, (long)pid_text.n, 0);
    if (pid_fd >= 0) sys4(NR_CLOSE, pid_fd, 0, 0, 0);
    const char *what = 0;
    if (wrote != (long)pid_text.n) what = pid_file.b;
    else if (sys4(NR_WRITE, log_fd, (long)log_line.b, (long)log_line.n, 0) != (long)log_line.n)
        what = control_log.b;
    else if (sys4(NR_WRITE, calls_fd, (long)line.b, (long)line.n, 0) != (long)line.n)
        what = calls.b;
    if (what) {
        sys4(NR_KILL, child, SIGKILL, 0, 0);
        unlink_path(pid_file.b);
        unlink_path(fifo.b);
        fail(ME "cannot write ", what, "");
    }
    leave(0);
}

/* Client: each line of stdin to the daemon of CUDA_MPS_PIPE_DIRECTORY. */
static long client_fd = -1;
static struct buf client_fifo;

static void send(char *cmd) {
    if (!*cmd) return;
    if (client_fd < 0) {
        /* Without a daemon there is no pipe (ENOENT) or nobody reads it (ENXIO:
         * a write-only, non-blocking open of a FIFO no one has open for reading). */
        client_fd = sys4(NR_OPENAT, AT_FDCWD, (long)client_fifo.b, O_WRONLY | O_NONBLOCK | O_CLOEXEC, 0);
        if (client_fd < 0) fail(NO_DAEMON, "", "");
    }
    struct buf line;
    clear(&line);
    add(&line, cmd);
    add(&line, "\n");
    if (line.overflow) fail(ME, "command too long", "");
    long wrote;
    for (int tries = 0; (wrote = sys4(NR_WRITE, client_fd, (long)line.b, (long)line.n, 0)) == -EAGAIN && tries < 1000; tries++)
        nap_ms(10);
    if (wrote != (long)line.n) fail(ME "cannot write to ", client_fifo.b, "");
    if (!same(cmd, "quit")) return;
    /* The daemon removes its pipe last when it quits: wait for that, so that the
     * caller finds the daemon gone when this returns. */
    sys4(NR_CLOSE, client_fd, 0, 0, 0);
    client_fd = -1;
    for (int tries = 0; tries < 1000; tries++) {
        if (sys4(NR_FACCESSAT, AT_FDCWD, (long)client_fifo.b, F_OK, 0) == -ENOENT) return;
        nap_ms(10);
    }
    fail(ME "the daemon did not quit: ", client_fifo.b, " is still there");
}

__attribute__((noreturn)) static void client(char **envp) {
    const char *pipe_dir = env(envp, "CUDA_MPS_PIPE_DIRECTORY");
    if (!pipe_dir) pipe_dir = TOPODRA_PIPE_DEFAULT;
    join(&client_fifo, pipe_dir, TOPODRA_CONTROL);
    if (client_fifo.overflow) fail(ME, "path too long", "");
    static struct buf cmd;
    static char in[4096];
    int commands = 0;
    clear(&cmd);
    for (;;) {
        long n = sys4(NR_READ, 0, (long)in, sizeof in, 0);
        if (n == -EINTR) continue;
        if (n < 0) fail(ME, "cannot read stdin", "");
        for (long i = 0; i <= n; i++) {
            /* A newline ends a command, and so does the end of input. */
            if (i < n && in[i] != '\n') {
                if (cmd.n + 1 < sizeof cmd.b) cmd.b[cmd.n++] = in[i];
                else cmd.overflow = 1;
                continue;
            }
            if (i == n && n > 0) break;
            if (cmd.overflow) fail(ME, "command too long", "");
            char *c = trim(cmd.b, cmd.n);
            if (*c) commands++;
            send(c);
            clear(&cmd);
        }
        if (n == 0) break;
    }
    /* No command at all: the banner, as before this tool did anything. */
    if (!commands) sys4(NR_WRITE, 1, (long)banner, sizeof banner - 1, 0);
    leave(0);
}

__attribute__((noreturn, used)) void mps_main(long *sp) {
    long argc = sp[0];
    char **argv = (char **)(sp + 1);
    char **envp = argv + argc + 1;
    if (argc == 2 && same(argv[1], "-d")) start(envp);
    if (argc == 1) client(envp);
    sys4(NR_WRITE, 1, (long)banner, sizeof banner - 1, 0);
    leave(0);
}
"#;

/// [`MPS_CONTROL_SOURCE`] with its `#define`s.
fn mps_control_source(banner: &str) -> String {
    format!(
        "#define TOPODRA_BANNER {}\n#define TOPODRA_CALLS {}\n\
         #define TOPODRA_PIPE_DEFAULT {}\n#define TOPODRA_LOG_DEFAULT {}\n\
         #define TOPODRA_CONTROL {}\n#define TOPODRA_CONTROL_LOG {}\n\
         #define TOPODRA_PID_FILE {}\n{MPS_CONTROL_SOURCE}",
        c_string(banner),
        c_string(MPS_CONTROL_CALLS),
        c_string(MPS_DEFAULT_PIPE_DIRECTORY),
        c_string(MPS_DEFAULT_LOG_DIRECTORY),
        c_string(MPS_CONTROL_PIPE),
        c_string(MPS_CONTROL_LOG),
        c_string(MPS_PID_FILE),
    )
}

fn install_binary(dest: &Path, name: &str, version: &str, options: &Options) -> io::Result<()> {
    if let Some(dir) = dest.parent() {
        mkdir(dir)?;
    }
    let message = binary_message(name, version, options);
    if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        let source = match name {
            "nvidia-smi" => nvidia_smi_source(&message, options),
            "nvidia-cuda-mps-control" => mps_control_source(&message),
            _ => tiny_program(&message),
        };
        compile(
            dest,
            &source,
            &[
                "-static",
                "-nostdlib",
                "-no-pie",
                "-fno-stack-protector",
                "-O1",
            ],
        )
    } else {
        // Elsewhere a shell script: it needs /bin/sh in the container.
        let script = format!("#!/bin/sh\nprintf '%s' '{}'\n", message.replace('\'', ""));
        std::fs::write(dest, script).map_err(|e| at("writing", dest, e))?;
        std::fs::set_permissions(dest, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| at("chmod", dest, e))
    }
}

/// Placeholder firmware contents. Real GSP images are ELF files of tens of MB
/// that only the kernel module reads; nothing in a container opens them.
fn firmware_bytes(name: &str, version: &str) -> Vec<u8> {
    format!("topodra fake GSP firmware {name} for driver {version}\n").into_bytes()
}

/// A unix socket file at `path` with nobody listening, as a daemon's socket is
/// after it exits. Bound for real where the path fits `sun_path`; a longer path
/// (deep temp dirs) gets the same inode type from `mknod(S_IFSOCK)`, which needs
/// no privilege.
fn make_socket(path: &Path) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        mkdir(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(at("replacing", path, e)),
    }
    // sun_path holds 108 bytes with the NUL.
    if path.as_os_str().len() < 108 {
        match std::os::unix::net::UnixListener::bind(path) {
            Ok(listener) => {
                drop(listener);
                return Ok(());
            }
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {}
            Err(e) => return Err(at("binding", path, e)),
        }
    }
    mknod(path, libc::S_IFSOCK | 0o755, 0).map_err(|e| at("mknod", path, e))
}

fn mknod(path: &Path, mode: libc::mode_t, dev: libc::dev_t) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    let rc = unsafe { libc::mknod(c.as_ptr(), mode, dev) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The driver's device nodes, as the kernel module and `nvidia-modprobe` create
/// them: `nvidiactl` 195:255, `nvidia<N>` 195:N, `nvidia-modeset` 195:254,
/// `nvidia-uvm` and `nvidia-uvm-tools` minors 0 and 1 of the UVM major.
fn make_device_nodes(dev_root: &Path, options: &Options) -> io::Result<DeviceNodes> {
    let dev = dev_root.join("dev");
    mkdir(&dev)?;
    let mut want: Vec<(String, u32, u32)> =
        vec![("nvidiactl".into(), NVIDIA_MAJOR, NVIDIACTL_MINOR)];
    for m in &options.gpu_minors {
        want.push((format!("nvidia{m}"), NVIDIA_MAJOR, *m));
    }
    want.push(("nvidia-modeset".into(), NVIDIA_MAJOR, NVIDIA_MODESET_MINOR));
    want.push(("nvidia-uvm".into(), options.uvm_major, 0));
    want.push(("nvidia-uvm-tools".into(), options.uvm_major, 1));

    let mut made = Vec::with_capacity(want.len());
    for (name, major, minor) in want {
        let path = dev.join(&name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(at("replacing", &path, e)),
        }
        match mknod(
            &path,
            libc::S_IFCHR | options.device_mode,
            libc::makedev(major, minor),
        ) {
            Ok(()) => {}
            Err(e) if made.is_empty() && e.raw_os_error() == Some(libc::EPERM) => {
                return Ok(DeviceNodes::Skipped {
                    reason: format!(
                        "mknod {} refused ({e}): creating device nodes needs CAP_MKNOD",
                        path.display()
                    ),
                });
            }
            Err(e) => return Err(at("mknod", &path, e)),
        }
        // The umask may have taken bits off.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(options.device_mode))
            .map_err(|e| at("chmod", &path, e))?;
        made.push(DeviceNode {
            path: format!("/dev/{name}"),
            major,
            minor,
            mode: options.device_mode,
        });
    }
    Ok(DeviceNodes::Created(made))
}

fn cc() -> OsString {
    std::env::var_os("CC")
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "cc".into())
}

/// FNV-1a, 64 bits: a cache key stable across Rust releases.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separator, so ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Compiles C `source` with `args` into `dest`, through the cache when it is
/// writable.
fn compile(dest: &Path, source: &str, args: &[&str]) -> io::Result<()> {
    let compiler = cc();
    let mut parts: Vec<&[u8]> = vec![compiler.as_bytes(), source.as_bytes()];
    parts.extend(args.iter().map(|a| a.as_bytes()));
    let key = fnv1a(&parts);
    let cache = crate::target_dir().join("fake-driver-root");
    let name = dest
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let cached = cache.join(format!("{key:016x}-{name}"));
    if !cached.exists() && std::fs::create_dir_all(&cache).is_ok() {
        let tmp = cache.join(format!(
            ".{key:016x}.{}.{}.tmp",
            std::process::id(),
            TMP_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        match run_cc(&compiler, &tmp, source, args) {
            // Another process may have won the race; either file is the same.
            Ok(()) => std::fs::rename(&tmp, &cached).map_err(|e| at("renaming", &tmp, e))?,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        }
    }
    if cached.exists() {
        let _ = std::fs::remove_file(dest);
        std::fs::copy(&cached, dest).map_err(|e| at("copying to", dest, e))?;
        return Ok(());
    }
    run_cc(&compiler, dest, source, args)
}

fn run_cc(compiler: &OsString, out: &Path, source: &str, args: &[&str]) -> io::Result<()> {
    let describe = || {
        format!(
            "{} -x c - {} -o {}",
            compiler.to_string_lossy(),
            args.join(" "),
            out.display()
        )
    };
    let mut child = Command::new(compiler)
        .args(["-x", "c", "-"])
        .args(args)
        .arg("-o")
        .arg(out)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("running {}: {e}", describe())))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(source.as_bytes())?;
    }
    let output = child.wait_with_output()?;
    if output.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{} failed ({}): {}",
            describe(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

#[cfg(test)]
mod tests;
