//! Whatever a claim carries as opaque parameters, decoding must not panic, and what it
//! accepts must survive a serialize/decode cycle unchanged (otherwise the driver and a
//! checkpoint or an operator's copy of the config could disagree).
#![no_main]

use libfuzzer_sys::fuzz_target;
use topodra_model::config::decode_parameters;

fuzz_target!(|bytes: &[u8]| {
    // The API server hands us JSON; bytes that are not JSON never reach the decoder.
    let Ok(parameters) = serde_json::from_slice::<serde_json::Value>(bytes) else {
        return;
    };
    let Ok(config) = decode_parameters(&parameters) else {
        return;
    };
    let json = serde_json::to_vec(&config).expect("an accepted config serializes");
    let reparsed = serde_json::from_slice(&json).expect("our own output is JSON");
    let again = decode_parameters(&reparsed).expect("an accepted config decodes again");
    assert_eq!(again, config);
});
