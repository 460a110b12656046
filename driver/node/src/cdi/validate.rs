//! Our own check of the rules container runtimes apply when they load a spec.
//!
//! A spec a runtime refuses fails every container that uses the claim, long after
//! prepare reported success; checking before writing turns that into a prepare error
//! with a reason. Where the CDI specification and runtimes differ, the stricter rule
//! is applied (kind vendor: a DNS-subdomain-like name; annotation keys: Kubernetes
//! qualified names).

use std::collections::BTreeSet;
use std::fmt;

use super::spec::{ContainerEdits, Spec};
use super::version::{Version, minimum_version};

/// Every rule a spec breaks, each as one sentence naming the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problems(pub Vec<String>);

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("; "))
    }
}

/// Hook names runtimes accept (the OCI hook points).
pub(crate) const HOOK_NAMES: &[&str] = &[
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// Kubernetes' limit on the total size of an object's annotations, which runtimes
/// apply to CDI annotations as well.
const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

/// Checks `spec`; lists every problem found, not only the first.
pub(crate) fn validate(spec: &Spec) -> Result<(), Problems> {
    let mut p = Vec::new();

    match spec.cdi_version.parse::<Version>() {
        Err(e) => p.push(e.to_string()),
        Ok(v) => {
            if !v.is_released() {
                p.push(format!("cdiVersion {v} is not a released CDI version"));
            }
            let min = minimum_version(spec);
            if v < min {
                p.push(format!(
                    "cdiVersion {v} is lower than {min}, which the fields used require"
                ));
            }
        }
    }

    match spec.kind.split_once('/') {
        Some((vendor, class)) => {
            if let Err(e) = check_vendor(vendor) {
                p.push(format!("kind {:?}: vendor {e}", spec.kind));
            }
            if let Err(e) = check_class(class) {
                p.push(format!("kind {:?}: class {e}", spec.kind));
            }
        }
        None => p.push(format!("kind {:?} is not vendor/class", spec.kind)),
    }

    check_annotations("annotations", &spec.annotations, &mut p);
    check_edits("containerEdits", &spec.container_edits, &mut p);

    if spec.devices.is_empty() {
        p.push("devices: a spec must define at least one device".into());
    }
    let mut names = BTreeSet::new();
    for (i, d) in spec.devices.iter().enumerate() {
        let at = format!("devices[{i}]");
        if let Err(e) = check_device_name(&d.name) {
            p.push(format!("{at}.name {e}"));
        }
        if !names.insert(d.name.as_str()) {
            p.push(format!("{at}.name {:?} is defined twice", d.name));
        }
        check_annotations(&format!("{at}.annotations"), &d.annotations, &mut p);
        if d.container_edits.is_empty() {
            p.push(format!("{at}.containerEdits is empty"));
        }
        check_edits(&format!("{at}.containerEdits"), &d.container_edits, &mut p);
    }

    if p.is_empty() {
        Ok(())
    } else {
        Err(Problems(p))
    }
}

fn check_edits(at: &str, e: &ContainerEdits, p: &mut Vec<String>) {
    check_env(&format!("{at}.env"), &e.env, p);
    for (i, n) in e.device_nodes.iter().enumerate() {
        let at = format!("{at}.deviceNodes[{i}]");
        check_abs(&format!("{at}.path"), &n.path, p);
        if let Some(h) = &n.host_path {
            check_abs(&format!("{at}.hostPath"), h, p);
        }
        if let Some(t) = &n.kind
            && !matches!(t.as_str(), "" | "b" | "c" | "u" | "p")
        {
            p.push(format!("{at}.type {t:?} is not one of b, c, u, p"));
        }
        if let Some(perm) = &n.permissions
            && perm != "none"
            && !perm.chars().all(|c| matches!(c, 'r' | 'w' | 'm'))
        {
            p.push(format!(
                "{at}.permissions {perm:?} is not letters of rwm or \"none\""
            ));
        }
    }
    for (i, m) in e.mounts.iter().enumerate() {
        let at = format!("{at}.mounts[{i}]");
        check_abs(&format!("{at}.containerPath"), &m.container_path, p);
        let bind = m.kind.as_deref() == Some("bind")
            || m.options.iter().any(|o| o == "bind" || o == "rbind");
        if bind {
            check_abs(&format!("{at}.hostPath"), &m.host_path, p);
        } else if m.host_path.is_empty() {
            p.push(format!("{at}.hostPath is empty"));
        }
    }
    for (i, h) in e.hooks.iter().enumerate() {
        let at = format!("{at}.hooks[{i}]");
        if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
            p.push(format!(
                "{at}.hookName {:?} is not one of {}",
                h.hook_name,
                HOOK_NAMES.join(", ")
            ));
        }
        check_abs(&format!("{at}.path"), &h.path, p);
        check_env(&format!("{at}.env"), &h.env, p);
        if h.timeout.is_some_and(|t| t <= 0) {
            p.push(format!("{at}.timeout must be positive"));
        }
    }
    if let Some(rdt) = &e.intel_rdt
        && let Some(c) = &rdt.clos_id
        && c != "/"
        && (c.len() >= 4096 || c == "." || c == ".." || c.contains(['/', '\n']))
    {
        p.push(format!(
            "{at}.intelRdt.closID {c:?} is not a valid file name"
        ));
    }
    let mut hosts = BTreeSet::new();
    let mut names = BTreeSet::new();
    for (i, n) in e.net_devices.iter().enumerate() {
        let at = format!("{at}.netDevices[{i}]");
        if n.host_interface_name.is_empty() || n.name.is_empty() {
            p.push(format!("{at} needs both hostInterfaceName and name"));
        }
        if !hosts.insert(&n.host_interface_name) || !names.insert(&n.name) {
            p.push(format!("{at} repeats an interface name"));
        }
    }
}

fn check_env(at: &str, env: &[String], p: &mut Vec<String>) {
    for e in env {
        if e.find('=').is_none_or(|i| i == 0) {
            p.push(format!("{at}: {e:?} is not KEY=VALUE"));
        }
    }
}

fn check_abs(at: &str, path: &str, p: &mut Vec<String>) {
    if !path.starts_with('/') {
        p.push(format!("{at} {path:?} is not an absolute path"));
    }
}

fn check_annotations(
    at: &str,
    annotations: &std::collections::BTreeMap<String, String>,
    p: &mut Vec<String>,
) {
    let mut total = 0;
    for (k, v) in annotations {
        total += k.len() + v.len();
        if let Err(e) = check_qualified_name(k) {
            p.push(format!("{at}: key {k:?} {e}"));
        }
    }
    if total > MAX_ANNOTATIONS_BYTES {
        p.push(format!(
            "{at}: {total} bytes, more than {MAX_ANNOTATIONS_BYTES}"
        ));
    }
}

fn alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// `first`, then any of `inner`, ending alphanumeric.
fn check_chars(
    s: &str,
    first: fn(char) -> bool,
    inner: fn(char) -> bool,
    what: &str,
) -> Result<(), String> {
    let mut chars = s.chars();
    match chars.next() {
        None => return Err("is empty".into()),
        Some(c) if !first(c) => return Err(format!("{s:?} must start with {what}")),
        Some(_) => {}
    }
    if let Some(c) = s.chars().find(|c| !inner(*c) && !alnum(*c)) {
        return Err(format!("{s:?} has the invalid character {c:?}"));
    }
    if !s.ends_with(alnum) {
        return Err(format!("{s:?} must end with a letter or digit"));
    }
    Ok(())
}

/// `[A-Za-z0-9][A-Za-z0-9_.:-]*` ending alphanumeric; a leading digit needs 0.5.0,
/// which [`minimum_version`] accounts for.
pub(crate) fn check_device_name(name: &str) -> Result<(), String> {
    check_chars(
        name,
        alnum,
        |c| matches!(c, '_' | '.' | ':' | '-'),
        "a letter or digit",
    )
}

/// A DNS subdomain made of the characters runtimes allow in a vendor.
fn check_vendor(vendor: &str) -> Result<(), String> {
    check_chars(
        vendor,
        |c| c.is_ascii_alphabetic(),
        |c| matches!(c, '_' | '.' | '-'),
        "a letter",
    )?;
    if vendor.len() > 253 {
        return Err(format!("{vendor:?} is longer than 253 characters"));
    }
    if vendor.split('.').any(str::is_empty) {
        return Err(format!("{vendor:?} has an empty DNS label"));
    }
    Ok(())
}

fn check_class(class: &str) -> Result<(), String> {
    check_chars(
        class,
        |c| c.is_ascii_alphabetic(),
        |c| matches!(c, '_' | '.' | '-'),
        "a letter",
    )?;
    if class.len() > 63 {
        return Err(format!("{class:?} is longer than 63 characters"));
    }
    Ok(())
}

/// A Kubernetes qualified name: `[prefix/]name`, prefix a lowercase DNS subdomain.
fn check_qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let ok = !prefix.is_empty()
            && prefix.len() <= 253
            && prefix.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && l.starts_with(alnum)
                    && l.ends_with(alnum)
            });
        if !ok {
            return Err(format!(
                "prefix {prefix:?} is not a lowercase DNS subdomain"
            ));
        }
    }
    if name.len() > 63 {
        return Err("name is longer than 63 characters".into());
    }
    check_chars(
        name,
        alnum,
        |c| matches!(c, '-' | '_' | '.'),
        "a letter or digit",
    )
}

#[cfg(test)]
mod tests;
