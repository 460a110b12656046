use super::*;
use crate::cdi::spec::{Device, DeviceNode, Hook, IntelRdt, Mount, NetDevice};

fn good() -> Spec {
    Spec {
        cdi_version: "0.3.0".into(),
        kind: "k8s.gpu.topodra.dev/claim".into(),
        devices: vec![Device {
            name: "gpu-0".into(),
            container_edits: ContainerEdits {
                device_nodes: vec![DeviceNode {
                    path: "/dev/nvidia0".into(),
                    kind: Some("c".into()),
                    major: Some(195),
                    minor: Some(0),
                    ..Default::default()
                }],
                ..Default::default()
            },
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[test]
fn a_good_spec_passes() {
    validate(&good()).unwrap();
}

#[test]
fn each_rule_is_enforced() {
    type Edit = fn(&mut Spec);
    let cases: Vec<(Edit, &str)> = vec![
        (|s| s.cdi_version = "0.6".into(), "invalid CDI version"),
        (|s| s.cdi_version = "0.6.1".into(), "not a released"),
        (
            |s| {
                s.annotations.insert("a".into(), "b".into());
            },
            "lower than 0.6.0",
        ),
        (|s| s.kind = "claim".into(), "not vendor/class"),
        (
            |s| s.kind = "vendor.com/foo/bar".into(),
            "invalid character '/'",
        ),
        (|s| s.kind = "vendor..com/foo".into(), "empty DNS label"),
        (
            |s| s.kind = "1vendor.com/foo".into(),
            "must start with a letter",
        ),
        (|s| s.kind = "vendor.com/foo-".into(), "must end"),
        (|s| s.kind = "vendor.com/".into(), "class is empty"),
        (|s| s.devices.clear(), "at least one device"),
        (|s| s.devices[0].name = "-gpu".into(), "must start"),
        (
            |s| s.devices[0].name = "gpu 0".into(),
            "invalid character ' '",
        ),
        (|s| s.devices[0].name = "gpu-".into(), "must end"),
        (
            |s| {
                let d = s.devices[0].clone();
                s.devices.push(d);
            },
            "defined twice",
        ),
        (
            |s| s.devices[0].container_edits = ContainerEdits::default(),
            "devices[0].containerEdits is empty",
        ),
        (
            |s| s.container_edits.env = vec!["=x".into()],
            "is not KEY=VALUE",
        ),
        (
            |s| s.devices[0].container_edits.env = vec!["NOVALUE".into()],
            "is not KEY=VALUE",
        ),
        (
            |s| s.devices[0].container_edits.device_nodes[0].path = "dev/nvidia0".into(),
            "not an absolute path",
        ),
        (
            |s| {
                s.cdi_version = "0.5.0".into();
                s.devices[0].container_edits.device_nodes[0].host_path = Some("x".into());
            },
            "hostPath \"x\" is not an absolute path",
        ),
        (
            |s| s.devices[0].container_edits.device_nodes[0].kind = Some("x".into()),
            "is not one of b, c, u, p",
        ),
        (
            |s| s.devices[0].container_edits.device_nodes[0].permissions = Some("rwx".into()),
            "permissions",
        ),
        (
            |s| {
                s.container_edits.mounts = vec![Mount {
                    host_path: "lib".into(),
                    container_path: "/lib".into(),
                    kind: None,
                    options: vec!["rbind".into()],
                }]
            },
            "hostPath \"lib\" is not an absolute path",
        ),
        (
            |s| {
                s.container_edits.mounts = vec![Mount {
                    host_path: "tmpfs".into(),
                    container_path: "tmp".into(),
                    kind: None,
                    options: vec![],
                }]
            },
            "containerPath \"tmp\" is not an absolute path",
        ),
        (
            |s| {
                s.container_edits.hooks = vec![Hook {
                    hook_name: "postStart".into(),
                    path: "/bin/true".into(),
                    ..Default::default()
                }]
            },
            "hookName",
        ),
        (
            |s| {
                s.container_edits.hooks = vec![Hook {
                    hook_name: "createContainer".into(),
                    path: "true".into(),
                    timeout: Some(0),
                    ..Default::default()
                }]
            },
            "timeout must be positive",
        ),
        (
            |s| {
                s.cdi_version = "0.7.0".into();
                s.container_edits.intel_rdt = Some(IntelRdt {
                    clos_id: Some("..".into()),
                    ..Default::default()
                })
            },
            "closID",
        ),
        (
            |s| {
                s.cdi_version = "1.1.0".into();
                let n = NetDevice {
                    host_interface_name: "eth1".into(),
                    name: "net1".into(),
                };
                s.container_edits.net_devices = vec![n.clone(), n];
            },
            "repeats",
        ),
        (
            |s| {
                s.cdi_version = "0.6.0".into();
                s.annotations.insert("Topodra.dev/x".into(), "y".into());
            },
            "lowercase DNS subdomain",
        ),
        (
            |s| {
                s.cdi_version = "0.6.0".into();
                s.devices[0].annotations.insert("a b".into(), "y".into());
            },
            "invalid character ' '",
        ),
        (
            |s| {
                s.cdi_version = "0.6.0".into();
                s.annotations.insert("big".into(), "x".repeat(300 * 1024));
            },
            "more than",
        ),
    ];
    for (edit, want) in cases {
        let mut spec = good();
        edit(&mut spec);
        let err = validate(&spec).unwrap_err().to_string();
        assert!(err.contains(want), "want {want:?} in {err:?}");
    }
}

#[test]
fn device_names_may_start_with_a_digit_from_0_5_0() {
    let mut spec = good();
    spec.devices[0].name = "0b7c2f4e-gpu-0".into();
    assert!(validate(&spec).unwrap_err().to_string().contains("0.5.0"));
    spec.cdi_version = "0.5.0".into();
    validate(&spec).unwrap();
    assert!(check_device_name("a:b.c_d-e").is_ok());
    assert!(check_device_name("x").is_ok());
}

#[test]
fn reports_every_problem() {
    let mut spec = good();
    spec.kind = "bad".into();
    spec.devices[0].name = "bad!".into();
    assert_eq!(validate(&spec).unwrap_err().0.len(), 2);
}
