//! Parity with the NVIDIA Container Toolkit: what a claim's CDI spec hands a
//! container, compared with what `nvidia-ctk cdi generate` (the toolkit's `nvcdi`)
//! generates for the same GPUs on the same driver root.
//!
//! For each library layout (Debian, RHEL) the test builds a fake driver root of real
//! ELF files (`topodra_fake_nvml::driver_root`, R570 file list, device nodes under
//! the root), its NVML the fake one answering with the `l40s-pcie` profile (8 GPUs,
//! driver version set to the root's). Then, with the same hook path on both sides:
//!
//! - `--mode=management` (no NVML queries for devices; one `all` device with every
//!   node) against a claim of all 8 GPUs;
//! - `--mode=nvml` (per-GPU devices named by index and UUID) against a claim of two
//!   GPUs, merged with the toolkit's devices of those two UUIDs.
//!
//! Both specs are normalized into the same flat form (see [`Item`]): mounts by
//! container path (host path relative to the root, type, sorted options), hooks by
//! name (lifecycle, path, env) and each hook argument on its own (`create-symlinks
//! --link a::b`, `update-ldcache --folder d`), env by name, device nodes by path
//! (host path relative to the dev root, type, numbers, mode; and apart, owner and
//! permissions), and
//! annotations by key. The layout's library directory reads `<libdir>` and the
//! driver root `<driver-root>`, so the two layouts produce the same keys.
//!
//! Every difference must match an entry of `toolkit_parity_allowlist.yaml`, with its
//! reason; an entry that matches nothing fails too, so the list stays true. The whole
//! normalized diff is printed either way (`-- --nocapture`).
//!
//! Needs `nvidia-ctk` (`$TOPODRA_NVIDIA_CTK`, else on `PATH`) and the right to create
//! device nodes (root): without either it skips, and under `TOPODRA_REQUIRE_TOOLS=1`
//! fails. MIG devices are not compared: in nvml mode the toolkit reads MIG minors
//! from the host's own `/proc/driver/nvidia-caps/mig-minors` (`nvcaps.NewMigCaps`,
//! not under the driver root), which a test cannot provide. Nor are DRM nodes: the
//! toolkit lists them from the host's `/sys/bus/pci/devices/<bus id>/drm`, so here
//! both sides find none.
//!
//! Run it alone with `cargo test -p topodra-node --test toolkit_parity -- --nocapture`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;
use topodra_fake_nvml::driver_root::{self, DeviceNodes, DriverRoot, Layout, R570_VERSION};
use topodra_fake_nvml::{Profile, cdylib_path};
use topodra_node::cdi::{
    CdiConfig, CdiKind, ClaimGpu, ClaimSpecRequest, DriverCapabilities, NvidiaFiles, claim_spec,
};

/// The same `nvidia-cdi-hook` path on both sides, where neither side would pick it.
const HOOK_PATH: &str = "/opt/parity/bin/nvidia-cdi-hook";
const PROFILE: &str = "l40s-pcie";
/// NVML indices of the GPUs of the nvml-mode claim: one per socket.
const NVML_CLAIM: [u32; 2] = [1, 6];
const CLAIM_UID: &str = "5f0c9a8e-1d2b-4c3a-9e8f-7a6b5c4d3e2f";
const ALLOWLIST: &str = "toolkit_parity_allowlist.yaml";

fn require_tools() -> bool {
    std::env::var("TOPODRA_REQUIRE_TOOLS").is_ok_and(|v| v == "1")
}

fn skip(why: &str) {
    if require_tools() {
        panic!("toolkit parity needs its tools (TOPODRA_REQUIRE_TOOLS=1): {why}");
    }
    eprintln!(
        "SKIPPING toolkit parity: {why} (TOPODRA_REQUIRE_TOOLS=1 turns this skip into a failure)"
    );
}

/// `$TOPODRA_NVIDIA_CTK`, else `nvidia-ctk` on `PATH`.
fn nvidia_ctk() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("TOPODRA_NVIDIA_CTK").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("TOPODRA_NVIDIA_CTK={} is not a file", p.display()))
        };
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("nvidia-ctk"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "nvidia-ctk not found (set TOPODRA_NVIDIA_CTK or build it with tests/tools/build.sh)"
                .into()
        })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Mode {
    Management,
    Nvml,
}

impl Mode {
    fn flag(self) -> &'static str {
        match self {
            Mode::Management => "management",
            Mode::Nvml => "nvml",
        }
    }
}

/// What one normalized item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Kind {
    Mount,
    Hook,
    HookArg,
    Env,
    DeviceNode,
    /// A device node's owner and cgroup permissions, apart from its identity and
    /// mode, so that an intended difference there cannot hide one in the numbers.
    DeviceNodeAccess,
    Annotation,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Mount => "mount",
            Kind::Hook => "hook",
            Kind::HookArg => "hook-arg",
            Kind::Env => "env",
            Kind::DeviceNode => "device-node",
            Kind::DeviceNodeAccess => "device-node-access",
            Kind::Annotation => "annotation",
        })
    }
}

/// A spec reduced to what a container gets: each key with the set of values it has
/// (a set, because a hook or node may be listed by the common edits and a device).
type Normalized = BTreeMap<(Kind, String), BTreeSet<String>>;

/// How paths in one run read after normalization.
struct Paths {
    driver_root: String,
    dev_root: String,
    lib_dir: String,
}

impl Paths {
    /// The driver root, then the layout's library directory, by placeholders.
    fn text(&self, s: &str) -> String {
        let s = s.replace(&self.driver_root, "<driver-root>");
        s.replace(&self.lib_dir, "<libdir>")
    }

    /// A host path as the container stack resolves it: relative to the root it lies
    /// under, placeholders for the library directory.
    fn host(&self, host: &str, root: &str) -> String {
        let rel = host.strip_prefix(root).filter(|r| r.starts_with('/'));
        let rel = rel.unwrap_or(host);
        rel.replace(&self.lib_dir, "<libdir>")
    }
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn field<'a>(v: &'a Value, name: &str) -> Option<&'a str> {
    v.get(name).and_then(Value::as_str)
}

/// The arguments after a hook's name, one item per flag with its value.
fn hook_args(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        let takes_value = a.starts_with("--") && !a.contains('=');
        match args.get(i + 1) {
            Some(v) if takes_value && !v.starts_with("--") => {
                out.push(format!("{a} {v}"));
                i += 2;
            }
            _ => {
                out.push(a.clone());
                i += 1;
            }
        }
    }
    out
}

/// Adds one `containerEdits` object to `out`.
fn add_edits(out: &mut Normalized, edits: &Value, paths: &Paths) {
    let mut put = |kind: Kind, key: String, value: String| {
        out.entry((kind, key)).or_default().insert(value);
    };
    for e in strs(&edits["env"]) {
        let (k, v) = e.split_once('=').unwrap_or((&e, ""));
        put(Kind::Env, k.to_owned(), paths.text(v));
    }
    for m in edits["mounts"].as_array().into_iter().flatten() {
        let container = field(m, "containerPath").unwrap_or("?");
        // The file the mount binds: a host path through a symlink of the root (a
        // merged /usr's `lib -> usr/lib`) binds the same file as the resolved one.
        let host = field(m, "hostPath").unwrap_or("?");
        let host = std::fs::canonicalize(host)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| host.to_owned());
        let mut options = strs(&m["options"]);
        options.sort();
        // OCI runtime spec (config.md, mounts): "For bind mounts (when options
        // include either bind or rbind), the type is a no-op"; the toolkit leaves
        // it out, topodra writes "bind".
        let bind = options.iter().any(|o| o == "bind" || o == "rbind");
        let kind = match field(m, "type") {
            Some(t) => t,
            None if bind => "bind",
            None => "-",
        };
        put(
            Kind::Mount,
            paths.text(container),
            format!(
                "host={} type={kind} options={}",
                paths.host(&host, &paths.driver_root),
                options.join(",")
            ),
        );
    }
    for h in edits["hooks"].as_array().into_iter().flatten() {
        let args = strs(&h["args"]);
        // `nvidia-cdi-hook <name> ...`, or `nvidia-ctk hook <name> ...`.
        let skip = if args.get(1).is_some_and(|a| a == "hook") {
            2
        } else {
            1
        };
        let name = args.get(skip).cloned().unwrap_or_else(|| "?".into());
        let mut env = strs(&h["env"]);
        env.sort();
        put(
            Kind::Hook,
            name.clone(),
            format!(
                "lifecycle={} path={} argv0={} env=[{}]",
                field(h, "hookName").unwrap_or("?"),
                field(h, "path").unwrap_or("?"),
                args.first().map_or("?", String::as_str),
                env.join(",")
            ),
        );
        for arg in hook_args(args.get(skip + 1..).unwrap_or_default()) {
            put(
                Kind::HookArg,
                format!("{name} {}", paths.text(&arg)),
                String::new(),
            );
        }
    }
    for n in edits["deviceNodes"].as_array().into_iter().flatten() {
        let path = field(n, "path").unwrap_or("?");
        let host = field(n, "hostPath").unwrap_or(path);
        let host_rel = paths.host(host, &paths.dev_root);
        let (kind, major, minor) = filled_numbers(n, &paths.dev_root, &host_rel);
        let num = |k: &str| n.get(k).and_then(Value::as_u64);
        put(
            Kind::DeviceNode,
            path.to_owned(),
            format!(
                "host={host_rel} type={kind} major={major} minor={minor} fileMode={}",
                num("fileMode").map_or("-".into(), |m| format!("{m:o}")),
            ),
        );
        put(
            Kind::DeviceNodeAccess,
            path.to_owned(),
            format!(
                "uid={} gid={} permissions={}",
                num("uid").map_or("-".into(), |u| u.to_string()),
                num("gid").map_or("-".into(), |g| g.to_string()),
                field(n, "permissions").unwrap_or("-"),
            ),
        );
    }
}

/// Type and numbers of a device node as a runtime ends up with them: as written,
/// and where missing, from the host node, as the CDI library fills them in
/// (`fillMissingInfo` in container-device-interface). The toolkit leaves out `type`
/// and, by Go's `omitempty`, every number that is 0, relying on that.
fn filled_numbers(n: &Value, dev_root: &str, host_rel: &str) -> (String, String, String) {
    let stat = std::fs::metadata(Path::new(dev_root).join(host_rel.trim_start_matches('/'))).ok();
    let from_host =
        |pick: fn(&std::fs::Metadata) -> String| stat.as_ref().map_or_else(|| "-".into(), pick);
    let kind = field(n, "type").map_or_else(
        || {
            from_host(|m| {
                if m.file_type().is_block_device() {
                    "b".into()
                } else {
                    "c".into()
                }
            })
        },
        str::to_owned,
    );
    let number = |name: &str, pick: fn(&std::fs::Metadata) -> String| {
        n.get(name)
            .and_then(Value::as_u64)
            .map_or_else(|| from_host(pick), |v| v.to_string())
    };
    (
        kind,
        number("major", |m| libc::major(m.rdev()).to_string()),
        number("minor", |m| libc::minor(m.rdev()).to_string()),
    )
}

/// The spec as one container using `devices` (all when `None`) gets it: the common
/// edits and those of the selected devices, and the annotations.
fn normalize(spec: &Value, devices: Option<&BTreeSet<String>>, paths: &Paths) -> Normalized {
    let mut out = Normalized::new();
    add_edits(&mut out, &spec["containerEdits"], paths);
    for (k, v) in spec["annotations"].as_object().into_iter().flatten() {
        out.entry((Kind::Annotation, k.clone()))
            .or_default()
            .insert(v.as_str().unwrap_or("?").to_owned());
    }
    for d in spec["devices"].as_array().into_iter().flatten() {
        let name = field(d, "name").unwrap_or("");
        if devices.is_some_and(|want| !want.contains(name)) {
            continue;
        }
        add_edits(&mut out, &d["containerEdits"], paths);
        for (k, v) in d["annotations"].as_object().into_iter().flatten() {
            out.entry((Kind::Annotation, k.clone()))
                .or_default()
                .insert(v.as_str().unwrap_or("?").to_owned());
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Side {
    /// Only the toolkit's spec has the key.
    ToolkitOnly,
    /// Only ours has it.
    TopodraOnly,
    /// Both have it, with different values.
    Differs,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::ToolkitOnly => "toolkit only",
            Side::TopodraOnly => "topodra only",
            Side::Differs => "differs",
        })
    }
}

#[derive(Debug, Clone)]
struct Difference {
    layout: Layout,
    mode: Mode,
    kind: Kind,
    key: String,
    side: Side,
    toolkit: Vec<String>,
    topodra: Vec<String>,
}

fn diff(layout: Layout, mode: Mode, toolkit: &Normalized, ours: &Normalized) -> Vec<Difference> {
    let keys: BTreeSet<&(Kind, String)> = toolkit.keys().chain(ours.keys()).collect();
    let mut out = Vec::new();
    for key in keys {
        let (t, o) = (toolkit.get(key), ours.get(key));
        let side = match (t, o) {
            (Some(t), Some(o)) if t == o => continue,
            (Some(_), Some(_)) => Side::Differs,
            (Some(_), None) => Side::ToolkitOnly,
            (None, _) => Side::TopodraOnly,
        };
        let list = |s: Option<&BTreeSet<String>>| s.into_iter().flatten().cloned().collect();
        out.push(Difference {
            layout,
            mode,
            kind: key.0,
            key: key.1.clone(),
            side,
            toolkit: list(t),
            topodra: list(o),
        });
    }
    out
}

/// One accepted difference. `key` may use `*` for any run of characters; `side`,
/// `modes` and `layouts` narrow the match when given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AllowEntry {
    kind: Kind,
    key: String,
    #[serde(default)]
    side: Option<Side>,
    #[serde(default)]
    modes: Option<Vec<Mode>>,
    #[serde(default)]
    layouts: Option<Vec<String>>,
    reason: String,
}

impl AllowEntry {
    fn matches(&self, d: &Difference) -> bool {
        self.kind == d.kind
            && glob(&self.key, &d.key)
            && self.side.is_none_or(|s| s == d.side)
            && self.modes.as_ref().is_none_or(|m| m.contains(&d.mode))
            && self
                .layouts
                .as_ref()
                .is_none_or(|l| l.iter().any(|l| l == d.layout.name()))
    }

    /// Whether this entry could have matched anything in the runs that happened.
    fn applies_to(&self, runs: &BTreeSet<(Layout, Mode)>) -> bool {
        runs.iter().any(|(layout, mode)| {
            self.modes.as_ref().is_none_or(|m| m.contains(mode))
                && self
                    .layouts
                    .as_ref()
                    .is_none_or(|l| l.iter().any(|l| l == layout.name()))
        })
    }
}

/// `*` matches any run of characters, everything else itself.
fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || !text[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

fn load_allowlist() -> Vec<AllowEntry> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(ALLOWLIST);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let entries: Vec<AllowEntry> =
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for e in &entries {
        assert!(
            !e.reason.trim().is_empty(),
            "{ALLOWLIST}: {} {:?} has no reason",
            e.kind,
            e.key
        );
    }
    entries
}

/// The profile with the fake root's driver and CUDA versions, so NVML and the
/// files agree.
fn profile_yaml() -> (Profile, String) {
    let mut profile = Profile::builtin(PROFILE).expect("builtin profile");
    profile.driver_version = R570_VERSION.to_owned();
    profile.cuda_driver_version = driver_root::R570_CUDA_VERSION;
    let yaml = profile.to_yaml();
    Profile::from_yaml_str(&yaml).expect("the edited profile is valid");
    (profile, yaml)
}

struct Run {
    layout: Layout,
    mode: Mode,
    toolkit: Normalized,
    ours: Normalized,
}

fn toolkit_spec(ctk: &Path, mode: Mode, root: &DriverRoot, profile_path: &Path) -> Value {
    let out = Command::new(ctk)
        .args(["cdi", "generate", "--format=json"])
        .arg(format!("--mode={}", mode.flag()))
        .arg(format!("--driver-root={}", root.root.display()))
        .arg(format!("--dev-root={}", root.dev_root.display()))
        .arg(format!("--nvidia-cdi-hook-path={HOOK_PATH}"))
        .env("TOPODRA_FAKE_NVML_PROFILE", profile_path)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", ctk.display()));
    assert!(
        out.status.success(),
        "nvidia-ctk cdi generate --mode={} failed ({}):\n{}",
        mode.flag(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "nvidia-ctk printed no JSON spec ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn our_spec(root: &DriverRoot, profile: &Profile, gpus: &[u32]) -> Value {
    let mut config = CdiConfig::default();
    config.driver_root = root.root.clone();
    config.dev_root = root.dev_root.clone();
    config.hook_path = HOOK_PATH.into();
    let files = NvidiaFiles::load(&config).unwrap_or_else(|e| panic!("NvidiaFiles::load: {e}"));
    let nodes = config.device_nodes();
    let claim_gpus = gpus
        .iter()
        .map(|i| {
            let g = profile
                .gpus
                .iter()
                .find(|g| g.index == *i)
                .expect("GPU of the profile");
            ClaimGpu {
                device_name: format!("gpu-{}", g.minor),
                minor: g.minor,
                uuid: Some(g.uuid.clone()),
                numa_node: None,
                local_cpus: Default::default(),
                mig_nodes: Vec::new(),
                requests: vec!["gpus".into()],
                pci_bus_id: Some(g.bus_id.to_string()),
                share: None,
            }
        })
        .collect();
    let req = ClaimSpecRequest {
        claim_uid: CLAIM_UID.into(),
        claim_namespace: "parity".into(),
        claim_name: "gpus".into(),
        gpus: claim_gpus,
        env_hints: true,
        kind: CdiKind::default(),
        capabilities: DriverCapabilities::default(),
    };
    let spec = claim_spec(&req, &nodes, &files).unwrap_or_else(|e| panic!("claim_spec: {e}"));
    serde_json::to_value(&spec).expect("a spec serializes")
}

fn run_layout(ctk: &Path, layout: Layout, work: &Path) -> Result<Vec<Run>, String> {
    let (profile, yaml) = profile_yaml();
    let profile_path = work.join(format!("{}-profile.yaml", layout.name()));
    std::fs::write(&profile_path, &yaml).expect("write profile");
    // Canonical, so that paths the toolkit resolves through symlinks (a temp dir
    // under a link) still start with the root we strip.
    let dir = work.join(layout.name());
    std::fs::create_dir_all(&dir).expect("mkdir");
    let dir = std::fs::canonicalize(&dir).expect("canonicalize");
    let options = driver_root::Options {
        gpu_minors: profile.gpus.iter().map(|g| g.minor).collect(),
        cuda_driver_version: profile.cuda_driver_version,
        nvml_lib: Some(cdylib_path()),
        nvml_profile: Some(yaml.clone()),
        ..driver_root::Options::default()
    };
    let root = DriverRoot::build(&dir, layout, R570_VERSION, &options)
        .unwrap_or_else(|e| panic!("building the {} driver root: {e}", layout.name()));
    if let DeviceNodes::Skipped { reason } = &root.device_nodes {
        return Err(format!(
            "both sides need the driver root's device nodes: {reason}"
        ));
    }
    let paths = Paths {
        driver_root: root.root.display().to_string(),
        dev_root: root.dev_root.display().to_string(),
        lib_dir: format!("/{}", layout.lib_dir()),
    };

    let mut runs = Vec::new();
    // Management: every GPU, the toolkit's one `all` device.
    let all: Vec<u32> = profile.gpus.iter().map(|g| g.index).collect();
    let spec = toolkit_spec(ctk, Mode::Management, &root, &profile_path);
    runs.push(Run {
        layout,
        mode: Mode::Management,
        toolkit: normalize(&spec, None, &paths),
        ours: normalize(&our_spec(&root, &profile, &all), None, &paths),
    });

    // NVML: two GPUs, the toolkit's devices named by their UUIDs.
    let spec = toolkit_spec(ctk, Mode::Nvml, &root, &profile_path);
    let uuids: BTreeSet<String> = NVML_CLAIM
        .iter()
        .map(|i| {
            profile
                .gpus
                .iter()
                .find(|g| g.index == *i)
                .expect("GPU")
                .uuid
                .clone()
        })
        .collect();
    let names: BTreeSet<String> = spec["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| field(d, "name"))
        .map(str::to_owned)
        .collect();
    assert!(
        uuids.is_subset(&names),
        "nvidia-ctk --mode=nvml named its devices {names:?}, not by the UUIDs {uuids:?}"
    );
    adopts_whole(&spec, &root, work, layout);
    runs.push(Run {
        layout,
        mode: Mode::Nvml,
        toolkit: normalize(&spec, Some(&uuids), &paths),
        ours: normalize(&our_spec(&root, &profile, &NVML_CLAIM), None, &paths),
    });
    Ok(runs)
}

/// The toolkit's own spec, adopted as `--toolkit-cdi-spec`, loses nothing to the
/// check of what driver files can be: every mount, hook and variable is taken.
fn adopts_whole(spec: &Value, root: &DriverRoot, work: &Path, layout: Layout) {
    let path = work.join(format!("{}-toolkit.json", layout.name()));
    std::fs::write(&path, serde_json::to_vec(spec).expect("JSON")).expect("write spec");
    let mut config = CdiConfig::default();
    config.driver_root = root.root.clone();
    config.toolkit_spec = Some(path);
    config.hook_path = HOOK_PATH.into();
    let files = NvidiaFiles::load(&config)
        .unwrap_or_else(|e| panic!("{}: the toolkit's spec is not adopted: {e}", layout.name()));
    assert_eq!(
        files.dropped(),
        &[] as &[String],
        "{}: the toolkit's own spec lost entries when adopted",
        layout.name()
    );
    let edits = files.edits(&DriverCapabilities::all());
    let count = |key: &str| spec["containerEdits"][key].as_array().map_or(0, Vec::len);
    // Less the toolkit's /dev/null over the device list, which our spec has anyway.
    let void = spec["containerEdits"]["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| {
            m["hostPath"] == "/dev/null"
                && m["containerPath"] == "/var/run/nvidia-container-devices/void"
        })
        .count();
    assert_eq!(
        (edits.mounts.len(), edits.hooks.len(), edits.env.len()),
        (count("mounts") - void, count("hooks"), count("env")),
        "{}",
        layout.name()
    );
}

fn print_diff(differences: &[(Difference, Option<usize>)], allow: &[AllowEntry]) {
    let mut current = None;
    for (d, allowed) in differences {
        if current != Some((d.layout, d.mode)) {
            current = Some((d.layout, d.mode));
            let n = differences
                .iter()
                .filter(|(x, _)| (x.layout, x.mode) == (d.layout, d.mode))
                .count();
            println!(
                "\n== {} layout, --mode={}: {n} differences",
                d.layout.name(),
                d.mode.flag()
            );
        }
        let mark = match allowed {
            Some(i) => format!("allowed: {}", allow[*i].reason.trim()),
            None => "NOT ALLOWED".into(),
        };
        println!("[{}] {} ({}) -- {mark}", d.kind, d.key, d.side);
        for v in &d.toolkit {
            if !v.is_empty() {
                println!("    toolkit: {v}");
            }
        }
        for v in &d.topodra {
            if !v.is_empty() {
                println!("    topodra: {v}");
            }
        }
    }
}

#[test]
fn claim_specs_match_the_toolkit() {
    let ctk = match nvidia_ctk() {
        Ok(p) => p,
        Err(why) => return skip(&why),
    };
    let allow = load_allowlist();
    let work = tempfile::tempdir().expect("tempdir");
    let mut runs = Vec::new();
    for layout in [Layout::Debian, Layout::Rhel] {
        match run_layout(&ctk, layout, work.path()) {
            Ok(r) => runs.extend(r),
            Err(why) => return skip(&why),
        }
    }

    let mut differences = Vec::new();
    for run in &runs {
        assert!(
            !run.toolkit.is_empty() && !run.ours.is_empty(),
            "empty normalized spec"
        );
        for d in diff(run.layout, run.mode, &run.toolkit, &run.ours) {
            let allowed = allow.iter().position(|e| e.matches(&d));
            differences.push((d, allowed));
        }
    }
    print_diff(&differences, &allow);

    let ran: BTreeSet<(Layout, Mode)> = runs.iter().map(|r| (r.layout, r.mode)).collect();
    let used: BTreeSet<usize> = differences.iter().filter_map(|(_, a)| *a).collect();
    let stale: Vec<String> = allow
        .iter()
        .enumerate()
        .filter(|(i, e)| !used.contains(i) && e.applies_to(&ran))
        .map(|(_, e)| format!("{} {:?}: {}", e.kind, e.key, e.reason.trim()))
        .collect();
    let unallowed: Vec<String> = differences
        .iter()
        .filter(|(_, a)| a.is_none())
        .map(|(d, _)| {
            format!(
                "{}/{}: [{}] {} ({})",
                d.layout.name(),
                d.mode.flag(),
                d.kind,
                d.key,
                d.side
            )
        })
        .collect();
    println!(
        "\ntoolkit parity: {} differences, {} allowed, {} not allowed; {} stale allow-list entries",
        differences.len(),
        differences.len() - unallowed.len(),
        unallowed.len(),
        stale.len()
    );
    let mut problems = String::new();
    if !unallowed.is_empty() {
        problems.push_str(&format!(
            "{} differences from the toolkit's spec are not in {ALLOWLIST} (the full diff is \
             printed above; run with -- --nocapture):\n  {}\n",
            unallowed.len(),
            unallowed.join("\n  ")
        ));
    }
    if !stale.is_empty() {
        problems.push_str(&format!(
            "{ALLOWLIST} entries that match no difference any more (remove them):\n  {}\n",
            stale.join("\n  ")
        ));
    }
    assert!(problems.is_empty(), "{problems}");
}

#[test]
fn glob_matches_runs_of_characters() {
    assert!(glob("TOPODRA_*", "TOPODRA_CPUS"));
    assert!(glob("*", ""));
    assert!(glob("a*b*c", "aXXbYYc"));
    assert!(!glob("a*b*c", "aXXcYYb"));
    assert!(!glob("TOPODRA_*", "CUDA_DEVICE_ORDER"));
    assert!(glob("exact", "exact"));
    assert!(!glob("exact", "exactly"));
}

#[test]
fn hook_args_pair_flags_with_values() {
    let args: Vec<String> = [
        "--link",
        "a::b",
        "--host-driver-version=570",
        "--folder",
        "/x",
        "--flag",
    ]
    .map(str::to_owned)
    .to_vec();
    assert_eq!(
        hook_args(&args),
        [
            "--link a::b",
            "--host-driver-version=570",
            "--folder /x",
            "--flag"
        ]
    );
}

#[test]
fn allow_entries_narrow_by_side_mode_and_layout() {
    let entry: Vec<AllowEntry> = serde_saphyr::from_str(
        "- {kind: env, key: \"TOPODRA_*\", side: topodra-only, modes: [nvml], layouts: [rhel], reason: r}\n",
    )
    .unwrap();
    let entry = &entry[0];
    let d = |layout, mode, kind, key: &str, side| Difference {
        layout,
        mode,
        kind,
        key: key.into(),
        side,
        toolkit: vec![],
        topodra: vec![],
    };
    assert!(entry.matches(&d(
        Layout::Rhel,
        Mode::Nvml,
        Kind::Env,
        "TOPODRA_CPUS",
        Side::TopodraOnly
    )));
    assert!(!entry.matches(&d(
        Layout::Debian,
        Mode::Nvml,
        Kind::Env,
        "TOPODRA_CPUS",
        Side::TopodraOnly
    )));
    assert!(!entry.matches(&d(
        Layout::Rhel,
        Mode::Management,
        Kind::Env,
        "TOPODRA_CPUS",
        Side::TopodraOnly
    )));
    assert!(!entry.matches(&d(
        Layout::Rhel,
        Mode::Nvml,
        Kind::Env,
        "TOPODRA_CPUS",
        Side::Differs
    )));
    assert!(!entry.matches(&d(
        Layout::Rhel,
        Mode::Nvml,
        Kind::Mount,
        "TOPODRA_CPUS",
        Side::TopodraOnly
    )));
    let ran = BTreeSet::from([(Layout::Debian, Mode::Nvml)]);
    assert!(
        !entry.applies_to(&ran),
        "an entry for rhel cannot be stale in a debian-only run"
    );
    // Unknown fields are refused, so a typo cannot widen an entry.
    assert!(
        serde_saphyr::from_str::<Vec<AllowEntry>>(
            "- {kind: env, key: a, reason: r, mode: [nvml]}\n"
        )
        .is_err()
    );
}
