use super::*;

fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

fn tracker(policy: HealthPolicy) -> Tracker {
    let mut tr = Tracker::new(policy, ["gpu-0".to_owned(), "gpu-1".to_owned()], t(0));
    assert!(tr.on_probe("gpu-0", &Probe::Ok, t(0)));
    assert!(tr.on_probe("gpu-1", &Probe::Ok, t(0)));
    tr
}

fn status(tr: &Tracker, dev: &str) -> Status {
    tr.health(dev).unwrap().status
}

#[test]
fn starts_unknown_until_probed() {
    let mut tr = Tracker::new(HealthPolicy::default(), ["gpu-0".to_owned()], t(0));
    assert_eq!(status(&tr, "gpu-0"), Status::Unknown);
    assert!(tr.on_probe("gpu-0", &Probe::Error("busy".into()), t(1)));
    assert_eq!(status(&tr, "gpu-0"), Status::Unknown);
    assert!(tr.health("gpu-0").unwrap().reason.contains("busy"));
    assert!(tr.on_probe("gpu-0", &Probe::Ok, t(2)));
    assert_eq!(status(&tr, "gpu-0"), Status::Healthy);
    assert_eq!(tr.health("gpu-0").unwrap().since, t(2));
}

#[test]
fn fatal_xid_marks_only_that_gpu() {
    let mut tr = tracker(HealthPolicy::default());
    assert!(tr.on_xid("gpu-1", 79, t(10)));
    let h = tr.health("gpu-1").unwrap();
    assert_eq!(h.status, Status::Unhealthy);
    assert_eq!(h.reason, "XID 79: GPU has fallen off the bus");
    assert_eq!(h.cause, Some(Cause::Xid(79)));
    assert_eq!(h.since, t(10));
    assert_eq!(status(&tr, "gpu-0"), Status::Healthy);
}

#[test]
fn application_xids_are_ignored() {
    let mut tr = tracker(HealthPolicy::default());
    for xid in [13, 31, 43, 45, 68, 109] {
        assert!(!tr.on_xid("gpu-0", xid, t(10)), "XID {xid}");
    }
    assert_eq!(status(&tr, "gpu-0"), Status::Healthy);
}

#[test]
fn fatal_table_and_unlisted_xids() {
    let policy = HealthPolicy::default();
    for xid in [48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 999, 4242] {
        assert!(policy.is_fatal(xid), "XID {xid}");
    }
    let lenient = HealthPolicy {
        unlisted_fatal: false,
        ..HealthPolicy::default()
    };
    assert!(!lenient.is_fatal(4242));
    assert!(lenient.is_fatal(79));
}

#[test]
fn operator_override_ignores_xids() {
    let policy = HealthPolicy {
        ignored_xids: [63, 92].into(),
        ..HealthPolicy::default()
    };
    let mut tr = tracker(policy);
    assert!(!tr.on_xid("gpu-0", 63, t(1)));
    assert!(!tr.on_xid("gpu-0", 92, t(1)));
    assert_eq!(status(&tr, "gpu-0"), Status::Healthy);
    assert!(tr.on_xid("gpu-0", 79, t(1)));
}

#[test]
fn recovers_after_quiet_period_and_successful_probe() {
    let policy = HealthPolicy {
        quiet_period: Duration::from_secs(300),
        ..HealthPolicy::default()
    };
    let mut tr = tracker(policy);
    assert!(tr.on_xid("gpu-0", 48, t(100)));
    // Probes inside the quiet period change nothing.
    assert!(!tr.on_probe("gpu-0", &Probe::Ok, t(130)));
    assert!(!tr.on_probe("gpu-0", &Probe::Ok, t(399)));
    // Another fatal XID restarts the quiet period, keeping the first `since`.
    assert!(!tr.on_xid("gpu-0", 48, t(350)));
    assert_eq!(tr.health("gpu-0").unwrap().since, t(100));
    assert!(!tr.on_probe("gpu-0", &Probe::Ok, t(500)));
    assert_eq!(status(&tr, "gpu-0"), Status::Unhealthy);
    // Quiet long enough, but the probe fails: still unhealthy.
    assert!(!tr.on_probe("gpu-0", &Probe::Error("timeout".into()), t(660)));
    assert_eq!(status(&tr, "gpu-0"), Status::Unhealthy);
    assert!(tr.on_probe("gpu-0", &Probe::Ok, t(661)));
    let h = tr.health("gpu-0").unwrap();
    assert_eq!(
        (h.status, h.cause, h.since),
        (Status::Healthy, None, t(661))
    );
}

#[test]
fn clock_going_back_restarts_the_quiet_period() {
    let mut tr = tracker(HealthPolicy::default());
    assert!(tr.on_xid("gpu-0", 79, t(10_000)));
    assert!(!tr.on_probe("gpu-0", &Probe::Ok, t(100)));
    assert!(!tr.on_probe("gpu-0", &Probe::Ok, t(399)));
    assert!(tr.on_probe("gpu-0", &Probe::Ok, t(400)));
}

#[test]
fn lost_until_queries_succeed() {
    let mut tr = tracker(HealthPolicy::default());
    assert!(tr.on_probe("gpu-1", &Probe::Lost, t(5)));
    let h = tr.health("gpu-1").unwrap();
    assert_eq!((h.status, h.cause), (Status::Unhealthy, Some(Cause::Lost)));
    assert!(!tr.on_probe("gpu-1", &Probe::Lost, t(35)));
    // An XID while lost keeps the lost verdict, which is the more severe.
    assert!(!tr.on_xid("gpu-1", 79, t(36)));
    assert_eq!(tr.health("gpu-1").unwrap().cause, Some(Cause::Lost));
    // Back on the bus: no longer lost, but the XID still needs its quiet period.
    assert!(tr.on_probe("gpu-1", &Probe::Ok, t(40)));
    assert_eq!(tr.health("gpu-1").unwrap().cause, Some(Cause::Xid(79)));
    assert!(tr.on_probe("gpu-1", &Probe::Ok, t(36 + 300)));
    assert_eq!(status(&tr, "gpu-1"), Status::Healthy);
}

#[test]
fn lost_without_xid_recovers_on_first_good_probe() {
    let mut tr = tracker(HealthPolicy::default());
    assert!(tr.on_probe("gpu-0", &Probe::Lost, t(5)));
    assert!(tr.on_probe("gpu-0", &Probe::Ok, t(6)));
    assert_eq!(status(&tr, "gpu-0"), Status::Healthy);
}

#[test]
fn nvml_unavailable_follows_policy_but_keeps_failures() {
    let mut tr = tracker(HealthPolicy::default());
    assert!(tr.on_xid("gpu-1", 79, t(1)));
    assert!(tr.on_unavailable("driver not loaded", t(2)));
    assert_eq!(status(&tr, "gpu-0"), Status::Unknown);
    assert!(
        tr.health("gpu-0")
            .unwrap()
            .reason
            .contains("driver not loaded")
    );
    assert_eq!(status(&tr, "gpu-1"), Status::Unhealthy);
    // Reopened: Unknown until probed.
    assert!(tr.on_available(t(3)));
    assert_eq!(status(&tr, "gpu-0"), Status::Unknown);
    assert!(tr.on_probe("gpu-0", &Probe::Ok, t(4)));
    assert_eq!(status(&tr, "gpu-0"), Status::Healthy);

    let optimistic = HealthPolicy {
        when_unavailable: Status::Healthy,
        ..HealthPolicy::default()
    };
    let mut tr = Tracker::new(optimistic, ["gpu-0".to_owned()], t(0));
    assert!(tr.on_unavailable("no library", t(1)));
    assert_eq!(status(&tr, "gpu-0"), Status::Healthy);
}

#[test]
fn unknown_devices_are_ignored() {
    let mut tr = tracker(HealthPolicy::default());
    assert!(!tr.on_xid("gpu-9", 79, t(1)));
    assert!(!tr.on_probe("gpu-9", &Probe::Lost, t(1)));
    assert_eq!(tr.state().devices.len(), 2);
}
