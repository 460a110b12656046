//! `topodra-kubelet-plugin`: the node side of topodra. All of it is the library's;
//! see [`topodra_kubelet_plugin::Cli`].

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    topodra_kubelet_plugin::Cli::parse_and_run()
}
