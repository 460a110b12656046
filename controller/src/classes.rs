//! Which DeviceClasses hand out our GPUs.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::DeviceClass;
use topodra_model::capacity::ClassKind;

/// The classes whose claims are ours: a claim request names a class, and the model
/// judges only requests for our GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OurClasses {
    /// Each class and what its selectors say it hands out (whole GPUs, MIG devices
    /// of a profile, shares of a sharing mode); [`ClassKind::Any`] where they say
    /// none of these.
    names: BTreeMap<String, ClassKind>,
    /// Extended resources (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`) that a class of
    /// ours serves through DRA, with that class's kind.
    extended: BTreeMap<String, ClassKind>,
}

impl OurClasses {
    /// The classes that select our driver's devices (a CEL selector comparing
    /// `device.driver` with the driver name), plus `extra` names given by the operator
    /// for classes written another way.
    pub fn from_classes<'a>(
        classes: impl IntoIterator<Item = &'a DeviceClass>,
        driver: &str,
        extra: &[String],
    ) -> Self {
        let mut ours = Self {
            names: extra.iter().map(|n| (n.clone(), ClassKind::Any)).collect(),
            extended: BTreeMap::new(),
        };
        for class in classes {
            let Some(name) = class.metadata.name.as_deref() else {
                continue;
            };
            if !(ours.names.contains_key(name) || selects_driver(class, driver)) {
                continue;
            }
            let (kind, _) = ClassKind::of_selectors(expressions(class), driver);
            if let Some(r) = class
                .spec
                .as_ref()
                .and_then(|s| s.extended_resource_name.as_deref())
            {
                ours.extended.insert(r.to_owned(), kind.clone());
            }
            ours.names.insert(name.to_owned(), kind);
        }
        ours
    }

    pub fn contains(&self, class: &str) -> bool {
        self.names.contains_key(class)
    }

    /// What a class of ours hands out; `None` for a class that is not ours.
    pub fn kind(&self, class: &str) -> Option<ClassKind> {
        self.names.get(class).cloned()
    }

    pub fn serves_extended(&self, resource: &str) -> bool {
        self.extended.contains_key(resource)
    }

    /// The kind of the class that serves an extended resource.
    pub fn extended_kind(&self, resource: &str) -> Option<&ClassKind> {
        self.extended.get(resource)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.keys().map(String::as_str)
    }
}

/// The CEL expressions of a class's selectors.
fn expressions(class: &DeviceClass) -> impl Iterator<Item = &str> {
    class
        .spec
        .iter()
        .flat_map(|s| s.selectors.iter().flatten())
        .filter_map(|s| s.cel.as_ref())
        .map(|c| c.expression.as_str())
}

/// `device.driver == "gpu.topodra.dev"` in any of the class's selectors, with either
/// quote and any spacing: how our chart and every example write it.
fn selects_driver(class: &DeviceClass, driver: &str) -> bool {
    let wanted = [
        format!("device.driver==\"{driver}\""),
        format!("device.driver=='{driver}'"),
    ];
    expressions(class)
        .map(|e| e.split_whitespace().collect::<String>())
        .any(|e| wanted.iter().any(|w| e.contains(w.as_str())))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::{CELDeviceSelector, DeviceClassSpec, DeviceSelector};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn class(name: &str, cel: &str, extended: Option<&str>) -> DeviceClass {
        DeviceClass {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            spec: Some(DeviceClassSpec {
                selectors: Some(vec![DeviceSelector {
                    cel: Some(CELDeviceSelector {
                        expression: cel.to_owned(),
                    }),
                }]),
                extended_resource_name: extended.map(str::to_owned),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn classes_selecting_the_driver_are_ours() {
        let classes = [
            class(
                "gpu.topodra.dev",
                r#"device.driver == "gpu.topodra.dev""#,
                None,
            ),
            class(
                "gpu-aligned.topodra.dev",
                "device.driver=='gpu.topodra.dev' && device.attributes['gpu.topodra.dev'].type == 'gpu'",
                Some("nvidia.com/gpu"),
            ),
            class(
                "nic",
                r#"device.driver == "nic.example.com""#,
                Some("example.com/nic"),
            ),
            class("by-hand", "true", None),
        ];
        let ours = OurClasses::from_classes(&classes, "gpu.topodra.dev", &["by-hand".to_owned()]);
        assert_eq!(
            ours.names().collect::<Vec<_>>(),
            ["by-hand", "gpu-aligned.topodra.dev", "gpu.topodra.dev"]
        );
        assert!(ours.serves_extended("nvidia.com/gpu"));
        assert!(!ours.serves_extended("example.com/nic"));
        assert_eq!(ours.kind("gpu-aligned.topodra.dev"), Some(ClassKind::Gpus));
        assert_eq!(ours.kind("by-hand"), Some(ClassKind::Any));
        assert_eq!(ours.kind("nic"), None);
    }

    /// The chart's classes, as it renders them.
    #[test]
    fn the_charts_classes_say_what_they_hand_out() {
        let d = r#"device.driver == "gpu.topodra.dev""#;
        let t = |v: &str| format!(r#"device.attributes["gpu.topodra.dev"].type == "{v}""#);
        let p = r#"device.attributes["gpu.topodra.dev"].profile == "1g.10gb""#;
        let ts = r#"device.attributes["gpu.topodra.dev"].sharing == "TimeSlicing""#;
        let with = |name: &str, sel: &[&str], ext: Option<&str>| {
            let mut c = class(name, d, ext);
            if let Some(spec) = c.spec.as_mut() {
                spec.selectors = Some(
                    sel.iter()
                        .map(|e| DeviceSelector {
                            cel: Some(CELDeviceSelector {
                                expression: (*e).to_owned(),
                            }),
                        })
                        .collect(),
                );
            }
            c
        };
        let classes = [
            with("gpu.topodra.dev", &[d, &t("gpu")], None),
            with("mig.topodra.dev", &[d, &t("mig")], None),
            with(
                "mig-1g.10gb.topodra.dev",
                &[d, &t("mig"), p],
                Some("nvidia.com/mig-1g.10gb"),
            ),
            with(
                "time-sliced.topodra.dev",
                &[d, &t("shared"), ts],
                Some("nvidia.com/gpu.shared"),
            ),
        ];
        let ours = OurClasses::from_classes(&classes, "gpu.topodra.dev", &[]);
        assert_eq!(ours.kind("gpu.topodra.dev"), Some(ClassKind::Gpus));
        assert_eq!(
            ours.kind("mig.topodra.dev"),
            Some(ClassKind::Mig { profile: None })
        );
        let one = ClassKind::Mig {
            profile: Some("1g.10gb".to_owned()),
        };
        assert_eq!(ours.kind("mig-1g.10gb.topodra.dev"), Some(one.clone()));
        assert_eq!(ours.extended_kind("nvidia.com/mig-1g.10gb"), Some(&one));
        let shared = ClassKind::Shared {
            sharing: Some("TimeSlicing".to_owned()),
        };
        assert_eq!(ours.kind("time-sliced.topodra.dev"), Some(shared.clone()));
        assert_eq!(ours.extended_kind("nvidia.com/gpu.shared"), Some(&shared));
    }
}
