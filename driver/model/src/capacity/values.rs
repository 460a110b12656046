//! Which topology values of a published device the model believes.
//!
//! Anyone allowed to create ResourceSlices can publish any value under our driver's
//! name, and the group keys end up in NodeResourceTopology zone names
//! (`node-<numaNode>`), in Events and on terminals. So a value is taken only in the
//! form and range our plugin publishes; anything else is ignored (the device counts
//! as not carrying the attribute, as when discovery did not know it) and reported.

use std::collections::BTreeSet;
use std::fmt;

use k8s_openapi::api::resource::v1::DeviceAttribute;

use super::Level;

/// The highest NUMA node id Linux can have: `MAX_NUMNODES` is `1 << NODES_SHIFT`,
/// and `NODES_SHIFT` is at most 10 on every architecture that builds it.
pub const MAX_NUMA_NODE: i64 = 1023;

/// The highest socket (package) index: the plugin publishes a `u32`.
pub const MAX_SOCKET: i64 = u32::MAX as i64;

/// The longest string group key: the API's limit for a string attribute.
pub const MAX_KEY_LEN: usize = 64;

/// The NUMA node ids a node's slices announce under
/// [`NUMA_NODES_ANNOTATION`](crate::slice::NUMA_NODES_ANNOTATION), taken only in the
/// form our plugin writes (`0-1`, `0,2-3`, every id at most [`MAX_NUMA_NODE`]), so
/// the set never holds more than 1024 ids whatever the text. `None` for any other
/// text: the node then announces nothing.
pub(crate) fn numa_node_set(value: &str) -> Option<BTreeSet<u32>> {
    let mut set = BTreeSet::new();
    for part in value.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let lo: u32 = lo.parse().ok()?;
        let hi: u32 = hi.parse().ok()?;
        if lo > hi || i64::from(hi) > MAX_NUMA_NODE {
            return None;
        }
        set.extend(lo..=hi);
    }
    Some(set)
}

/// A topology value the model did not take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidValue {
    pub level: Level,
    /// The value as published, in Rust's escaped form (`string "a\n"`, `int -1`), so
    /// it can be logged or printed as it is.
    pub value: String,
}

impl fmt::Display for InvalidValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.level, self.value)
    }
}

/// The group key of a device at one level: `Ok(None)` when the attribute is absent,
/// an error when it is there but not a value our plugin could have published.
///
/// For the list form of `numaNode` the key is the first element, the device's own
/// node: the model reports strict NUMA locality, whatever wider match the list
/// allows. Every element must be valid, since the scheduler matches on all of them.
pub(crate) fn group_key(
    level: Level,
    attr: Option<&DeviceAttribute>,
) -> Result<Option<String>, InvalidValue> {
    let Some(a) = attr else {
        return Ok(None);
    };
    let key = match level {
        Level::NumaNode => numa_node(a),
        Level::Socket => a
            .int
            .filter(|i| (0..=MAX_SOCKET).contains(i))
            .map(|i| i.to_string()),
        Level::PcieRoot | Level::PcieSwitch | Level::NvlinkDomain => a
            .string
            .as_deref()
            .filter(|s| is_safe_key(s))
            .map(str::to_owned),
    };
    key.map(Some).ok_or_else(|| InvalidValue {
        level,
        value: describe(a),
    })
}

fn numa_node(a: &DeviceAttribute) -> Option<String> {
    let valid = |i: &i64| (0..=MAX_NUMA_NODE).contains(i);
    if let Some(i) = a.int {
        return valid(&i).then(|| i.to_string());
    }
    let list = a.ints.as_deref()?;
    let first = list.first()?;
    list.iter().all(valid).then(|| first.to_string())
}

/// What our plugin publishes as a string key (`pci0000:17`, `0000:3a:00.0`, `nvl0`):
/// letters, digits, `.`, `:`, `_` and `-`, beginning and ending with a letter or
/// digit, at most [`MAX_KEY_LEN`] long. That keeps keys printable and one word, and
/// none of them reads as a path (`../x`).
pub(crate) fn is_safe_key(s: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    s.len() <= MAX_KEY_LEN
        && edge(s.chars().next())
        && edge(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '_' | '-'))
}

/// The value of an attribute, whatever its type, for a report. Strings are cut to
/// [`MAX_KEY_LEN`] characters so a report stays one short line.
fn describe(a: &DeviceAttribute) -> String {
    let cut = |s: &str| s.chars().take(MAX_KEY_LEN).collect::<String>();
    if let Some(i) = a.int {
        format!("int {i}")
    } else if let Some(s) = &a.string {
        format!("string {:?}", cut(s))
    } else if let Some(v) = &a.version {
        format!("version {:?}", cut(v))
    } else if let Some(b) = a.bool {
        format!("bool {b}")
    } else if let Some(v) = &a.ints {
        format!("ints {v:?}")
    } else if let Some(v) = &a.strings {
        let v: Vec<String> = v.iter().map(|s| cut(s)).collect();
        format!("strings {v:?}")
    } else {
        "no value".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slice::fixtures::{int, string};

    #[test]
    fn an_announced_numa_node_set_is_taken_only_in_the_plugins_form() {
        let set = |v: &str| numa_node_set(v).map(|s| s.into_iter().collect::<Vec<_>>());
        assert_eq!(set("0-1"), Some(vec![0, 1]));
        assert_eq!(set("0,2-3"), Some(vec![0, 2, 3]));
        assert_eq!(set("1023"), Some(vec![1023]));
        for bad in [
            "",
            "0-1024",
            "4294967295",
            "3-1",
            "0-",
            "a",
            "0,,1",
            "-1",
            "0-1\n",
        ] {
            assert_eq!(set(bad), None, "{bad:?}");
        }
    }

    fn key(level: Level, a: DeviceAttribute) -> Result<Option<String>, InvalidValue> {
        group_key(level, Some(&a))
    }

    #[test]
    fn numa_nodes_are_small_non_negative_ints() {
        assert_eq!(key(Level::NumaNode, int(0)), Ok(Some("0".into())));
        assert_eq!(key(Level::NumaNode, int(1023)), Ok(Some("1023".into())));
        for bad in [-1, 1024, i64::MAX, i64::MIN] {
            let e = key(Level::NumaNode, int(bad)).unwrap_err();
            assert_eq!(e.value, format!("int {bad}"));
        }
        let version = DeviceAttribute {
            version: Some("0.0.0".into()),
            ..Default::default()
        };
        assert_eq!(
            key(Level::NumaNode, version).unwrap_err().to_string(),
            "numaNode version \"0.0.0\""
        );
        for s in ["1", "0\n\u{1b}[31m", "../../x"] {
            assert!(key(Level::NumaNode, string(s)).is_err(), "{s:?}");
        }
        assert_eq!(group_key(Level::NumaNode, None), Ok(None));
    }

    #[test]
    fn the_list_form_gives_its_first_node_when_every_node_is_valid() {
        let list = |v: Vec<i64>| DeviceAttribute {
            ints: Some(v),
            ..Default::default()
        };
        assert_eq!(
            key(Level::NumaNode, list(vec![2, 0, 1])),
            Ok(Some("2".into()))
        );
        assert!(key(Level::NumaNode, list(vec![0, -1])).is_err());
        assert!(key(Level::NumaNode, list(vec![])).is_err());
    }

    #[test]
    fn sockets_are_non_negative_ints() {
        assert_eq!(key(Level::Socket, int(1)), Ok(Some("1".into())));
        assert!(key(Level::Socket, int(-1)).is_err());
        assert!(key(Level::Socket, int(MAX_SOCKET + 1)).is_err());
        assert!(key(Level::Socket, string("0")).is_err());
    }

    #[test]
    fn string_keys_are_one_printable_word() {
        for (level, good) in [
            (Level::PcieRoot, "pci0000:17"),
            (Level::PcieSwitch, "0000:3a:00.0"),
            (Level::NvlinkDomain, "nvl0"),
        ] {
            assert_eq!(key(level, string(good)), Ok(Some(good.into())));
        }
        let long = "a".repeat(MAX_KEY_LEN + 1);
        for bad in [
            "",
            "nvl0\n",
            "\u{1b}[2Jx",
            "../x",
            "a/b",
            "a b",
            "-a",
            "a\u{202e}b",
            &long,
        ] {
            let e = key(Level::NvlinkDomain, string(bad)).unwrap_err();
            assert!(!e.value.contains(['\n', '\u{1b}']), "{e}");
        }
        assert!(key(Level::PcieRoot, int(0)).is_err());
    }
}
