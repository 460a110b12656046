//! The health decisions, as pure logic over events and an injected clock: every
//! method takes `now`, so tests drive time by hand.
//!
//! A device is, in order of precedence:
//! 1. Unhealthy (lost) while NVML answers GPU_IS_LOST for it;
//! 2. Unhealthy (XID) from a fatal XID until a successful probe at least
//!    `quiet_period` after the last fatal XID: the quiet period keeps a GPU that
//!    keeps failing from flapping, the probe proves the driver still reaches it;
//! 3. `when_unavailable` while NVML cannot be opened;
//! 4. Unknown until a probe has answered;
//! 5. Healthy.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use super::event::Probe;
use super::model::{Cause, DeviceHealth, HealthState, Status};
use super::xid::{self, XidClass};

/// Default time without a fatal XID before a GPU may be healthy again.
pub(crate) const DEFAULT_QUIET_PERIOD: Duration = Duration::from_secs(5 * 60);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthPolicy {
    /// Operator override: XIDs never acted on, on top of the built-in ignored ones.
    pub ignored_xids: BTreeSet<u64>,
    /// Whether an XID the built-in table does not list is fatal.
    pub unlisted_fatal: bool,
    pub quiet_period: Duration,
    /// Health of devices without a known failure while NVML cannot be opened.
    /// Unknown by default: the plugin cannot vouch for a GPU it cannot see, and
    /// Unknown neither taints nor evicts.
    pub when_unavailable: Status,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self {
            ignored_xids: BTreeSet::new(),
            unlisted_fatal: true,
            quiet_period: DEFAULT_QUIET_PERIOD,
            when_unavailable: Status::Unknown,
        }
    }
}

impl HealthPolicy {
    pub fn is_fatal(&self, xid: u64) -> bool {
        if self.ignored_xids.contains(&xid) {
            return false;
        }
        match xid::classify(xid) {
            XidClass::Fatal(_) => true,
            XidClass::Ignored(_) => false,
            XidClass::Unlisted => self.unlisted_fatal,
        }
    }
}

#[derive(Debug, Clone)]
struct Track {
    lost: bool,
    /// The last fatal XID and when it arrived.
    fatal: Option<(u64, SystemTime)>,
    /// A probe has succeeded since NVML was (re)opened.
    confirmed: bool,
    unavailable: Option<String>,
    probe_error: Option<String>,
    health: DeviceHealth,
}

impl Track {
    fn verdict(&self, policy: &HealthPolicy) -> (Status, String, Option<Cause>) {
        if self.lost {
            return (
                Status::Unhealthy,
                "GPU is lost: NVML answers GPU_IS_LOST or no longer finds it".to_owned(),
                Some(Cause::Lost),
            );
        }
        if let Some((xid, _)) = self.fatal {
            return (Status::Unhealthy, xid::describe(xid), Some(Cause::Xid(xid)));
        }
        if let Some(why) = &self.unavailable {
            return (
                policy.when_unavailable,
                format!("NVML unavailable: {why}"),
                None,
            );
        }
        if !self.confirmed {
            let reason = match &self.probe_error {
                Some(e) => format!("NVML query failed: {e}"),
                None => "not checked yet".to_owned(),
            };
            return (Status::Unknown, reason, None);
        }
        (Status::Healthy, String::new(), None)
    }
}

/// Per-device health state machine.
#[derive(Debug, Clone)]
pub struct Tracker {
    policy: HealthPolicy,
    devices: BTreeMap<String, Track>,
}

impl Tracker {
    /// Every device starts Unknown: nothing has been checked yet.
    pub fn new(
        policy: HealthPolicy,
        devices: impl IntoIterator<Item = String>,
        now: SystemTime,
    ) -> Self {
        let devices = devices
            .into_iter()
            .map(|name| {
                let track = Track {
                    lost: false,
                    fatal: None,
                    confirmed: false,
                    unavailable: None,
                    probe_error: None,
                    health: DeviceHealth {
                        status: Status::Unknown,
                        since: now,
                        reason: "not checked yet".to_owned(),
                        cause: None,
                    },
                };
                (name, track)
            })
            .collect();
        Self { policy, devices }
    }

    pub fn policy(&self) -> &HealthPolicy {
        &self.policy
    }

    pub fn state(&self) -> HealthState {
        HealthState {
            devices: self
                .devices
                .iter()
                .map(|(name, t)| (name.clone(), t.health.clone()))
                .collect(),
        }
    }

    pub fn health(&self, device: &str) -> Option<&DeviceHealth> {
        self.devices.get(device).map(|t| &t.health)
    }

    /// Applies an XID; returns whether the device's health changed. Unknown devices
    /// and ignored XIDs change nothing.
    pub fn on_xid(&mut self, device: &str, xid: u64, now: SystemTime) -> bool {
        if !self.policy.is_fatal(xid) {
            return false;
        }
        self.update(device, now, |t| t.fatal = Some((xid, now)))
    }

    /// Applies a probe result; returns whether the device's health changed.
    pub fn on_probe(&mut self, device: &str, probe: &Probe, now: SystemTime) -> bool {
        let quiet = self.policy.quiet_period;
        self.update(device, now, |t| match probe {
            Probe::Ok => {
                t.lost = false;
                t.confirmed = true;
                t.probe_error = None;
                if let Some((xid, at)) = t.fatal {
                    match now.duration_since(at) {
                        Ok(quiet_for) if quiet_for >= quiet => t.fatal = None,
                        Ok(_) => {}
                        // The wall clock went back: restart the quiet period from
                        // now rather than wait for the clock to catch up.
                        Err(_) => t.fatal = Some((xid, now)),
                    }
                }
            }
            Probe::Lost => t.lost = true,
            Probe::Error(e) => t.probe_error = Some(e.clone()),
        })
    }

    /// NVML could not be opened; returns whether anything changed.
    pub fn on_unavailable(&mut self, why: &str, now: SystemTime) -> bool {
        let names: Vec<String> = self.devices.keys().cloned().collect();
        let mut changed = false;
        for name in names {
            changed |= self.update(&name, now, |t| {
                t.unavailable = Some(why.to_owned());
                t.confirmed = false;
            });
        }
        changed
    }

    /// NVML is open again; devices stay Unknown until probed.
    pub fn on_available(&mut self, now: SystemTime) -> bool {
        let names: Vec<String> = self.devices.keys().cloned().collect();
        let mut changed = false;
        for name in names {
            changed |= self.update(&name, now, |t| t.unavailable = None);
        }
        changed
    }

    fn update(&mut self, device: &str, now: SystemTime, f: impl FnOnce(&mut Track)) -> bool {
        let Some(track) = self.devices.get_mut(device) else {
            return false;
        };
        f(track);
        let (status, reason, cause) = track.verdict(&self.policy);
        let h = &mut track.health;
        if h.status == status && h.reason == reason && h.cause == cause {
            return false;
        }
        *h = DeviceHealth {
            status,
            since: now,
            reason,
            cause,
        };
        true
    }
}

#[cfg(test)]
mod tests {
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
}
