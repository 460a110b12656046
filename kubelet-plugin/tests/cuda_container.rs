//! CUDA inside a container built from a claim's CDI spec, with NVIDIA's real
//! `nvidia-cdi-hook` running the spec's hooks, on a node whose driver is laid out as
//! on RHEL (`/usr/lib64`) while the container's image is Debian-like (its loader
//! searches `/lib/x86_64-linux-gnu`, never `/usr/lib64`).
//!
//! The real plugin prepares a whole GPU and a MIG device on a simulated DGX A100
//! with MIG; `cdi-check` (the CDI Go library runtimes use) turns each claim's ids
//! into the runtime's spec, and runc (or crun) runs a container of busybox, the
//! host's glibc and a probe program. Inside, the container shows that:
//! - `ldconfig -p` lists `libcuda.so.1` (the `update-ldcache` hook ran the loader
//!   cache over the driver's directory),
//! - `libcuda.so` resolves (`create-symlinks`),
//! - the probe `dlopen`s `libcuda.so.1` and `cuInit` on the fake driver's stub
//!   succeeds, CUDA sees one GPU, the claim's (the stub enumerates the GPUs whose
//!   nodes the process has, as the real driver in a container does), and
//!   `nvidia-smi` runs,
//! - with a newer CUDA forward-compatibility `libcuda` in the image's
//!   `/usr/local/cuda/compat`, that one is loaded (`enable-cuda-compat`), and the
//!   host's without it,
//! - only the claim's device nodes exist, with the host nodes' mode.
//!
//! Needs what `oci_runtime.rs` needs (root, runc or crun, a static busybox,
//! `cdi-check`), plus the hook (`TOPODRA_NVIDIA_CDI_HOOK`, which `make test` sets
//! from tests/tools/build.sh's `nvidia-ctk`), `cc`, and the host's `ldconfig`. It skips
//! without them, or fails under `TOPODRA_REQUIRE_TOOLS=1`.

// clippy.toml allows unwrap in #[test] functions only; this crate's helpers are tests too.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::json;
use support::cdi::*;
use support::oci::*;
use support::*;
use topodra_fake_nvml::Profile;
use topodra_fake_nvml::driver_root::{self, DriverRoot, LIBCUDA_SOURCE, Layout};
use topodra_mock_apiserver::MockApiServer;

/// The driver's device nodes' mode on this node: `NVreg_DeviceFileMode=0660`, not
/// the 0666 a runtime gives a node the spec states no mode for.
const GPU_NODE_MODE: u32 = 0o660;
/// MIG capability nodes are read-only (`DeviceFileMode: 292` in the capability
/// files, NVIDIA MIG user guide).
const CAP_NODE_MODE: u32 = 0o444;

/// A CUDA forward-compatibility driver newer than the profile's R535: R550, CUDA
/// 12.4 (`cuDriverGetVersion` 12040).
const COMPAT_VERSION: &str = "550.54.15";
const COMPAT_CUDA: i32 = 12040;

/// The probe: loads `libcuda.so.1` as CUDA applications do, initializes it, and
/// says which file the loader picked and how many GPUs CUDA sees, with the first
/// one's UUID. Then `libcuda.so`, as Triton does.
const PROBE_SOURCE: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { printf("cuda dlopen-failed %s\n", dlerror()); return 0; }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*version)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
    int (*count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
    int (*get)(int *, int) = (int (*)(int *, int))dlsym(h, "cuDeviceGet");
    int (*uuid)(unsigned char *, int) =
        (int (*)(unsigned char *, int))dlsym(h, "cuDeviceGetUuid_v2");
    if (!init || !version || !count || !get || !uuid) {
        printf("cuda missing-symbols\n");
        return 0;
    }
    int v = 0, c = 0;
    int r = init(0);
    version(&v);
    count(&c);
    Dl_info info;
    dladdr((void *)init, &info);
    printf("cuda init=%d version=%d count=%d lib=%s\n", r, v, c, info.dli_fname);
    int d = -1;
    unsigned char u[16];
    if (c > 0 && get(&d, 0) == 0 && uuid(u, d) == 0)
        printf("uuid GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n",
               u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
               u[12], u[13], u[14], u[15]);
    void *dev = dlopen("libcuda.so", RTLD_NOW);
    printf("devlink %s\n", dev ? "ok" : dlerror());
    return 0;
}
"#;

/// What else the test needs besides the OCI tools.
struct CudaTools {
    oci: Tools,
    hook: PathBuf,
    ldconfig: PathBuf,
}

fn cuda_tools() -> Option<CudaTools> {
    let oci = tools()?;
    let hook = match std::env::var_os("TOPODRA_NVIDIA_CDI_HOOK").map(PathBuf::from) {
        Some(p) if p.is_file() => p,
        other => {
            let why = format!(
                "TOPODRA_NVIDIA_CDI_HOOK is {} (tests/tools/build.sh nvidia-ctk builds it)",
                other.map_or("unset".into(), |p| format!("{} (not a file)", p.display()))
            );
            if tools_required() {
                panic!("NVIDIA's nvidia-cdi-hook is required (TOPODRA_REQUIRE_TOOLS=1): {why}");
            }
            eprintln!("SKIPPED: the CUDA container test runs the real hook: {why}");
            return None;
        }
    };
    // The hook runs the host's ldconfig inside the container root; glibc's is
    // statically linked, so it runs there too.
    let Some(ldconfig) = find_program("ldconfig").filter(|p| is_static_elf(p).unwrap_or(false))
    else {
        eprintln!("SKIPPED: no statically linked ldconfig on this host");
        return None;
    };
    Some(CudaTools {
        oci,
        hook,
        ldconfig,
    })
}

/// `cc` over `source`, with `args`; the output at `out`. The source goes in a
/// directory of its own: beside a library in the image it would be one more file
/// the hooks' globs see.
fn cc(source: &str, out: &Path, args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("source.c");
    std::fs::write(&src, source).unwrap();
    let status = Command::new("cc")
        .args(args)
        .arg("-o")
        .arg(out)
        .arg(&src)
        .status()
        .unwrap();
    assert!(status.success(), "cc {}", out.display());
}

/// The dynamic libraries a program needs, as `ldd` resolves them on this host.
fn needed_libraries(program: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(program).output().unwrap();
    assert!(out.status.success(), "ldd {}", program.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let path = l.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// A Debian-like image: busybox, the host's glibc at its Debian paths, the host's
/// static ldconfig, the probe; optionally a CUDA forward-compatibility driver
/// that knows `gpus` (the same kernel driver's GPUs as the host's libcuda).
fn make_image(dir: &Path, tools: &CudaTools, compat: Option<&[driver_root::CudaGpu]>) -> PathBuf {
    let bundle = make_bundle(dir, &tools.oci.busybox);
    let rootfs = bundle.join("rootfs");
    for d in ["etc", "sbin", "lib64", "lib/x86_64-linux-gnu", "tmp"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    // What the hook's ldconfig reads to know the image's own search path.
    std::fs::write(rootfs.join("etc/debian_version"), "12.0\n").unwrap();
    std::fs::copy(&tools.ldconfig, rootfs.join("sbin/ldconfig")).unwrap();
    let probe = rootfs.join("probe");
    cc(PROBE_SOURCE, &probe, &["-O1"]);
    for lib in needed_libraries(&probe) {
        let dest = rootfs.join(lib.strip_prefix("/").unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(std::fs::canonicalize(&lib).unwrap(), &dest).unwrap();
    }
    if let Some(gpus) = compat {
        let compat_dir = rootfs.join("usr/local/cuda/compat");
        std::fs::create_dir_all(&compat_dir).unwrap();
        let lib = compat_dir.join(format!("libcuda.so.{COMPAT_VERSION}"));
        cc(
            LIBCUDA_SOURCE,
            &lib,
            &[
                "-shared",
                "-fPIC",
                "-Wl,-soname,libcuda.so.1",
                &format!("-DTOPODRA_CUDA_VERSION={COMPAT_CUDA}"),
                &format!(
                    "-DTOPODRA_GPUS={}",
                    driver_root::libcuda_gpu_table(gpus).unwrap()
                ),
            ],
        );
        std::os::unix::fs::symlink(
            format!("libcuda.so.{COMPAT_VERSION}"),
            compat_dir.join("libcuda.so.1"),
        )
        .unwrap();
    }
    bundle
}

/// The MIG capability minors the sim's capability files name, for GPU `minor`'s
/// instances.
fn capability_minors(node: &NodeDirs) -> Vec<u64> {
    let mut minors = Vec::new();
    let mut stack = vec![node.sim.capabilities_dir.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == "access") {
                let text = std::fs::read_to_string(&path).unwrap();
                if let Some(m) = text
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("DeviceFileMinor:"))
                {
                    minors.push(m.trim().parse().unwrap());
                }
            }
        }
    }
    minors.sort_unstable();
    minors
}

/// The container's script: one fact per line, keyed by its first word.
const SCRIPT: &str = r#"ldconfig -p | grep 'libcuda\.so' | while read -r l; do echo "ldcache $l"; done
echo "devlib $(readlink -f /usr/lib64/libcuda.so)"
/probe
echo "smi $(nvidia-smi 2>&1 | head -n 1)"
for n in $(find /dev -name 'nvidia*' | sort); do
  echo "node $n $(stat -c '%a' "$n")"
done
echo done
"#;

#[derive(Debug, Default)]
struct Seen {
    ldcache: Vec<String>,
    devlib: String,
    cuda: String,
    /// The UUID of CUDA device 0, when CUDA sees one.
    uuid: String,
    devlink: String,
    smi: String,
    nodes: BTreeMap<String, String>,
    done: bool,
}

fn parse(stdout: &str) -> Seen {
    let mut s = Seen::default();
    for line in stdout.lines() {
        let (key, rest) = line.split_once(' ').unwrap_or((line, ""));
        match key {
            "ldcache" => s.ldcache.push(rest.trim().to_owned()),
            "devlib" => s.devlib = rest.to_owned(),
            "cuda" => s.cuda = rest.to_owned(),
            "uuid" => s.uuid = rest.to_owned(),
            "devlink" => s.devlink = rest.to_owned(),
            "smi" => s.smi = rest.to_owned(),
            "node" => {
                let (path, mode) = rest.split_once(' ').unwrap();
                s.nodes.insert(path.to_owned(), mode.to_owned());
            }
            "done" => s.done = true,
            _ => {}
        }
    }
    s
}

/// Runs the claim's CDI ids in `bundle` and returns what the container saw.
fn run_claim(tools: &CudaTools, node: &NodeDirs, bundle: &Path, ids: &[String]) -> Seen {
    let runtime = &tools.oci.runtime;
    let mut spec = base_spec(runtime, bundle, SCRIPT).unwrap();
    // The hooks write the loader cache and links into the image.
    spec["root"]["readonly"] = json!(false);
    spec["process"]["env"] =
        json!(["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]);
    let config = inject_into_bundle(&tools.oci.cdi_check, node, bundle, &spec, ids);
    let out = runtime.run(bundle);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} run: {}\nstdout:\n{stdout}\nstderr:\n{stderr}\nconfig.json:\n{}",
        runtime.name(),
        out.status,
        std::fs::read_to_string(&config).unwrap_or_default()
    );
    eprintln!("the container reported:\n{stdout}");
    let seen = parse(&stdout);
    assert!(seen.done, "the script did not finish:\n{stdout}\n{stderr}");
    seen
}

#[tokio::test(flavor = "multi_thread")]
async fn cuda_finds_its_driver_across_distribution_layouts() {
    let Some(tools) = cuda_tools() else { return };
    let node = NodeDirs::profile("dgx-a100-mig");
    let profile = Profile::from_yaml_str(
        &std::fs::read_to_string(topodra_fake_nvml::profiles_dir().join("dgx-a100-mig.yaml"))
            .unwrap(),
    )
    .unwrap();
    let version = profile.driver_version.clone();
    let cuda_gpus = driver_root::CudaGpu::from_profile(&profile);

    // The driver in the RHEL layout, where the simulated node had Debian's.
    std::fs::remove_dir_all(&node.sim.driver_root).unwrap();
    let root = DriverRoot::build(
        &node.sim.driver_root,
        Layout::Rhel,
        &version,
        &driver_root::Options {
            gpu_minors: profile.gpus.iter().map(|g| g.minor).collect(),
            cuda_gpus: cuda_gpus.clone(),
            cuda_driver_version: profile.cuda_driver_version,
            device_nodes: false,
            ..driver_root::Options::default()
        },
    )
    .unwrap();
    assert_eq!(root.lib_dir(), node.sim.driver_root.join("usr/lib64"));

    // The host's nodes, as the driver makes them with NVreg_DeviceFileMode=0660.
    let dev = node.sim.dev_root.join("dev");
    let uvm = proc_major(&node, "nvidia-uvm");
    for g in &profile.gpus {
        mknod(
            &dev.join(format!("nvidia{}", g.minor)),
            NVIDIA_MAJOR,
            u64::from(g.minor),
            GPU_NODE_MODE,
        );
    }
    mknod(
        &dev.join("nvidiactl"),
        NVIDIA_MAJOR,
        NVIDIACTL_MINOR,
        GPU_NODE_MODE,
    );
    mknod(&dev.join("nvidia-uvm"), uvm, 0, GPU_NODE_MODE);
    mknod(&dev.join("nvidia-uvm-tools"), uvm, 1, GPU_NODE_MODE);
    let caps = proc_major(&node, "nvidia-caps");
    for minor in capability_minors(&node) {
        mknod(
            &dev.join(format!("nvidia-caps/nvidia-cap{minor}")),
            caps,
            minor,
            CAP_NODE_MODE,
        );
    }

    let api = MockApiServer::start().await.unwrap();
    api.add_node(&node.name, "node-uid-1");
    let kubeconfig = api.kubeconfig(node.root.path()).unwrap();
    let mut plugin = Plugin::start(&node, &kubeconfig, &[]);
    plugin.wait_live(Duration::from_secs(60)).await;

    // A whole GPU (GPU 3 is not in MIG mode) and a MIG device of GPU 1.
    let whole = "gpu-3";
    let mig = "gpu-1-mig-2-0";
    api.put_claim(claim_json("whole", "node-a", &[whole], None));
    api.put_claim(claim_json("mig", "node-a", &[mig], None));
    let resp = prepare(&node, &["whole", "mig"]).await;
    for uid in ["whole", "mig"] {
        assert_eq!(resp.claims[uid].error, "", "{uid}: {}", plugin.logs());
    }
    let spec_text = std::fs::read_to_string(node.cdi_dir().join(&node.cdi_specs()[0])).unwrap();
    assert!(
        spec_text.contains(
            &tools
                .hook
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        ),
        "{spec_text}"
    );

    let dir = tempfile::tempdir().unwrap();
    let host_cuda = "/usr/lib64/libcuda.so.1";
    let profile_cuda = profile.cuda_driver_version;

    // The whole GPU, an image without forward-compatibility libraries.
    let bundle = make_image(&dir.path().join("plain"), &tools, None);
    let seen = run_claim(&tools, &node, &bundle, &cdi_ids(&resp.claims["whole"]));
    assert!(
        seen.ldcache
            .iter()
            .any(|l| l.starts_with("libcuda.so.1 ") && l.ends_with(&host_cuda)),
        "{seen:?}"
    );
    assert_eq!(
        seen.devlib,
        format!("/usr/lib64/libcuda.so.{version}"),
        "{seen:?}"
    );
    // CUDA sees the one GPU whose node the spec injected, not the node's eight.
    assert!(
        seen.cuda
            .starts_with(&format!("init=0 version={profile_cuda} count=1 ")),
        "{seen:?}"
    );
    assert!(seen.cuda.ends_with(&format!("lib={host_cuda}")), "{seen:?}");
    assert_eq!(seen.devlink, "ok", "{seen:?}");
    assert!(
        !seen.smi.is_empty() && !seen.smi.contains("not found"),
        "{seen:?}"
    );
    let gpu3 = profile.gpus.iter().find(|g| g.minor == 3).unwrap();
    assert_eq!(seen.uuid, gpu3.uuid, "{seen:?}");
    let mode = format!("{GPU_NODE_MODE:o}");
    let want: BTreeMap<String, String> = [
        format!("/dev/nvidia{}", gpu3.minor),
        "/dev/nvidiactl".into(),
        "/dev/nvidia-uvm".into(),
        "/dev/nvidia-uvm-tools".into(),
    ]
    .into_iter()
    .map(|n| (n, mode.clone()))
    .collect();
    assert_eq!(seen.nodes, want, "{seen:?}");

    // The MIG device, an image with a newer forward-compatibility driver: the
    // compat libcuda is the one loaded.
    let bundle = make_image(&dir.path().join("compat"), &tools, Some(&cuda_gpus));
    let seen = run_claim(&tools, &node, &bundle, &cdi_ids(&resp.claims["mig"]));
    // One device: the MIG device's parent is the only GPU node there. (The fake
    // knows whole GPUs only, so its UUID is the parent's; a real driver answers
    // the MIG UUID to cuDeviceGetUuid_v2, which is why it is not asserted here.)
    assert!(
        seen.cuda
            .starts_with(&format!("init=0 version={COMPAT_CUDA} count=1 ")),
        "{seen:?}"
    );
    assert!(seen.cuda.contains("/usr/local/cuda/compat/"), "{seen:?}");
    assert_eq!(seen.devlink, "ok", "{seen:?}");
    let caps: Vec<(&String, &String)> = seen
        .nodes
        .iter()
        .filter(|(n, _)| n.starts_with("/dev/nvidia-caps/"))
        .collect();
    assert_eq!(caps.len(), 2, "{seen:?}");
    assert!(
        caps.iter()
            .all(|(_, m)| **m == format!("{CAP_NODE_MODE:o}")),
        "{seen:?}"
    );
    assert!(
        seen.nodes.contains_key("/dev/nvidia1"),
        "the MIG device's parent: {seen:?}"
    );
    let gpus: Vec<&String> = seen
        .nodes
        .keys()
        .filter(|n| n.trim_start_matches("/dev/nvidia").parse::<u32>().is_ok())
        .collect();
    assert_eq!(gpus, ["/dev/nvidia1"], "{seen:?}");

    assert!(plugin.terminate().success(), "{}", plugin.logs());
}
