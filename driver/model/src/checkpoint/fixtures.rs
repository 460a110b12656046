//! Checkpoints for tests of this crate and of the node crate (feature
//! `test-fixtures`): a sample with every state, its version 1 file, and arbitrary
//! checkpoints for property tests.

// Fixtures panic on bad test data, as the tests that use them would.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;

use super::format::checksum_of;
use super::*;

/// A version 1 file as the plugin wrote it, holding [`sample`]. It must parse
/// forever; never edit it.
pub const V1_FIXTURE: &str = include_str!("testdata/v1.json");

/// An envelope around arbitrary data text, with a correct checksum.
pub fn envelope(version: u64, data: &str) -> String {
    format!(
        r#"{{"version":{version},"checksum":"sha256:{}","data":{data}}}"#,
        checksum_of(data)
    )
}

pub fn device(pool: &str, name: &str, claim: &str) -> PreparedGpu {
    PreparedGpu {
        requests: vec!["gpu".into()],
        pool: pool.into(),
        device: name.into(),
        cdi_device_ids: vec![format!("k8s.gpu.topodra.dev/claim={claim}-{name}")],
        share_id: None,
        mig: None,
        sharing: None,
    }
}

pub fn claim(uid: &str) -> ClaimIdentity {
    ClaimIdentity {
        uid: uid.into(),
        namespace: "ns".into(),
        name: format!("claim-{uid}"),
    }
}

pub fn sample() -> Checkpoint {
    let mut cp = Checkpoint::new("boot-a");
    begin_prepare(
        &mut cp,
        claim("u1"),
        vec![
            device("node-1", "gpu-0", "u1"),
            device("node-1", "gpu-1", "u1"),
        ],
        Some("/var/run/cdi/k8s.gpu.topodra.dev-claim_u1.json".into()),
        100,
    )
    .unwrap();
    complete_prepare(&mut cp, "u1", 101).unwrap();
    begin_prepare(
        &mut cp,
        claim("u2"),
        vec![PreparedGpu {
            share_id: Some("ts-1".into()),
            ..device("node-1", "gpu-3", "u2")
        }],
        None,
        102,
    )
    .unwrap();
    cp
}

fn text() -> impl Strategy<Value = String> {
    // Any scalar values, so JSON escaping of controls and non-BMP chars is covered.
    prop::collection::vec(any::<char>(), 0..10).prop_map(String::from_iter)
}

fn prepared_device() -> impl Strategy<Value = PreparedGpu> {
    (
        prop::collection::vec(text(), 0..3),
        text(),
        text(),
        prop::collection::vec(text(), 0..3),
        prop::option::of(text()),
        prop::option::of((text(), any::<u32>(), any::<u32>(), any::<u32>())),
        prop::option::of((
            any::<bool>(),
            (text(), text()),
            0u8..4,
            prop::option::of(any::<u64>()),
            prop::option::of(any::<u32>()),
            prop::option::of(text()),
            prop::option::of(any::<u32>()),
        )),
    )
        .prop_map(
            |(requests, pool, device, cdi_device_ids, share_id, mig, sharing)| PreparedGpu {
                requests,
                pool,
                device,
                cdi_device_ids,
                share_id,
                mig: mig.map(|(parent_uuid, profile_id, start, size)| MigIntent {
                    parent_uuid,
                    profile_id,
                    start,
                    size,
                }),
                sharing: sharing.map(
                    |(
                        mps,
                        (gpu_device, gpu_uuid),
                        timeslice,
                        memory_bytes,
                        compute,
                        pipe,
                        prior,
                    )| {
                        ShareIntent {
                            mode: if mps {
                                ShareMode::Mps
                            } else {
                                ShareMode::TimeSlicing
                            },
                            gpu_device,
                            gpu_uuid,
                            timeslice,
                            memory_bytes,
                            compute_percent: compute,
                            pipe_dir: pipe,
                            prior_compute_mode: prior,
                        }
                    },
                ),
            },
        )
}

fn record() -> impl Strategy<Value = ClaimRecord> {
    (
        (text(), text(), text()),
        prop_oneof![
            Just(ClaimState::PrepareStarted),
            Just(ClaimState::PrepareCompleted),
            Just(ClaimState::NeedsReprepare),
        ],
        prop::collection::vec(prepared_device(), 0..3),
        prop::option::of(text()),
        any::<u64>(),
    )
        .prop_map(
            |((uid, namespace, name), state, devices, cdi_spec, updated_at)| ClaimRecord {
                uid,
                namespace,
                name,
                state,
                devices,
                cdi_spec,
                updated_at,
            },
        )
}

pub fn arb_checkpoint() -> impl Strategy<Value = Checkpoint> {
    (text(), prop::collection::vec(record(), 0..4)).prop_map(|(boot_id, records)| {
        let mut cp = Checkpoint::new(boot_id);
        for r in records {
            cp.insert(r);
        }
        cp
    })
}
