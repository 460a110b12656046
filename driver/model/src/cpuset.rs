//! Sets of CPU (or NUMA node) ids in the Linux list format (`0-55,112-167`).

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// An ordered set of small ids; prints and parses the kernel's list format.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdList(BTreeSet<u32>);

/// A list string that is not in the kernel's list format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid id list {input:?}: expected comma-separated ids or ranges like 0-3,8")]
pub struct IdListError {
    pub input: String,
}

impl IdList {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, id: u32) {
        self.0.insert(id);
    }

    pub fn contains(&self, id: u32) -> bool {
        self.0.contains(&id)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    pub fn first(&self) -> Option<u32> {
        self.0.first().copied()
    }
}

impl FromIterator<u32> for IdList {
    fn from_iter<T: IntoIterator<Item = u32>>(iter: T) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl FromStr for IdList {
    type Err = IdListError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = || IdListError {
            input: input.to_owned(),
        };
        let mut set = BTreeSet::new();
        for part in input.trim().split(',').filter(|p| !p.is_empty()) {
            match part.split_once('-') {
                Some((lo, hi)) => {
                    let lo: u32 = lo.trim().parse().map_err(|_| err())?;
                    let hi: u32 = hi.trim().parse().map_err(|_| err())?;
                    if hi.checked_sub(lo).is_none_or(|span| span > 1 << 20) {
                        return Err(err());
                    }
                    set.extend(lo..=hi);
                }
                None => {
                    set.insert(part.trim().parse().map_err(|_| err())?);
                }
            }
        }
        Ok(Self(set))
    }
}

impl fmt::Display for IdList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids = self.0.iter().copied().peekable();
        let mut first = true;
        while let Some(lo) = ids.next() {
            let mut hi = lo;
            while let Some(next) = ids.next_if(|id| Some(*id) == hi.checked_add(1)) {
                hi = next;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

serde_as_string!(IdList);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_ranges() {
        let l: IdList = "0-55,112-167".parse().unwrap();
        assert_eq!(l.len(), 112);
        assert_eq!(l.to_string(), "0-55,112-167");
        let l: IdList = "3,1,2,7".parse().unwrap();
        assert_eq!(l.to_string(), "1-3,7");
        assert_eq!("".parse::<IdList>().unwrap().to_string(), "");
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["a", "3-1", "1-", "0-99999999"] {
            assert!(bad.parse::<IdList>().is_err(), "{bad} accepted");
        }
    }
}
