//! Which XIDs say the GPU itself is in trouble, and which only that an application
//! misbehaved.
//!
//! An XID is the NVIDIA kernel driver's error report. Many are caused by the program
//! running on the GPU (a bad pointer, a killed process) and leave the GPU fit for the
//! next workload; tainting on those would take healthy GPUs out of service whenever
//! someone's CUDA code crashes. The others point at hardware, firmware or the bus and
//! mean the GPU needs attention (usually a reset) before it can be trusted.
//!
//! | XID | Class | Meaning |
//! | --- | --- | --- |
//! | 13 | ignored | graphics engine exception: an application fault (bad address, illegal instruction) |
//! | 31 | ignored | GPU memory page fault: an application accessed an invalid address |
//! | 43 | ignored | GPU stopped processing: a context was torn down after a software fault |
//! | 45 | ignored | preemptive cleanup after earlier errors, e.g. a killed process |
//! | 68 | ignored | video decoder (NVDEC) exception, raised by the decode stream |
//! | 109 | ignored | context switch timeout, usually an application hang |
//! | 48 | fatal | double-bit (uncorrectable) ECC error |
//! | 61 | fatal | internal micro-controller breakpoint/warning |
//! | 62 | fatal | internal micro-controller halt |
//! | 63 | fatal | ECC page retirement or row remapping event: memory is being retired |
//! | 64 | fatal | ECC page retirement or row remapping failure |
//! | 74 | fatal | NVLink error |
//! | 79 | fatal | GPU has fallen off the bus |
//! | 92 | fatal | high single-bit ECC error rate |
//! | 94 | fatal | contained ECC error: memory needs a reset to be remapped |
//! | 95 | fatal | uncontained ECC error |
//! | 119 | fatal | GSP RPC timeout |
//! | 120 | fatal | GSP error |
//!
//! An XID in neither list is treated as fatal by default, as NVIDIA's device plugin
//! does: new XIDs tend to be new hardware failure modes, and an operator can ignore
//! one with a flag far more easily than notice a missed failure.

#[cfg(test)]
use std::collections::BTreeSet;

/// How one XID is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum XidClass {
    /// Marks the GPU unhealthy; the text describes the error.
    Fatal(&'static str),
    /// An application error; the text says why it is ignored.
    Ignored(&'static str),
    /// Not in the table.
    Unlisted,
}

/// XID 999 is what NVML reports when the driver could not name the XID.
pub const UNKNOWN_XID: u64 = 999;

const IGNORED: &[(u64, &str)] = &[
    (13, "graphics engine exception (application fault)"),
    (31, "GPU memory page fault (application fault)"),
    (43, "GPU stopped processing (application fault)"),
    (45, "preemptive cleanup after earlier errors"),
    (68, "video decoder exception (application fault)"),
    (109, "context switch timeout (application hang)"),
];

const FATAL: &[(u64, &str)] = &[
    (48, "double-bit ECC error"),
    (61, "internal micro-controller breakpoint/warning"),
    (62, "internal micro-controller halt"),
    (63, "ECC page retirement or row remapping event"),
    (64, "ECC page retirement or row remapping failure"),
    (74, "NVLink error"),
    (79, "GPU has fallen off the bus"),
    (92, "high single-bit ECC error rate"),
    (94, "contained ECC error"),
    (95, "uncontained ECC error"),
    (119, "GSP RPC timeout"),
    (120, "GSP error"),
];

/// The built-in classification, before any operator override.
pub(crate) fn classify(xid: u64) -> XidClass {
    let find = |table: &[(u64, &'static str)]| {
        table.iter().find(|(x, _)| *x == xid).map(|(_, text)| *text)
    };
    if let Some(text) = find(FATAL) {
        XidClass::Fatal(text)
    } else if let Some(text) = find(IGNORED) {
        XidClass::Ignored(text)
    } else {
        XidClass::Unlisted
    }
}

/// The XIDs the built-in table ignores (for logging the effective policy).
#[cfg(test)]
pub(crate) fn builtin_ignored() -> BTreeSet<u64> {
    IGNORED.iter().map(|(x, _)| *x).collect()
}

/// The operator-facing reason for an XID that marks a GPU unhealthy.
pub(crate) fn describe(xid: u64) -> String {
    match classify(xid) {
        XidClass::Fatal(text) => format!("XID {xid}: {text}"),
        _ if xid == UNKNOWN_XID => format!("XID {xid}: unknown error reported by the driver"),
        _ => format!("XID {xid}: critical error"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_entries_are_disjoint_and_sorted() {
        let fatal: BTreeSet<u64> = FATAL.iter().map(|(x, _)| *x).collect();
        assert_eq!(fatal.len(), FATAL.len());
        assert!(fatal.is_disjoint(&builtin_ignored()));
        assert!(FATAL.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(IGNORED.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn classifies_known_xids() {
        assert_eq!(classify(79), XidClass::Fatal("GPU has fallen off the bus"));
        assert!(matches!(classify(13), XidClass::Ignored(_)));
        assert_eq!(classify(12345), XidClass::Unlisted);
        assert_eq!(describe(79), "XID 79: GPU has fallen off the bus");
        assert_eq!(describe(500), "XID 500: critical error");
    }
}
