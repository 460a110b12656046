//! The version every topodra binary reports: the crate version and the commit it was
//! built from. `make image` sets the commit (deploy/image/build.sh) and writes the same
//! pair into the image labels, so `--version` inside a running pod can be matched with
//! the image it came from and with the source.

/// The commit the binary was built from: `TOPODRA_REVISION` at build time (the full
/// hash, with `-dirty` when the tree had changes), `unknown` when it was not set. Read
/// with `option_env!` so that cargo rebuilds when it changes.
pub const REVISION: &str = match option_env!("TOPODRA_REVISION") {
    Some(r) if !r.is_empty() => r,
    _ => "unknown",
};

/// The workspace version, shared by every crate (and the chart's appVersion).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `VERSION (REVISION)`, e.g. `0.1.0 (2190591dc31ad7497cf979b5fbe7d785194c9b8b)`: what
/// `--version` prints after the binary name.
pub fn long() -> &'static str {
    static LONG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LONG.get_or_init(|| format!("{VERSION} ({REVISION})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_version_and_revision() {
        assert_eq!(long(), format!("{VERSION} ({REVISION})"));
        assert!(!REVISION.is_empty());
        assert!(!REVISION.contains(char::is_whitespace));
    }
}
