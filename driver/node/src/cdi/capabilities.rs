//! Which capability class each of the driver's files belongs to: the files
//! libnvidia-container assigns to each class of `NVIDIA_DRIVER_CAPABILITIES`
//! (NVIDIA Container Toolkit, "Driver Capabilities"). The classes themselves are
//! the model's ([`topodra_model::capabilities`]).

pub use topodra_model::capabilities::{DriverCapabilities, DriverCapability};

/// The class of a driver library, by its name before `.so`.
pub(crate) fn library_class(file_name: &str) -> Option<DriverCapability> {
    use DriverCapability::*;
    let stem = file_name.split(".so").next().unwrap_or(file_name);
    let class = match stem {
        "libnvidia-ml" | "libnvidia-cfg" | "libnvidia-nscq" => Utility,
        "libcuda"
        | "libcudadebugger"
        | "libnvidia-opencl"
        | "libnvidia-gpucomp"
        | "libnvidia-ptxjitcompiler"
        | "libnvidia-fatbinaryloader"
        | "libnvidia-allocator"
        | "libnvidia-compiler"
        | "libnvidia-pkcs11"
        | "libnvidia-pkcs11-openssl3"
        | "libnvidia-nvvm"
        | "libnvidia-nvvm70" => Compute,
        "libvdpau_nvidia" | "libnvidia-encode" | "libnvidia-opticalflow" | "libnvcuvid" => Video,
        "libnvidia-eglcore"
        | "libnvidia-glcore"
        | "libnvidia-tls"
        | "libnvidia-glsi"
        | "libnvidia-fbc"
        | "libnvidia-ifr"
        | "libnvidia-rtcore"
        | "libnvoptix"
        | "libGLX_nvidia"
        | "libEGL_nvidia"
        | "libGLESv2_nvidia"
        | "libGLESv1_CM_nvidia"
        | "libnvidia-glvkspirv"
        | "libnvidia-cbl"
        | "libnvidia-egl-gbm"
        | "libnvidia-egl-wayland"
        | "libnvidia-vksc-core" => Graphics,
        "libnvidia-ngx" => Ngx,
        _ => return None,
    };
    Some(class)
}

/// The class of a driver binary.
pub(crate) fn binary_class(name: &str) -> Option<DriverCapability> {
    use DriverCapability::*;
    match name {
        "nvidia-smi"
        | "nvidia-debugdump"
        | "nvidia-persistenced"
        | "nvidia-imex"
        | "nvidia-imex-ctl" => Some(Utility),
        "nvidia-cuda-mps-control" | "nvidia-cuda-mps-server" => Some(Compute),
        "nvidia-xconfig" => Some(Graphics),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_of_files() {
        assert_eq!(
            library_class("libcuda.so.570.172.08"),
            Some(DriverCapability::Compute)
        );
        assert_eq!(
            library_class("libnvidia-ml.so.570.172.08"),
            Some(DriverCapability::Utility)
        );
        assert_eq!(
            library_class("libvdpau_nvidia.so.570.172.08"),
            Some(DriverCapability::Video)
        );
        assert_eq!(
            library_class("libGLX_nvidia.so.570.172.08"),
            Some(DriverCapability::Graphics)
        );
        assert_eq!(library_class("libnvidia-something-new.so.570.172.08"), None);
        assert_eq!(binary_class("nvidia-smi"), Some(DriverCapability::Utility));
        assert_eq!(
            binary_class("nvidia-cuda-mps-server"),
            Some(DriverCapability::Compute)
        );
    }
}
