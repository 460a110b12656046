mod corpus;

use k8s_openapi::api::resource::v1::{
    DeviceAllocationConfiguration, OpaqueDeviceConfiguration, ResourceClaimTemplate,
};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use proptest::prelude::*;
use serde_json::json;

use super::v1alpha1::{
    DeviceName, Mps, Numa, Percentage, Sharing, SharingStrategy, TimeSliceInterval, TimeSlicing,
};
use super::*;

const DRIVER: &str = "gpu.topodra.dev";

fn opaque(driver: &str, parameters: Value) -> OpaqueDeviceConfiguration {
    OpaqueDeviceConfiguration {
        driver: driver.to_owned(),
        parameters: RawExtension(parameters),
    }
}

fn ok(parameters: Value) -> EffectiveConfig {
    decode(DRIVER, &opaque(DRIVER, parameters))
        .unwrap()
        .unwrap()
        .to_effective()
        .unwrap()
}

/// Asserts the config decodes but is refused as something a claim cannot have,
/// at `path`; returns the message.
fn refused_at(parameters: Value, path: &str) -> String {
    let decoded = decode(DRIVER, &opaque(DRIVER, parameters))
        .unwrap()
        .unwrap();
    let error = decoded.to_effective().unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, ConfigError::NotImplemented { .. }),
        "{message}"
    );
    assert_eq!(error.path(), Some(path), "{message}");
    assert!(message.starts_with(&format!("{path}: ")), "{message}");
    message
}

/// Asserts the config decodes but is refused because the device, not the config,
/// chooses MPS, at `path`.
fn device_chosen_at(parameters: Value, path: &str) -> String {
    let message = refused_at(parameters, path);
    assert!(message.contains("chosen by the device"), "{message}");
    message
}

fn err(parameters: Value) -> ConfigError {
    decode(DRIVER, &opaque(DRIVER, parameters)).unwrap_err()
}

fn with(fields: Value) -> Value {
    let mut config = json!({"apiVersion": "gpu.topodra.dev/v1alpha1", "kind": "GpuConfig"});
    let (Value::Object(config_map), Value::Object(extra)) = (&mut config, fields) else {
        panic!("objects only");
    };
    config_map.extend(extra);
    config
}

/// Asserts the error is about `path` and its message says so, then returns it.
fn invalid_at(parameters: Value, path: &str) -> String {
    let error = err(parameters);
    let message = error.to_string();
    assert_eq!(error.path(), Some(path), "{message}");
    assert!(message.starts_with(&format!("{path}: ")), "{message}");
    message
}

#[test]
fn versions_are_consistent() {
    assert_eq!(
        v1alpha1::API_VERSION,
        format!("{GROUP}/{}", v1alpha1::VERSION)
    );
}

#[test]
fn minimal_config_is_all_defaults() {
    assert_eq!(ok(with(json!({}))), EffectiveConfig::default());
    assert_eq!(
        ok(with(json!({"sharing": {}, "numa": {}}))),
        EffectiveConfig::default()
    );
    let numa = ok(with(json!({"numa": {"requireAligned": true}}))).numa;
    assert!(numa.export_hints && numa.require_aligned);
    let numa = ok(with(json!({"numa": {"exportHints": false}}))).numa;
    assert!(!numa.export_hints && !numa.require_aligned);
}

#[test]
fn exclusive() {
    let config = ok(with(json!({"sharing": {"strategy": "Exclusive"}})));
    assert_eq!(config.sharing, SharingPolicy::Exclusive);
}

#[test]
fn time_slicing() {
    let config = ok(with(json!({"sharing": {"strategy": "TimeSlicing"}})));
    assert_eq!(config.sharing, SharingPolicy::TimeSlicing);
    let config = ok(with(json!({"sharing": {
        "strategy": "TimeSlicing", "timeSlicing": {"interval": "Default"}
    }})));
    assert_eq!(config.sharing, SharingPolicy::TimeSlicing);
    for name in ["Short", "Medium", "Long"] {
        let message = refused_at(
            with(json!({"sharing": {
                "strategy": "TimeSlicing", "timeSlicing": {"interval": name}
            }})),
            "sharing.timeSlicing.interval",
        );
        assert_eq!(
            message,
            format!(
                "sharing.timeSlicing.interval: {name} cannot be set per claim: the interval is a node setting; \
                 select time-sliced devices with timeSliceInterval == \"{name}\" and leave interval out or set Default"
            )
        );
    }
}

#[test]
fn mps() {
    // The whole block decodes strictly (see the invalid cases), then MPS is refused.
    for sharing in [
        json!({"strategy": "MPS"}),
        json!({"strategy": "MPS", "mps": {
            "defaultActiveThreadPercentage": 100,
            "defaultPinnedDeviceMemoryLimit": "10Gi",
            "perDevicePinnedMemoryLimit": {"gpu-0": "1Gi", "gpu-12": "512M"}
        }}),
    ] {
        device_chosen_at(with(json!({ "sharing": sharing })), "sharing.strategy");
    }
}

#[test]
fn other_drivers_are_ignored() {
    for parameters in [json!("not even an object"), json!({"apiVersion": "x/y"})] {
        let decoded = decode(DRIVER, &opaque("nic.example.com", parameters)).unwrap();
        assert_eq!(decoded, None);
    }
}

#[test]
fn driver_name_is_a_parameter() {
    let custom = "gpu.example.org";
    let config = opaque(custom, with(json!({})));
    assert!(decode(custom, &config).unwrap().is_some());
    assert!(decode(DRIVER, &config).unwrap().is_none());
}

#[test]
fn parameters_must_be_an_object() {
    for (parameters, found) in [
        (json!(null), "null"),
        (json!(true), "boolean"),
        (json!(3), "number"),
        (json!("GpuConfig"), "string"),
        (json!([with(json!({}))]), "array"),
    ] {
        let error = err(parameters);
        assert!(matches!(error, ConfigError::NotAnObject { .. }));
        let message = error.to_string();
        assert!(
            message.contains("JSON object") && message.contains(found),
            "{message}"
        );
    }
}

#[test]
fn oversized_parameters() {
    let padding = "x".repeat(MAX_PARAMETERS_BYTES);
    let error = err(with(json!({"padding": padding})));
    assert_eq!(
        error,
        ConfigError::TooLarge {
            limit: MAX_PARAMETERS_BYTES
        }
    );
    assert!(error.to_string().contains("10240 bytes"), "{error}");

    // At the limit exactly is fine as far as size goes.
    let base = serde_json::to_string(&with(json!({"numa": {"x": ""}}))).unwrap();
    let fill = "y".repeat(MAX_PARAMETERS_BYTES - base.len());
    let exact = with(json!({"numa": {"x": fill}}));
    assert_eq!(
        serde_json::to_string(&exact).unwrap().len(),
        MAX_PARAMETERS_BYTES
    );
    invalid_at(exact, "numa.x");
}

#[test]
fn accepted_at_the_limit_reencodes_under_it() {
    // Padded with device keys up to the limit, with defaults left implicit:
    // re-encoding must not write them out and grow past the limit, or the round
    // trip would fail.
    let padded = |devices: usize| {
        let limits: serde_json::Map<_, _> = (0..devices)
            .map(|n| (format!("gpu-{n}"), json!("1Gi")))
            .collect();
        with(json!({
            "sharing": {"strategy": "MPS", "mps": {"perDevicePinnedMemoryLimit": limits}},
            "numa": {}
        }))
    };
    let len = |v: &Value| serde_json::to_string(v).unwrap().len();
    let devices = (1..)
        .find(|n| len(&padded(*n)) > MAX_PARAMETERS_BYTES)
        .unwrap();
    let parameters = padded(devices - 1);
    assert!(len(&parameters) + 30 > MAX_PARAMETERS_BYTES);

    let decoded = decode_parameters(&parameters).unwrap();
    let reencoded = serde_json::to_value(&decoded).unwrap();
    assert!(len(&reencoded) <= len(&parameters));
    assert_eq!(decode_parameters(&reencoded).unwrap(), decoded);
}

#[test]
fn missing_type_fields() {
    for (parameters, field) in [
        (json!({"kind": "GpuConfig"}), "apiVersion"),
        (
            json!({"apiVersion": null, "kind": "GpuConfig"}),
            "apiVersion",
        ),
        (json!({"apiVersion": "gpu.topodra.dev/v1alpha1"}), "kind"),
        (json!({}), "apiVersion"),
    ] {
        let error = err(parameters);
        assert_eq!(error.path(), Some(field));
        let message = error.to_string();
        assert!(
            message.starts_with(&format!("{field} is required")),
            "{message}"
        );
        assert!(
            message.contains("gpu.topodra.dev/v1alpha1 (kind GpuConfig)"),
            "{message}"
        );
    }
}

#[test]
fn type_fields_must_be_strings() {
    let message = invalid_at(json!({"apiVersion": 1, "kind": "GpuConfig"}), "apiVersion");
    assert!(message.contains("expected a string"), "{message}");
    invalid_at(
        json!({"apiVersion": "gpu.topodra.dev/v1alpha1", "kind": ["GpuConfig"]}),
        "kind",
    );
}

#[test]
fn wrong_api_version() {
    for api_version in [
        "gpu.nvidia.com/v1beta1",
        "gpu.topodra.dev/v1beta1",
        "gpu.topodra.dev/v1",
        "v1alpha1",
        "GPU.topodra.dev/v1alpha1",
        "",
    ] {
        let error = err(json!({"apiVersion": api_version, "kind": "GpuConfig"}));
        assert_eq!(error.path(), Some("apiVersion"));
        let message = error.to_string();
        assert!(message.contains(&format!("{api_version:?}")), "{message}");
        assert!(
            message.contains("accepts apiVersion gpu.topodra.dev/v1alpha1 (kind GpuConfig)"),
            "{message}"
        );
    }
}

#[test]
fn wrong_kind() {
    let error =
        err(json!({"apiVersion": "gpu.topodra.dev/v1alpha1", "kind": "GpuClaimParameters"}));
    assert_eq!(error.path(), Some("kind"));
    let message = error.to_string();
    assert!(message.contains("\"GpuClaimParameters\""), "{message}");
    assert!(message.contains("expected one of: GpuConfig"), "{message}");
}

#[test]
fn unknown_fields_at_every_depth() {
    let message = invalid_at(with(json!({"sharingg": {}})), "sharingg");
    assert!(message.contains("unknown field `sharingg`"), "{message}");
    invalid_at(
        with(json!({"numa": {"exportHint": true}})),
        "numa.exportHint",
    );
    invalid_at(
        with(json!({"sharing": {"strategy": "TimeSlicing", "timeSlicing": {"intervall": "Long"}}})),
        "sharing.timeSlicing.intervall",
    );
    let message = invalid_at(
        with(json!({"sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentag": 5}}})),
        "sharing.mps.defaultActiveThreadPercentag",
    );
    // The message lists the fields that do exist, so the typo is easy to spot.
    assert!(
        message.contains("`defaultActiveThreadPercentage`"),
        "{message}"
    );
    // Type metadata that Kubernetes objects carry is not a loophole.
    invalid_at(with(json!({"metadata": {"name": "x"}})), "metadata");
}

#[test]
fn wrong_types_name_field_and_expected_type() {
    for (fields, path, expected) in [
        (
            json!({"numa": {"exportHints": "true"}}),
            "numa.exportHints",
            "a boolean",
        ),
        (
            json!({"numa": {"requireAligned": null}}),
            "numa.requireAligned",
            "a boolean",
        ),
        (
            json!({"numa": [true, true]}),
            "numa",
            "invalid type: sequence, expected an object",
        ),
        (json!({"sharing": "MPS"}), "sharing", "expected an object"),
        (
            json!({"sharing": {"strategy": "MPS", "mps": []}}),
            "sharing.mps",
            "expected an object",
        ),
        (
            json!({"sharing": {"strategy": 1}}),
            "sharing.strategy",
            "expected a string",
        ),
        (
            json!({"sharing": {"strategy": {"MPS": null}}}),
            "sharing.strategy",
            "expected a string",
        ),
        (
            json!({"sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": ["Long"]}}}),
            "sharing.timeSlicing.interval",
            "expected a string",
        ),
        (
            json!({"sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": "50"}}}),
            "sharing.mps.defaultActiveThreadPercentage",
            "an integer from 1 to 100",
        ),
        (
            json!({"sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50.5}}}),
            "sharing.mps.defaultActiveThreadPercentage",
            "an integer from 1 to 100",
        ),
        (
            json!({"sharing": {"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": 1024}}}),
            "sharing.mps.defaultPinnedDeviceMemoryLimit",
            "a quantity string",
        ),
        (
            json!({"sharing": {"strategy": "MPS", "mps": {"perDevicePinnedMemoryLimit": ["gpu-0"]}}}),
            "sharing.mps.perDevicePinnedMemoryLimit",
            "a map",
        ),
    ] {
        let message = invalid_at(with(fields), path);
        assert!(message.contains(expected), "{message}");
    }
}

#[test]
fn unknown_enum_values() {
    let message = invalid_at(
        with(json!({"sharing": {"strategy": "Mps"}})),
        "sharing.strategy",
    );
    assert!(
        message.contains("`Exclusive`, `TimeSlicing`, `MPS`"),
        "{message}"
    );
    let message = invalid_at(
        with(json!({"sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "long"}}})),
        "sharing.timeSlicing.interval",
    );
    assert!(
        message.contains("`Default`, `Short`, `Medium`, `Long`"),
        "{message}"
    );
}

#[test]
fn percentage_range() {
    for bad in [json!(0), json!(101), json!(-1), json!(256), json!(u64::MAX)] {
        let message = invalid_at(
            with(
                json!({"sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": bad}}}),
            ),
            "sharing.mps.defaultActiveThreadPercentage",
        );
        assert!(
            message.contains(&format!("invalid value: integer `{bad}`")),
            "{message}"
        );
        assert!(message.contains("from 1 to 100"), "{message}");
    }
}

#[test]
fn bad_quantities() {
    for (bad, why) in [
        ("10 GiB", "expected a number"),
        ("10GB", "expected a number"),
        ("0", "greater than zero"),
        ("-1Gi", "negative"),
    ] {
        let message = invalid_at(
            with(
                json!({"sharing": {"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": bad}}}),
            ),
            "sharing.mps.defaultPinnedDeviceMemoryLimit",
        );
        assert!(message.contains(why) && message.contains(bad), "{message}");
    }
    invalid_at(
        with(json!({"sharing": {"strategy": "MPS", "mps": {
            "perDevicePinnedMemoryLimit": {"gpu-1": "1Gi", "gpu-2": "lots"}
        }}})),
        "sharing.mps.perDevicePinnedMemoryLimit.gpu-2",
    );
}

#[test]
fn bad_device_names() {
    for bad in ["GPU-0", "gpu_0", "", "-gpu", "gpu-"] {
        let message = invalid_at(
            with(json!({"sharing": {"strategy": "MPS", "mps": {
                "perDevicePinnedMemoryLimit": {bad: "1Gi"}
            }}})),
            &format!("sharing.mps.perDevicePinnedMemoryLimit.{bad}"),
        );
        assert!(message.contains("device name"), "{message}");
    }
    assert!(DeviceName::new(&"a".repeat(63)).is_some());
    assert!(DeviceName::new(&"a".repeat(64)).is_none());
}

#[test]
fn strategy_blocks_must_match() {
    for (sharing, block, wants, strategy) in [
        (json!({"mps": {}}), "mps", "MPS", "Exclusive"),
        (
            json!({"strategy": "Exclusive", "timeSlicing": {}}),
            "timeSlicing",
            "TimeSlicing",
            "Exclusive",
        ),
        (
            json!({"strategy": "TimeSlicing", "mps": {}}),
            "mps",
            "MPS",
            "TimeSlicing",
        ),
        (
            json!({"strategy": "MPS", "timeSlicing": {}}),
            "timeSlicing",
            "TimeSlicing",
            "MPS",
        ),
        (
            json!({"strategy": "MPS", "mps": {}, "timeSlicing": {"interval": "Long"}}),
            "timeSlicing",
            "TimeSlicing",
            "MPS",
        ),
        (
            json!({"strategy": "TimeSlicing", "timeSlicing": {}, "mps": {}}),
            "mps",
            "MPS",
            "TimeSlicing",
        ),
    ] {
        let message = invalid_at(
            with(json!({"sharing": sharing})),
            &format!("sharing.{block}"),
        );
        assert!(
            message.contains(&format!(
                "only allowed when sharing.strategy is {wants}, but the strategy is {strategy}"
            )),
            "{message}"
        );
    }
}

#[test]
fn round_trip() {
    let mut limits = std::collections::BTreeMap::new();
    limits.insert(DeviceName::new("gpu-7").unwrap(), "1.5Gi".parse().unwrap());
    let configs = [
        v1alpha1::GpuConfig::default(),
        v1alpha1::GpuConfig {
            sharing: Some(Sharing {
                strategy: SharingStrategy::TimeSlicing,
                time_slicing: Some(TimeSlicing {
                    interval: TimeSliceInterval::Medium,
                }),
                mps: None,
            }),
            numa: Some(Numa {
                export_hints: false,
                require_aligned: true,
            }),
            ..Default::default()
        },
        v1alpha1::GpuConfig {
            sharing: Some(Sharing {
                strategy: SharingStrategy::Mps,
                time_slicing: None,
                mps: Some(Mps {
                    default_active_thread_percentage: Percentage::new(30),
                    default_pinned_device_memory_limit: Some("4G".parse().unwrap()),
                    per_device_pinned_memory_limit: Some(limits),
                }),
            }),
            ..Default::default()
        },
    ];
    for config in configs {
        let config = GpuConfig::from(config);
        let json = serde_json::to_value(&config).unwrap();
        assert_eq!(json["apiVersion"], "gpu.topodra.dev/v1alpha1");
        assert_eq!(json["kind"], "GpuConfig");
        let back = decode(DRIVER, &opaque(DRIVER, json)).unwrap().unwrap();
        assert_eq!(back, config);
        assert_eq!(back.api_version(), v1alpha1::API_VERSION);
    }
}

#[test]
fn documented_examples_decode() {
    let docs = include_str!("examples.md");
    let templates: Vec<ResourceClaimTemplate> = docs
        .split("```yaml\n")
        .skip(1)
        .map(|block| serde_saphyr::from_str(block.split("```").next().unwrap()).unwrap())
        .collect();
    assert_eq!(templates.len(), 2);

    let mut effective = Vec::new();
    for (template, request) in templates.iter().zip(["gpus", "gpu/large"]) {
        let configs: Vec<_> = template
            .spec
            .as_ref()
            .and_then(|s| s.spec.as_ref())
            .and_then(|s| s.devices.as_ref())
            .and_then(|d| d.config.as_ref())
            .unwrap()
            .iter()
            .map(|c| DeviceAllocationConfiguration {
                opaque: c.opaque.clone(),
                requests: c.requests.clone(),
                source: SOURCE_FROM_CLAIM.to_owned(),
            })
            .collect();
        let mut got = effective_configs(DRIVER, &configs, &[request.to_owned()]).unwrap();
        effective.push(got.remove(request).unwrap());
    }
    assert!(effective[0].numa.require_aligned);
    assert_eq!(effective[1].sharing, SharingPolicy::TimeSlicing);
}

#[test]
fn module_doc_example_decodes() {
    let docs = include_str!("mod.rs");
    let json: String = docs
        .lines()
        .skip_while(|l| *l != "//! ```json")
        .skip(1)
        .take_while(|l| *l != "//! ```")
        .map(|l| l.trim_start_matches("//!"))
        .collect();
    let config = ok(serde_json::from_str(&json).unwrap());
    assert_eq!(config.sharing, SharingPolicy::TimeSlicing);
}

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop_oneof![
            Just("gpu.topodra.dev/v1alpha1".to_owned()),
            Just("GpuConfig".to_owned()),
            Just("MPS".to_owned()),
            Just("TimeSlicing".to_owned()),
            Just("1Gi".to_owned()),
            "\\PC{0,12}",
        ]
        .prop_map(Value::from),
    ];
    let key = prop_oneof![
        Just("apiVersion".to_owned()),
        Just("kind".to_owned()),
        Just("sharing".to_owned()),
        Just("strategy".to_owned()),
        Just("mps".to_owned()),
        Just("timeSlicing".to_owned()),
        Just("interval".to_owned()),
        Just("numa".to_owned()),
        Just("defaultActiveThreadPercentage".to_owned()),
        Just("defaultPinnedDeviceMemoryLimit".to_owned()),
        Just("perDevicePinnedMemoryLimit".to_owned()),
        Just("gpu-0".to_owned()),
        "\\PC{0,8}",
    ];
    leaf.prop_recursive(5, 64, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::from),
            prop::collection::btree_map(key.clone(), inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn decode_never_panics(parameters in arbitrary_json()) {
        let _ = decode(DRIVER, &opaque(DRIVER, parameters));
    }

    #[test]
    fn decode_never_panics_near_valid(
        sharing in arbitrary_json(),
        numa in arbitrary_json(),
    ) {
        let parameters = with(json!({"sharing": sharing, "numa": numa}));
        if let Ok(config) = decode(DRIVER, &opaque(DRIVER, parameters.clone())) {
            // Whatever is accepted must survive a round trip.
            let config = config.unwrap();
            let json = serde_json::to_value(&config).unwrap();
            prop_assert!(
                serde_json::to_string(&json).unwrap().len()
                    <= serde_json::to_string(&parameters).unwrap().len()
            );
            let back = decode(DRIVER, &opaque(DRIVER, json)).unwrap().unwrap();
            prop_assert_eq!(back, config);
        }
    }
}
