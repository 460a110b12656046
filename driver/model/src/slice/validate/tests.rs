use super::*;
use crate::slice::fixtures::{dgx_h100, version};
use crate::slice::{SliceOptions, build_slices};

fn dgx_slice() -> ResourceSlice {
    build_slices(&dgx_h100(), &SliceOptions::new("node-a"))
        .unwrap()
        .remove(0)
}

fn attr(slice: &mut ResourceSlice, device: usize, name: &str, a: DeviceAttribute) {
    slice.spec.devices.as_mut().unwrap()[device]
        .attributes
        .get_or_insert_default()
        .insert(name.to_owned(), a);
}

#[test]
fn built_slices_pass() {
    validate_slice(&dgx_slice()).unwrap();
}

#[test]
fn semver_is_strict() {
    for good in [
        "0.0.0",
        "550.90.7",
        "1.2.3-alpha.1+build.01",
        "1.2.3-0.3.7",
        "1.2.3-x-y-z.--",
        "1.0.0+0.build.1-rc.10000aaa-kk-0.1",
        "18446744073709551615.0.0",
    ] {
        assert_eq!(check_version(good), Ok(()), "{good}");
    }
    for bad in [
        "",
        "1.2",
        "1.2.3.4",
        "v1.2.3",
        "1.02.3",
        "550.90.07",
        "1.2.3-",
        "1.2.3-01",
        "1.2.3-a..b",
        "1.2.3+",
        "1.2.3+a_b",
        "1.2.3 ",
        "18446744073709551616.0.0",
        &format!("1.2.3-{}", "a".repeat(60)),
    ] {
        assert!(check_version(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn bad_driver_names_are_refused() {
    for bad in [
        "GPU.topodra.dev",
        "-gpu.topodra.dev",
        "gpu..topodra.dev",
        "gpu_topodra.dev",
        "",
        &format!("{}.dev", "g".repeat(60)),
    ] {
        let opts = SliceOptions {
            driver_name: bad.to_owned(),
            ..SliceOptions::new("node-a")
        };
        let err = build_slices(&dgx_h100(), &opts).unwrap_err();
        assert!(
            matches!(&err, SliceError::DriverName { name, .. } if name == bad),
            "{bad:?}: {err}"
        );
    }
    validate_driver_name(&format!("{}.dev", "g".repeat(59))).unwrap();
}

#[test]
fn bad_node_names_are_refused() {
    let long = format!("{}.example", "n".repeat(250));
    for bad in ["Node-A", "node_a", "node-a.", long.as_str()] {
        let err = build_slices(&dgx_h100(), &SliceOptions::new(bad)).unwrap_err();
        assert!(matches!(err, SliceError::NodeName { .. }), "{bad:?}: {err}");
    }
}

#[test]
fn long_string_values_are_refused() {
    let mut s = dgx_slice();
    let value = "N".repeat(65);
    attr(
        &mut s,
        3,
        "productName",
        DeviceAttribute {
            string: Some(value.clone()),
            ..Default::default()
        },
    );
    let err = validate_slice(&s).unwrap_err();
    assert_eq!(
        err,
        SliceError::ValueTooLong {
            device: "gpu-3".to_owned(),
            attribute: "productName".to_owned(),
            value,
            len: 65,
            max: 64
        }
    );
    assert!(err.to_string().contains("gpu-3"), "{err}");
}

#[test]
fn bad_versions_are_refused() {
    let mut s = dgx_slice();
    attr(&mut s, 0, "driverVersion", version("550.90.07"));
    let err = validate_slice(&s).unwrap_err();
    assert!(
        matches!(&err, SliceError::InvalidVersion { device, attribute, value, .. }
            if device == "gpu-0" && attribute == "driverVersion" && value == "550.90.07"),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("leading zeros") && msg.contains("driverVersion"),
        "{msg}"
    );
}

#[test]
fn duplicate_device_names_are_refused() {
    let mut inv = dgx_h100();
    inv.gpus[6].minor = Some(1);
    let err = build_slices(&inv, &SliceOptions::new("node-a")).unwrap_err();
    assert_eq!(
        err,
        SliceError::DuplicateDevice {
            pool: "node-a".to_owned(),
            device: "gpu-1".to_owned()
        }
    );
    // Also when the two land in different slices.
    let opts = SliceOptions {
        max_devices_per_slice: Some(1),
        ..SliceOptions::new("node-a")
    };
    let err = build_slices(&inv, &opts).unwrap_err();
    assert!(matches!(err, SliceError::DuplicateDevice { .. }), "{err}");
}

#[test]
fn too_many_attributes_are_refused() {
    let mut s = dgx_slice();
    // 12 attributes (the lean set) and 1 capacity already; 20 more make 33.
    for i in 0..20 {
        attr(&mut s, 2, &format!("extra{i}"), version("1.0.0"));
    }
    let err = validate_slice(&s).unwrap_err();
    assert_eq!(
        err,
        SliceError::TooManyAttributes {
            device: "gpu-2".to_owned(),
            count: 33,
            max: 32
        }
    );
}

#[test]
fn attribute_names_are_checked() {
    let cases = [
        ("9lives", false),
        ("has-dash", false),
        (&*"a".repeat(33), false),
        ("Bad.Domain/x", false),
        ("/x", false),
        ("example.com/", false),
        (&*format!("{}.com/x", "d".repeat(60)), false),
        ("_ok", true),
        (&*"a".repeat(32), true),
        ("resource.kubernetes.io/pciBusID", true),
    ];
    for (name, ok) in cases {
        let mut s = dgx_slice();
        attr(&mut s, 0, name, version("1.0.0"));
        let res = validate_slice(&s);
        assert_eq!(res.is_ok(), ok, "{name:?}: {res:?}");
        if !ok {
            assert!(
                matches!(res, Err(SliceError::AttributeName { .. })),
                "{res:?}"
            );
        }
    }
}

#[test]
fn a_qualified_spelling_of_our_own_attribute_is_a_duplicate() {
    let mut s = dgx_slice();
    attr(&mut s, 0, "gpu.topodra.dev/uuid", version("1.0.0"));
    let err = validate_slice(&s).unwrap_err();
    assert!(
        matches!(err, SliceError::DuplicateAttribute { .. }),
        "{err}"
    );
}

#[test]
fn attribute_values_must_set_one_non_empty_value() {
    let mut s = dgx_slice();
    attr(&mut s, 0, "x", DeviceAttribute::default());
    assert!(matches!(
        validate_slice(&s),
        Err(SliceError::ValueCount { count: 0, .. })
    ));
    let mut s = dgx_slice();
    let both = DeviceAttribute {
        int: Some(1),
        string: Some("a".to_owned()),
        ..Default::default()
    };
    attr(&mut s, 0, "x", both);
    assert!(matches!(
        validate_slice(&s),
        Err(SliceError::ValueCount { count: 2, .. })
    ));
    let mut s = dgx_slice();
    let empty = DeviceAttribute {
        ints: Some(vec![]),
        ..Default::default()
    };
    attr(&mut s, 0, "x", empty);
    assert!(matches!(
        validate_slice(&s),
        Err(SliceError::EmptyList { .. })
    ));
}

#[test]
fn device_limits_depend_on_list_attributes() {
    let mut s = dgx_slice();
    let template = s.spec.devices.as_ref().unwrap()[0].clone();
    let devices: Vec<Device> = (0..65)
        .map(|i| Device {
            name: format!("gpu-{i}"),
            ..template.clone()
        })
        .collect();
    s.spec.devices = Some(devices);
    validate_slice(&s).unwrap();
    let list = DeviceAttribute {
        ints: Some(vec![0, 1]),
        ..Default::default()
    };
    attr(&mut s, 64, "resource.kubernetes.io/numaNode", list);
    let err = validate_slice(&s).unwrap_err();
    assert!(
        matches!(
            err,
            SliceError::TooManyDevices {
                count: 65,
                max: 64,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn pools_must_agree_across_slices() {
    let opts = SliceOptions {
        max_devices_per_slice: Some(4),
        ..SliceOptions::new("node-a")
    };
    let slices = build_slices(&dgx_h100(), &opts).unwrap();
    validate_pool(&slices).unwrap();

    let mut bad = slices.clone();
    bad[1].spec.pool.generation += 1;
    assert!(matches!(
        validate_pool(&bad),
        Err(SliceError::MixedPool {
            field: "pool generation",
            ..
        })
    ));

    let err = validate_pool(&slices[..1]).unwrap_err();
    assert!(
        matches!(
            err,
            SliceError::SliceCount {
                declared: 2,
                actual: Some(1),
                ..
            }
        ),
        "{err}"
    );
}
