//! What the model refused to take from the slices, for its caller to count, log and
//! show. The model stays pure: it says what it found, the controller turns that into
//! metrics and logs, `kubectl topodra` into warnings.

use std::fmt;

use super::values::InvalidValue;

/// Why a complete pool was left out of the model, so that none of its devices count
/// on any node: the scheduler cannot trust such a pool either.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolProblem {
    /// Slices of the pool's newest generation name different nodes. Counting the pool
    /// on one of them would give that node the other's GPUs.
    NodesDiffer { nodes: Vec<String> },
    /// Device names that appear more than once in the pool. Keeping one of each would
    /// hide the others; the scheduler calls such a pool invalid.
    DuplicateDevices { devices: Vec<String> },
}

impl PoolProblem {
    /// A short name of the problem, for a metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            PoolProblem::NodesDiffer { .. } => "nodes_differ",
            PoolProblem::DuplicateDevices { .. } => "duplicate_devices",
        }
    }
}

/// Names are quoted in Rust's escaped form: they come from the slices, and this text
/// goes to logs and terminals.
impl fmt::Display for PoolProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolProblem::NodesDiffer { nodes } => {
                write!(f, "its slices name more than one node: {nodes:?}")
            }
            PoolProblem::DuplicateDevices { devices } => {
                write!(f, "device names appear more than once: {devices:?}")
            }
        }
    }
}

/// One thing the model did not take, reported once when it appears (not again when
/// an unchanged slice comes back, as after a relist).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// A device's topology value was ignored: the device counts as not carrying the
    /// attribute.
    InvalidValue {
        slice: String,
        device: String,
        value: InvalidValue,
    },
    /// A pool was left out, or left out for another reason than before.
    PoolSkipped { pool: String, problem: PoolProblem },
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::InvalidValue {
                slice,
                device,
                value,
            } => write!(
                f,
                "ResourceSlice {slice:?}, device {device:?}: ignored {value}"
            ),
            Finding::PoolSkipped { pool, problem } => {
                write!(f, "pool {pool:?} skipped: {problem}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::Level;

    #[test]
    fn reports_quote_names_escaped() {
        let hostile = "a\n\u{1b}[31m\u{202e}\u{85}";
        let findings = [
            Finding::PoolSkipped {
                pool: hostile.into(),
                problem: PoolProblem::NodesDiffer {
                    nodes: vec![hostile.into(), "b".into()],
                },
            },
            Finding::PoolSkipped {
                pool: "p".into(),
                problem: PoolProblem::DuplicateDevices {
                    devices: vec![hostile.into()],
                },
            },
            Finding::InvalidValue {
                slice: hostile.into(),
                device: hostile.into(),
                value: InvalidValue {
                    level: Level::NumaNode,
                    value: format!("string {hostile:?}"),
                },
            },
        ];
        for f in findings {
            let text = f.to_string();
            assert!(
                !text.chars().any(|c| c.is_control() || c == '\u{202e}'),
                "{text}"
            );
            assert!(text.contains(r#""a\n\u{1b}[31m\u{202e}\u{85}""#), "{text}");
        }
    }
}
