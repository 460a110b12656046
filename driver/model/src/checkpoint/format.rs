//! The on-disk encoding of a [`Checkpoint`], free of I/O so it can be fuzzed.
//!
//! The file is one JSON object, written compact and followed by a newline:
//!
//! ```json
//! {"version":1,"checksum":"sha256:<64 hex digits>","data":{"bootId":"…","claims":{…}}}
//! ```
//!
//! - `version` numbers the schema of `data`. Every version this code ever wrote stays
//!   readable; a higher one is [`CorruptReason::UnsupportedVersion`], because a file
//!   from a newer plugin may mean something this one cannot honour. Adding optional
//!   fields does not need a new version (unknown fields are ignored); a new claim state
//!   or a changed meaning does.
//! - `checksum` is SHA-256 over the exact bytes of the `data` value as they appear in
//!   the file. `data` is kept as a raw JSON slice on read, so no re-serialization is
//!   involved: a canonical re-encoding would make the check depend on serde_json's
//!   escaping and key order (which its `preserve_order` feature changes) and would
//!   silently reject files written by a differently built plugin.
//!
//! The version is read before anything else, so a future version may change the rest
//! of the envelope, including the checksum scheme.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use super::Checkpoint;
use super::records::CheckpointV1;

/// The version [`encode`] writes and the highest [`parse`] reads.
pub(crate) const CURRENT_VERSION: u64 = 1;

/// Files larger than this are rejected unread: a node holds a few dozen claims, a few
/// kilobytes, so anything this size is not ours and must not be parsed into memory.
pub const MAX_CHECKPOINT_BYTES: usize = 16 << 20;

const CHECKSUM_PREFIX: &str = "sha256:";

/// Why a checkpoint file cannot be trusted. Every variant leads to quarantine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CorruptReason {
    #[error("checkpoint path is {0}")]
    NotAFile(&'static str),
    #[error("checkpoint file is empty")]
    Empty,
    #[error("checkpoint file is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("checkpoint file is truncated: {0}")]
    Truncated(String),
    #[error("checkpoint file is not valid JSON: {0}")]
    NotJson(String),
    #[error("checkpoint envelope is malformed: {0}")]
    BadEnvelope(String),
    #[error(
        "checkpoint version {found} is not supported (this plugin reads versions 1 to {supported})"
    )]
    UnsupportedVersion { found: u64, supported: u64 },
    #[error("checkpoint checksum {0:?} is not of the form sha256:<64 hex digits>")]
    BadChecksumFormat(String),
    #[error("checkpoint checksum mismatch: file says {expected}, data hashes to {actual}")]
    ChecksumMismatch { expected: String, actual: String },
    #[error("checkpoint data does not match the version {version} schema: {detail}")]
    BadData { version: u64, detail: String },
}

#[derive(Deserialize)]
struct VersionProbe {
    version: u64,
}

#[derive(Serialize, Deserialize)]
struct Envelope<'a> {
    version: u64,
    checksum: String,
    #[serde(borrow)]
    data: &'a RawValue,
}

pub(super) fn checksum_of(data: &str) -> String {
    hex::encode(Sha256::digest(data.as_bytes()))
}

/// The file contents for `checkpoint`, at `CURRENT_VERSION`.
pub fn encode(checkpoint: &Checkpoint) -> Result<Vec<u8>, serde_json::Error> {
    let data = RawValue::from_string(serde_json::to_string(&CheckpointV1::from(checkpoint))?)?;
    let envelope = Envelope {
        version: CURRENT_VERSION,
        checksum: format!("{CHECKSUM_PREFIX}{}", checksum_of(data.get())),
        data: &data,
    };
    let mut out = serde_json::to_vec(&envelope)?;
    out.push(b'\n');
    Ok(out)
}

/// Decodes and verifies file contents. Never panics, whatever the input.
pub fn parse(bytes: &[u8]) -> Result<Checkpoint, CorruptReason> {
    if bytes.len() > MAX_CHECKPOINT_BYTES {
        return Err(CorruptReason::TooLarge {
            limit: MAX_CHECKPOINT_BYTES,
        });
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(CorruptReason::Empty);
    }
    // Serde would also accept `[1, ...]` for a struct; only an object is ours.
    if bytes.trim_ascii_start().first() != Some(&b'{') {
        // Still let syntax errors, the more telling reason, come first.
        serde_json::from_slice::<serde::de::IgnoredAny>(bytes).map_err(json_error)?;
        return Err(CorruptReason::BadEnvelope("not a JSON object".into()));
    }
    let probe: VersionProbe = serde_json::from_slice(bytes).map_err(json_error)?;
    if probe.version == 0 || probe.version > CURRENT_VERSION {
        return Err(CorruptReason::UnsupportedVersion {
            found: probe.version,
            supported: CURRENT_VERSION,
        });
    }
    let envelope: Envelope<'_> = serde_json::from_slice(bytes).map_err(json_error)?;
    let expected = envelope
        .checksum
        .strip_prefix(CHECKSUM_PREFIX)
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| CorruptReason::BadChecksumFormat(envelope.checksum.clone()))?;
    let actual = checksum_of(envelope.data.get());
    if !expected.eq_ignore_ascii_case(&actual) {
        return Err(CorruptReason::ChecksumMismatch {
            expected: envelope.checksum,
            actual: format!("{CHECKSUM_PREFIX}{actual}"),
        });
    }
    decode_data(envelope.version, envelope.data)
}

fn decode_data(version: u64, data: &RawValue) -> Result<Checkpoint, CorruptReason> {
    // One arm per version ever written; older ones convert into the current model.
    match version {
        1 => serde_json::from_str::<CheckpointV1>(data.get())
            .map(Checkpoint::from)
            .map_err(|e| CorruptReason::BadData {
                version,
                detail: e.to_string(),
            }),
        found => Err(CorruptReason::UnsupportedVersion {
            found,
            supported: CURRENT_VERSION,
        }),
    }
}

fn json_error(e: serde_json::Error) -> CorruptReason {
    use serde_json::error::Category;
    match e.classify() {
        Category::Eof => CorruptReason::Truncated(e.to_string()),
        Category::Syntax | Category::Io => CorruptReason::NotJson(e.to_string()),
        Category::Data => CorruptReason::BadEnvelope(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::fixtures::{V1_FIXTURE, arb_checkpoint, envelope, sample};
    use proptest::prelude::*;

    #[test]
    fn round_trip() {
        let cp = sample();
        let bytes = encode(&cp).unwrap();
        assert_eq!(parse(&bytes).unwrap(), cp);
        assert!(bytes.ends_with(b"}\n"));
    }

    #[test]
    fn v1_fixture_still_parses() {
        let cp = parse(V1_FIXTURE.as_bytes()).unwrap();
        assert_eq!(cp, sample());
        // Also pins the writer: the same model encodes to the same bytes.
        assert_eq!(encode(&sample()).unwrap(), V1_FIXTURE.as_bytes());
    }

    #[test]
    fn checksum_covers_the_exact_data_bytes() {
        // Whitespace inside data is part of what was hashed, so this verifies...
        let spaced = envelope(1, r#"{ "bootId" : "b", "claims" : {} }"#);
        assert_eq!(parse(spaced.as_bytes()).unwrap(), Checkpoint::new("b"));
        // ...and re-spacing the same JSON value breaks it.
        let respaced = spaced.replace(r#""bootId" :"#, r#""bootId":"#);
        assert!(matches!(
            parse(respaced.as_bytes()),
            Err(CorruptReason::ChecksumMismatch { .. })
        ));
        // Uppercase hex is the same digest.
        let upper = envelope(1, r#"{"bootId":"b"}"#);
        let (head, tail) = upper.split_once("sha256:").unwrap();
        let upper = format!("{head}sha256:{}{}", tail[..64].to_uppercase(), &tail[64..]);
        assert_eq!(parse(upper.as_bytes()).unwrap(), Checkpoint::new("b"));
    }

    #[test]
    fn unknown_fields_are_ignored_everywhere() {
        let data = r#"{"bootId":"b","future":{"x":[1,2]},"claims":{"u1":{
            "uid":"u1","namespace":"ns","name":"c","state":"PrepareCompleted",
            "priority":7,"devices":[{"pool":"p","device":"gpu-0","health":"ok",
            "requests":["gpu"],"cdiDeviceIds":["k8s.gpu.topodra.dev/claim=u1-gpu-0"]}],
            "updatedAt":5}}}"#;
        let text = envelope(1, data).replace(r#"{"version""#, r#"{"writer":"v9","version""#);
        let cp = parse(text.as_bytes()).unwrap();
        let r = cp.get("u1").unwrap();
        assert_eq!(r.state, crate::checkpoint::ClaimState::PrepareCompleted);
        assert_eq!(r.devices[0].device, "gpu-0");
        assert_eq!(r.devices[0].share_id, None);
        assert_eq!(r.cdi_spec, None);
    }

    #[test]
    fn corrupt_inputs_name_their_problem() {
        let good = encode(&sample()).unwrap();
        let good = std::str::from_utf8(&good).unwrap();
        // Name, file contents, and what the reason must be.
        type Case = (&'static str, Vec<u8>, fn(&CorruptReason) -> bool);
        let cases: Vec<Case> = vec![
            ("empty", vec![], |r| matches!(r, CorruptReason::Empty)),
            ("blank", b" \n".to_vec(), |r| matches!(r, CorruptReason::Empty)),
            ("truncated", good.as_bytes()[..good.len() / 2].to_vec(), |r| {
                matches!(r, CorruptReason::Truncated(_))
            }),
            ("garbage", vec![0xff, 0x00, 0x13, 0x37, b'{'], |r| {
                matches!(r, CorruptReason::NotJson(_))
            }),
            ("array", b"[1,\"sha256:00\",{}]".to_vec(), |r| {
                matches!(r, CorruptReason::BadEnvelope(_))
            }),
            ("no version", br#"{"data":{}}"#.to_vec(), |r| {
                matches!(r, CorruptReason::BadEnvelope(m) if m.contains("version"))
            }),
            (
                "bad checksum",
                good.replacen("sha256:", "sha256:0", 1).into_bytes(),
                |r| matches!(r, CorruptReason::BadChecksumFormat(_)),
            ),
            (
                "checksum mismatch",
                good.replacen(r#""bootId":"boot-a""#, r#""bootId":"boot-b""#, 1)
                    .into_bytes(),
                |r| matches!(r, CorruptReason::ChecksumMismatch { .. }),
            ),
            (
                "future version",
                envelope(2, r#"{"bootId":"b"}"#).into_bytes(),
                |r| {
                    matches!(
                        r,
                        CorruptReason::UnsupportedVersion {
                            found: 2,
                            supported: 1
                        }
                    )
                },
            ),
            (
                "future version with another envelope",
                br#"{"version":3,"sig":{"alg":"ed25519"},"payload":"..."}"#.to_vec(),
                |r| matches!(r, CorruptReason::UnsupportedVersion { found: 3, .. }),
            ),
            (
                "version zero",
                envelope(0, "{}").into_bytes(),
                |r| matches!(r, CorruptReason::UnsupportedVersion { found: 0, .. }),
            ),
            (
                "wrong type",
                envelope(1, r#"{"bootId":"b","claims":{"u":{"uid":"u","state":"PrepareStarted","devices":"gpu-0"}}}"#)
                    .into_bytes(),
                |r| matches!(r, CorruptReason::BadData { detail, .. } if detail.contains("invalid type")),
            ),
            (
                "unknown state",
                envelope(1, r#"{"claims":{"u":{"uid":"u","state":"Prepared"}}}"#).into_bytes(),
                |r| matches!(r, CorruptReason::BadData { detail, .. } if detail.contains("Prepared")),
            ),
            (
                "trailing garbage",
                format!("{good}x").into_bytes(),
                |r| matches!(r, CorruptReason::NotJson(m) if m.contains("trailing")),
            ),
        ];
        for (name, bytes, check) in cases {
            let reason = parse(&bytes).expect_err(name);
            assert!(check(&reason), "{name}: unexpected reason {reason}");
        }
    }

    #[test]
    fn too_large_is_rejected_unparsed() {
        let bytes = vec![b' '; MAX_CHECKPOINT_BYTES + 1];
        assert!(matches!(parse(&bytes), Err(CorruptReason::TooLarge { .. })));
    }

    #[test]
    fn fuzz_seeds_are_what_their_names_say() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/corpus/checkpoint_load"
        );
        let Ok(entries) = std::fs::read_dir(dir) else {
            return; // Seeds are optional to this crate.
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let result = parse(&std::fs::read(&path).unwrap());
            assert_eq!(
                result.is_ok(),
                name.starts_with("valid-"),
                "{name}: {result:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn arbitrary_checkpoints_round_trip(cp in arb_checkpoint()) {
            prop_assert_eq!(parse(&encode(&cp).unwrap()).unwrap(), cp);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn damaged_files_are_rejected_or_unchanged(
            cp in arb_checkpoint(),
            cut in any::<prop::sample::Index>(),
            at in any::<prop::sample::Index>(),
            flip in 1u8..,
        ) {
            let bytes = encode(&cp).unwrap();
            // Cutting anything before the final newline loses the closing brace.
            let cut = cut.index(bytes.len() - 1);
            prop_assert!(parse(&bytes[..cut]).is_err());
            // A flipped byte is caught, or is one that cannot change the content
            // (the trailing newline, the case of a checksum hex digit).
            let mut flipped = bytes.clone();
            flipped[at.index(bytes.len())] ^= flip;
            if let Ok(parsed) = parse(&flipped) {
                prop_assert_eq!(parsed, cp);
            }
        }
    }
}
