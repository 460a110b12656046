//! `kubectl topodra explain`: why a pod waits for GPUs, in the words of the Event the
//! controller records, then where each of its demands could go.

use std::collections::BTreeMap;

use crate::classes::OurClasses;
use crate::pending::{self, EVENT_REASON, Source};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use topodra_model::capacity::{Candidate, Cluster, Demand, Explanation, Level, amount_text};

use crate::kubectl::table::Table;
use crate::kubectl::terminal::escape;

/// How many candidate nodes a demand lists before "and N more".
const LISTED: usize = 10;

/// The pod name of `pod/NAME`, `pods/NAME`, `po/NAME` or `NAME`.
pub(crate) fn pod_name(arg: &str) -> Result<&str, String> {
    let name = match arg.split_once('/') {
        None => arg,
        Some((kind, name))
            if ["pod", "pods", "po"].contains(&kind.to_ascii_lowercase().as_str()) =>
        {
            name
        }
        Some((kind, _)) => return Err(format!("only pods can be explained, not {kind:?}")),
    };
    if name.is_empty() {
        return Err(format!("no pod name in {arg:?}"));
    }
    Ok(name)
}

/// What became of one of the pod's claims.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ClaimState {
    /// Not allocated, and asks for GPUs of ours: one of the verdict's demands.
    Waiting,
    Allocated,
    NotOurs,
    NotFound,
    /// From a template, and the claim has not been generated yet.
    NotCreated,
    /// From a template that needed no claim.
    NotNeeded,
}

impl ClaimState {
    fn describe(&self, driver: &str) -> String {
        match self {
            ClaimState::Waiting => "waiting for GPUs".to_owned(),
            ClaimState::Allocated => "allocated".to_owned(),
            ClaimState::NotOurs => format!("asks for no device class of {driver}"),
            ClaimState::NotFound => "not found".to_owned(),
            ClaimState::NotCreated => "not created yet".to_owned(),
            ClaimState::NotNeeded => "not needed".to_owned(),
        }
    }
}

/// Each claim of the pod, by the name it is known by, and what became of it.
fn claim_states(
    pod: &Pod,
    claims: &BTreeMap<String, ResourceClaim>,
    classes: &OurClasses,
    driver: &str,
) -> Vec<(String, ClaimState)> {
    let statuses: BTreeMap<&str, Option<&str>> = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (s.name.as_str(), s.resource_claim_name.as_deref()))
        .collect();
    let entries = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref());
    let mut out = Vec::new();
    for c in entries.into_iter().flatten() {
        let name = match (&c.resource_claim_name, statuses.get(c.name.as_str())) {
            (Some(n), _) => n.clone(),
            (None, Some(Some(n))) => (*n).to_owned(),
            (None, Some(None)) => {
                out.push((c.name.clone(), ClaimState::NotNeeded));
                continue;
            }
            (None, None) => {
                let label = match &c.resource_claim_template_name {
                    Some(t) => format!("{} (from template {t})", c.name),
                    None => c.name.clone(),
                };
                out.push((label, ClaimState::NotCreated));
                continue;
            }
        };
        let state = match claims.get(&name) {
            None => ClaimState::NotFound,
            Some(claim)
                if claim
                    .status
                    .as_ref()
                    .is_some_and(|s| s.allocation.is_some()) =>
            {
                ClaimState::Allocated
            }
            Some(claim) => {
                let ours = claim
                    .spec
                    .as_ref()
                    .and_then(|s| Demand::of_claim(s, driver, |class| classes.contains(class)));
                if ours.is_some() {
                    ClaimState::Waiting
                } else {
                    ClaimState::NotOurs
                }
            }
        };
        out.push((name, state));
    }
    out
}

/// What the scheduler says about the pod, when it has said something.
fn scheduling(pod: &Pod) -> String {
    let condition = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    let with_message = |what: &str| match condition.and_then(|c| c.message.as_deref()) {
        Some(m) if !m.is_empty() => format!("{what}: {m}"),
        _ => what.to_owned(),
    };
    if pending::is_unschedulable(pod) {
        with_message("unschedulable")
    } else if let Some(reason) = condition.and_then(|c| c.reason.as_deref()) {
        with_message(reason)
    } else {
        "not tried by the scheduler yet".to_owned()
    }
}

/// One `Label: value` line; the value comes from API objects, so it is escaped.
fn field(out: &mut String, label: &str, value: &str) {
    out.push_str(&format!("{:<12} {}\n", format!("{label}:"), escape(value)));
}

fn pod_id(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The whole answer for a pod bound to a node, which waits for nothing; `None` for a
/// pod not bound yet.
pub(crate) fn scheduled(pod: &Pod) -> Option<String> {
    let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    node.filter(|n| !n.is_empty()).map(|node| {
        format!(
            "Pod {} is scheduled on node {}: it waits for no GPU.\n",
            escape(&pod_id(pod)),
            escape(node)
        )
    })
}

/// The whole answer for one pod; `claims` are the ResourceClaims of the pod's
/// namespace by name.
pub(crate) fn explain_pod(
    cluster: &Cluster,
    cpus: &pending::CpuSide<'_>,
    pod: &Pod,
    claims: &BTreeMap<String, ResourceClaim>,
    classes: &OurClasses,
) -> String {
    let driver = cluster.driver();
    let id = pod_id(pod);
    if let Some(text) = scheduled(pod) {
        return text;
    }
    let states = claim_states(pod, claims, classes, driver);
    let verdict = pending::verdict(cluster, cpus, pod, |n| claims.get(n).cloned(), classes);
    let mut out = String::new();
    let others: Vec<&(String, ClaimState)> = states
        .iter()
        .filter(|(_, s)| *s != ClaimState::Waiting)
        .collect();
    let Some(verdict) = verdict else {
        let unknown = states
            .iter()
            .any(|(_, s)| matches!(s, ClaimState::NotCreated | ClaimState::NotFound));
        let yet = if unknown {
            " that can be judged yet"
        } else {
            ""
        };
        out.push_str(&format!(
            "Pod {} waits for no GPU of {}{yet}.\n",
            escape(&id),
            escape(driver)
        ));
        field(&mut out, "Scheduling", &scheduling(pod));
        if others.is_empty() {
            out.push_str("It has no resource claims, and asks for no extended resource of our device classes.\n");
        } else {
            out.push_str(&other_claims("Claims", &others, driver));
        }
        return out;
    };
    field(&mut out, "Pod", &id);
    field(&mut out, "Scheduling", &scheduling(pod));
    field(&mut out, "Reason", EVENT_REASON);
    field(&mut out, "Message", &verdict.message);
    for (source, demand, explanation) in &verdict.parts {
        out.push('\n');
        let title = match source {
            Source::Claim(name) => format!("Claim {name}"),
            Source::ExtendedResource(r) => format!("Extended resource {r}"),
        };
        out.push_str(&format!("{}: {}\n", escape(&title), demand.describe()));
        out.push_str(&candidates(demand, explanation));
    }
    if !others.is_empty() {
        out.push('\n');
        out.push_str(&other_claims("Other claims", &others, driver));
    }
    out
}

fn other_claims(title: &str, states: &[&(String, ClaimState)], driver: &str) -> String {
    let mut t = Table::new(["CLAIM", "STATE"]);
    for (name, state) in states {
        t.row([name.clone(), state.describe(driver)]);
    }
    let mut out = format!("{title}:\n");
    for line in t.render().lines() {
        out.push_str(&format!("  {line}\n"));
    }
    out
}

/// Where one demand fits now, or the nearest thing to it.
fn candidates(demand: &Demand, e: &Explanation) -> String {
    if demand.shares_only() {
        return share_candidates(demand, e);
    }
    let mut out = String::new();
    let cpus = demand.cpus.is_some();
    if e.fits.is_empty() {
        out.push_str("  Fits now on no node.\n");
        match (&e.best, demand.level) {
            (Some(b), _) if cpus => out.push_str(&format!(
                "  Nearest: {}, {}: {} free GPUs, {} free CPUs\n",
                escape(&b.node),
                escape(b.group.as_deref().unwrap_or_default()),
                b.free,
                b.free_cpus.unwrap_or(0)
            )),
            (Some(b), Some(_)) => out.push_str(&format!(
                "  Largest aligned free set: {} ({}, {})\n",
                b.free,
                escape(&b.node),
                escape(b.group.as_deref().unwrap_or_default())
            )),
            (Some(b), None) => {
                out.push_str(&format!("  Most free: {} ({})\n", b.free, escape(&b.node)))
            }
            (None, _) => out.push_str("  No GPU is free.\n"),
        }
        if demand.level.is_some() {
            let gpus = if demand.count == 1 { "GPU" } else { "GPUs" };
            out.push_str(&format!(
                "  Nodes with {} free {gpus}, aligned or not: {}\n",
                demand.count, e.nodes_with_enough_free
            ));
        }
    } else {
        let n = e.fits.len();
        out.push_str(&format!(
            "  Fits now on {n} node{}:\n",
            if n == 1 { "" } else { "s" }
        ));
        let mut t = match demand.level {
            _ if cpus => Table::new(["NODE", "GROUP", "FREE", "FREE CPUS"]),
            Some(_) => Table::new(["NODE", "GROUP", "FREE"]),
            None => Table::new(["NODE", "FREE"]),
        };
        for c in e.fits.iter().take(LISTED) {
            let mut row = vec![c.node.clone()];
            row.extend(c.group.clone());
            row.push(c.free.to_string());
            row.extend(c.free_cpus.filter(|_| cpus).map(|n| n.to_string()));
            t.row(row);
        }
        for line in t.render().lines() {
            out.push_str(&format!("    {line}\n"));
        }
        if n > LISTED {
            out.push_str(&format!("    ... and {} more\n", n.saturating_sub(LISTED)));
        }
    }
    if !demand.unjudged.is_empty() {
        out.push_str(&format!(
            "  Not checked: {}\n",
            escape(&demand.unjudged.join(", "))
        ));
    }
    out
}

/// Where a demand for shares fits now: each place with how many shares it can take
/// and the most left on one GPU there; or, fitting nowhere, the most one GPU has.
fn share_candidates(demand: &Demand, e: &Explanation) -> String {
    let mut out = String::new();
    let capacities = |c: &Candidate| -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = c
            .largest_free
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        v.sort_by(|a, b| (a.0 != "memory", &a.0).cmp(&(b.0 != "memory", &b.0)));
        v
    };
    if e.fits.is_empty() {
        out.push_str("  Fits now on no node.\n");
        if let Some(b) = &e.best {
            let most: Vec<String> = capacities(b)
                .iter()
                .map(|(name, v)| format!("{} {name}", amount_text(name, *v)))
                .collect();
            if !most.is_empty() {
                let place = match &b.group {
                    Some(g) => format!("{}, {g}", b.node),
                    None => b.node.clone(),
                };
                out.push_str(&format!(
                    "  Most left on one GPU: {} ({})\n",
                    most.join(", "),
                    escape(&place)
                ));
            }
        }
        if demand.level.is_some() {
            out.push_str(&format!(
                "  Nodes with room for them, aligned or not: {}\n",
                e.nodes_with_enough_free
            ));
        }
    } else {
        let n = e.fits.len();
        let numa = demand.level == Some(Level::NumaNode);
        out.push_str(&format!(
            "  Fits now on {n} {}{}:\n",
            if numa { "NUMA node" } else { "node" },
            if n == 1 { "" } else { "s" }
        ));
        let names: Vec<String> = e
            .fits
            .first()
            .map(|c| capacities(c).into_iter().map(|(k, _)| k).collect())
            .unwrap_or_default();
        let mut head = vec!["NODE".to_owned()];
        if numa {
            head.push("GROUP".to_owned());
        }
        head.push("SHARES".to_owned());
        head.extend(
            names
                .iter()
                .map(|k| format!("LARGEST {}", k.to_uppercase())),
        );
        let mut t = Table::new(head);
        for c in e.fits.iter().take(LISTED) {
            let mut row = vec![c.node.clone()];
            row.extend(c.group.clone());
            row.push(c.free.to_string());
            let left = capacities(c);
            for k in &names {
                let v = left.iter().find(|(name, _)| name == k);
                row.push(v.map_or_else(|| "-".to_owned(), |(_, v)| amount_text(k, *v)));
            }
            t.row(row);
        }
        for line in t.render().lines() {
            out.push_str(&format!("    {line}\n"));
        }
        if n > LISTED {
            out.push_str(&format!("    ... and {} more\n", n.saturating_sub(LISTED)));
        }
    }
    if !demand.unjudged.is_empty() {
        out.push_str(&format!(
            "  Not checked: {}\n",
            escape(&demand.unjudged.join(", "))
        ));
    }
    out
}

#[cfg(test)]
mod tests;
