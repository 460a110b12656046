//! `topodra-kubelet-plugin discover` as an operator runs it: the real binary on the
//! fake NVML and the profile's hwloc topology.

// clippy.toml allows unwrap in #[test] functions only; this crate's helpers are tests too.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

use topodra_fake_nvml::sim;

fn profile_yaml(profile: &str) -> String {
    std::fs::read_to_string(topodra_fake_nvml::profiles_dir().join(format!("{profile}.yaml")))
        .unwrap()
}

fn discover(profile: &str, extra: &[&str]) -> Output {
    discover_yaml(&profile_yaml(profile), extra)
}

fn discover_yaml(yaml: &str, extra: &[&str]) -> Output {
    discover_node(yaml, "node-a", extra)
}

fn discover_node(yaml: &str, node_name: &str, extra: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let node = sim::materialize(dir.path(), yaml, &topodra_fake_nvml::cdylib_path()).unwrap();
    Command::new(env!("CARGO_BIN_EXE_topodra-kubelet-plugin"))
        .arg("discover")
        .arg(format!("--nvml-lib={}", node.nvml_lib.display()))
        .arg(format!("--hwloc-xml={}", node.hwloc_xml.display()))
        .args(["--node-name", node_name])
        .args(extra)
        .env_remove("TOPODRA_DISCOVER_STRICT")
        .output()
        .unwrap()
}

#[test]
fn strict_fails_on_gpus_only_one_source_sees() {
    // `mismatch`: one GPU hidden from hwloc, one hidden from NVML.
    let lax = discover("mismatch", &[]);
    assert!(
        lax.status.success(),
        "{}",
        String::from_utf8_lossy(&lax.stderr)
    );
    let strict = discover("mismatch", &["--strict"]);
    let stderr = String::from_utf8_lossy(&strict.stderr);
    assert!(!strict.status.success());
    assert!(
        stderr.contains("--strict: 2 GPU(s) seen by only one of NVML and the hwloc topology"),
        "{stderr}"
    );
    // The table is still printed before the verdict.
    assert!(String::from_utf8_lossy(&strict.stdout).contains("DEVICE"));

    let clean = discover("dgx-h100", &["--strict"]);
    assert!(
        clean.status.success(),
        "{}",
        String::from_utf8_lossy(&clean.stderr)
    );
    // A lost GPU is no join failure: it is reported, not published, and passes.
    let lost = discover("lost-gpu", &["--strict"]);
    assert!(
        lost.status.success(),
        "{}",
        String::from_utf8_lossy(&lost.stderr)
    );
    assert!(String::from_utf8_lossy(&lost.stderr).contains("0000:9b:00.0"));
}

#[test]
fn yaml_output_quotes_pci_addresses() {
    let out = discover("dgx-h100", &["-o", "yaml"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("string: \"0000:18:00.0\""), "{text}");
    assert!(!text.contains("string: 0000:"), "{text}");
    // And it is still the same List the JSON output gives.
    let json: serde_json::Value =
        serde_json::from_slice(&discover("dgx-h100", &["-o", "json"]).stdout).unwrap();
    let yaml: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(yaml, json);
}

#[test]
fn mig_gpus_list_their_mig_devices() {
    let out = discover("dgx-a100-mig", &[]);
    assert!(out.status.success());
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("gpu-1-mig-2-0"), "{table}");
    assert!(table.contains("MIG 3g.20gb"), "{table}");
    assert!(
        table.contains("not offered: MIG change pending reset"),
        "{table}"
    );
    assert!(!table.lines().any(|l| l.starts_with("gpu-0 ")), "{table}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("MIG mode change pending"), "{stderr}");
}

/// `-o nvml`: NVML's answers as JSON, MIG geometry included, on the fake NVML of the
/// profile (A100-SXM4-40GB with MIG on); NVML only, so it refuses --no-nvml.
#[test]
fn nvml_output_records_mig_profiles_and_placements() {
    let out = discover("dgx-a100-mig", &["-o", "nvml"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rec["system"]["driverVersion"], "535.183.01");
    assert_eq!(rec["deviceCount"], 8);
    let gpu = &rec["devices"][0];
    assert_eq!(gpu["name"], "NVIDIA A100-SXM4-40GB");
    assert_eq!(gpu["migMode"]["current"], 1);
    // NVML_GPU_INSTANCE_PROFILE_3_SLICE: id 9, placed at memory slice 0 or 4.
    let three = &gpu["gpuInstanceProfiles"][2];
    assert_eq!(three["profile"], 2);
    assert_eq!(three["info"]["id"], 9);
    assert_eq!(three["info"]["name"], "MIG 3g.20gb");
    assert_eq!(three["info"]["memorySizeMB"], 19968);
    assert_eq!(
        three["possiblePlacements"],
        serde_json::json!([{"start": 0, "size": 4}, {"start": 4, "size": 4}])
    );
    let one = &gpu["gpuInstanceProfiles"][0];
    assert_eq!(one["possiblePlacements"].as_array().unwrap().len(), 7);
    // An index the A100 has no profile for is recorded with NVML's code.
    assert_eq!(
        gpu["gpuInstanceProfiles"][5]["info"]["code"],
        "NVML_ERROR_NOT_SUPPORTED"
    );

    let refused = discover("dgx-a100-mig", &["-o", "nvml", "--no-nvml"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--no-nvml"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

#[test]
fn numa_node_aliases_carry_the_numa_node_and_bad_ones_stop_the_command() {
    let out = discover(
        "dgx-h100",
        &["-o", "json", "--numa-node-aliases=dra.net/numaNode"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let devices = list["items"][0]["spec"]["devices"].as_array().unwrap();
    for d in devices {
        let a = &d["attributes"];
        assert_eq!(
            a["dra.net/numaNode"], a["resource.kubernetes.io/numaNode"],
            "{}",
            d["name"]
        );
    }
    assert_eq!(devices[7]["attributes"]["dra.net/numaNode"]["int"], 1);

    let own = discover(
        "dgx-h100",
        &["-o", "json", "--numa-node-aliases=gpu.topodra.dev/numa"],
    );
    let stderr = String::from_utf8_lossy(&own.stderr);
    assert!(!own.status.success());
    assert!(
        stderr.contains("--numa-node-aliases") && stderr.contains("own domain"),
        "{stderr}"
    );
    let bare = discover("dgx-h100", &["--numa-node-aliases=numaNode"]);
    let stderr = String::from_utf8_lossy(&bare.stderr);
    assert!(!bare.status.success());
    assert!(stderr.contains("has no domain"), "{stderr}");
}

/// The slice sizes docs/attributes.md states ("Size on the wire") are what its
/// command prints now: the compact JSON of the DGX H100 node's one slice, with the
/// int and the list form of `numaNode`.
#[test]
fn slice_sizes_in_the_docs_are_what_discover_prints() {
    let figure = doc_figure;
    let size = |extra: &[&str]| -> (usize, usize) {
        let dir = tempfile::tempdir().unwrap();
        let yaml = std::fs::read_to_string(topodra_fake_nvml::profiles_dir().join("dgx-h100.yaml"))
            .unwrap();
        let node = sim::materialize(dir.path(), &yaml, &topodra_fake_nvml::cdylib_path()).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_topodra-kubelet-plugin"))
            .arg("discover")
            .arg(format!("--nvml-lib={}", node.nvml_lib.display()))
            .arg(format!("--hwloc-xml={}", node.hwloc_xml.display()))
            .args(["--node-name", "dgx-h100-a", "-o", "json"])
            .args(extra)
            .env_remove("TOPODRA_DISCOVER_STRICT")
            .output()
            .unwrap();
        assert!(out.status.success());
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let slice = &list["items"][0];
        (
            serde_json::to_vec(slice).unwrap().len(),
            serde_json::to_vec(&slice["spec"]["devices"][0])
                .unwrap()
                .len(),
        )
    };
    let (int, device) = size(&[]);
    let (list, _) = size(&["--numa-node-format=list"]);
    assert_eq!(figure("DGX H100 node is"), int);
    assert_eq!(figure("one device object alone is"), device);
    assert_eq!(figure("compact JSON\n("), int / 8, "per device");
    assert_eq!(figure("`numaNode` it is"), list);
    let (full, full_device) = size(&["--attributes=full"]);
    assert_eq!(figure("With `--attributes full` the slice is"), full);
    assert_eq!(figure("a device alone"), full_device);
}

/// The number docs/attributes.md writes right after the first `after` (`5,395`).
fn doc_figure(after: &str) -> usize {
    figure_in("docs/attributes.md", after)
}

/// The number the document `path` (from the repository root) writes right after the
/// first `after`.
fn figure_in(path: &str, after: &str) -> usize {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(path),
    )
    .unwrap();
    let at = doc
        .find(after)
        .unwrap_or_else(|| panic!("{after:?} not in the doc"))
        + after.len();
    let digits: String = doc[at..]
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap()
}

/// Slice bytes per GPU of the simulated DGX H100 as the scale benchmark counts them
/// (`tests/scale/fleet.go`, `sliceBytesPerGPU`: the JSON of every slice's spec over
/// the devices, node named as its kwok nodes are): the lean default takes no more
/// than NVIDIA's attribute set on the same GPUs (568, docs/benchmarks.md), and
/// `--attributes=full` is the set before lean slices.
#[test]
fn lean_slices_take_no_more_bytes_per_gpu_than_nvidias_attribute_set() {
    let measure = |extra: &[&str]| -> (usize, usize, usize) {
        let mut args = vec!["-o", "json"];
        args.extend_from_slice(extra);
        let out = discover_node(&profile_yaml("dgx-h100"), "kwok-gpu-0000", &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let items = list["items"].as_array().unwrap();
        let spec: usize = items
            .iter()
            .map(|s| serde_json::to_vec(&s["spec"]).unwrap().len())
            .sum();
        let devices: usize = items
            .iter()
            .map(|s| s["spec"]["devices"].as_array().map_or(0, Vec::len))
            .sum();
        let device = serde_json::to_vec(&items[0]["spec"]["devices"][0])
            .unwrap()
            .len();
        (spec, devices, device)
    };
    let (lean, n, lean_device) = measure(&[]);
    let (full, _, full_device) = measure(&["--attributes=full"]);
    assert_eq!(n, 8);
    assert!(lean <= 568 * n, "{lean} bytes over {n} GPUs");
    // 540.125 and 644.125 bytes per GPU; the device alone 522 and 626.
    assert_eq!((lean, lean_device), (4_321, 522));
    assert_eq!((full, full_device), (5_153, 626));
    assert_eq!(measure(&["--attributes=lean"]).0, lean);
    // docs/attributes.md, "Lean and full attribute sets", in whole bytes.
    assert_eq!(doc_figure("a GPU then takes"), lean / n);
    assert_eq!(doc_figure("the device object alone"), lean_device);
    assert_eq!(doc_figure("with every attribute it takes"), full / n);
    assert_eq!(doc_figure("a device object\nalone:"), full_device);
    // README, "Numbers".
    assert_eq!(
        figure_in("README.md", "A whole GPU's slice entry is now"),
        lean / n
    );
    assert_eq!(figure_in("README.md", "bytes by default ("), full / n);
}

/// The ResourceSlices `discover -o json` prints for the profile `yaml`.
fn slice_items(yaml: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let out = discover_yaml(yaml, extra);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    list["items"].as_array().unwrap().clone()
}

#[test]
fn dynamic_mig_is_previewed_only_when_asked_for() {
    // dgx-h100 with every GPU in MIG mode and no MIG devices yet.
    let yaml = profile_yaml("dgx-h100").replace(
        "    mig: {current: false, pending: false}",
        "    mig: {current: true, pending: true}",
    );
    let slices = |extra: &[&str]| slice_items(&yaml, extra);
    let count = |items: &[serde_json::Value], field: &str| -> usize {
        items
            .iter()
            .map(|s| s["spec"][field].as_array().map_or(0, Vec::len))
            .sum()
    };
    // Without the flag a GPU in MIG mode with no MIG devices offers nothing.
    let plain = slices(&["-o", "json"]);
    assert_eq!(count(&plain, "devices"), 0);
    assert_eq!(count(&plain, "sharedCounters"), 0);

    let preview = slices(&["-o", "json", "--preview-dynamic-mig"]);
    assert_eq!(preview.len(), 5);
    assert_eq!(count(&preview, "devices"), 8 * 26);
    assert_eq!(count(&preview, "sharedCounters"), 8);
    let names: Vec<&str> = preview
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"gpu-0"));
    assert!(names.contains(&"gpu-7-mig-1g-10gb-6"));
    assert!(names.contains(&"gpu-0-mig-7g-80gb-0"));
}

#[test]
fn time_slicing_is_previewed_only_when_asked_for() {
    let yaml = profile_yaml("dgx-h100");
    let slices = |extra: &[&str]| slice_items(&yaml, extra);
    let devices = |items: &[serde_json::Value]| -> Vec<serde_json::Value> {
        items
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .collect()
    };
    let plain = slices(&["-o", "json"]);
    assert_eq!(devices(&plain).len(), 8);

    let preview = slices(&["-o", "json", "--preview-time-slicing"]);
    let all = devices(&preview);
    assert_eq!(all.len(), 16);
    let ts = all.iter().find(|d| d["name"] == "gpu-0-ts").unwrap();
    assert_eq!(ts["allowMultipleAllocations"], true);
    assert_eq!(ts["attributes"]["type"]["string"], "shared");
    assert_eq!(ts["attributes"]["sharing"]["string"], "TimeSlicing");
    assert_eq!(ts["capacity"]["memory"]["requestPolicy"]["default"], "19Gi");
    let sets: usize = preview
        .iter()
        .map(|s| s["spec"]["sharedCounters"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(sets, 8);
}
