//! The API server's rules for names and versions, as `ResourceSlice` validation
//! applies them: semantic versions, qualified names, DNS labels and subdomains.

use super::*;

/// Strict semver 2.0.0, as the server parses version attributes: three numeric parts
/// without leading zeros, optional pre-release and build metadata, no `v` prefix.
/// Numbers must fit in 64 bits, because the server's parser stores them that way.
pub(crate) fn check_version(v: &str) -> Result<(), &'static str> {
    if v.len() > MAX_VALUE_LEN {
        return Err("longer than 64 bytes");
    }
    let (rest, build) = match v.split_once('+') {
        Some((rest, build)) => (rest, Some(build)),
        None => (v, None),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (rest, None),
    };
    let parts: Vec<&str> = core.split('.').collect();
    if parts.len() != 3 {
        return Err("expected MAJOR.MINOR.PATCH");
    }
    for p in parts {
        numeric_identifier(p)?;
    }
    for id in pre.iter().flat_map(|p| p.split('.')) {
        identifier(id)?;
        if id.bytes().all(|b| b.is_ascii_digit()) {
            numeric_identifier(id)?;
        }
    }
    for id in build.iter().flat_map(|b| b.split('.')) {
        identifier(id)?;
    }
    Ok(())
}

pub(super) fn numeric_identifier(s: &str) -> Result<(), &'static str> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err("version numbers must be decimal digits");
    }
    if s.len() > 1 && s.starts_with('0') {
        return Err("version numbers must not have leading zeros");
    }
    s.parse::<u64>()
        .map(drop)
        .map_err(|_| "version number does not fit in 64 bits")
}

pub(super) fn identifier(s: &str) -> Result<(), &'static str> {
    if s.is_empty() {
        return Err("empty pre-release or build identifier");
    }
    if !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err("pre-release and build identifiers allow only [0-9A-Za-z-]");
    }
    Ok(())
}

/// RFC 1123 label: lower-case alphanumerics and `-`, alphanumeric at both ends.
pub(super) fn dns_label(s: &str) -> Result<(), &'static str> {
    if s.len() > MAX_LABEL_LEN {
        return Err("too long");
    }
    label_chars(s)
}

pub(super) fn label_chars(s: &str) -> Result<(), &'static str> {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (b.first(), b.last()) {
        (None, _) | (_, None) => Err("empty"),
        _ if !b.iter().all(|c| alnum(*c) || *c == b'-') => {
            Err("only lower-case letters, digits and '-' are allowed")
        }
        (Some(f), Some(l)) if !alnum(*f) || !alnum(*l) => {
            Err("must start and end with a lower-case letter or digit")
        }
        _ => Ok(()),
    }
}

/// RFC 1123 subdomain: dot-separated labels, at most `max` characters in all.
pub(super) fn dns_subdomain(s: &str, max: usize) -> Result<(), &'static str> {
    if s.len() > max {
        return Err("too long");
    }
    s.split('.').try_for_each(label_chars)
}

/// `[domain/]identifier`: a C identifier of at most 32 characters, optionally after a
/// DNS subdomain of at most 63.
pub(crate) fn qualified_name(name: &str) -> Result<(), &'static str> {
    let id = match name.split_once('/') {
        Some((domain, id)) => {
            dns_subdomain(domain, MAX_DOMAIN_LEN).map_err(
                |_| "the domain before '/' must be a DNS subdomain of at most 63 characters",
            )?;
            id
        }
        None => name,
    };
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err("the identifier must have 1 to 32 characters");
    }
    let mut chars = id.bytes();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == b'_') {
        return Err("the identifier must be a C identifier ([A-Za-z_][A-Za-z0-9_]*)");
    }
    Ok(())
}
