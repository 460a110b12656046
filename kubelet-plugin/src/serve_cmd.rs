//! `serve`: the DaemonSet entry point. Discovers the node, recovers prepared claims,
//! serves the kubelet over Unix sockets, publishes the ResourceSlices, and exposes
//! metrics and health, until SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use topodra_node::cdi::{CdiConfig, DriverFiles};
use topodra_node::checkpoint::read_boot_id;
use topodra_node::discovery::{self, DiscoveryConfig, NvmlPolicy, TopologyInput};
use topodra_ops::requests::RequestCounter;

pub(crate) use crate::args::ServeArgs;
use crate::cdi_hook;
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::node_state::{self, Owner};
use crate::shutdown::Stop;
use dra_kubeletplugin::ownership;

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
    // the host's own), checked to run. Without one the plugin does not start.
    let setup = args.cdi_hook_setup();
    let hook = tokio::task::spawn_blocking(move || cdi_hook::prepare(&setup))
        .await
        .context("installing nvidia-cdi-hook")??;
    tracing::info!(
        path = %hook.path.display(),
        version = %hook.version,
        sha256 = %hook.sha256,
        action = ?hook.action,
        "nvidia-cdi-hook ready; the CDI specs' hooks name this path"
    );

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
    cdi.hook_path = hook.path;
    let files =
        DriverFiles::load(&cdi).context("finding the NVIDIA driver's files for CDI specs")?;
    if let Ok(now) = files.current() {
        tracing::info!(
            source = ?now.source,
            driver_version = now.driver_version(),
            files = now.file_count(),
            hook = %cdi.hook_path.display(),
            "driver files for CDI specs"
        );
    }
    let boot_id = read_boot_id(&args.cdi.boot_id_file).context("reading the boot id")?;

    let counter = RequestCounter::new();
    let kube_config = kube::Config::infer()
        .await
        .context("finding the API server (kubeconfig or in-cluster)")?;
    let client = topodra_ops::requests::counted_client(kube_config, &counter, USER_AGENT)
        .context("building the API client")?;
    let metrics = Arc::new(Metrics::new(&counter));
    host_node_check(&cdi, &inventory, &client, &args.node_name);
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
    let mut owner = tokio::select! {
        owner = Owner::take(&state_dir, &name, timing) => owner,
        () = topodra_ops::signal::terminated() => {
            tracing::info!("terminated while waiting for the node state");
            http.stop().await;
            return Ok(());
        }
    };
    let ctx = Setup {
        args: &args,
        inventory: &inventory,
        cdi: &cdi,
        files: &files,
        boot_id: &boot_id,
        client: &client,
        metrics: &metrics,
        lifecycle: &lifecycle,
    };
    loop {
        let stop = match &owner {
            Owner::Owned(ownership) => {
                tracing::info!(owner = ownership.name(), "owns the node state");
                match ctx.start_preparer() {
                    Ok(preparer) => {
                        let until = async {
                            let who = ownership.handover_requested(timing).await;
                            tracing::info!(to = %who, "handing the node state over to another instance");
                            Stop::Handover(who)
                        };
                        serve(&ctx, preparer, until).await?
                    }
                    Err(e) => {
                        tracing::error!(
                            error = format!("{e:#}"),
                            "cannot start from the node state"
                        );
                        owner = Owner::ReadOnly(format!("{e:#}"));
                        continue;
                    }
                }
            }
            Owner::ReadOnly(reason) => {
                let preparer = ctx.start_read_only(reason);
                let until = async {
                    let retry = Duration::from_secs(args.kubelet.state_retry_seconds);
                    Stop::StateUsable(
                        node_state::usable_again(&state_dir, &name, timing, retry).await,
                    )
                };
                serve(&ctx, preparer, until).await?
            }
        };
        owner = match stop {
            Stop::Terminate => break,
            Stop::StateUsable(ownership) => {
                tracing::info!("the node state directory is usable again");
                Owner::Owned(ownership)
            }
            Stop::Handover(to) => {
                let Owner::Owned(ownership) = owner else {
                    unreachable!("only an owner is asked to hand over")
                };
                // Serving has ended and the state is fenced (nothing here writes it
                // any more); releasing the lock lets the new owner read the
                // checkpoint. Exiting would only restart this container.
                let released = ownership.release();
                lifecycle.handed_over(&to);
                tracing::info!(to = %to, "handed the node state over; idle until this pod is deleted");
                tokio::select! {
                    () = topodra_ops::signal::terminated() => break,
                    back = released.reclaim_when_abandoned(timing) => {
                        tracing::warn!(
                            to = %to,
                            "the instance the node state was handed to did not take it, or gave it up; serving again"
                        );
                        back.map_or_else(|e| Owner::ReadOnly(e.to_string()), Owner::Owned)
                    }
                }
            }
        };
    }
    http.stop().await;
    tracing::info!("stopped");
    Ok(())
}
