//! `kubectl topodra`: GPU capacity by topology, why a pod waits for GPUs, and where a
//! claim would fit. All of it is the library's; see
//! [`topodra_controller::kubectl`].

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    topodra_controller::kubectl::parse_and_run()
}
