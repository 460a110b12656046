//! Links the plugin with `DT_RPATH=$ORIGIN/../lib/<multiarch>`.
//!
//! In its image the plugin is /usr/bin/topodra-kubelet-plugin and its libraries (glibc,
//! hwloc, libudev) are in /usr/lib/<multiarch>. The chart sets `LD_LIBRARY_PATH` to the
//! host driver's library directories so that NVML (`libnvidia-ml.so.1`) is found, and
//! those directories hold the host's own glibc too: without an RPATH the loader would
//! take the host's libc.so.6 with the image's ld.so, which fails or misbehaves as soon
//! as the two glibc versions differ. `DT_RPATH` (not `DT_RUNPATH`) is searched before
//! `LD_LIBRARY_PATH`, also for the libraries' own dependencies, while NVML, which is not
//! in the image, is still found through `LD_LIBRARY_PATH`. Outside the image the path
//! (target/lib/...) does not exist and changes nothing. ld.so expands `$ORIGIN` from
//! /proc/self/exe, which every container has; a bare chroot needs /proc mounted.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") != "linux" || var("CARGO_CFG_TARGET_ENV") != "gnu" {
        return;
    }
    let multiarch = match var("CARGO_CFG_TARGET_ARCH").as_str() {
        "x86_64" => "x86_64-linux-gnu",
        "aarch64" => "aarch64-linux-gnu",
        _ => return,
    };
    println!("cargo:rustc-link-arg-bins=-Wl,--disable-new-dtags");
    println!("cargo:rustc-link-arg-bins=-Wl,-rpath,$ORIGIN/../lib/{multiarch}");
}
