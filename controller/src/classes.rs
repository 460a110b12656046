//! Which DeviceClasses hand out our GPUs.

use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::DeviceClass;

/// The classes whose claims are ours: a claim request names a class, and the model
/// judges only requests for our GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OurClasses {
    names: BTreeSet<String>,
    /// Extended resources (`nvidia.com/gpu`) that a class of ours serves through DRA.
    extended: BTreeSet<String>,
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
            names: extra.iter().cloned().collect(),
            extended: BTreeSet::new(),
        };
        for class in classes {
            let Some(name) = class.metadata.name.as_deref() else {
                continue;
            };
            if !(ours.names.contains(name) || selects_driver(class, driver)) {
                continue;
            }
            ours.names.insert(name.to_owned());
            if let Some(r) = class
                .spec
                .as_ref()
                .and_then(|s| s.extended_resource_name.as_deref())
            {
                ours.extended.insert(r.to_owned());
            }
        }
        ours
    }

    pub fn contains(&self, class: &str) -> bool {
        self.names.contains(class)
    }

    pub fn serves_extended(&self, resource: &str) -> bool {
        self.extended.contains(resource)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }
}

/// `device.driver == "gpu.topodra.dev"` in any of the class's selectors, with either
/// quote and any spacing: how our chart and every example write it.
fn selects_driver(class: &DeviceClass, driver: &str) -> bool {
    let wanted = [
        format!("device.driver==\"{driver}\""),
        format!("device.driver=='{driver}'"),
    ];
    class
        .spec
        .iter()
        .flat_map(|s| s.selectors.iter().flatten())
        .filter_map(|s| s.cel.as_ref())
        .map(|c| c.expression.split_whitespace().collect::<String>())
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
    }
}
