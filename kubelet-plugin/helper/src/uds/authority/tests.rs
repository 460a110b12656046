//! The shim on frames and header blocks built by hand.

use super::*;
use crate::uds::frames::{FLAG_PADDED, FLAG_PRIORITY, SAFE_FRAME_SIZE};

fn frame(kind: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream_id.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn request_headers(authority: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    [
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", b"/pluginregistration.Registration/GetInfo"),
        (b":authority", authority),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]
    .iter()
    .map(|(n, v)| (n.to_vec(), v.to_vec()))
    .collect()
}

fn encode(encoder: &mut Encoder<'_>, fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    encoder.encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
}

/// Splits rewriter output into frames: (type, flags, stream id, payload).
fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let header = FrameHeader::parse(bytes[..9].try_into().unwrap());
        frames.push((
            header.kind,
            header.flags,
            header.stream_id,
            bytes[9..9 + header.len].to_vec(),
        ));
        bytes = &bytes[9 + header.len..];
    }
    frames
}

fn rewrite(input: &[u8]) -> Result<Vec<u8>, ShimError> {
    let mut rewriter = AuthorityRewriter::new();
    let mut out = Vec::new();
    rewriter.push(input, &mut out)?;
    Ok(out)
}

/// Feeds the rewriter output to a fresh decoder, as the server would.
fn decode_all(frames: &[(u8, u8, u32, Vec<u8>)]) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut decoder = Decoder::new();
    let mut blocks = Vec::new();
    let mut current = Vec::new();
    for (kind, flags, _, payload) in frames {
        match *kind {
            TYPE_HEADERS => {
                let (fragment, _) = split_headers_payload(*flags, payload).unwrap();
                current = fragment.to_vec();
            }
            TYPE_CONTINUATION => current.extend_from_slice(payload),
            _ => continue,
        }
        if flags & FLAG_END_HEADERS != 0 {
            blocks.push(decoder.decode(&current).unwrap());
        }
    }
    blocks
}

fn authority_of(fields: &[(Vec<u8>, Vec<u8>)]) -> &[u8] {
    &fields.iter().find(|(n, _)| n == b":authority").unwrap().1
}

#[test]
fn authority_validity_matches_h2() {
    assert!(is_valid_authority(b"localhost"));
    assert!(is_valid_authority(b"unix.sock:80"));
    assert!(!is_valid_authority(
        b"/var/lib/kubelet/plugins_registry/x-reg.sock"
    ));
    assert!(!is_valid_authority(b"%2Ftmp%2Fx.sock"));
    assert!(!is_valid_authority(b""));
}

#[test]
fn non_header_frames_pass_byte_for_byte() {
    let mut input = PREFACE.to_vec();
    input.extend(frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100])); // SETTINGS
    input.extend(frame(0x4, 0x1, 0, &[])); // SETTINGS ack
    input.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0])); // DATA
    input.extend(frame(0x8, 0, 0, &[0, 1, 0, 0])); // WINDOW_UPDATE
    assert_eq!(rewrite(&input).unwrap(), input);
}

#[test]
fn non_http2_bytes_are_relayed_untouched() {
    let input = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x01\x04HEADERS-looking bytes".to_vec();
    assert_eq!(rewrite(&input).unwrap(), input);
}

#[test]
fn path_authority_is_replaced_and_the_rest_kept() {
    let fields = request_headers(b"/tmp/x/gpu.topodra.dev-reg.sock");
    let mut input = PREFACE.to_vec();
    input.extend(frame(
        TYPE_HEADERS,
        FLAG_END_HEADERS,
        1,
        &encode(&mut Encoder::new(), &fields),
    ));
    let out = rewrite(&input).unwrap();
    assert_eq!(&out[..24], PREFACE);
    let frames = frames(&out[24..]);
    assert_eq!(frames.len(), 1);
    assert_eq!(
        (frames[0].0, frames[0].1, frames[0].2),
        (TYPE_HEADERS, FLAG_END_HEADERS, 1)
    );

    let blocks = decode_all(&frames);
    let mut expected = fields.clone();
    expected[3].1 = b"localhost".to_vec();
    assert_eq!(blocks, vec![expected]);
}

#[test]
fn valid_authority_is_kept() {
    let fields = request_headers(b"gpu.topodra.dev:443");
    let mut input = PREFACE.to_vec();
    input.extend(frame(
        TYPE_HEADERS,
        FLAG_END_HEADERS,
        1,
        &encode(&mut Encoder::new(), &fields),
    ));
    let blocks = decode_all(&frames(&rewrite(&input).unwrap()[24..]));
    assert_eq!(blocks, vec![fields]);
}

#[test]
fn output_is_independent_of_how_input_is_split() {
    let mut encoder = Encoder::new();
    let mut input = PREFACE.to_vec();
    input.extend(frame(0x4, 0, 0, &[]));
    input.extend(frame(
        TYPE_HEADERS,
        FLAG_END_HEADERS | FLAG_PADDED,
        1,
        &[
            &[3][..],
            &encode(&mut encoder, &request_headers(b"/a.sock")),
            &[0, 0, 0],
        ]
        .concat(),
    ));
    input.extend(frame(0x0, FLAG_END_STREAM, 1, &[0; 5]));
    input.extend(frame(
        TYPE_HEADERS,
        FLAG_END_HEADERS,
        3,
        &encode(&mut encoder, &request_headers(b"/a.sock")),
    ));

    let whole = rewrite(&input).unwrap();
    let mut rewriter = AuthorityRewriter::new();
    let mut bytewise = Vec::new();
    for b in &input {
        rewriter
            .push(std::slice::from_ref(b), &mut bytewise)
            .unwrap();
    }
    assert_eq!(whole, bytewise);
    let blocks = decode_all(&frames(&whole[24..]));
    assert_eq!(blocks.len(), 2);
    assert!(blocks.iter().all(|b| authority_of(b) == b"localhost"));
}

#[test]
fn end_stream_and_priority_survive_and_padding_is_dropped() {
    let block = encode(&mut Encoder::new(), &request_headers(b"/a.sock"));
    let priority = [0x80, 0, 0, 0, 15];
    let payload = [&[7][..], &priority, &block, &[0; 7]].concat();
    let mut input = PREFACE.to_vec();
    input.extend(frame(
        TYPE_HEADERS,
        FLAG_END_STREAM | FLAG_END_HEADERS | FLAG_PADDED | FLAG_PRIORITY,
        5,
        &payload,
    ));
    let frames = frames(&rewrite(&input).unwrap()[24..]);
    assert_eq!(frames.len(), 1);
    let (kind, flags, stream_id, payload) = &frames[0];
    assert_eq!(
        (*kind, *flags, *stream_id),
        (
            TYPE_HEADERS,
            FLAG_END_STREAM | FLAG_END_HEADERS | FLAG_PRIORITY,
            5
        )
    );
    assert_eq!(&payload[..5], &priority);
    assert_eq!(authority_of(&decode_all(&frames)[0]), b"localhost");
}

#[test]
fn header_frames_over_the_servers_frame_size_are_refused() {
    let mut fields = request_headers(b"/a.sock");
    fields.push((b"x-big".to_vec(), vec![b'v'; 12_000]));
    let block = encode(&mut Encoder::new(), &fields);
    // One frame over 16 KiB: a FRAME_SIZE_ERROR for a server that never raised
    // SETTINGS_MAX_FRAME_SIZE, so it is refused, not re-framed.
    let padded = [&[5][..], &block, &[0; 5]].concat();
    let mut input = PREFACE.to_vec();
    input.extend(frame(
        TYPE_HEADERS,
        FLAG_END_HEADERS | FLAG_PADDED,
        1,
        &[&padded[..], &[0; 4400]].concat(),
    ));
    assert!(matches!(
        rewrite(&input),
        Err(ShimError::FrameTooLarge {
            frame_type: TYPE_HEADERS,
            stream_id: 1,
            ..
        })
    ));

    // The same block in frames the server accepts goes through as one frame.
    let (a, b) = block.split_at(block.len() / 2);
    let mut input = PREFACE.to_vec();
    input.extend(frame(TYPE_HEADERS, FLAG_END_STREAM, 1, a));
    input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, b));
    let frames = frames(&rewrite(&input).unwrap()[24..]);
    let kinds: Vec<(u8, u8)> = frames.iter().map(|f| (f.0, f.1)).collect();
    assert_eq!(
        kinds,
        vec![(TYPE_HEADERS, FLAG_END_STREAM | FLAG_END_HEADERS)]
    );
    let blocks = decode_all(&frames);
    assert_eq!(authority_of(&blocks[0]), b"localhost");
    assert_eq!(blocks[0].last().unwrap().1.len(), 12_000);
}

#[test]
fn never_indexed_fields_stay_never_indexed() {
    let mut block = Vec::new();
    let mut encoder = Encoder::new();
    let fields = request_headers(b"/a.sock");
    block.extend(encode(&mut encoder, &fields));
    super::super::representation::encode_never_indexed(
        &mut block,
        b"authorization",
        b"Bearer secret",
    );
    let mut input = PREFACE.to_vec();
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &block));
    let frames = frames(&rewrite(&input).unwrap()[24..]);
    let out = &frames[0].3;
    let flags = super::super::representation::never_indexed(out).unwrap();
    assert_eq!(flags.len(), fields.len() + 1);
    assert_eq!(flags.iter().filter(|f| **f).count(), 1);
    assert!(flags[fields.len()], "the secret is still never-indexed");
    let blocks = decode_all(&frames);
    assert_eq!(
        blocks[0].last().unwrap(),
        &(b"authorization".to_vec(), b"Bearer secret".to_vec())
    );
}

#[test]
fn size_update_and_huffman_from_the_client_are_understood() {
    // RFC 7541 C.4.1 request (Huffman-coded), preceded by a table size update to
    // 256; the authority there is valid and must come back unchanged.
    let mut block = vec![0x3f, 0xe1, 0x01];
    block.extend([
        0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90,
        0xf4, 0xff,
    ]);
    let mut input = PREFACE.to_vec();
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &block));
    let blocks = decode_all(&frames(&rewrite(&input).unwrap()[24..]));
    assert_eq!(authority_of(&blocks[0]), b"www.example.com");
}

#[test]
fn interleaving_an_open_header_block_is_refused() {
    let block = encode(&mut Encoder::new(), &request_headers(b"/a.sock"));
    let mut input = PREFACE.to_vec();
    input.extend(frame(TYPE_HEADERS, 0, 1, &block[..4]));
    input.extend(frame(0x0, 0, 1, &[0; 5]));
    assert!(matches!(
        rewrite(&input),
        Err(ShimError::ExpectedContinuation {
            expected: 1,
            frame_type: 0,
            stream_id: 1
        })
    ));

    let mut input = PREFACE.to_vec();
    input.extend(frame(TYPE_HEADERS, 0, 1, &block[..4]));
    input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 3, &block[4..]));
    assert!(matches!(
        rewrite(&input),
        Err(ShimError::ExpectedContinuation { .. })
    ));

    let mut input = PREFACE.to_vec();
    input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &block));
    assert!(matches!(
        rewrite(&input),
        Err(ShimError::UnexpectedContinuation { stream_id: 1 })
    ));
}

#[test]
fn oversized_block_is_refused_before_it_is_buffered() {
    let mut input = PREFACE.to_vec();
    // Only the frame header: the length alone must trip the limit.
    input.extend(&frame(TYPE_HEADERS, 0, 1, &[])[..9]);
    input[24..27].copy_from_slice(&[0xff, 0xff, 0xff]);
    assert!(matches!(
        rewrite(&input),
        Err(ShimError::FrameTooLarge { .. })
    ));

    // Growing through CONTINUATION frames counts as well.
    let mut rewriter = AuthorityRewriter::new();
    let mut out = Vec::new();
    rewriter.push(PREFACE, &mut out).unwrap();
    let chunk = vec![0u8; SAFE_FRAME_SIZE];
    rewriter
        .push(&frame(TYPE_HEADERS, 0, 1, &chunk), &mut out)
        .unwrap();
    let err = (0..MAX_HEADER_BLOCK / SAFE_FRAME_SIZE).find_map(|_| {
        rewriter
            .push(&frame(TYPE_CONTINUATION, 0, 1, &chunk), &mut out)
            .err()
    });
    assert!(matches!(err, Some(ShimError::HeaderBlockTooLarge { .. })));
}

#[test]
fn expanding_indexed_references_is_bounded() {
    let mut encoder = Encoder::new();
    let fields = vec![(b"x-fill".to_vec(), vec![b'a'; 4000])];
    let mut input = PREFACE.to_vec();
    input.extend(frame(
        TYPE_HEADERS,
        FLAG_END_HEADERS,
        1,
        &encode(&mut encoder, &fields),
    ));
    // One byte per 4 KiB field: a 5-byte block expands past the server's limit.
    let reference = encode(&mut encoder, &fields);
    assert_eq!(reference.len(), 1);
    let block = reference.repeat(5);
    input.extend(frame(TYPE_HEADERS, 0, 3, &block));
    input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 3, &[]));
    assert!(matches!(
        rewrite(&input),
        Err(ShimError::HeaderListTooLarge { stream_id: 3, .. })
    ));
}

#[test]
fn malformed_hpack_and_padding_are_refused() {
    let mut input = PREFACE.to_vec();
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &[0x80 | 63])); // index past the empty table
    assert!(matches!(
        rewrite(&input),
        Err(ShimError::Hpack { stream_id: 1, .. })
    ));

    let mut input = PREFACE.to_vec();
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &[0x3f])); // truncated size update
    assert!(matches!(rewrite(&input), Err(ShimError::Hpack { .. })));

    let mut input = PREFACE.to_vec();
    input.extend(frame(
        TYPE_HEADERS,
        FLAG_END_HEADERS | FLAG_PADDED,
        1,
        &[9, 0x82],
    ));
    assert!(matches!(
        rewrite(&input),
        Err(ShimError::MalformedHeaders { stream_id: 1 })
    ));

    let mut input = PREFACE.to_vec();
    input.extend(frame(
        TYPE_HEADERS,
        FLAG_END_HEADERS | FLAG_PRIORITY,
        1,
        &[0, 0, 0],
    ));
    assert!(matches!(
        rewrite(&input),
        Err(ShimError::MalformedHeaders { .. })
    ));
}

mod arbitrary_frames {
    use proptest::prelude::*;

    use super::*;

    fn arb_frame() -> impl Strategy<Value = Vec<u8>> {
        (
            prop_oneof![Just(TYPE_HEADERS), Just(TYPE_CONTINUATION), 0u8..=10],
            any::<u8>(),
            0u32..4,
            prop::collection::vec(any::<u8>(), 0..64),
        )
            .prop_map(|(kind, flags, stream, payload)| frame(kind, flags, stream, &payload))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Whatever frames a client sends, in whatever pieces, the rewriter never
        /// panics, and what it lets through is whole frames, header frames within
        /// the servers' frame size.
        #[test]
        fn any_frames_give_whole_frames_or_an_error(
            frames in prop::collection::vec(arb_frame(), 0..12),
            cut in 1usize..40,
        ) {
            let mut input = PREFACE.to_vec();
            for f in &frames {
                input.extend(f);
            }
            let mut rewriter = AuthorityRewriter::new();
            let mut out = Vec::new();
            let mut failed = false;
            for chunk in input.chunks(cut) {
                if rewriter.push(chunk, &mut out).is_err() {
                    failed = true;
                    break;
                }
            }
            prop_assert!(out.starts_with(PREFACE) || out.len() < PREFACE.len());
            if !failed && rewriter.block.is_none() {
                let mut rest = &out[PREFACE.len().min(out.len())..];
                while !rest.is_empty() {
                    prop_assert!(rest.len() >= FRAME_HEADER_LEN);
                    let header = FrameHeader::parse(rest[..FRAME_HEADER_LEN].try_into().unwrap());
                    prop_assert!(rest.len() >= FRAME_HEADER_LEN + header.len);
                    if matches!(header.kind, TYPE_HEADERS | TYPE_CONTINUATION) {
                        prop_assert!(header.len <= MAX_FRAME_SIZE);
                    }
                    rest = &rest[FRAME_HEADER_LEN + header.len..];
                }
            }
        }
    }
}
