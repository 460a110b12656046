//! Cutting the pool's devices into slices the API accepts.
//!
//! Chunks are contiguous in device order, so the pool reads the same whichever slice
//! boundaries the limits impose, and each is filled as far as the API allows: fewer,
//! fuller slices mean fewer objects for the API server to store and watchers to
//! receive.

use k8s_openapi::api::resource::v1::{CounterSet, Device};

use super::validate::{MAX_COUNTER_SETS, MAX_DEVICES, MAX_DEVICES_RESTRICTED, is_restricted};

/// `cap`, when set, lowers the per-slice limit below the API's (never raises it).
pub(crate) fn into_chunks(devices: Vec<Device>, cap: Option<usize>) -> Vec<Vec<Device>> {
    let cap = cap.unwrap_or(usize::MAX).max(1);
    let mut chunks = Vec::new();
    let mut chunk: Vec<Device> = Vec::new();
    let mut restricted = false;
    for d in devices {
        let with_d = restricted || is_restricted(&d);
        let limit = cap.min(if with_d {
            MAX_DEVICES_RESTRICTED
        } else {
            MAX_DEVICES
        });
        if chunk.len() >= limit {
            chunks.push(std::mem::take(&mut chunk));
            restricted = is_restricted(&d);
        } else {
            restricted = with_d;
        }
        chunk.push(d);
    }
    if !chunk.is_empty() || chunks.is_empty() {
        chunks.push(chunk);
    }
    chunks
}

/// Counter sets in slices of their own, as many to a slice as the API allows;
/// none when there are none.
pub(crate) fn counter_set_chunks(sets: Vec<CounterSet>) -> Vec<Vec<CounterSet>> {
    let mut chunks: Vec<Vec<CounterSet>> = Vec::new();
    for set in sets {
        match chunks.last_mut() {
            Some(last) if last.len() < MAX_COUNTER_SETS => last.push(set),
            _ => chunks.push(vec![set]),
        }
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceTaint};

    fn plain(n: usize) -> Vec<Device> {
        (0..n)
            .map(|i| Device {
                name: format!("gpu-{i}"),
                ..Default::default()
            })
            .collect()
    }

    fn sizes(chunks: &[Vec<Device>]) -> Vec<usize> {
        chunks.iter().map(Vec::len).collect()
    }

    #[test]
    fn plain_devices_fill_slices_of_128() {
        assert_eq!(sizes(&into_chunks(plain(300), None)), [128, 128, 44]);
        assert_eq!(sizes(&into_chunks(plain(128), None)), [128]);
        assert_eq!(sizes(&into_chunks(plain(0), None)), [0]);
    }

    #[test]
    fn a_cap_lowers_the_limit_but_never_raises_it() {
        assert_eq!(sizes(&into_chunks(plain(8), Some(3))), [3, 3, 2]);
        assert_eq!(sizes(&into_chunks(plain(200), Some(1000))), [128, 72]);
        assert_eq!(sizes(&into_chunks(plain(2), Some(0))), [1, 1]);
    }

    #[test]
    fn a_restricted_device_limits_only_its_own_slice() {
        let mut devices = plain(200);
        devices[100].taints = Some(vec![DeviceTaint::default()]);
        // 100 plain devices fill past 64, so the tainted one starts a slice that
        // then stops at 64; the rest go back to 128.
        assert_eq!(sizes(&into_chunks(devices, None)), [100, 64, 36]);

        let mut devices = plain(200);
        devices[10].attributes = Some(
            [(
                "n".to_owned(),
                DeviceAttribute {
                    ints: Some(vec![0]),
                    ..Default::default()
                },
            )]
            .into(),
        );
        assert_eq!(sizes(&into_chunks(devices, None)), [64, 128, 8]);
    }

    #[test]
    fn counter_sets_go_eight_to_a_slice() {
        let sets = |n: usize| {
            (0..n)
                .map(|i| CounterSet {
                    name: format!("gpu-{i}"),
                    ..Default::default()
                })
                .collect::<Vec<_>>()
        };
        let sizes = |c: Vec<Vec<CounterSet>>| c.iter().map(Vec::len).collect::<Vec<_>>();
        assert_eq!(sizes(counter_set_chunks(sets(0))), [0usize; 0]);
        assert_eq!(sizes(counter_set_chunks(sets(8))), [8]);
        assert_eq!(sizes(counter_set_chunks(sets(9))), [8, 1]);
        assert_eq!(sizes(counter_set_chunks(sets(17))), [8, 8, 1]);
    }

    #[test]
    fn chunks_keep_device_order() {
        let names: Vec<String> = into_chunks(plain(300), None)
            .into_iter()
            .flatten()
            .map(|d| d.name)
            .collect();
        let want: Vec<String> = (0..300).map(|i| format!("gpu-{i}")).collect();
        assert_eq!(names, want);
    }
}
