//! Decoding API objects whose nesting anyone who can write them chooses.
//!
//! serde_json refuses input nested deeper than 128 levels, and kube-rs decodes each
//! GET answer, LIST page and watch event whole. A ResourceClaim whose opaque
//! parameters for *any* driver nest 150 objects (1.1 KB, which the API server takes)
//! therefore failed the controller's whole claim watch, every `kubectl topodra`, and
//! each prepare of that claim, as if the API server were unreachable.
//!
//! [`Bounded<K>`] is `K` for kube-rs's typed API (`Api<Bounded<K>>`, watchers): it
//! decodes the object as `K`; when that fails it decodes again with everything
//! nested deeper than [`MAX_DEPTH`] levels replaced by `null` ([`Bounded::Pruned`]);
//! and when that fails too it keeps the object's name and the error
//! ([`Bounded::Undecodable`]), so one bad object fails alone. Skipping a value is
//! serde_json's `IgnoredAny`, which walks any depth without recursion, so no input
//! reaches the recursion limit or the stack.
//!
//! Why null is safe for what topodra reads: no field topodra reads from an object
//! lies deeper than a dozen levels (allocation results, taints, attributes), and its
//! own opaque config is at most five levels below `parameters`, which is seven below
//! the claim. A config of ours that reaches [`MAX_DEPTH`] is invalid whatever the
//! pruned part held, and stays invalid after pruning, since strict decoding refuses
//! the containers above the cut. What is pruned is other drivers' parameters and the
//! `managedFields` entries that mirror them.

use std::borrow::Cow;
use std::fmt;

use kube::api::ObjectMeta;
use serde::de::{DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// Levels of nesting kept (the object itself is level 1); deeper values become null.
pub const MAX_DEPTH: usize = 64;

/// Pruned places kept for the log, and the levels of each path shown.
const PATHS_KEPT: usize = 4;
const PATH_LEVELS_SHOWN: usize = 12;

/// An object decoded with bounded depth.
#[derive(Clone, Debug)]
pub enum Bounded<K> {
    /// Decoded as it is.
    Whole(K),
    /// Decoded after dropping what lay deeper than [`MAX_DEPTH`]; `paths` names the
    /// first few places (`spec.devices.config[0].opaque.parameters.a.a…`).
    Pruned { object: K, paths: Vec<String> },
    /// Not decodable even so: only the metadata and why.
    Undecodable(Box<Undecodable>),
}

/// What is kept of an object that could not be decoded.
#[derive(Clone, Debug)]
pub struct Undecodable {
    pub metadata: ObjectMeta,
    pub error: String,
}

impl<K> Bounded<K> {
    /// The object, unless it could not be decoded.
    pub fn object(&self) -> Option<&K> {
        match self {
            Bounded::Whole(o) | Bounded::Pruned { object: o, .. } => Some(o),
            Bounded::Undecodable(_) => None,
        }
    }

    /// The object, or the metadata and error of one that could not be decoded.
    pub fn into_result(self) -> Result<K, Box<Undecodable>> {
        match self {
            Bounded::Whole(o) | Bounded::Pruned { object: o, .. } => Ok(o),
            Bounded::Undecodable(u) => Err(u),
        }
    }
}

impl<K: DeserializeOwned> Bounded<K> {
    /// Decodes one object from its JSON text.
    pub fn from_json(text: &str) -> Self {
        let first = match serde_json::from_str::<K>(text) {
            Ok(o) => return Bounded::Whole(o),
            Err(e) => e,
        };
        let mut paths = Vec::new();
        let mut at = Vec::new();
        let mut de = serde_json::Deserializer::from_str(text);
        let pruned = Prune {
            depth: MAX_DEPTH,
            at: &mut at,
            paths: &mut paths,
        }
        .deserialize(&mut de);
        let decoded = pruned
            .map_err(|e| e.to_string())
            .and_then(|value| serde_json::from_value::<K>(value).map_err(|e| e.to_string()));
        match decoded {
            // Pruning nothing and decoding then is impossible (same input); kept as
            // Pruned with no paths should serde_json ever differ between the two.
            Ok(object) => Bounded::Pruned { object, paths },
            Err(_) => Bounded::Undecodable(Box::new(Undecodable {
                metadata: identity(text),
                error: first.to_string(),
            })),
        }
    }
}

/// The name, namespace, uid and resource version of an object that did not decode,
/// read without recursion into anything else.
fn identity(text: &str) -> ObjectMeta {
    #[derive(Deserialize, Default)]
    #[serde(default)]
    struct Shell {
        metadata: Ident,
    }
    #[derive(Deserialize, Default)]
    #[serde(default, rename_all = "camelCase")]
    struct Ident {
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
        resource_version: Option<String>,
    }
    let m = serde_json::from_str::<Shell>(text)
        .unwrap_or_default()
        .metadata;
    ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        ..ObjectMeta::default()
    }
}

/// Builds a `Value` no deeper than `depth`, recording where it cut.
struct Prune<'a> {
    depth: usize,
    at: &'a mut Vec<String>,
    paths: &'a mut Vec<String>,
}

impl Prune<'_> {
    fn cut(&mut self) {
        if self.paths.len() < PATHS_KEPT {
            let mut p = String::new();
            for (i, seg) in self.at.iter().take(PATH_LEVELS_SHOWN).enumerate() {
                if i > 0 && !seg.starts_with('[') {
                    p.push('.');
                }
                p.push_str(seg);
            }
            if self.at.len() > PATH_LEVELS_SHOWN {
                p.push('…');
            }
            self.paths.push(p);
        }
    }

    fn child(&mut self) -> Prune<'_> {
        Prune {
            depth: self.depth.saturating_sub(1),
            at: self.at,
            paths: self.paths,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Prune<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(mut self, d: D) -> Result<Value, D::Error> {
        if self.depth == 0 {
            IgnoredAny::deserialize(d)?;
            self.cut();
            return Ok(Value::Null);
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Prune<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        loop {
            self.at.push(format!("[{}]", out.len()));
            let next = seq.next_element_seed(self.child());
            self.at.pop();
            match next? {
                Some(v) => out.push(v),
                None => return Ok(Value::Array(out)),
            }
        }
    }
    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            self.at.push(key.clone());
            let v = map.next_value_seed(self.child());
            self.at.pop();
            out.insert(key, v?);
        }
        Ok(Value::Object(out))
    }
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Bounded<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // The raw text is captured without recursion, whatever its depth.
        let raw = Box::<RawValue>::deserialize(d)?;
        Ok(Bounded::from_json(raw.get()))
    }
}

impl<K: kube::Resource> kube::Resource for Bounded<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn metadata_api() -> bool {
        K::metadata_api()
    }
    fn url_path(dt: &Self::DynamicType, namespace: Option<&str>) -> String {
        K::url_path(dt, namespace)
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            Bounded::Whole(o) | Bounded::Pruned { object: o, .. } => o.meta(),
            Bounded::Undecodable(u) => &u.metadata,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Bounded::Whole(o) | Bounded::Pruned { object: o, .. } => o.meta_mut(),
            Bounded::Undecodable(u) => &mut u.metadata,
        }
    }
}

#[cfg(test)]
mod tests;
