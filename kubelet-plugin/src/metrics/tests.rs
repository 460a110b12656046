use std::time::Duration;

use super::*;

#[test]
fn encodes_latency_errors_and_api_totals() {
    let requests = RequestCounter::new();
    let m = Metrics::new(&requests);
    m.claims().observe_prepare(Duration::from_millis(3), "ok");
    m.claims()
        .observe_prepare(Duration::from_millis(3), "config");
    m.claims().set_prepared_devices(8);
    let nodes = http::Request::get("/api/v1/nodes/n").body(()).unwrap();
    for _ in 0..3 {
        requests.record(&nodes, topodra_ops::requests::Code::Status(200));
    }
    let text = m.encode();
    assert!(
        text.contains("topodra_prepare_duration_seconds_count{outcome=\"ok\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("topodra_claim_errors_total{operation=\"prepare\",kind=\"config\"} 1"),
        "{text}"
    );
    assert!(text.contains("topodra_prepared_devices 8"), "{text}");
    assert!(
        text.contains("topodra_api_requests_total{verb=\"get\",resource=\"nodes\",code=\"200\"} 3"),
        "{text}"
    );
    assert!(text.contains("topodra_build_info{version=\""), "{text}");
}

#[test]
fn health_counts_by_state_and_cause_and_causes_that_went_stay_at_zero() {
    use topodra_model::health::{Cause, Verdict};
    let m = Metrics::new(&RequestCounter::new());
    let h = |status, cause| Verdict {
        status,
        since: SystemTime::UNIX_EPOCH,
        reason: String::new(),
        cause,
    };
    let mut state = HealthState::default();
    state
        .devices
        .insert("gpu-0".into(), h(Status::Healthy, None));
    state
        .devices
        .insert("gpu-1".into(), h(Status::Unhealthy, Some(Cause::Xid(79))));
    state
        .devices
        .insert("gpu-2".into(), h(Status::Unknown, None));
    m.set_health(&state);
    let text = m.encode();
    for line in [
        "topodra_device_health{state=\"healthy\"} 1",
        "topodra_device_health{state=\"unhealthy\"} 1",
        "topodra_device_health{state=\"unknown\"} 1",
        "topodra_unhealthy_devices{cause=\"xid-79\"} 1",
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
    state
        .devices
        .insert("gpu-1".into(), h(Status::Healthy, None));
    m.set_health(&state);
    let text = m.encode();
    assert!(
        text.contains("topodra_unhealthy_devices{cause=\"xid-79\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("topodra_device_health{state=\"healthy\"} 2"),
        "{text}"
    );
}

#[test]
fn xids_and_nvml_errors_are_counted() {
    use topodra_node::monitor::Observed;
    let m = Metrics::new(&RequestCounter::new());
    m.observe_health(Observed::Xid {
        xid: 79,
        fatal: true,
    });
    m.observe_health(Observed::Xid {
        xid: 13,
        fatal: false,
    });
    m.observe_health(Observed::NvmlWaitFailed);
    m.observe_health(Observed::NvmlWaitFailed);
    m.observe_health(Observed::EventGpus(8));
    let text = m.encode();
    for line in [
        "topodra_health_event_gpus 8",
        "topodra_xid_events_total{xid=\"79\",fatal=\"true\"} 1",
        "topodra_xid_events_total{xid=\"13\",fatal=\"false\"} 1",
        "topodra_nvml_errors_total{operation=\"event_wait\"} 2",
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
}

#[test]
fn publish_failures_count_every_failure_of_a_streak() {
    let m = Metrics::new(&RequestCounter::new());
    let failing = |n| PublishStatus::Failing {
        consecutive_failures: n,
        error: "e".into(),
    };
    m.set_publish(&PublishStatus::Starting, &failing(1));
    // Two more failures seen as one change.
    m.set_publish(&failing(1), &failing(3));
    let text = m.encode();
    assert!(text.contains("topodra_publish_failures_total 3"), "{text}");
    assert!(text.contains("topodra_publish_in_sync 0"), "{text}");
    assert!(
        text.contains("topodra_last_publish_success_timestamp_seconds 0"),
        "{text}"
    );
    m.set_publish(&failing(3), &PublishStatus::InSync { generation: 2 });
    let text = m.encode();
    assert!(text.contains("topodra_publish_in_sync 1"), "{text}");
    assert!(
        !text.contains("topodra_last_publish_success_timestamp_seconds 0"),
        "{text}"
    );
    // A new streak starts from zero.
    m.set_publish(&PublishStatus::InSync { generation: 2 }, &failing(1));
    assert!(m.encode().contains("topodra_publish_failures_total 4"));
}

/// GPUs by NUMA node and state, counted by physical GPU: a MIG GPU is one GPU,
/// prepared when a claim holds one of its MIG devices, unhealthy when one of them
/// is; a GPU without a NUMA node is under `none`; states that empty stay at 0.
#[test]
fn numa_devices_count_whole_gpus_by_numa_node_and_state() {
    use topodra_model::health::Verdict;
    use topodra_model::{Gpu, MigDevice};
    let gpu = |minor: u32, numa: Option<u32>| {
        let mut g = Gpu::at(format!("0000:{:02x}:00.0", 0x18 + minor).parse().unwrap());
        g.minor = Some(minor);
        g.numa_node = numa;
        g
    };
    let whole = |g: Gpu| AllocatableDevice { gpu: g, mig: None };
    let mig = |g: &Gpu, gi| AllocatableDevice {
        gpu: g.clone(),
        mig: Some(MigDevice {
            uuid: format!("MIG-{gi}"),
            gpu_instance: gi,
            compute_instance: 0,
            profile: None,
            memory_bytes: None,
            multiprocessors: None,
            placement: None,
            profile_id: None,
        }),
    };
    let split = gpu(2, Some(1));
    let devices = vec![
        whole(gpu(0, Some(0))),
        whole(gpu(1, Some(0))),
        mig(&split, 1),
        mig(&split, 2),
        whole(gpu(3, Some(1))),
        whole(gpu(4, None)),
    ];
    let m = Metrics::new(&RequestCounter::new());
    m.set_devices(&devices);
    let has = |text: &str, numa: &str, state: &str, n: u32| {
        let line = format!("topodra_numa_devices{{numa_node=\"{numa}\",state=\"{state}\"}} {n}\n");
        assert!(text.contains(&line), "{line}{text}");
    };
    let text = m.encode();
    assert!(text.contains("topodra_devices 6"), "{text}");
    has(&text, "0", "free", 2);
    has(&text, "1", "free", 2);
    has(&text, "none", "free", 1);
    has(&text, "0", "prepared", 0);
    has(&text, "1", "unhealthy", 0);

    // One MIG device of the split GPU prepared (and shared by two claims' worth
    // of names), gpu-0 prepared, gpu-3 unhealthy.
    m.set_prepared(["gpu-0", "gpu-2-mig-1-0", "gpu-2-mig-1-0"].map(String::from));
    let mut health = HealthState::default();
    for (name, status) in [("gpu-3", Status::Unhealthy), ("gpu-1", Status::Unknown)] {
        health.devices.insert(
            name.to_owned(),
            Verdict {
                status,
                since: SystemTime::UNIX_EPOCH,
                reason: String::new(),
                cause: None,
            },
        );
    }
    m.set_health(&health);
    let text = m.encode();
    has(&text, "0", "prepared", 1);
    // Unknown health is no taint: the GPU can still be allocated.
    has(&text, "0", "free", 1);
    has(&text, "1", "prepared", 1);
    has(&text, "1", "unhealthy", 1);
    has(&text, "1", "free", 0);

    // The claims go and the GPU recovers: back to free, the other states at 0.
    m.set_prepared(Vec::new());
    m.set_health(&HealthState::default());
    let text = m.encode();
    has(&text, "0", "free", 2);
    has(&text, "0", "prepared", 0);
    has(&text, "1", "free", 2);
    has(&text, "1", "prepared", 0);
    has(&text, "1", "unhealthy", 0);
    has(&text, "none", "unhealthy", 0);
}
