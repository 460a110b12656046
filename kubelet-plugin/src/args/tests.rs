use std::net::SocketAddr;

use clap::Parser;

use super::*;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
}

fn http_addr(flags: &[&str]) -> Result<SocketAddr, clap::Error> {
    let argv = ["serve", "--node-name=node-a"].iter().chain(flags);
    Cli::try_parse_from(argv).map(|c| c.serve.http.addr())
}

#[test]
fn http_endpoint_address_from_bind_address_and_port() {
    assert_eq!(http_addr(&[]).unwrap(), "0.0.0.0:9464".parse().unwrap());
    assert_eq!(
        http_addr(&["--http-bind-address=10.1.2.3", "--http-port=9000"]).unwrap(),
        "10.1.2.3:9000".parse().unwrap()
    );
    // A pod IP from the downward API is a bare IPv6 address, without brackets.
    assert_eq!(
        http_addr(&["--http-bind-address=fd00::12"]).unwrap(),
        "[fd00::12]:9464".parse().unwrap()
    );
    assert_eq!(
        http_addr(&["--http-bind-address=10.1.2.3", "--http-addr=127.0.0.1:0"]).unwrap(),
        "127.0.0.1:0".parse().unwrap()
    );
    assert!(http_addr(&["--http-bind-address=node-a.local"]).is_err());
}

#[test]
fn numa_node_aliases_are_a_checked_list() {
    let parse = |flags: &[&str]| {
        let argv = ["serve", "--node-name=node-a"].iter().chain(flags);
        Cli::try_parse_from(argv).map(|c| c.serve)
    };
    assert!(parse(&[]).unwrap().discovery.numa_node_aliases.is_empty());
    let args = parse(&["--numa-node-aliases=dra.net/numaNode,example.com/numa"]).unwrap();
    let got: Vec<String> = args
        .discovery
        .checked_numa_node_aliases()
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(got, ["dra.net/numaNode", "example.com/numa"]);
    // Syntax is clap's to refuse; the driver's own domain needs the driver name.
    assert!(parse(&["--numa-node-aliases=numaNode"]).is_err());
    let own = parse(&["--numa-node-aliases=gpu.topodra.dev/numa"]).unwrap();
    assert!(own.discovery.checked_numa_node_aliases().is_err());
}

#[test]
fn the_attribute_set_is_lean_unless_asked_for_full() {
    let parse = |flags: &[&str]| {
        let argv = ["serve", "--node-name=node-a"].iter().chain(flags);
        Cli::try_parse_from(argv).map(|c| c.serve.discovery.attributes)
    };
    assert_eq!(parse(&[]).unwrap(), AttributeSet::Lean);
    assert_eq!(parse(&["--attributes=full"]).unwrap(), AttributeSet::Full);
    assert_eq!(
        parse(&["--attributes", "lean"]).unwrap(),
        AttributeSet::Lean
    );
    let err = parse(&["--attributes=all"]).unwrap_err();
    assert!(
        err.to_string().contains(r#"expected "lean" or "full""#),
        "{err}"
    );
}

#[test]
fn limits_of_zero_are_refused() {
    for flag in [
        "--http-max-connections=0",
        "--http-header-read-timeout-seconds=0",
        "--http-write-timeout-seconds=0",
        "--http-max-requests-per-connection=0",
        "--max-concurrent-claims-per-call=0",
        "--max-concurrent-claims=0",
        "--call-deadline-seconds=0",
        "--call-deadline-seconds=41",
    ] {
        assert!(http_addr(&[flag]).is_err(), "{flag}");
    }
}

#[test]
fn the_hook_is_installed_into_the_plugin_dir_unless_the_host_has_one() {
    use crate::cdi_hook::HookSetup;
    let setup = |flags: &[&str]| {
        let argv = ["serve", "--node-name=node-a"].iter().chain(flags);
        Cli::try_parse_from(argv).map(|c| c.serve.cdi_hook_setup())
    };
    assert_eq!(
        setup(&[]).unwrap(),
        HookSetup::Install {
            source: "/usr/bin/nvidia-cdi-hook".into(),
            plugin_dir: "/var/lib/kubelet/plugins/gpu.topodra.dev".into(),
        }
    );
    assert_eq!(
        setup(&[
            "--cdi-hook-source=/opt/hook",
            "--kubelet-plugins-dir=/k/plugins",
            "--driver-name=gpu.example.com",
            "--state-dir=/elsewhere",
        ])
        .unwrap(),
        HookSetup::Install {
            source: "/opt/hook".into(),
            plugin_dir: "/k/plugins/gpu.example.com".into(),
        }
    );
    assert_eq!(
        setup(&["--cdi-hook-host-path=/usr/local/bin/nvidia-cdi-hook"]).unwrap(),
        HookSetup::Host {
            path: "/usr/local/bin/nvidia-cdi-hook".into()
        }
    );
    // Installing one hook and naming another cannot both be meant.
    let err = setup(&[
        "--cdi-hook-source=/opt/hook",
        "--cdi-hook-host-path=/usr/bin/nvidia-cdi-hook",
    ])
    .unwrap_err();
    assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
}

/// The Helm chart and the e2e tests pass these; grouping the flags must not
/// rename one.
#[test]
fn flag_names_and_environment_variables_stay_as_they_were() {
    use clap::CommandFactory;

    let mut flags: Vec<(String, String)> = Cli::command()
        .get_arguments()
        .filter_map(|a| {
            let env = a.get_env()?.to_str()?.to_owned();
            Some((a.get_long()?.to_owned(), env))
        })
        .collect();
    flags.sort();
    let mut expected: Vec<(String, String)> = [
        ("node-name", "NODE_NAME"),
        ("driver-name", "TOPODRA_DRIVER_NAME"),
        ("kubelet-registry-dir", "TOPODRA_KUBELET_REGISTRY_DIR"),
        ("kubelet-plugins-dir", "TOPODRA_KUBELET_PLUGINS_DIR"),
        ("state-dir", "TOPODRA_STATE_DIR"),
        ("state-retry-seconds", "TOPODRA_STATE_RETRY_SECONDS"),
        ("pod-uid", "POD_UID"),
        ("cdi-dir", "TOPODRA_CDI_DIR"),
        ("driver-root", "TOPODRA_DRIVER_ROOT"),
        ("driver-root-local", "TOPODRA_DRIVER_ROOT_LOCAL"),
        ("toolkit-cdi-spec", "TOPODRA_TOOLKIT_CDI_SPEC"),
        ("dev-root", "TOPODRA_DEV_ROOT"),
        ("proc-devices", "TOPODRA_PROC_DEVICES"),
        ("nvidia-capabilities-dir", "TOPODRA_NVIDIA_CAPABILITIES_DIR"),
        ("nvml-lib", "TOPODRA_NVML_LIB"),
        ("hwloc-xml", "TOPODRA_HWLOC_XML"),
        ("sysfs-root", "TOPODRA_SYSFS_ROOT"),
        ("numa-node-format", "TOPODRA_NUMA_NODE_FORMAT"),
        ("numa-node-aliases", "TOPODRA_NUMA_NODE_ALIASES"),
        ("attributes", "TOPODRA_ATTRIBUTES"),
        ("http-bind-address", "TOPODRA_HTTP_BIND_ADDRESS"),
        ("http-port", "TOPODRA_HTTP_PORT"),
        ("http-addr", "TOPODRA_HTTP_ADDR"),
        (
            "http-header-read-timeout-seconds",
            "TOPODRA_HTTP_HEADER_READ_TIMEOUT_SECONDS",
        ),
        ("http-max-connections", "TOPODRA_HTTP_MAX_CONNECTIONS"),
        (
            "http-write-timeout-seconds",
            "TOPODRA_HTTP_WRITE_TIMEOUT_SECONDS",
        ),
        (
            "http-max-requests-per-connection",
            "TOPODRA_HTTP_MAX_REQUESTS_PER_CONNECTION",
        ),
        (
            "max-concurrent-claims-per-call",
            "TOPODRA_MAX_CONCURRENT_CLAIMS_PER_CALL",
        ),
        (
            "claim-read-timeout-seconds",
            "TOPODRA_CLAIM_READ_TIMEOUT_SECONDS",
        ),
        (
            "claim-read-deadline-seconds",
            "TOPODRA_CLAIM_READ_DEADLINE_SECONDS",
        ),
        ("call-deadline-seconds", "TOPODRA_CALL_DEADLINE_SECONDS"),
        (
            "stale-claim-check-interval-seconds",
            "TOPODRA_STALE_CLAIM_CHECK_INTERVAL_SECONDS",
        ),
        (
            "stale-claim-grace-seconds",
            "TOPODRA_STALE_CLAIM_GRACE_SECONDS",
        ),
        ("max-concurrent-claims", "TOPODRA_MAX_CONCURRENT_CLAIMS"),
        ("boot-id-file", "TOPODRA_BOOT_ID_FILE"),
        ("cdi-hook-source", "TOPODRA_CDI_HOOK_SOURCE"),
        ("cdi-hook-host-path", "TOPODRA_CDI_HOOK_HOST_PATH"),
        ("ignored-xids", "TOPODRA_IGNORED_XIDS"),
        (
            "health-quiet-period-seconds",
            "TOPODRA_HEALTH_QUIET_PERIOD_SECONDS",
        ),
        ("evict-unhealthy", "TOPODRA_EVICT_UNHEALTHY"),
        ("dynamic-mig", "TOPODRA_DYNAMIC_MIG"),
        ("enable-mig-mode", "TOPODRA_ENABLE_MIG_MODE"),
        ("time-slicing", "TOPODRA_TIME_SLICING"),
        ("time-slice-interval", "TOPODRA_TIME_SLICE_INTERVAL"),
        ("time-slicing-replicas", "TOPODRA_TIME_SLICING_REPLICAS"),
        ("mps", "TOPODRA_MPS"),
        ("mps-replicas", "TOPODRA_MPS_REPLICAS"),
        ("mps-host-namespaces", "TOPODRA_MPS_HOST_NAMESPACES"),
        ("shared-mig-profiles", "TOPODRA_SHARED_MIG_PROFILES"),
        #[cfg(feature = "crash-points")]
        ("test-crash-at", "TOPODRA_TEST_CRASH_AT"),
    ]
    .iter()
    .map(|(f, e)| ((*f).to_owned(), (*e).to_owned()))
    .collect();
    expected.sort();
    assert_eq!(flags, expected);
}

#[test]
fn sharing_flags_parse_and_need_what_they_build_on() {
    let base = ["topodra-kubelet-plugin", "serve", "--node-name", "n"];
    let parse = |extra: &[&str]| {
        let mut args: Vec<&str> = base.to_vec();
        args.extend_from_slice(extra);
        crate::Cli::try_parse_from(args)
    };
    assert!(parse(&["--time-slicing", "--time-slice-interval", "Long"]).is_ok());
    let err = parse(&["--time-slicing", "--time-slice-interval", "Longer"]).unwrap_err();
    assert!(
        err.to_string().contains("Default, Short, Medium or Long"),
        "{err}"
    );
    assert!(parse(&["--mps", "--mps-replicas", "0"]).is_err());
    assert!(parse(&["--mps-host-namespaces"]).is_err(), "needs --mps");
    assert!(
        parse(&["--mps", "--shared-mig-profiles", "3g.40gb"]).is_err(),
        "needs --dynamic-mig"
    );
    assert!(
        parse(&[
            "--mps",
            "--dynamic-mig",
            "--shared-mig-profiles",
            "3g.40gb,1g.10gb"
        ])
        .is_ok()
    );
}
