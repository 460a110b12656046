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
use super::model::{Cause, HealthState, Status, Verdict};
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
    health: Verdict,
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

impl Track {
    /// Unknown: nothing checked yet.
    fn new(now: SystemTime) -> Self {
        Track {
            lost: false,
            fatal: None,
            confirmed: false,
            unavailable: None,
            probe_error: None,
            health: Verdict {
                status: Status::Unknown,
                since: now,
                reason: "not checked yet".to_owned(),
                cause: None,
            },
        }
    }

    fn apply_probe(&mut self, probe: &Probe, quiet: std::time::Duration, now: SystemTime) {
        match probe {
            Probe::Ok => {
                self.lost = false;
                self.confirmed = true;
                self.probe_error = None;
                if let Some((xid, at)) = self.fatal {
                    match now.duration_since(at) {
                        Ok(quiet_for) if quiet_for >= quiet => self.fatal = None,
                        Ok(_) => {}
                        // The wall clock went back: restart the quiet period from
                        // now rather than wait for the clock to catch up.
                        Err(_) => self.fatal = Some((xid, now)),
                    }
                }
            }
            Probe::Lost => self.lost = true,
            Probe::Error(e) => self.probe_error = Some(e.clone()),
        }
    }
}

/// Per-device health state machine.
#[derive(Debug, Clone)]
pub struct Tracker {
    policy: HealthPolicy,
    devices: BTreeMap<String, Track>,
    /// Devices tracked because an error named them alone (dynamic MIG partitions,
    /// which the monitor does not watch), by their GPU's device name: they recover
    /// when their GPU's probes do.
    partitions: BTreeMap<String, String>,
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
            .map(|name| (name, Track::new(now)))
            .collect();
        Self {
            policy,
            devices,
            partitions: BTreeMap::new(),
        }
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

    pub fn health(&self, device: &str) -> Option<&Verdict> {
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

    /// Applies an XID that NVML attributes to one MIG instance which the monitor
    /// does not watch (a dynamic partition, named by where it sits): only that
    /// device becomes unhealthy, not its GPU nor the GPU's other partitions. It
    /// recovers as a GPU does, after the quiet period, with its GPU's next
    /// successful probe. Ignored XIDs change nothing.
    pub fn on_partition_xid(&mut self, device: &str, gpu: &str, xid: u64, now: SystemTime) -> bool {
        if !self.policy.is_fatal(xid) {
            return false;
        }
        if !self.devices.contains_key(device) {
            // Healthy until now: it was not named before, and its GPU answered.
            let mut track = Track::new(now);
            track.confirmed = true;
            track.health.status = Status::Healthy;
            track.health.reason = String::new();
            self.devices.insert(device.to_owned(), track);
            self.partitions.insert(device.to_owned(), gpu.to_owned());
        }
        self.update(device, now, |t| t.fatal = Some((xid, now)))
    }

    /// Applies a probe result; returns whether the device's health changed. A
    /// successful probe of a GPU also lets the partitions an XID named recover.
    pub fn on_probe(&mut self, device: &str, probe: &Probe, now: SystemTime) -> bool {
        let quiet = self.policy.quiet_period;
        let mut changed = self.update(device, now, |t| t.apply_probe(probe, quiet, now));
        if *probe == Probe::Ok {
            let children: Vec<String> = self
                .partitions
                .iter()
                .filter(|(_, gpu)| *gpu == device)
                .map(|(p, _)| p.clone())
                .collect();
            for child in children {
                changed |= self.update(&child, now, |t| t.apply_probe(probe, quiet, now));
            }
        }
        changed
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
        *h = Verdict {
            status,
            since: now,
            reason,
            cause,
        };
        true
    }
}

#[cfg(test)]
mod tests;
