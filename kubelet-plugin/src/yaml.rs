//! YAML output that every YAML parser reads back as the same data.
//!
//! In YAML 1.2, `0000:07:00.0` written plain is a string; YAML 1.1
//! parsers (PyYAML, Go's yaml.v2, older kubectl plugins) read such a scalar as a
//! base-60 number, and `no`, `on` or `y` as booleans. So every string that is not
//! plainly a word is written double-quoted, in JSON's escaping, which YAML's
//! double-quoted style accepts as is.

use std::fmt::Write;

use serde_json::Value;

/// `value` as a YAML document, block style, two-space indents.
pub(crate) fn to_string(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(m) if !m.is_empty() => map(&mut out, m, 0),
        Value::Array(a) if !a.is_empty() => seq(&mut out, a, 0),
        other => {
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
    out
}

fn pad(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

fn map(out: &mut String, m: &serde_json::Map<String, Value>, indent: usize) {
    let mut first = true;
    for (k, v) in m {
        // The first key of a sequence item sits on the dash's line.
        if !first || !out.ends_with("- ") {
            pad(out, indent);
        }
        first = false;
        let _ = write!(out, "{}:", string(k));
        nested(out, v, indent);
    }
}

fn seq(out: &mut String, a: &[Value], indent: usize) {
    for v in a {
        pad(out, indent);
        out.push_str("- ");
        match v {
            Value::Object(m) if !m.is_empty() => map(out, m, indent + 2),
            Value::Array(inner) if !inner.is_empty() => {
                out.push('\n');
                seq(out, inner, indent + 2);
            }
            other => {
                out.push_str(&scalar(other));
                out.push('\n');
            }
        }
    }
}

/// What follows `key:`: a scalar on the same line, or a block below it.
fn nested(out: &mut String, v: &Value, indent: usize) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            out.push('\n');
            map(out, m, indent + 2);
        }
        Value::Array(a) if !a.is_empty() => {
            out.push('\n');
            seq(out, a, indent);
        }
        other => {
            out.push(' ');
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => string(s),
        Value::Object(_) => "{}".to_owned(),
        Value::Array(_) => "[]".to_owned(),
    }
}

/// Words YAML 1.1 reads as booleans or null.
const RESERVED: &[&str] = &[
    "y", "n", "yes", "no", "on", "off", "true", "false", "null", "~",
];

/// Plain when it starts with a letter and holds only letters, digits and `-_./`,
/// and is no reserved word; quoted otherwise.
fn string(s: &str) -> String {
    let plain = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
        && !RESERVED.contains(&s.to_ascii_lowercase().as_str());
    if plain {
        s.to_owned()
    } else {
        // A JSON string literal is a valid YAML double-quoted scalar.
        Value::String(s.to_owned()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strings_a_yaml_1_1_parser_would_misread_are_quoted() {
        for s in [
            "0000:07:00.0",
            "no",
            "On",
            "1.5",
            "12",
            "",
            "- x",
            "a: b",
            "#c",
            "550.90.07",
        ] {
            assert!(string(s).starts_with('"'), "{s}");
        }
        for s in ["gpu-0", "resource.kubernetes.io/pciBusID", "nvl0", "v1"] {
            assert_eq!(string(s), s);
        }
    }

    #[test]
    fn output_reads_back_as_the_same_value() {
        let v = json!({
            "apiVersion": "v1",
            "items": [{
                "spec": {
                    "devices": [{
                        "name": "gpu-0",
                        "attributes": {
                            "resource.kubernetes.io/pciBusID": {"string": "0000:07:00.0"},
                            "numaNode": {"ints": [0, 1]},
                            "uuid": {"string": "GPU-1\n\"x\""},
                        },
                        "capacity": {"memory": {"value": "80Gi"}},
                        "taints": [],
                        "empty": {},
                    }],
                    "nested": [[1, 2], ["a"]],
                    "allNodes": false,
                    "nothing": null,
                },
            }],
            "kind": "List",
        });
        let text = to_string(&v);
        assert!(text.contains("string: \"0000:07:00.0\""), "{text}");
        let back: Value = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(back, v, "{text}");
    }
}
