use super::*;
use crate::slice::fixtures::{addr, dgx_h100, int, snc, string, version};

fn opts(format: NumaNodeFormat) -> SliceOptions {
    SliceOptions {
        numa_node_format: format,
        ..SliceOptions::new("node-a")
    }
}

/// Every attribute, as before the lean set: what `--attributes=full` publishes.
fn full(format: NumaNodeFormat) -> SliceOptions {
    SliceOptions {
        attributes: AttributeSet::Full,
        ..opts(format)
    }
}

#[test]
fn every_attribute_of_a_known_gpu() {
    let inv = dgx_h100();
    let gpu = &inv.gpus[5];
    let got = device_attributes(gpu, &inv, &full(NumaNodeFormat::Int));
    // The whole set, exactly as topodra published it before lean slices.
    let want: BTreeMap<String, DeviceAttribute> = [
        (PCI_BUS_ID, string("0000:ab:00.0")),
        (PCIE_ROOT, string("pci0000:a8")),
        (NUMA_NODE, int(1)),
        (TYPE, string("gpu")),
        (UUID, string("GPU-7f1c2b3a-0000-4e5f-8a9b-000000000005")),
        (MINOR, int(5)),
        (PRODUCT_NAME, string("NVIDIA H100 80GB HBM3")),
        (BRAND, string("Nvidia")),
        (ARCHITECTURE, string("Hopper")),
        (CUDA_COMPUTE_CAPABILITY, version("9.0.0")),
        (DRIVER_VERSION, version("550.90.7")),
        (CUDA_DRIVER_VERSION, version("12.4.0")),
        (SOCKET, int(1)),
        (PCIE_SWITCH, string("0000:a9:00.0")),
        (NVLINK_DOMAIN, string("nvls-0")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(got, want);

    // The default is the same less FULL_ONLY, nothing else.
    let lean = device_attributes(gpu, &inv, &opts(NumaNodeFormat::Int));
    let mut want_lean = want;
    for name in FULL_ONLY {
        assert!(want_lean.remove(name).is_some(), "{name}");
    }
    assert_eq!(lean, want_lean);

    let cap = device_capacity(gpu);
    assert_eq!(cap.len(), 1);
    assert_eq!(cap[MEMORY].value.0, "81559Mi");
    assert!(cap[MEMORY].request_policy.is_none());
}

#[test]
fn memory_numa_node_is_published_for_c2c_gpus() {
    let mut inv = dgx_h100();
    inv.gpus[0].memory_numa_node = Some(4);
    let got = device_attributes(&inv.gpus[0], &inv, &opts(NumaNodeFormat::Int));
    assert_eq!(got[MEMORY_NUMA_NODE], int(4));
}

#[test]
fn unknown_values_are_omitted() {
    let inv = Inventory::default();
    let gpu = Gpu::at(addr("0000:18:00.0"));
    for format in [NumaNodeFormat::Int, NumaNodeFormat::List] {
        let got = device_attributes(&gpu, &inv, &opts(format));
        let names: Vec<&str> = got.keys().map(String::as_str).collect();
        assert_eq!(names, [PCI_BUS_ID, TYPE]);
    }
    assert!(device_capacity(&gpu).is_empty());
}

#[test]
fn socket_falls_back_to_the_numa_nodes_socket() {
    let mut inv = dgx_h100();
    inv.gpus[6].socket = None;
    let got = device_attributes(&inv.gpus[6], &inv, &opts(NumaNodeFormat::Int));
    assert_eq!(got[SOCKET], int(1));

    inv.gpus[6].numa_node = None;
    let got = device_attributes(&inv.gpus[6], &inv, &opts(NumaNodeFormat::Int));
    assert!(!got.contains_key(SOCKET));
    assert!(!got.contains_key(NUMA_NODE));
}

#[test]
fn list_form_puts_the_own_node_first() {
    let inv = snc();
    let ints = |g: &Gpu| {
        device_attributes(g, &inv, &opts(NumaNodeFormat::List))
            .remove(NUMA_NODE)
            .unwrap()
    };
    let list = |v: &[i64]| DeviceAttribute {
        ints: Some(v.to_vec()),
        ..Default::default()
    };
    assert_eq!(ints(&inv.gpus[1]), list(&[1, 0, 2, 3]));
    assert_eq!(ints(&inv.gpus[6]), list(&[6, 4, 5, 7]));

    // Discovery's order is not trusted to lead with the own node.
    let mut g = inv.gpus[2].clone();
    g.same_socket_numa_nodes = vec![0, 1, 2, 3];
    assert_eq!(ints(&g), list(&[2, 0, 1, 3]));

    g.same_socket_numa_nodes.clear();
    assert_eq!(ints(&g), list(&[2]));

    // The int form ignores the list.
    let got = device_attributes(&inv.gpus[1], &inv, &opts(NumaNodeFormat::Int));
    assert_eq!(got[NUMA_NODE], int(1));
}

#[test]
fn driver_versions_normalize_to_semver() {
    for (raw, want) in [
        ("550.90.07", "550.90.7"),
        ("560.35", "560.35.0"),
        ("535", "535.0.0"),
        (" 570.124.06\n", "570.124.6"),
        ("0.0.0", "0.0.0"),
        ("00.01.000", "0.1.0"),
    ] {
        assert_eq!(normalize_version(raw).as_deref(), Some(want), "{raw:?}");
    }
    for bad in [
        "",
        "550.90.07.1",
        "550..1",
        "r550",
        "550.90.07-beta",
        "5 50",
        "abc",
        "99999999999999999999.1",
    ] {
        assert_eq!(normalize_version(bad), None, "{bad:?}");
    }
}

#[test]
fn a_driver_version_that_cannot_be_normalized_is_omitted() {
    let mut inv = dgx_h100();
    inv.driver_version = Some("550.90.07-custom".to_owned());
    let got = device_attributes(&inv.gpus[0], &inv, &opts(NumaNodeFormat::Int));
    assert!(!got.contains_key(DRIVER_VERSION));
    inv.driver_version = Some("560.35".to_owned());
    let got = device_attributes(&inv.gpus[0], &inv, &opts(NumaNodeFormat::Int));
    assert_eq!(got[DRIVER_VERSION], version("560.35.0"));
}

#[test]
fn strings_the_api_would_refuse_are_omitted() {
    let mut inv = dgx_h100();
    inv.gpus[0].product_name = Some("N".repeat(65));
    inv.gpus[0].brand = Some(String::new());
    inv.gpus[0].nvlink_domain = Some("d".repeat(64));
    let got = device_attributes(&inv.gpus[0], &inv, &full(NumaNodeFormat::Int));
    assert!(!got.contains_key(PRODUCT_NAME));
    assert!(!got.contains_key(BRAND));
    assert_eq!(got[NVLINK_DOMAIN], string(&"d".repeat(64)));
}

fn mig_of(gpu: &Gpu) -> AllocatableDevice {
    AllocatableDevice {
        gpu: gpu.clone(),
        mig: Some(crate::inventory::MigDevice {
            uuid: "MIG-6b8c3a9e-5c47-5d2b-9d5b-6f0e8a3c1d20".into(),
            gpu_instance: 1,
            compute_instance: 0,
            profile: Some("3g.40gb".into()),
            memory_bytes: Some(40_192 << 20),
            multiprocessors: Some(60),
            placement: None,
            profile_id: None,
        }),
    }
}

#[test]
fn schema_stays_within_the_per_device_limit() {
    let inv = dgx_h100();
    let mut gpu = inv.gpus[0].clone();
    gpu.memory_numa_node = Some(2);
    gpu.nvlink_clique = Some(format!("{}.{}", "c".repeat(36), u32::MAX));
    // The full set is the fullest a device gets: the alias budget counts it.
    let n = device_attributes(&gpu, &inv, &full(NumaNodeFormat::List)).len()
        + device_capacity(&gpu).len();
    assert_eq!(n, 18);
    let mig = mig_of(&gpu);
    let m = allocatable_attributes(&mig, &inv, &full(NumaNodeFormat::List)).len()
        + allocatable_capacity(&mig).len();
    assert_eq!(m, 23);
    let lean = allocatable_attributes(&mig, &inv, &opts(NumaNodeFormat::List)).len()
        + allocatable_capacity(&mig).len();
    assert_eq!(lean, m - FULL_ONLY.len());
    assert_eq!(
        n.max(m),
        crate::slice::aliases::MAX_OWN_ENTRIES,
        "the alias budget counts the fullest device"
    );

    // With every alias that fits, the fullest device is at the limit, not over it.
    let o = SliceOptions {
        numa_node_aliases: (0..crate::slice::MAX_NUMA_NODE_ALIASES)
            .map(|i| format!("example.com/numa{i}").parse().unwrap())
            .collect(),
        ..full(NumaNodeFormat::List)
    };
    let full = allocatable_attributes(&mig, &inv, &o).len() + allocatable_capacity(&mig).len();
    assert_eq!(full, crate::slice::validate::MAX_ATTRIBUTES);
}

#[test]
fn aliases_carry_the_numa_node_in_the_same_form() {
    let inv = snc();
    for format in [NumaNodeFormat::Int, NumaNodeFormat::List] {
        let o = SliceOptions {
            numa_node_aliases: vec!["dra.net/numaNode".parse().unwrap()],
            ..opts(format)
        };
        let got = device_attributes(&inv.gpus[0], &inv, &o);
        assert_eq!(got["dra.net/numaNode"], got[NUMA_NODE], "{format}");
    }
    // A GPU whose NUMA node is unknown gets neither name.
    let mut gpu = inv.gpus[0].clone();
    gpu.numa_node = None;
    let o = SliceOptions {
        numa_node_aliases: vec!["dra.net/numaNode".parse().unwrap()],
        ..opts(NumaNodeFormat::Int)
    };
    let got = device_attributes(&gpu, &inv, &o);
    assert!(!got.contains_key(NUMA_NODE) && !got.contains_key("dra.net/numaNode"));
}

#[test]
fn mig_devices_carry_their_own_identity_and_the_parents_topology() {
    for set in [AttributeSet::Lean, AttributeSet::Full] {
        mig_device_under(set);
    }
}

fn mig_device_under(set: AttributeSet) {
    let inv = dgx_h100();
    let gpu = &inv.gpus[0];
    let o = SliceOptions {
        attributes: set,
        ..opts(NumaNodeFormat::Int)
    };
    let whole = device_attributes(gpu, &inv, &o);
    let got = allocatable_attributes(&mig_of(gpu), &inv, &o);
    assert_eq!(got[TYPE], string("mig"));
    assert_eq!(
        got[UUID],
        string("MIG-6b8c3a9e-5c47-5d2b-9d5b-6f0e8a3c1d20")
    );
    assert_eq!(got[PROFILE], string("3g.40gb"));
    assert_eq!(got[PARENT_UUID], whole[UUID]);
    assert_eq!(got[PARENT_MINOR], whole[MINOR]);
    assert_eq!(got[GPU_INSTANCE].int, Some(1));
    assert_eq!(got[COMPUTE_INSTANCE].int, Some(0));
    assert!(!got.contains_key(MINOR));
    for topo in [
        NUMA_NODE,
        PCIE_ROOT,
        PCI_BUS_ID,
        SOCKET,
        PRODUCT_NAME,
        DRIVER_VERSION,
        BRAND,
        ARCHITECTURE,
        CUDA_DRIVER_VERSION,
    ] {
        assert_eq!(got.get(topo), whole.get(topo), "{set} {topo}");
    }
    // A MIG device publishes what its GPU does under the same set, no more.
    for name in FULL_ONLY {
        assert_eq!(got.contains_key(name), set == AttributeSet::Full, "{name}");
    }
    let cap = allocatable_capacity(&mig_of(gpu));
    assert_eq!(cap[MEMORY].value.0, "40192Mi");
    assert_eq!(cap[MULTIPROCESSORS].value.0, "60");
}

#[test]
fn clique_is_published_when_known() {
    let mut inv = dgx_h100();
    inv.gpus[0].nvlink_clique = Some("9d3c0b8e-3d0c-4c1e-9a46-2b1f0c7e5a11.4".into());
    let got = device_attributes(&inv.gpus[0], &inv, &opts(NumaNodeFormat::Int));
    assert_eq!(
        got[NVLINK_CLIQUE],
        string("9d3c0b8e-3d0c-4c1e-9a46-2b1f0c7e5a11.4")
    );
    let other = device_attributes(&inv.gpus[1], &inv, &opts(NumaNodeFormat::Int));
    assert!(!other.contains_key(NVLINK_CLIQUE));
}

/// What the lean set must keep, and who reads each: a constraint, selector or the
/// controller that finds an attribute gone fails to match or to count, silently.
#[test]
fn the_lean_set_keeps_what_constraints_selectors_and_the_controller_use() {
    let mut inv = dgx_h100();
    inv.gpus[0].memory_numa_node = Some(4);
    inv.gpus[0].nvlink_clique = Some("9d3c0b8e-3d0c-4c1e-9a46-2b1f0c7e5a11.4".into());
    let got = device_attributes(&inv.gpus[0], &inv, &opts(NumaNodeFormat::Int));
    for name in [
        // matchAttribute in the chart's aligned class, the examples and the docs; the
        // controller's NUMA, PCIe and NVLink levels.
        NUMA_NODE,
        PCIE_ROOT,
        NVLINK_DOMAIN,
        SOCKET,
        PCIE_SWITCH,
        // Identity: the controller's devices, the DCGM exporter, pinning a GPU.
        TYPE,
        UUID,
        MINOR,
        PCI_BUS_ID,
        // Selectors of the docs, the chart's values and the examples.
        PRODUCT_NAME,
        CUDA_COMPUTE_CAPABILITY,
        DRIVER_VERSION,
        NVLINK_CLIQUE,
        MEMORY_NUMA_NODE,
    ] {
        assert!(got.contains_key(name), "lean set lost {name}");
        assert!(AttributeSet::Lean.publishes(name), "{name}");
    }
    for name in FULL_ONLY {
        assert!(!got.contains_key(name), "{name}");
        assert!(!AttributeSet::Lean.publishes(name) && AttributeSet::Full.publishes(name));
    }
    // The aliases of the NUMA node stay with it.
    let o = SliceOptions {
        numa_node_aliases: vec!["dra.net/numaNode".parse().unwrap()],
        ..opts(NumaNodeFormat::Int)
    };
    assert!(device_attributes(&inv.gpus[0], &inv, &o).contains_key("dra.net/numaNode"));
}

#[test]
fn attribute_set_parses_prints_and_serializes() {
    assert_eq!(AttributeSet::default(), AttributeSet::Lean);
    assert_eq!(SliceOptions::new("n").attributes, AttributeSet::Lean);
    assert_eq!("Full".parse::<AttributeSet>(), Ok(AttributeSet::Full));
    assert_eq!(
        "all".parse::<AttributeSet>(),
        Err(AttributeSetError("all".to_owned()))
    );
    for set in [AttributeSet::Lean, AttributeSet::Full] {
        assert_eq!(set.to_string().parse::<AttributeSet>(), Ok(set));
        let json = serde_json::to_string(&set).unwrap();
        assert_eq!(json, format!("\"{set}\""));
    }
}

/// No CEL selector or `matchAttribute` the project documents or ships (the chart,
/// examples, docs, README, e2e and scale tests, demo scripts, the controller) reads
/// an attribute the lean default leaves out: each would stop matching on a default
/// install.
#[test]
fn no_documented_selector_reads_an_attribute_the_lean_set_leaves_out() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = vec![root.join("README.md")];
    for dir in [
        "deploy/helm",
        "deploy/examples",
        "docs",
        "tests/e2e",
        "tests/scale",
        "tests/scripts",
        "controller/src",
    ] {
        collect(&root.join(dir), &mut files);
    }
    assert!(files.len() > 50, "{} files: the tree moved?", files.len());
    let mut uses = 0;
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for name in selector_uses(&text) {
            uses += 1;
            assert!(
                AttributeSet::Lean.publishes(&name),
                "{} selects on {name:?}, which only --attributes=full publishes",
                file.display()
            );
        }
    }
    assert!(
        uses > 20,
        "only {uses} selector uses found: the scan broke?"
    );
}

fn collect(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            collect(&path, out);
        } else if path
            .extension()
            .and_then(|x| x.to_str())
            .is_some_and(|x| ["md", "yaml", "yml", "tpl", "json", "go", "sh", "rs", "txt"].contains(&x))
            // Recorded slices of other drivers and older runs: data, not selectors.
            && !path.components().any(|c| c.as_os_str() == "benchmarks")
        {
            out.push(path);
        }
    }
}

/// The attribute names `text` selects on: `device.attributes["<domain>"].<name>`
/// (CEL, quotes escaped or not) and `matchAttribute: <domain>/<name>`, or the
/// Go `FullyQualifiedName("<domain>/<name>")`.
fn selector_uses(text: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (at, _) in text.match_indices("device.attributes[") {
        let rest = &text[at..];
        if let Some(close) = rest.find("].") {
            out.push(ident(&rest[close + 2..]));
        }
    }
    for marker in ["matchAttribute:", "FullyQualifiedName(\""] {
        for (at, _) in text.match_indices(marker) {
            let rest = text[at + marker.len()..].trim_start();
            let word: String = rest
                .chars()
                .take_while(|c| !c.is_whitespace() && !"\"'),".contains(*c))
                .collect();
            out.push(ident(word.rsplit('/').next().unwrap_or_default()));
        }
    }
    out.retain(|n| !n.is_empty());
    out
}

#[test]
fn selector_uses_finds_every_form() {
    let text = r#"
        - 'device.attributes["gpu.topodra.dev"].brand == "NVIDIA"'
        "device.attributes[\"gpu.topodra.dev\"].architecture == 'Hopper'",
        matchAttribute: gpu.topodra.dev/cudaDriverVersion
        MatchAttribute: ptrTo(resourceapi.FullyQualifiedName("resource.kubernetes.io/pcieRoot"))
        matchAttribute: variables.attribute
    "#;
    // A CEL variable reads as its first word, never as an attribute of FULL_ONLY.
    assert_eq!(
        selector_uses(text),
        [
            "brand",
            "architecture",
            "cudaDriverVersion",
            "variables",
            "pcieRoot"
        ]
    );
}
