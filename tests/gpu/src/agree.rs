//! Does discovery agree with the machine? `discover -o inventory` against the
//! driver's own report (`nvidia-smi -q -x`: one `<gpu>` per GPU with its UUID,
//! minor number, bus id, name, memory and MIG mode) and against sysfs (each GPU's
//! `local_cpulist`, the CPUs the firmware or the kernel places near it).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context as _;
use serde_json::Value;

use crate::verdict::Report;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    common: crate::Common,
    /// `topodra-kubelet-plugin discover -o inventory`.
    #[arg(long)]
    inventory: PathBuf,
    /// `nvidia-smi -q -x`.
    #[arg(long)]
    nvidia_smi_xml: PathBuf,
    /// The sysfs the GPUs' PCI functions are read from.
    #[arg(long, default_value = "/sys")]
    sysfs: PathBuf,
}

/// What `nvidia-smi -q -x` says of one GPU.
#[derive(Debug, Default, PartialEq)]
struct SmiGpu {
    name: String,
    minor: String,
    bus_id: String,
    memory_mib: String,
    mig_current: String,
}

pub(crate) fn run(args: &Args) -> anyhow::Result<bool> {
    let mut report = Report::new(&args.common.out, "agree", args.common.dry_run)?;
    let read = std::fs::read(&args.inventory)
        .with_context(|| format!("reading {}", args.inventory.display()))
        .and_then(|bytes| Ok(serde_json::from_slice::<Value>(&bytes)?));
    let inventory = match read {
        Ok(inventory) => inventory,
        Err(e) => {
            report.check("agree", false, format!("no inventory to compare: {e:#}"));
            return report.finish();
        }
    };
    let gpus: Vec<&Value> = inventory["gpus"].as_array().into_iter().flatten().collect();

    let xml = std::fs::read_to_string(&args.nvidia_smi_xml).unwrap_or_default();
    match parse_smi(&xml) {
        Ok((driver, smi)) => nvidia_smi_steps(&mut report, &inventory, &gpus, &driver, &smi),
        Err(e) => {
            report.check_real(
                "agree-nvidia-smi",
                false,
                format!("{}: {e}", args.nvidia_smi_xml.display()),
                "the simulated driver's nvidia-smi writes no XML",
            );
        }
    }

    let mut differ = Vec::new();
    let mut compared = 0;
    for g in &gpus {
        let bus = g["pciBusId"].as_str().unwrap_or_default().to_lowercase();
        let path = args
            .sysfs
            .join("bus/pci/devices")
            .join(&bus)
            .join("local_cpulist");
        let Ok(text) = std::fs::read_to_string(&path) else {
            differ.push(format!("{bus}: no {}", path.display()));
            continue;
        };
        compared += 1;
        let found = g["localCpus"].as_str().unwrap_or_default();
        if text.trim() != found {
            differ.push(format!(
                "{bus}: sysfs {:?}, discovery {found:?}",
                text.trim()
            ));
        }
    }
    report.check_real(
        "agree-sysfs",
        differ.is_empty() && compared == gpus.len(),
        format!("local_cpulist of {compared} GPU(s) compared; differences {differ:?}"),
        "the simulated GPUs are not in this host's sysfs",
    );
    report.finish()
}

fn nvidia_smi_steps(
    report: &mut Report,
    inventory: &Value,
    gpus: &[&Value],
    driver: &str,
    smi: &BTreeMap<String, SmiGpu>,
) {
    report.check(
        "agree-driver",
        inventory["driverVersion"] == driver,
        format!(
            "nvidia-smi {driver:?}, discovery {}",
            inventory["driverVersion"]
        ),
    );
    let mut differ = Vec::new();
    for g in gpus {
        let uuid = g["uuid"].as_str().unwrap_or_default();
        let Some(s) = smi.get(uuid) else {
            differ.push(format!("{uuid}: not in nvidia-smi"));
            continue;
        };
        let memory_mib = g["memoryBytes"].as_u64().unwrap_or_default() / (1 << 20);
        let mig = if g["migMode"]["current"] == true {
            "Enabled"
        } else {
            "Disabled"
        };
        let pairs = [
            (
                "name",
                s.name.clone(),
                g["productName"].as_str().unwrap_or_default().to_owned(),
            ),
            ("minor", s.minor.clone(), g["minor"].to_string()),
            (
                "bus id",
                s.bus_id.clone(),
                g["pciBusId"].as_str().unwrap_or_default().to_lowercase(),
            ),
            ("memory MiB", s.memory_mib.clone(), memory_mib.to_string()),
            ("MIG mode", s.mig_current.clone(), mig.to_owned()),
        ];
        for (what, theirs, ours) in pairs {
            if theirs != ours {
                differ.push(format!(
                    "{uuid} {what}: nvidia-smi {theirs:?}, discovery {ours:?}"
                ));
            }
        }
    }
    report.check(
        "agree-gpus",
        differ.is_empty() && smi.len() == gpus.len(),
        format!(
            "nvidia-smi lists {} GPU(s), discovery {}; differences {differ:?}",
            smi.len(),
            gpus.len()
        ),
    );
}

/// The driver version and the GPUs by UUID, with bus ids in sysfs form (nvidia-smi
/// writes an 8-digit domain: `00000000:00:06.0`).
fn parse_smi(xml: &str) -> anyhow::Result<(String, BTreeMap<String, SmiGpu>)> {
    // nvidia-smi names its DTD in a DOCTYPE, which roxmltree refuses by default.
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..roxmltree::ParsingOptions::default()
    };
    let doc = roxmltree::Document::parse_with_options(xml, options).context("not XML")?;
    let root = doc.root_element();
    anyhow::ensure!(
        root.has_tag_name("nvidia_smi_log"),
        "not nvidia-smi -q -x output"
    );
    let text = |node: roxmltree::Node<'_, '_>, path: &[&str]| -> String {
        let mut at = Some(node);
        for name in path {
            at = at.and_then(|n| n.children().find(|c| c.has_tag_name(*name)));
        }
        at.and_then(|n| n.text())
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    let driver = text(root, &["driver_version"]);
    let mut gpus = BTreeMap::new();
    for gpu in root.children().filter(|c| c.has_tag_name("gpu")) {
        let bus = text(gpu, &["pci", "pci_bus_id"]).to_lowercase();
        let bus_id = if bus.len() > 12 {
            bus[bus.len() - 12..].to_owned()
        } else {
            bus
        };
        gpus.insert(
            text(gpu, &["uuid"]),
            SmiGpu {
                name: text(gpu, &["product_name"]),
                minor: text(gpu, &["minor_number"]),
                bus_id,
                memory_mib: text(gpu, &["fb_memory_usage", "total"])
                    .trim_end_matches(" MiB")
                    .to_owned(),
                mig_current: text(gpu, &["mig_mode", "current_mig"]),
            },
        );
    }
    Ok((driver, gpus))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of `nvidia-smi -q -x` on driver 580 (the h200-vm machine's
    /// values; tags as the driver's nvsmi DTD names them).
    const SMI: &str = r#"<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
  <driver_version>580.159.04</driver_version>
  <cuda_version>13.0</cuda_version>
  <attached_gpus>1</attached_gpus>
  <gpu id="00000000:00:06.0">
    <product_name>NVIDIA H200</product_name>
    <mig_mode><current_mig>Disabled</current_mig><pending_mig>Disabled</pending_mig></mig_mode>
    <uuid>GPU-11f42855-bbc5-4b61-a0ae-9780bc370569</uuid>
    <minor_number>0</minor_number>
    <pci><pci_bus>00</pci_bus><pci_bus_id>00000000:00:06.0</pci_bus_id></pci>
    <fb_memory_usage><total>143771 MiB</total><used>0 MiB</used></fb_memory_usage>
  </gpu>
</nvidia_smi_log>
"#;

    #[test]
    fn nvidia_smi_xml_is_read_per_gpu() {
        let (driver, gpus) = parse_smi(SMI).unwrap();
        assert_eq!(driver, "580.159.04");
        assert_eq!(
            gpus["GPU-11f42855-bbc5-4b61-a0ae-9780bc370569"],
            SmiGpu {
                name: "NVIDIA H200".into(),
                minor: "0".into(),
                bus_id: "0000:00:06.0".into(),
                memory_mib: "143771".into(),
                mig_current: "Disabled".into(),
            }
        );
        assert!(parse_smi("NVIDIA-SMI 570.172.08 (banner)").is_err());
    }
}
