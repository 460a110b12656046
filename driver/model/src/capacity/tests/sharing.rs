//! The model on a time-sliced DGX H100: shared devices are no GPUs of their own,
//! and a GPU that holds shares is not free for a whole-GPU claim.

use super::*;
use crate::slice::{Sharing, TimeSlicing};

fn shared_cluster(node: &str) -> Cluster {
    let opts = SliceOptions {
        sharing: Sharing {
            time_slicing: Some(TimeSlicing::default()),
            ..Default::default()
        },
        ..SliceOptions::new(node)
    };
    let mut c = Cluster::new(DRIVER);
    for s in build_slices(&dgx_h100(), &opts).unwrap() {
        c.apply_slice(&s);
    }
    c
}

fn share(name: &str, node: &str, device: &str, share_id: &str) -> ResourceClaim {
    let mut c = claim(name, node, &[]);
    if let Some(r) = c
        .status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
    {
        r.results = Some(vec![DeviceRequestAllocationResult {
            driver: DRIVER.to_owned(),
            pool: node.to_owned(),
            device: device.to_owned(),
            request: "gpus".to_owned(),
            share_id: Some(share_id.to_owned()),
            ..Default::default()
        }]);
    }
    c
}

#[test]
fn time_sliced_devices_are_not_counted_as_gpus() {
    let c = shared_cluster("node-a");
    let s = c.node("node-a").unwrap();
    assert_eq!((s.gpus.total, s.gpus.free, s.gpus.blocked), (8, 8, 0));
    assert_eq!(s.mig_devices.total, 0);
}

#[test]
fn a_shared_gpu_is_blocked_for_whole_gpu_claims_until_its_last_share_goes() {
    let mut c = shared_cluster("node-a");
    c.apply_claim(&share("a", "node-a", "gpu-7-ts", "s1"));
    c.apply_claim(&share("b", "node-a", "gpu-7-ts", "s2"));
    let s = c.node("node-a").unwrap();
    assert_eq!(
        (s.gpus.free, s.gpus.blocked, s.gpus.allocated),
        (7, 1, 0),
        "gpu-7 holds shares: blocked, not free"
    );
    c.delete_claim(&ClaimKey {
        namespace: "default".to_owned(),
        name: "a".to_owned(),
    });
    assert_eq!(c.node("node-a").unwrap().gpus.free, 7, "one share is left");
    c.delete_claim(&ClaimKey {
        namespace: "default".to_owned(),
        name: "b".to_owned(),
    });
    assert_eq!(c.node("node-a").unwrap().gpus.free, 8);
}
