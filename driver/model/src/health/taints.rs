//! Device taints for unhealthy GPUs, for the ResourceSlice publisher.
//!
//! The effect is `NoSchedule` by default: new claims stay off a failed GPU, but
//! pods already running on it are left alone. Evicting them (`NoExecute`) kills
//! work that may still be making progress or checkpointing, and whether that is
//! better than waiting for the job to fail on its own is the operator's call, so
//! it is an option rather than the default.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::resource::v1::DeviceTaint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::model::HealthState;

/// Taint key on unhealthy GPUs; the value says why (`xid-79`, `lost`).
pub const UNHEALTHY_TAINT_KEY: &str = "gpu.topodra.dev/unhealthy";

/// Kubernetes label values are at most this long.
const MAX_LABEL_VALUE: usize = 63;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TaintEffect {
    /// Keep new claims off the device.
    #[default]
    NoSchedule,
    /// Also evict pods whose claims use the device.
    NoExecute,
}

impl TaintEffect {
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Self::NoSchedule => "NoSchedule",
            Self::NoExecute => "NoExecute",
        }
    }
}

/// One taint per unhealthy device, keyed by device name; healthy and unknown
/// devices are absent. `time_added` is when the device became unhealthy, in whole
/// seconds (what the API server keeps, so an unchanged taint compares equal after
/// a round trip), and never later than `now`.
pub fn device_taints(
    state: &HealthState,
    now: SystemTime,
    effect: TaintEffect,
) -> BTreeMap<String, Vec<DeviceTaint>> {
    state
        .unhealthy()
        .map(|(name, h)| {
            let value = h
                .cause
                .map(|c| c.label())
                .unwrap_or_else(|| "unknown".to_owned());
            let taint = DeviceTaint {
                key: UNHEALTHY_TAINT_KEY.to_owned(),
                value: Some(label_value(&value)),
                effect: effect.as_str().to_owned(),
                time_added: Some(Time(whole_seconds(h.since.min(now)))),
            };
            (name.clone(), vec![taint])
        })
        .collect()
}

fn whole_seconds(t: SystemTime) -> Timestamp {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    i64::try_from(secs)
        .ok()
        .and_then(|s| Timestamp::from_second(s).ok())
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

/// Makes `s` a valid label value: allowed characters only, at most 63, starting
/// and ending alphanumeric.
fn label_value(s: &str) -> String {
    let cleaned: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(MAX_LABEL_VALUE)
        .collect();
    cleaned
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::super::model::{Cause, Status, Verdict};
    use super::*;

    fn at(secs: u64, nanos: u32) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::new(secs, nanos)
    }

    fn state() -> HealthState {
        let dev = |status, cause, since| Verdict {
            status,
            since,
            reason: String::new(),
            cause,
        };
        HealthState {
            devices: [
                ("gpu-0".to_owned(), dev(Status::Healthy, None, at(1, 0))),
                (
                    "gpu-1".to_owned(),
                    dev(
                        Status::Unhealthy,
                        Some(Cause::Xid(79)),
                        at(1_700_000_000, 5),
                    ),
                ),
                (
                    "gpu-2".to_owned(),
                    dev(Status::Unhealthy, Some(Cause::Lost), at(1_700_000_100, 0)),
                ),
                ("gpu-3".to_owned(), dev(Status::Unknown, None, at(1, 0))),
            ]
            .into(),
        }
    }

    #[test]
    fn one_taint_per_unhealthy_device() {
        let taints = device_taints(&state(), at(1_800_000_000, 0), TaintEffect::default());
        assert_eq!(taints.keys().collect::<Vec<_>>(), ["gpu-1", "gpu-2"]);
        let t = &taints["gpu-1"][0];
        assert_eq!(t.key, "gpu.topodra.dev/unhealthy");
        assert_eq!(t.value.as_deref(), Some("xid-79"));
        assert_eq!(t.effect, "NoSchedule");
        assert_eq!(
            t.time_added,
            Some(Time(Timestamp::from_second(1_700_000_000).unwrap()))
        );
        assert_eq!(taints["gpu-2"][0].value.as_deref(), Some("lost"));
    }

    #[test]
    fn no_execute_on_request_and_time_clamped_to_now() {
        let taints = device_taints(&state(), at(1_700_000_050, 0), TaintEffect::NoExecute);
        assert_eq!(taints["gpu-1"][0].effect, "NoExecute");
        assert_eq!(
            taints["gpu-2"][0].time_added,
            Some(Time(Timestamp::from_second(1_700_000_050).unwrap()))
        );
    }

    #[test]
    fn label_values_are_valid() {
        assert_eq!(label_value("xid-79"), "xid-79");
        assert_eq!(label_value("-a b/c-"), "a-b-c");
        assert_eq!(label_value(&"x".repeat(100)).len(), 63);
    }
}
