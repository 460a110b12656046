//! Whatever is on disk, parsing a checkpoint must not panic, and what it accepts must
//! survive a save/load cycle unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use topodra_model::checkpoint::{encode, parse};

fuzz_target!(|bytes: &[u8]| {
    if let Ok(checkpoint) = parse(bytes) {
        let reencoded = encode(&checkpoint).expect("an accepted checkpoint encodes");
        assert_eq!(parse(&reencoded).ok(), Some(checkpoint));
    }
});
