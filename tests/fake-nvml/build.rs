//! Gives the cdylib the soname real NVML has, `libnvidia-ml.so.1`.
//!
//! The driver installs `libnvidia-ml.so.<version>` with that soname and a
//! `libnvidia-ml.so.1` link to it (the NVML API reference: "On Linux the NVML
//! library is named libnvidia-ml.so"; loaders ask for `libnvidia-ml.so.1`).
//! Tools that rebuild a driver's links from its files read the soname from the
//! ELF dynamic section (the NVIDIA Container Toolkit's `create-symlinks` hook
//! arguments come from `DT_SONAME`), so a fake driver root that ships this
//! library as its NVML needs the soname to be right.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
