//! Field deserializers that close the leniencies serde's derive leaves open.
//!
//! A derived struct also accepts a JSON array of its fields in order (`"numa": [true,
//! false]`), and a unit enum also accepts `{"MPS": null}`. Both exist for other
//! formats; in a JSON API they would let a config through that no documented form
//! allows, so every struct- and enum-typed field goes through these instead.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::{MapAccessDeserializer, StrDeserializer};
use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};

/// An optional struct that must be a JSON object (or null, meaning absent).
pub(super) fn object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<Object<T>>::deserialize(deserializer).map(|o| o.map(|Object(t)| t))
}

struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
            type Value = Object<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Object<T>, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(Object)
            }
        }

        deserializer.deserialize_map(ObjectVisitor(PhantomData))
    }
}

/// A unit-variant enum that must be written as a plain string.
pub(super) fn string_enum<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct StringVisitor<T>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for StringVisitor<T> {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
            // Serde's own unknown-variant message lists the accepted values.
            T::deserialize(StrDeserializer::new(v))
        }
    }

    deserializer.deserialize_str(StringVisitor(PhantomData))
}

/// An optional list of unit-variant enums, each written as a plain string (or null,
/// meaning absent).
pub(super) fn string_enums<'de, D, T>(deserializer: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Item<T>(T);

    impl<'de, T: Deserialize<'de>> Deserialize<'de> for Item<T> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            string_enum(deserializer).map(Item)
        }
    }

    Option::<Vec<Item<T>>>::deserialize(deserializer)
        .map(|o| o.map(|items| items.into_iter().map(|Item(t)| t).collect()))
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        a: bool,
    }

    #[derive(Debug, Default, PartialEq, Deserialize)]
    enum Color {
        #[default]
        Red,
        Green,
    }

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        #[serde(default, deserialize_with = "object")]
        inner: Option<Inner>,
        #[serde(default, deserialize_with = "string_enum")]
        color: Color,
    }

    fn outer(v: serde_json::Value) -> Result<Outer, String> {
        Outer::deserialize(&v).map_err(|e| e.to_string())
    }

    #[test]
    fn objects_only() {
        let got = outer(json!({"inner": {"a": true}})).unwrap();
        assert_eq!(got.inner, Some(Inner { a: true }));
        assert_eq!(outer(json!({"inner": null})).unwrap().inner, None);
        assert_eq!(outer(json!({})).unwrap().inner, None);
        let err = outer(json!({"inner": [true]})).unwrap_err();
        assert!(err.contains("expected an object"), "{err}");
    }

    #[test]
    fn strings_only() {
        assert_eq!(
            outer(json!({"color": "Green"})).unwrap().color,
            Color::Green
        );
        assert_eq!(outer(json!({})).unwrap().color, Color::Red);
        let err = outer(json!({"color": {"Red": null}})).unwrap_err();
        assert!(err.contains("expected a string"), "{err}");
        let err = outer(json!({"color": "Blue"})).unwrap_err();
        assert!(
            err.contains("unknown variant `Blue`, expected `Red` or `Green`"),
            "{err}"
        );
    }
}
