use super::*;

fn parse(flags: &[&str]) -> Result<Args, clap::Error> {
    let matches = Args::command()
        .try_get_matches_from(std::iter::once("topodra-controller").chain(flags.iter().copied()))?;
    Args::from_arg_matches(&matches)
}

#[test]
fn defaults_are_valid_and_bad_lease_timing_is_refused() {
    let args = parse(&[]).unwrap();
    assert!(args.validate().is_ok());
    assert_eq!(args.http.addr(), "0.0.0.0:9465".parse().unwrap());
    let args = parse(&[
        "--lease-duration-seconds=5",
        "--lease-renew-before-seconds=5",
    ])
    .unwrap();
    assert!(
        args.validate()
            .unwrap_err()
            .contains("--lease-renew-before-seconds")
    );
    assert!(parse(&["--nrt-topology-manager-policy=strict"]).is_err());
}

/// The endpoint's limits are the plugin's (one set of flags in topodra-ops), zero
/// refused.
#[test]
fn http_limits_are_the_plugins() {
    let limits = parse(&[]).unwrap().http.limits();
    assert_eq!(
        limits.header_read_timeout,
        std::time::Duration::from_secs(5)
    );
    assert_eq!(limits.max_connections, 32);
    assert_eq!(limits.write_timeout, std::time::Duration::from_secs(10));
    assert_eq!(limits.max_requests_per_connection, 100);
    for flag in [
        "--http-header-read-timeout-seconds=0",
        "--http-max-connections=0",
        "--http-write-timeout-seconds=0",
        "--http-max-requests-per-connection=0",
    ] {
        assert!(parse(&[flag]).is_err(), "{flag}");
    }
}

#[test]
fn classes_come_comma_separated() {
    let args = parse(&["--device-class=a,b"]).unwrap();
    assert_eq!(args.device_classes, ["a", "b"]);
}

/// The Helm chart and the e2e tests pass these; a change of the flags must not
/// rename one.
#[test]
fn flag_names_and_environment_variables_stay_as_they_were() {
    let mut flags: Vec<(String, String)> = Args::command()
        .get_arguments()
        .filter_map(|a| {
            let env = a.get_env()?.to_str()?.to_owned();
            Some((a.get_long()?.to_owned(), env))
        })
        .collect();
    flags.sort();
    let mut expected: Vec<(String, String)> = [
        ("driver-name", "TOPODRA_DRIVER_NAME"),
        ("device-class", "TOPODRA_DEVICE_CLASSES"),
        ("cpu-driver-name", "TOPODRA_CPU_DRIVER_NAME"),
        ("numa-node-aliases", "TOPODRA_NUMA_NODE_ALIASES"),
        ("node-resource-topology", "TOPODRA_NODE_RESOURCE_TOPOLOGY"),
        ("nrt-resource-name", "TOPODRA_NRT_RESOURCE_NAME"),
        ("nrt-topology-manager-policy", "TOPODRA_NRT_POLICY"),
        ("nrt-topology-manager-scope", "TOPODRA_NRT_SCOPE"),
        ("pending-pod-events", "TOPODRA_PENDING_POD_EVENTS"),
        (
            "pending-event-min-interval-seconds",
            "TOPODRA_PENDING_EVENT_MIN_INTERVAL_SECONDS",
        ),
        (
            "write-delay-milliseconds",
            "TOPODRA_WRITE_DELAY_MILLISECONDS",
        ),
        ("nrt-writes-per-second", "TOPODRA_NRT_WRITES_PER_SECOND"),
        (
            "nrt-node-interval-seconds",
            "TOPODRA_NRT_NODE_INTERVAL_SECONDS",
        ),
        ("leader-elect", "TOPODRA_LEADER_ELECT"),
        ("lease-namespace", "POD_NAMESPACE"),
        ("lease-name", "TOPODRA_LEASE_NAME"),
        ("identity", "POD_NAME"),
        ("lease-duration-seconds", "TOPODRA_LEASE_DURATION_SECONDS"),
        (
            "lease-renew-before-seconds",
            "TOPODRA_LEASE_RENEW_BEFORE_SECONDS",
        ),
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
        ("log-format", "TOPODRA_LOG_FORMAT"),
        ("log-level", "TOPODRA_LOG"),
    ]
    .iter()
    .map(|(f, e)| ((*f).to_owned(), (*e).to_owned()))
    .collect();
    expected.sort();
    assert_eq!(flags, expected);
}
