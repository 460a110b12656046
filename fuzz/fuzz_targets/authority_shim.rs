//! Whatever bytes a client sends on a plugin socket, in whatever pieces, the
//! `:authority` shim (kubelet-plugin/helper/src/uds/authority.rs) never panics, and what it
//! lets through is whole frames, header frames within the servers' frame size.
//!
//! The shim is private to the dra-kubeletplugin crate; its three source files are
//! compiled into this target as they are.
#![no_main]

use libfuzzer_sys::fuzz_target;

// At the crate root, so `super::frames` and `super::representation` in authority.rs
// resolve as in the crate's `uds` module.
#[allow(dead_code, unreachable_pub, clippy::all)]
#[path = "../../kubelet-plugin/helper/src/uds/authority.rs"]
mod authority;
#[allow(dead_code, unreachable_pub, clippy::all)]
#[path = "../../kubelet-plugin/helper/src/uds/frames.rs"]
mod frames;
#[allow(dead_code, unreachable_pub, clippy::all)]
#[path = "../../kubelet-plugin/helper/src/uds/representation.rs"]
mod representation;

use authority::AuthorityRewriter;
use frames::MAX_FRAME_SIZE;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fuzz_target!(|input: (u8, &[u8])| {
    let (cut, body) = input;
    let cut = usize::from(cut).max(1);
    let bytes = [PREFACE, body].concat();
    let mut rewriter = AuthorityRewriter::new();
    let mut out = Vec::new();
    for chunk in bytes.chunks(cut) {
        if rewriter.push(chunk, &mut out).is_err() {
            return;
        }
    }
    // Whole output frames up to where the input stopped mid-frame.
    let mut rest = &out[PREFACE.len()..];
    while rest.len() >= 9 {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        let kind = rest[3];
        if kind == 0x1 || kind == 0x9 {
            assert!(len <= MAX_FRAME_SIZE, "a header frame of {len} bytes went out");
        }
        if rest.len() < 9 + len {
            break;
        }
        rest = &rest[9 + len..];
    }
});
