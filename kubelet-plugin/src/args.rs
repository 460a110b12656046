//! The flags of `serve`, in groups, and the discovery flags `discover` shares.
//! Names, environment variables and defaults are an interface: the Helm chart and
//! the e2e tests pass them.

use std::path::PathBuf;

use clap::Args;
use dra_kubeletplugin::uds::PluginSockets;
use topodra_model::config::v1alpha1::TimeSliceInterval;
use topodra_model::slice::{self, AttributeSet, NumaNodeFormat};
use topodra_node::discovery;

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// This node's name: the pool name and the slices' nodeName.
    #[arg(long, env = "NODE_NAME")]
    pub(crate) node_name: String,

    #[command(flatten)]
    pub(crate) discovery: DiscoveryFlags,

    #[command(flatten)]
    pub(crate) kubelet: KubeletFlags,

    #[command(flatten)]
    pub(crate) cdi: CdiFlags,

    #[command(flatten)]
    pub(crate) http: topodra_ops::endpoint::HttpArgs,

    #[command(flatten)]
    pub(crate) claims: ClaimFlags,

    #[command(flatten)]
    pub(crate) health: HealthFlags,

    #[command(flatten)]
    pub(crate) crash: crate::crash::CrashArgs,

    #[command(flatten)]
    pub(crate) sharing: SharingFlags,

    /// Dynamic MIG: publish every MIG partition the GPUs in MIG mode can hold,
    /// beside the whole GPU, with the counters that keep them apart, and make a
    /// partition's MIG instance when a claim for it is prepared (and remove it at
    /// unprepare). Changes a GPU's MIG mode only with --enable-mig-mode; never
    /// removes an instance the plugin did not make. Off: GPUs in MIG mode are
    /// offered as the MIG devices an operator made.
    #[arg(long, env = "TOPODRA_DYNAMIC_MIG")]
    pub(crate) dynamic_mig: bool,

    /// With --dynamic-mig: turn MIG mode on, each time this instance takes the node
    /// state and before it serves, for GPUs that support MIG, are not in MIG mode,
    /// change without a GPU reset (Hopper and later) and that no prepared claim
    /// holds. Ampere GPUs, which need a reset, are left alone.
    #[arg(long, env = "TOPODRA_ENABLE_MIG_MODE", requires = "dynamic_mig")]
    pub(crate) enable_mig_mode: bool,
}

/// Shared GPUs, published beside each GPU's exclusive device so the scheduler
/// picks the mode per claim.
#[derive(Debug, Args)]
pub(crate) struct SharingFlags {
    /// Publish a time-sliced device (`gpu-<minor>-ts`) per GPU beside its exclusive
    /// one: claims of the shared classes each get a share of its memory, and the
    /// GPU time-slices their work. GPUs in MIG mode, and GPUs under --dynamic-mig,
    /// are not time-sliced.
    #[arg(long, env = "TOPODRA_TIME_SLICING")]
    pub(crate) time_slicing: bool,

    /// The time slice every shared GPU of this node runs at while shared: Default
    /// (the driver's, which nothing sets), Short, Medium or Long. A node setting
    /// (published as the device's `timeSliceInterval`), so shares of one GPU never
    /// ask for two; other values are set with the driver root's nvidia-smi.
    #[arg(
        long,
        env = "TOPODRA_TIME_SLICE_INTERVAL",
        default_value = "Default",
        value_parser = parse_interval
    )]
    pub(crate) time_slice_interval: TimeSliceInterval,

    /// Shares per GPU when claims ask for no memory: such a share takes the GPU's
    /// memory divided by this, in whole GiB (the device plugin's `replicas`).
    #[arg(
        long,
        env = "TOPODRA_TIME_SLICING_REPLICAS",
        default_value_t = 4,
        value_parser = clap::value_parser!(u32).range(1..=1024)
    )]
    pub(crate) time_slicing_replicas: u32,

    /// Publish an MPS device (`gpu-<minor>-mps`) per GPU beside its exclusive one:
    /// claims of the MPS class each get a share of its memory and SMs, enforced
    /// by the GPU's MPS server. The GPU's first share sets it to EXCLUSIVE_PROCESS
    /// and starts its control daemon from the driver root; the last one stops it.
    #[arg(long, env = "TOPODRA_MPS")]
    pub(crate) mps: bool,

    /// Shares per GPU when MPS claims ask for no amount: such a share takes the
    /// GPU's memory divided by this (whole GiB) and 100 / this percent of its SMs.
    #[arg(
        long,
        env = "TOPODRA_MPS_REPLICAS",
        default_value_t = 4,
        value_parser = clap::value_parser!(u32).range(1..=100)
    )]
    pub(crate) mps_replicas: u32,

    /// Start MPS control daemons in the host's mount and cgroup namespaces (those
    /// of PID 1, so the pod needs `hostPID`), in a cgroup of their own where the
    /// host uses cgroup v2, so they and their clients outlive the plugin's
    /// container. The driver's MPS tools run by their path on the host
    /// (--driver-root). Without it a daemon lives in the plugin's namespaces.
    #[arg(long, env = "TOPODRA_MPS_HOST_NAMESPACES", requires = "mps")]
    pub(crate) mps_host_namespaces: bool,

    /// With --dynamic-mig and --time-slicing or --mps: MIG profiles whose
    /// partitions also publish shared devices (`<partition>-ts`, `<partition>-mps`),
    /// comma-separated (`3g.40gb,1g.10gb`). The first share's prepare makes the
    /// instance and the last one's unprepare removes it. Each profile adds devices
    /// to every slice, so only the profiles shared in practice belong here.
    #[arg(
        long,
        env = "TOPODRA_SHARED_MIG_PROFILES",
        value_delimiter = ',',
        requires = "dynamic_mig"
    )]
    pub(crate) shared_mig_profiles: Vec<String>,
}

impl SharingFlags {
    /// What the slices publish and the preparer prepares.
    pub(crate) fn sharing(&self) -> slice::Sharing {
        slice::Sharing {
            time_slicing: self.time_slicing.then_some(slice::TimeSlicing {
                interval: self.time_slice_interval,
                replicas: self.time_slicing_replicas,
            }),
            mps: self.mps.then_some(slice::Mps {
                replicas: self.mps_replicas,
            }),
            mig_profiles: self.shared_mig_profiles.clone(),
        }
    }
}

fn parse_interval(s: &str) -> Result<TimeSliceInterval, String> {
    match s {
        "Default" => Ok(TimeSliceInterval::Default),
        "Short" => Ok(TimeSliceInterval::Short),
        "Medium" => Ok(TimeSliceInterval::Medium),
        "Long" => Ok(TimeSliceInterval::Long),
        other => Err(format!(
            "{other:?} is not an interval: Default, Short, Medium or Long"
        )),
    }
}

/// Where the kubelet looks for the plugin, and where the plugin keeps its state.
#[derive(Debug, Args)]
pub(crate) struct KubeletFlags {
    /// The kubelet's plugin registry directory, watched by its plugin manager.
    #[arg(
        long,
        env = "TOPODRA_KUBELET_REGISTRY_DIR",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    pub(crate) kubelet_registry_dir: PathBuf,

    /// The kubelet's plugins directory; the DRA socket goes in `<dir>/<driver>/`.
    #[arg(
        long,
        env = "TOPODRA_KUBELET_PLUGINS_DIR",
        default_value = "/var/lib/kubelet/plugins"
    )]
    pub(crate) kubelet_plugins_dir: PathBuf,

    /// Where the checkpoint lives (default: the plugin's directory under the kubelet's).
    #[arg(long, env = "TOPODRA_STATE_DIR")]
    pub(crate) state_dir: Option<PathBuf>,

    /// How often a plugin that serves read-only, because its state directory is
    /// unusable (read-only, full, lock file not a file) or its nvidia-cdi-hook
    /// cannot be installed, tries again; also how often a new instance that cannot
    /// use the directory checks it before it asks for the node state, and how often
    /// sockets that could not be bound are bound again.
    #[arg(
        long,
        env = "TOPODRA_STATE_RETRY_SECONDS",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub(crate) state_retry_seconds: u64,

    /// The pod's UID, for socket names that let a new plugin pod register before the
    /// old one is gone (rolling update).
    #[arg(long, env = "POD_UID")]
    pub(crate) pod_uid: Option<String>,
}

/// What the CDI specs are built from: the driver installation and device nodes.
#[derive(Debug, Args)]
pub(crate) struct CdiFlags {
    /// The CDI spec directory container runtimes read.
    #[arg(long, env = "TOPODRA_CDI_DIR", default_value = topodra_node::cdi::DEFAULT_SPEC_DIR)]
    pub(crate) cdi_dir: PathBuf,

    /// Root of the NVIDIA driver installation as the host sees it (`/run/nvidia/driver`
    /// for a containerized driver).
    #[arg(long, env = "TOPODRA_DRIVER_ROOT", default_value = "/")]
    pub(crate) driver_root: PathBuf,

    /// Where this container sees the driver root, when it is mounted elsewhere.
    #[arg(long, env = "TOPODRA_DRIVER_ROOT_LOCAL")]
    pub(crate) driver_root_local: Option<PathBuf>,

    /// A toolkit-generated CDI spec whose mounts and hooks replace our own discovery.
    #[arg(long, env = "TOPODRA_TOOLKIT_CDI_SPEC")]
    pub(crate) toolkit_cdi_spec: Option<PathBuf>,

    /// The directory holding the host's `dev/`, as this container sees it.
    #[arg(long, env = "TOPODRA_DEV_ROOT", default_value = "/")]
    pub(crate) dev_root: PathBuf,

    /// The kernel's device registry, for device majors when a node is not in `/dev`.
    #[arg(long, env = "TOPODRA_PROC_DEVICES", default_value = "/proc/devices")]
    pub(crate) proc_devices: PathBuf,

    /// Where the NVIDIA driver lists the capability minors of MIG devices.
    #[arg(long, env = "TOPODRA_NVIDIA_CAPABILITIES_DIR", default_value = topodra_node::cdi::DEFAULT_CAPABILITIES_DIR)]
    pub(crate) nvidia_capabilities_dir: PathBuf,

    /// File holding the kernel's boot id.
    #[arg(long, env = "TOPODRA_BOOT_ID_FILE", default_value = topodra_node::checkpoint::DEFAULT_BOOT_ID_PATH)]
    pub(crate) boot_id_file: PathBuf,

    /// NVIDIA's `nvidia-cdi-hook` (the image's own copy), installed at start as
    /// `<kubelet-plugins-dir>/<driver>/nvidia-cdi-hook`, the path the CDI specs'
    /// hooks name; rewritten only when its bytes differ.
    #[arg(
        long,
        env = "TOPODRA_CDI_HOOK_SOURCE",
        default_value = topodra_node::cdi::DEFAULT_HOOK_PATH,
        conflicts_with = "cdi_hook_host_path"
    )]
    pub(crate) cdi_hook_source: PathBuf,

    /// Name this `nvidia-cdi-hook`, already on the host (the NVIDIA Container
    /// Toolkit's), in the CDI specs instead, and install nothing. The path must be
    /// the same inside this container as on the host.
    #[arg(long, env = "TOPODRA_CDI_HOOK_HOST_PATH")]
    pub(crate) cdi_hook_host_path: Option<PathBuf>,
}

/// How the node's GPUs and topology are found and published; `discover` and `serve`
/// take the same.
#[derive(Debug, Args)]
pub(crate) struct DiscoveryFlags {
    /// DRA driver name.
    #[arg(long, env = "TOPODRA_DRIVER_NAME", default_value = slice::DEFAULT_DRIVER_NAME)]
    pub(crate) driver_name: String,

    /// NVML library to load.
    #[arg(long, env = "TOPODRA_NVML_LIB", default_value = discovery::DEFAULT_NVML_LIB)]
    pub(crate) nvml_lib: PathBuf,

    /// Read topology from an hwloc XML export (`lstopo --of xml`) instead of this machine.
    #[arg(long, env = "TOPODRA_HWLOC_XML")]
    pub(crate) hwloc_xml: Option<PathBuf>,

    /// sysfs root for the topology fallback.
    #[arg(long, env = "TOPODRA_SYSFS_ROOT", default_value = "/sys")]
    pub(crate) sysfs_root: PathBuf,

    /// How `resource.kubernetes.io/numaNode` is published: `int`, or `list` (KEP-6072:
    /// own node first, then same-socket nodes at minimum distance; needs the
    /// DRAListTypeAttributes feature gate).
    #[arg(long, env = "TOPODRA_NUMA_NODE_FORMAT", default_value = "int")]
    pub(crate) numa_node_format: NumaNodeFormat,

    /// Other drivers' qualified names for the NUMA node, comma-separated, published
    /// with the same value as `resource.kubernetes.io/numaNode`: `dra.net/numaNode`
    /// aligns GPUs with the released CPU (dra-driver-cpu v0.2.0) and NIC (dranet
    /// v1.4.0) drivers through one `matchAttribute`.
    #[arg(long, env = "TOPODRA_NUMA_NODE_ALIASES", value_delimiter = ',')]
    pub(crate) numa_node_aliases: Vec<slice::NumaNodeAlias>,

    /// Which attributes a GPU carries: `lean` leaves out `brand`, `architecture` and
    /// `cudaDriverVersion`, which follow from `productName`, `cudaComputeCapability`
    /// and `driverVersion` and which no shipped class or documented selector reads,
    /// since every byte of a device is stored and sent to every slice watcher; `full`
    /// publishes them too, for selectors written against them (NVIDIA's driver has
    /// all three).
    #[arg(long, env = "TOPODRA_ATTRIBUTES", default_value = "lean")]
    pub(crate) attributes: AttributeSet,
}

impl DiscoveryFlags {
    /// The aliases, checked against the driver name and the per-device budget: a
    /// mistake stops the start rather than every publish.
    pub(crate) fn checked_numa_node_aliases(
        &self,
    ) -> Result<Vec<slice::NumaNodeAlias>, slice::NumaNodeAliasError> {
        slice::check_numa_node_aliases(&self.numa_node_aliases, &self.driver_name)?;
        Ok(self.numa_node_aliases.clone())
    }
}

/// Bounds on the work for the kubelet's calls, and the check for stale claims.
#[derive(Debug, Args)]
pub(crate) struct ClaimFlags {
    /// Claims of one NodePrepareResources or NodeUnprepareResources call worked on at
    /// once (each prepare is one claim GET); the others wait their turn.
    #[arg(
        long,
        env = "TOPODRA_MAX_CONCURRENT_CLAIMS_PER_CALL",
        default_value_t = 16,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub(crate) max_concurrent_claims_per_call: u32,

    /// Claims worked on at once across all calls.
    #[arg(
        long,
        env = "TOPODRA_MAX_CONCURRENT_CLAIMS",
        default_value_t = 64,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub(crate) max_concurrent_claims: u32,

    /// Limit on one GET of a claim on the prepare path.
    #[arg(
        long,
        env = "TOPODRA_CLAIM_READ_TIMEOUT_SECONDS",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub(crate) claim_read_timeout_seconds: u64,

    /// Limit on reading a claim, retries included (jittered backoff from 200 ms);
    /// keep it under the kubelet's 45 s for a whole prepare call.
    #[arg(
        long,
        env = "TOPODRA_CLAIM_READ_DEADLINE_SECONDS",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=40)
    )]
    pub(crate) claim_read_deadline_seconds: u64,

    /// Seconds after a NodePrepareResources or NodeUnprepareResources call arrives by
    /// which it is answered: claims not done by then get an error each (the kubelet
    /// retries them) rather than the whole call timing out at the kubelet's 45 s.
    #[arg(
        long,
        env = "TOPODRA_CALL_DEADLINE_SECONDS",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=40)
    )]
    pub(crate) call_deadline_seconds: u64,

    /// How often prepared claims are looked up in the API server (one GET each) to
    /// find those that no longer exist.
    #[arg(
        long,
        env = "TOPODRA_STALE_CLAIM_CHECK_INTERVAL_SECONDS",
        default_value_t = 600,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub(crate) stale_claim_check_interval_seconds: u64,

    /// How long a prepared claim must have been gone from the API server before the
    /// plugin unprepares it itself (the kubelet normally does it first).
    #[arg(long, env = "TOPODRA_STALE_CLAIM_GRACE_SECONDS", default_value_t = 300)]
    pub(crate) stale_claim_grace_seconds: u64,
}

/// What counts as a GPU failure, and what it does to the GPU's pods.
#[derive(Debug, Args)]
pub(crate) struct HealthFlags {
    /// XIDs never treated as a GPU failure, on top of the built-in application errors
    /// (13, 31, 43, 45, 68, 109). Comma-separated.
    #[arg(long, env = "TOPODRA_IGNORED_XIDS", value_delimiter = ',')]
    pub(crate) ignored_xids: Vec<u64>,

    /// Seconds without a fatal XID before an unhealthy GPU may be healthy again.
    #[arg(
        long,
        env = "TOPODRA_HEALTH_QUIET_PERIOD_SECONDS",
        default_value_t = 300
    )]
    pub(crate) health_quiet_period_seconds: u64,

    /// Taint unhealthy GPUs `NoExecute` (evicting the pods using them) instead of
    /// `NoSchedule`.
    #[arg(long, env = "TOPODRA_EVICT_UNHEALTHY")]
    pub(crate) evict_unhealthy: bool,
}

impl ServeArgs {
    pub(crate) fn sockets(&self) -> PluginSockets {
        PluginSockets::new(
            &self.kubelet.kubelet_registry_dir,
            &self.kubelet.kubelet_plugins_dir,
            &self.discovery.driver_name,
            self.kubelet.pod_uid.as_deref(),
        )
    }

    /// The plugin's own directory under the kubelet's plugins directory: the DRA
    /// socket, the installed `nvidia-cdi-hook` and, by default, the checkpoint.
    pub(crate) fn plugin_dir(&self) -> PathBuf {
        self.kubelet
            .kubelet_plugins_dir
            .join(&self.discovery.driver_name)
    }

    pub(crate) fn state_dir(&self) -> PathBuf {
        self.kubelet
            .state_dir
            .clone()
            .unwrap_or_else(|| self.plugin_dir())
    }

    /// Where the hook the CDI specs name comes from.
    pub(crate) fn cdi_hook_setup(&self) -> crate::cdi_hook::HookSetup {
        match &self.cdi.cdi_hook_host_path {
            Some(path) => crate::cdi_hook::HookSetup::Host { path: path.clone() },
            None => crate::cdi_hook::HookSetup::Install {
                source: self.cdi.cdi_hook_source.clone(),
                plugin_dir: self.plugin_dir(),
            },
        }
    }

    /// The name this instance gives itself in takeover requests and the lock file.
    pub(crate) fn instance_name(&self) -> String {
        match &self.kubelet.pod_uid {
            Some(uid) => format!("pod {uid}"),
            None => format!("process {}", std::process::id()),
        }
    }
}

#[cfg(test)]
mod tests;
