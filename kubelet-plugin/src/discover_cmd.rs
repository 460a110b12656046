//! `discover`: run discovery once and print the result.

use std::io::Write;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use topodra_model::slice::{self, SliceOptions};
use topodra_node::discovery::{self, DiscoveryConfig, NvmlPolicy, NvmlSource, TopologyInput};

use crate::args::DiscoveryFlags;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    /// A table of GPUs and NUMA nodes, for people.
    Table,
    /// The ResourceSlices as they would be sent, as a Kubernetes v1 List in JSON.
    Json,
    /// The same List in YAML.
    Yaml,
    /// The raw inventory (identity and topology per GPU) in JSON.
    Inventory,
    /// What NVML answers, in JSON: driver and NVML versions, and per GPU its
    /// identity, MIG mode and every GPU instance profile with its possible
    /// placements; a call that fails is recorded as its error. Asks NVML only: the
    /// topology flags, --node-name and --strict do not apply.
    Nvml,
}

#[derive(Debug, Args)]
pub(crate) struct DiscoverArgs {
    #[command(flatten)]
    discovery: DiscoveryFlags,

    /// Do not use NVML: list the NVIDIA GPUs the topology shows, without identity.
    #[arg(long, env = "TOPODRA_NO_NVML")]
    no_nvml: bool,

    /// Fail instead of falling back to topology only when NVML cannot be used.
    #[arg(long, conflicts_with = "no_nvml")]
    require_nvml: bool,

    /// Read topology from sysfs only, skipping hwloc.
    #[arg(long, conflicts_with = "hwloc_xml")]
    sysfs_only: bool,

    /// Node name: the pool name and the slices' nodeName.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,

    /// What to print.
    #[arg(long, short, value_enum, default_value = "table")]
    output: Output,

    /// Exit non-zero when a GPU is seen by only one of NVML and the topology (after
    /// printing): for provisioning checks that must not accept a node whose GPUs
    /// would be published without NUMA and PCIe attributes.
    #[arg(long, env = "TOPODRA_DISCOVER_STRICT")]
    strict: bool,

    /// With -o json or yaml: also show the dynamic MIG partitions and counter sets
    /// of the GPUs in MIG mode, as `serve --dynamic-mig` publishes them.
    #[arg(long)]
    preview_dynamic_mig: bool,

    /// With -o json or yaml: also show each whole GPU's time-sliced device and
    /// counter set, as `serve --time-slicing` publishes them (at the Default
    /// interval and 4 replicas).
    #[arg(long)]
    preview_time_slicing: bool,
}

impl DiscoverArgs {
    fn config(&self) -> DiscoveryConfig {
        let mut config = DiscoveryConfig::default();
        config.nvml_lib = Some(self.discovery.nvml_lib.clone());
        config.nvml = if self.no_nvml {
            NvmlPolicy::Disabled
        } else if self.require_nvml {
            NvmlPolicy::Required
        } else {
            NvmlPolicy::Optional
        };
        config.topology = match (&self.discovery.hwloc_xml, self.sysfs_only) {
            (Some(path), _) => TopologyInput::HwlocXml(path.clone()),
            (None, true) => TopologyInput::Sysfs(self.discovery.sysfs_root.clone()),
            (None, false) => TopologyInput::Live,
        };
        config.sysfs_root = self.discovery.sysfs_root.clone();
        config
    }

    fn node_name(&self) -> Result<String> {
        if let Some(name) = &self.node_name {
            return Ok(name.clone());
        }
        let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .context("no --node-name or NODE_NAME given, and the hostname cannot be read")?;
        Ok(name.trim().to_lowercase())
    }
}

pub(crate) fn run(args: &DiscoverArgs, out: &mut impl Write) -> Result<()> {
    if args.output == Output::Nvml {
        return record_nvml(args, out);
    }
    // discover() logs each warning; the inventory output carries them too.
    let numa_node_aliases = args
        .discovery
        .checked_numa_node_aliases()
        .context("--numa-node-aliases")?;
    let inventory = discovery::discover(&args.config()).context("discovery failed")?;
    let mut options = SliceOptions::new(args.node_name()?);
    options.driver_name = args.discovery.driver_name.clone();
    options.numa_node_format = args.discovery.numa_node_format;
    options.numa_node_aliases = numa_node_aliases;
    options.attributes = args.discovery.attributes;
    if args.preview_dynamic_mig {
        options.dynamic_mig = slice::DynamicMig::All;
    }
    if args.preview_time_slicing {
        options.sharing.time_slicing = Some(slice::TimeSlicing::default());
    }
    match args.output {
        Output::Table => crate::table::render(&inventory, out)?,
        Output::Inventory => {
            serde_json::to_writer_pretty(&mut *out, &inventory)?;
            writeln!(out)?;
        }
        Output::Json | Output::Yaml => {
            let slices = slice::build_slices(&inventory, &options)
                .context("the inventory does not fit the ResourceSlice API")?;
            let list = slice::to_list(&slices);
            if args.output == Output::Json {
                serde_json::to_writer_pretty(&mut *out, &list)?;
                writeln!(out)?;
            } else {
                out.write_all(crate::yaml::to_string(&list).as_bytes())?;
            }
        }
        // Answered before discovery ran: it asks NVML only.
        Output::Nvml => {}
    }
    if args.strict && !inventory.unjoined.is_empty() {
        let buses: Vec<String> = inventory.unjoined.iter().map(ToString::to_string).collect();
        anyhow::bail!(
            "--strict: {} GPU(s) seen by only one of NVML and the {} topology: {}",
            buses.len(),
            inventory.sources.topology.as_deref().unwrap_or("host"),
            buses.join(", ")
        );
    }
    Ok(())
}

/// `-o nvml`: NVML's answers as they are, for a fixture of a real machine or to see
/// what a GPU offers for MIG. Only loading and initialising NVML can fail it.
fn record_nvml(args: &DiscoverArgs, out: &mut impl Write) -> Result<()> {
    if args.no_nvml {
        anyhow::bail!("-o nvml records what NVML answers; it cannot be combined with --no-nvml");
    }
    let record = NvmlSource::new(Some(args.discovery.nvml_lib.clone()))
        .record()
        .context("recording NVML's answers")?;
    serde_json::to_writer_pretty(&mut *out, &record)?;
    writeln!(out)?;
    Ok(())
}
