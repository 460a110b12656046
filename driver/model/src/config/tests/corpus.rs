//! The shared opaque config cases (`tests/opaque-config/cases.yaml`) through the
//! decoder. The chart's ValidatingAdmissionPolicy is run over the same file against a
//! real API server by `TestOpaqueConfigPolicy` in `tests/e2e`, so the decoder and the
//! policy are held to one list of what is accepted and which field a refusal names.

use std::collections::BTreeSet;

use serde::Deserialize;
use serde_json::Value;

use super::super::decode_parameters;

const CASES: &str = include_str!("../../../../../tests/opaque-config/cases.yaml");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    #[serde(default)]
    valid: bool,
    path: Option<String>,
    parameters: Option<Value>,
    json: Option<String>,
}

impl Case {
    fn parameters(&self) -> Value {
        match (&self.parameters, &self.json) {
            (Some(parameters), None) => parameters.clone(),
            (None, Some(json)) => serde_json::from_str(json)
                .unwrap_or_else(|e| panic!("case {:?}: json: {e}", self.name)),
            _ => panic!(
                "case {:?}: give exactly one of parameters and json",
                self.name
            ),
        }
    }
}

fn cases() -> Vec<Case> {
    serde_saphyr::from_str(CASES).expect("tests/opaque-config/cases.yaml")
}

#[test]
fn corpus_is_well_formed() {
    let cases = cases();
    let mut names = BTreeSet::new();
    for case in &cases {
        assert!(
            names.insert(&case.name),
            "duplicate case name {:?}",
            case.name
        );
        assert_eq!(
            case.valid,
            case.path.is_none(),
            "case {:?}: an invalid case names a path, a valid one does not",
            case.name
        );
        case.parameters();
    }
    let valid = cases.iter().filter(|c| c.valid).count();
    assert!(
        valid >= 10 && cases.len() - valid >= 50,
        "{valid} of {}",
        cases.len()
    );
}

#[test]
fn decoder_agrees_with_corpus() {
    let mut failures = Vec::new();
    for case in cases() {
        let parameters = case.parameters();
        // What the plugin acts on: decoded and converted (which refuses what is not
        // implemented yet).
        let decoded = decode_parameters(&parameters).and_then(|c| c.to_effective().map(|_| c));
        match (decoded, &case.path) {
            (Ok(_), None) => {}
            (Ok(config), Some(path)) => failures.push(format!(
                "{:?}: accepted ({config:?}), want refused at {path:?}",
                case.name
            )),
            (Err(error), None) => {
                failures.push(format!("{:?}: refused ({error}), want accepted", case.name));
            }
            (Err(error), Some(path)) => {
                // `parameters` itself (not an object) has no field path.
                let got = error.path().unwrap_or("");
                if got != path {
                    failures.push(format!(
                        "{:?}: refused at {got:?} ({error}), want {path:?}",
                        case.name
                    ));
                }
                // The message names the field, so that it can be found in the claim.
                let message = error.to_string();
                if !message.contains(path.as_str()) {
                    failures.push(format!(
                        "{:?}: message {message:?} does not name {path:?}",
                        case.name
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
