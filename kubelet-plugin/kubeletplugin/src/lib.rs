//! The Rust counterpart of the kubelet-plugin helper that Go DRA drivers use: what
//! every DRA kubelet plugin needs, and nothing of any one driver.

pub mod publish;
