//! `serve`: the DaemonSet entry point. Discovers the node, recovers prepared claims,
//! serves the kubelet over Unix sockets, publishes the ResourceSlices, and exposes
//! metrics and health, until SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use topodra_node::cdi::{CdiConfig, DriverFiles};
use topodra_node::checkpoint::read_boot_id;
use topodra_node::discovery::{self, DiscoveryConfig, NvmlPolicy, TopologyInput};
use topodra_node::dynamic_mig::Carver;
use topodra_ops::requests::RequestCounter;

pub(crate) use crate::args::ServeArgs;
use crate::cdi_hook;
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::node_state::{self, Owner, Retaken, StartNeeds};
use crate::shutdown::Stop;
use dra_kubeletplugin::ownership::{self, Ownership};

mod round;
mod setup;

use round::serve;
use setup::{Setup, host_node_check};

/// How the API server's audit log and metrics name this program.
const USER_AGENT: &str = concat!("topodra-kubelet-plugin/", env!("CARGO_PKG_VERSION"));

pub(crate) async fn run(args: ServeArgs) -> Result<()> {
    let d = &args.discovery;
    d.checked_numa_node_aliases()
        .context("--numa-node-aliases")?;
    let mut discovery_config = DiscoveryConfig::default();
    discovery_config.nvml_lib = Some(d.nvml_lib.clone());
    discovery_config.nvml = NvmlPolicy::Required;
    discovery_config.topology = match &d.hwloc_xml {
        Some(path) => TopologyInput::HwlocXml(path.clone()),
        None => TopologyInput::Live,
    };
    discovery_config.sysfs_root = d.sysfs_root.clone();
    let inventory = discovery::discover(&discovery_config).context("discovering GPUs")?;
    let devices = inventory.allocatable();
    tracing::info!(
        gpus = inventory.gpus.len(),
        devices = devices.len(),
        "discovered"
    );

    // Before any spec can name it: the nvidia-cdi-hook the runtime runs for the
    // specs' hooks, installed from the image into the plugin's host directory (or
    // the host's own), checked to run. A hook the plugin was given that does not
    // work stops the start; a directory that cannot take the copy makes it serve
    // read-only until it can (`node_state`).
    let hook_setup = args.cdi_hook_setup();
    let first_hook = {
        let setup = hook_setup.clone();
        tokio::task::spawn_blocking(move || cdi_hook::prepare(&setup))
            .await
            .context("installing nvidia-cdi-hook")?
    };
    let hook_ready = match first_hook {
        Ok(hook) => {
            hook.log_ready();
            true
        }
        Err(e) if e.stops_the_start() => return Err(e.into()),
        Err(e) => {
            tracing::error!(error = %e, "nvidia-cdi-hook not in place; serving read-only until it is");
            false
        }
    };

    // Every field is set today; the default stays for the fields CdiConfig gains.
    #[allow(clippy::needless_update)]
    let mut cdi = CdiConfig::default();
    cdi.spec_dir = args.cdi.cdi_dir.clone();
    cdi.driver_root = args.cdi.driver_root.clone();
    cdi.driver_root_local = args.cdi.driver_root_local.clone();
    cdi.toolkit_spec = args.cdi.toolkit_cdi_spec.clone();
    cdi.dev_root = args.cdi.dev_root.clone();
    cdi.capabilities_dir = args.cdi.nvidia_capabilities_dir.clone();
    cdi.sysfs_root = d.sysfs_root.clone();
    cdi.hook_path = hook_setup.path();
    let files =
        DriverFiles::load(&cdi).context("finding the NVIDIA driver's files for CDI specs")?;
    let loaded = files.current();
    if let Ok(now) = &loaded {
        tracing::info!(
            source = ?now.source,
            driver_version = now.driver_version(),
            files = now.file_count(),
            hook = %cdi.hook_path.display(),
            "driver files for CDI specs"
        );
    }
    let boot_id = read_boot_id(&args.cdi.boot_id_file).context("reading the boot id")?;
    // Its own NVML session: the carver outlives discovery's, and its calls on one
    // GPU wait for each other, never for another GPU's. Opened without
    // `--dynamic-mig` too, so that instances the checkpoint names (made before it
    // was turned off) are still removed at unprepare. Discovery needed NVML, so
    // a failure here is a failure of NVML itself.
    let carver = discovery::NvmlSource::new(Some(d.nvml_lib.clone()))
        .open()
        .map(|nvml| Arc::new(Carver::new(nvml)))
        .context("opening NVML for MIG instances")?;
    let time_slicer = time_slicer(&args, &d.nvml_lib)?;
    let mps = mps_control(&args, &d.nvml_lib)?;
    if args.dynamic_mig {
        tracing::info!(
            gpus = inventory
                .gpus
                .iter()
                .filter(|g| !g.mig_profiles.is_empty())
                .count(),
            "dynamic MIG: partitions of GPUs in MIG mode are published and made at prepare"
        );
    }

    let counter = RequestCounter::new();
    let kube_config = kube::Config::infer()
        .await
        .context("finding the API server (kubeconfig or in-cluster)")?;
    let client = topodra_ops::requests::counted_client(kube_config, &counter, USER_AGENT)
        .context("building the API client")?;
    let metrics = Arc::new(Metrics::new(&counter));
    host_node_check(&cdi, &inventory, &client, &args.node_name);
    if let Ok(now) = &loaded {
        crate::events::toolkit_spec_dropped(client.clone(), &args.node_name, now);
    }
    metrics.set_devices(&devices);

    // The HTTP endpoint first, and until the process exits: a pod waiting for the
    // node state, or done with it, must stay live. A bind address that is not the
    // pod's fails the start here, before the kubelet learns of this plugin.
    let lifecycle = Lifecycle::waiting();
    let http = crate::http_endpoint::start(&args, &metrics, &lifecycle).await?;

    // One instance owns the node's state at a time; a rolling update's new pod
    // waits here until the old one has handed over. A state directory that cannot
    // be used is no reason to exit (the container would only restart into the same
    // error): the instance serves read-only until it can take the state.
    let name = args.instance_name();
    let state_dir = args.state_dir();
    let timing = ownership::Timing::default();
    let retry = Duration::from_secs(args.kubelet.state_retry_seconds);
    let needs = StartNeeds::new(state_dir.clone(), hook_setup, hook_ready);
    let ctx = Setup {
        args: &args,
        inventory: std::sync::Mutex::new(Arc::new(inventory.clone())),
        discovery: &discovery_config,
        cdi: &cdi,
        files: &files,
        boot_id: &boot_id,
        carver: &carver,
        time_slicer,
        mps,
        client: &client,
        metrics: &metrics,
        lifecycle: &lifecycle,
    };
    let waiting = |not_asking: Option<node_state::NotAsking<'_>>| ctx.waiting(not_asking);
    let mut owner = tokio::select! {
        owner = node_state::take(&state_dir, &name, timing, retry, &needs, &waiting) => owner,
        () = topodra_ops::signal::terminated() => {
            tracing::info!("terminated while waiting for the node state");
            http.stop().await;
            return Ok(());
        }
    };
    // Rounds served so far: an instance that owns the state after an earlier round
    // (read-only, or before a handover) discovers again before it changes MIG
    // modes, since another instance may have changed them meanwhile.
    let mut rounds = 0u32;
    loop {
        let again = rounds > 0;
        rounds = rounds.saturating_add(1);
        // Err: the state machine could not start from the state.
        let stop: Result<Stop, String> = match &owner {
            Owner::Owned(ownership) => {
                tracing::info!(owner = ownership.name(), "owns the node state");
                if args.enable_mig_mode {
                    ctx.enable_mig_mode(again);
                }
                match ctx.start_preparer() {
                    Ok(preparer) => Ok(serve(&ctx, preparer, handover(ownership, timing)).await?),
                    Err(e) => {
                        tracing::error!(
                            error = format!("{e:#}"),
                            "cannot start from the node state"
                        );
                        Err(format!("{e:#}"))
                    }
                }
            }
            Owner::ReadOnly {
                reason,
                lock: Some(ownership),
            } => {
                let preparer = ctx.start_read_only(reason);
                let until = async {
                    tokio::select! {
                        stop = handover(ownership, timing) => stop,
                        () = node_state::usable_again(retry, &needs) => Stop::Usable,
                    }
                };
                Ok(serve(&ctx, preparer, until).await?)
            }
            Owner::ReadOnly { reason, lock: None } => {
                let preparer = ctx.start_read_only(reason);
                let until = async {
                    Stop::Retaken(node_state::retake(&state_dir, &name, retry, &needs).await)
                };
                Ok(serve(&ctx, preparer, until).await?)
            }
        };
        // What this instance idles on after it stopped serving, and for whom.
        let (released, to) = match stop {
            Err(reason) => {
                owner = Owner::ReadOnly {
                    reason,
                    lock: owner.into_lock(),
                };
                continue;
            }
            Ok(Stop::Terminate) => break,
            Ok(Stop::Usable) => {
                tracing::info!("the node state directory is usable again");
                let lock = owner.into_lock();
                owner =
                    Owner::Owned(lock.expect("only an instance with the lock waits for usable"));
                continue;
            }
            Ok(Stop::Retaken(Retaken::Owner(retaken))) => {
                if matches!(retaken, Owner::Owned(_)) {
                    tracing::info!("the node state directory is usable again");
                }
                owner = retaken;
                continue;
            }
            Ok(Stop::Retaken(Retaken::OwnedElsewhere)) => {
                // Another instance took the state this one could not: it serves the
                // node now, and two instances must not both serve the kubelet.
                let to = ownership::named_owner(&state_dir)
                    .unwrap_or_else(|| "another instance".to_owned());
                tracing::warn!(to = %to, "another instance owns the node state now; idle until this pod is deleted");
                (ownership::Released::standing_by(&state_dir, &name), to)
            }
            Ok(Stop::Handover(to)) => {
                // Serving has ended and the state is fenced (nothing here writes it
                // any more); releasing the lock lets the new owner read the
                // checkpoint. Exiting would only restart this container.
                let ownership = owner
                    .into_lock()
                    .expect("only an instance with the lock is asked to hand over");
                tracing::info!(to = %to, "handed the node state over; idle until this pod is deleted");
                (ownership.release(), to)
            }
        };
        lifecycle.handed_over(&to);
        owner = tokio::select! {
            () = topodra_ops::signal::terminated() => break,
            back = released.reclaim_when_abandoned(timing) => {
                tracing::warn!(
                    to = %to,
                    "the instance the node state was handed to did not take it, or gave it up; serving again"
                );
                match back {
                    Ok(lock) => node_state::with_lock(lock, &needs).await,
                    Err(e) => Owner::ReadOnly { reason: e.to_string(), lock: None },
                }
            }
        };
    }
    http.stop().await;
    tracing::info!("stopped");
    Ok(())
}

/// The driver root's `nvidia-smi` for shared GPUs' time slices. A node that
/// time-slices at another interval than Default cannot serve a share without it,
/// so that fails the start with what to fix; anywhere else a missing one is only
/// logged (a record of an earlier configuration may still need it to undo).
fn time_slicer(
    args: &ServeArgs,
    nvml_lib: &std::path::Path,
) -> Result<Option<Arc<topodra_node::sharing::TimeSlicer>>> {
    let root = args
        .cdi
        .driver_root_local
        .as_ref()
        .unwrap_or(&args.cdi.driver_root);
    let needed = args.sharing.time_slicing
        && args.sharing.time_slice_interval
            != topodra_model::config::v1alpha1::TimeSliceInterval::Default;
    match topodra_node::sharing::TimeSlicer::find(root, Some(nvml_lib)) {
        Ok(t) => Ok(Some(Arc::new(t))),
        Err(e) if needed => Err(anyhow::Error::new(e).context(
            "--time-slice-interval is not Default, so shared GPUs need the driver's nvidia-smi",
        )),
        Err(e) => {
            tracing::debug!(error = %e, "no nvidia-smi: shared GPUs run at the Default interval only");
            Ok(None)
        }
    }
}

/// The driver root's MPS control program and an NVML session for compute modes,
/// keeping the daemons' pipe and log directories under the state directory (on
/// the host at the same path, so containers can mount them). Needed with `--mps`,
/// which fails the start without it; elsewhere only for records of an earlier
/// configuration.
fn mps_control(
    args: &ServeArgs,
    nvml_lib: &std::path::Path,
) -> Result<Option<Arc<topodra_node::sharing::MpsControl>>> {
    let root = args
        .cdi
        .driver_root_local
        .as_ref()
        .unwrap_or(&args.cdi.driver_root);
    let found = discovery::NvmlSource::new(Some(nvml_lib.to_owned()))
        .open()
        .map_err(|e| anyhow::anyhow!("opening NVML for compute modes: {e}"))
        .and_then(|nvml| {
            topodra_node::sharing::MpsControl::find(
                nvml,
                root,
                Some(nvml_lib),
                args.state_dir().join("mps"),
            )
            .map_err(anyhow::Error::new)
        });
    let found = found.and_then(|m| {
        if !args.sharing.mps_host_namespaces {
            return Ok(m);
        }
        m.in_host_namespaces(topodra_node::sharing::HostNamespaces {
            host_root: args.cdi.driver_root.clone(),
            local_root: root.clone(),
        })
        .map_err(anyhow::Error::new)
    });
    match found {
        Ok(m) => Ok(Some(Arc::new(m))),
        Err(e) if args.sharing.mps => Err(e.context("--mps needs the driver's MPS tools and NVML")),
        Err(e) => {
            tracing::debug!(error = %e, "no MPS control: MPS shares cannot be served");
            Ok(None)
        }
    }
}

/// Resolves once another instance asks for the node state `ownership` holds.
async fn handover(ownership: &Ownership, timing: ownership::Timing) -> Stop {
    let who = ownership.handover_requested(timing).await;
    tracing::info!(to = %who, "handing the node state over to another instance");
    Stop::Handover(who)
}
