//! Does an observed slice already say what we would apply?
//!
//! Only the fields we set count. The server adds its own (uid, resourceVersion,
//! managedFields, creationTimestamp), defaults some of ours (a taint's timeAdded), and
//! others may add labels or owner references under their own field managers, which
//! server-side apply keeps. None of that is a reason to write, so an observed object
//! matches when projecting it onto the shape of the desired one gives the desired one.

use serde_json::{Map, Value};

/// The desired object as the comparison sees it: its JSON form.
pub(crate) fn shape<T: serde::Serialize>(obj: &T) -> Value {
    // k8s-openapi types always serialize (string map keys only).
    serde_json::to_value(obj).unwrap_or(Value::Null)
}

/// `observed` reduced to the fields present in `shape`.
///
/// Objects keep the shape's keys; arrays are compared position by position and must
/// have the same length (the lists we set, devices and taints, are atomic, so the
/// server keeps them whole), except `metadata.ownerReferences`, a list merged by uid
/// where other owners' entries are not ours to judge. A device's `attributes` and
/// `capacity` maps keep every observed key: they live inside the atomic devices
/// list, so only our last write put keys there (the server defaults none), and a key
/// we no longer publish (an attribute turned off) is a difference to write.
pub(crate) fn project(observed: &Value, shape: &Value) -> Value {
    project_at(observed, shape, &mut Vec::new())
}

fn project_at<'a>(observed: &Value, shape: &'a Value, path: &mut Vec<&'a str>) -> Value {
    match (shape, observed) {
        (Value::Object(want), Value::Object(have)) => {
            let mut out = Map::new();
            for (k, w) in want {
                if let Some(h) = have.get(k) {
                    path.push(k);
                    out.insert(k.clone(), project_at(h, w, path));
                    path.pop();
                }
            }
            if matches!(
                path.as_slice(),
                ["spec", "devices", "attributes" | "capacity"]
            ) {
                for (k, h) in have {
                    out.entry(k.clone()).or_insert_with(|| h.clone());
                }
            }
            Value::Object(out)
        }
        (Value::Array(want), Value::Array(have)) if *path == ["metadata", "ownerReferences"] => {
            Value::Array(
                want.iter()
                    .map(|w| {
                        have.iter()
                            .find(|h| h.get("uid").is_some() && h.get("uid") == w.get("uid"))
                            .map_or(Value::Null, |h| project_at(h, w, path))
                    })
                    .collect(),
            )
        }
        (Value::Array(want), Value::Array(have)) if want.len() == have.len() => Value::Array(
            want.iter()
                .zip(have)
                .map(|(w, h)| project_at(h, w, path))
                .collect(),
        ),
        _ => observed.clone(),
    }
}

/// True when `observed` holds every field of `desired` with the same value.
pub(crate) fn covers(observed: &Value, desired: &Value) -> bool {
    project(observed, desired) == *desired
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn desired() -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "name": "n-gpu.topodra.dev-0",
                "labels": {"app.kubernetes.io/managed-by": "topodra"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u1", "controller": true}],
            },
            "spec": {
                "driver": "gpu.topodra.dev",
                "pool": {"name": "n", "generation": 2, "resourceSliceCount": 1},
                "devices": [
                    {"name": "gpu-0", "taints": [{"key": "k", "effect": "NoSchedule"}]},
                    {"name": "gpu-1"},
                ],
            },
        })
    }

    #[test]
    fn server_set_and_defaulted_fields_are_ignored() {
        let mut observed = desired();
        observed["metadata"]["uid"] = json!("abc");
        observed["metadata"]["resourceVersion"] = json!("17");
        observed["metadata"]["managedFields"] = json!([{"manager": "x"}]);
        observed["metadata"]["labels"]["team"] = json!("infra");
        observed["metadata"]["ownerReferences"]
            .as_array_mut()
            .unwrap()
            .insert(
                0,
                json!({"apiVersion": "v1", "kind": "Other", "name": "o", "uid": "u0"}),
            );
        observed["spec"]["devices"][0]["taints"][0]["timeAdded"] = json!("2026-01-01T00:00:00Z");
        assert!(covers(&observed, &desired()));
    }

    #[test]
    fn any_difference_in_our_fields_is_seen() {
        let d = desired();
        let changes: [fn(&mut Value); 6] = [
            |o| o["spec"]["pool"]["generation"] = json!(1),
            |o| o["spec"]["devices"].as_array_mut().unwrap().truncate(1),
            |o| o["spec"]["devices"][0]["taints"] = json!([]),
            |o| o["metadata"]["labels"] = json!({}),
            |o| o["metadata"]["ownerReferences"][0]["uid"] = json!("u2"),
            |o| {
                o["spec"].as_object_mut().unwrap().remove("driver").unwrap();
            },
        ];
        for (i, change) in changes.iter().enumerate() {
            let mut o = d.clone();
            change(&mut o);
            assert!(!covers(&o, &d), "change {i} went unnoticed");
        }
        // Extra devices or taints are a difference too: the lists are atomic.
        let mut o = d.clone();
        o["spec"]["devices"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "gpu-2"}));
        assert!(!covers(&o, &d));
    }

    #[test]
    fn an_attribute_or_capacity_no_longer_published_is_a_difference() {
        let mut d = desired();
        d["spec"]["devices"][1]["attributes"] = json!({"index": {"int": 1}});
        d["spec"]["devices"][1]["capacity"] = json!({"memory": {"value": "80Gi"}});
        assert!(covers(&d.clone(), &d));
        // Written before with an alias (an operator has since turned it off).
        let mut o = d.clone();
        o["spec"]["devices"][1]["attributes"]["dra.net/numaNode"] = json!({"int": 0});
        assert!(!covers(&o, &d));
        let mut o = d.clone();
        o["spec"]["devices"][1]["capacity"]["cores"] = json!({"value": "132"});
        assert!(!covers(&o, &d));
        // Inside a capacity value, what the server defaults is still ignored.
        let mut o = d.clone();
        o["spec"]["devices"][1]["capacity"]["memory"]["requestPolicy"] = json!({"default": "1"});
        assert!(covers(&o, &d));
    }
}
