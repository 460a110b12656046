//! Byte counts as Kubernetes quantities, spelled the way the API server stores them.
//!
//! The server canonicalizes every quantity it persists. Sending the canonical spelling
//! means the object read back equals the object sent, so the publisher can tell "no
//! change" by comparing values, and server-side apply sees no spurious diff.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const BINARY: [(&str, u32); 6] = [
    ("Ei", 60),
    ("Pi", 50),
    ("Ti", 40),
    ("Gi", 30),
    ("Mi", 20),
    ("Ki", 10),
];

const DECIMAL: [(&str, u64); 6] = [
    ("E", 1_000_000_000_000_000_000),
    ("P", 1_000_000_000_000_000),
    ("T", 1_000_000_000_000),
    ("G", 1_000_000_000),
    ("M", 1_000_000),
    ("k", 1_000),
];

/// `81559 MiB` becomes `81559Mi`; a count with no exact binary suffix keeps its exact
/// value in decimal form, because the server only keeps a binary spelling when it is
/// exact and at least 1Ki.
pub(crate) fn bytes(n: u64) -> Quantity {
    if let Some(binary) = exact_binary(n) {
        return Quantity(binary);
    }
    if n != 0 {
        for (suffix, unit) in DECIMAL {
            if n.is_multiple_of(unit) {
                return Quantity(format!("{}{suffix}", n.checked_div(unit).unwrap_or(n)));
            }
        }
    }
    Quantity(n.to_string())
}

/// `n` bytes with the largest binary suffix that keeps it exact (`81559Mi`),
/// from 1Ki up; `None` below that or without one.
pub(crate) fn exact_binary(n: u64) -> Option<String> {
    if n < 1024 {
        return None;
    }
    BINARY
        .iter()
        .find(|(_, shift)| n.trailing_zeros() >= *shift)
        .map(|(suffix, shift)| format!("{}{suffix}", n >> shift))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_binary_sizes_use_the_largest_suffix() {
        assert_eq!(bytes(81559 << 20).0, "81559Mi");
        assert_eq!(bytes(80 << 30).0, "80Gi");
        assert_eq!(bytes(1024).0, "1Ki");
        assert_eq!(bytes(3 << 40).0, "3Ti");
    }

    #[test]
    fn inexact_sizes_stay_exact_in_decimal() {
        assert_eq!(bytes(0).0, "0");
        assert_eq!(bytes(512).0, "512");
        assert_eq!(bytes(1000).0, "1k");
        assert_eq!(bytes(85_520_809_985).0, "85520809985");
        assert_eq!(bytes(3_000_000).0, "3M");
        assert_eq!(bytes(2_000_000_000).0, "1953125Ki");
    }
}
