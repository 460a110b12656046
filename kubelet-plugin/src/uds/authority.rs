//! Client-to-server HTTP/2 rewriter that makes any `:authority` acceptable to h2.
//!
//! The kubelet's grpc-go client may send the socket path as `:authority`. h2 parses
//! the pseudo-header as a URI authority and resets the stream with PROTOCOL_ERROR
//! when that fails, before tonic ever sees the request. This module sits on the
//! byte stream in front of the server: it lets every frame through untouched except
//! header blocks, which it decodes, fixes and re-encodes.
//!
//! Only authorities that h2 would reject are replaced (with `localhost`, what grpc-go
//! itself sends for unix targets nowadays); valid ones are left alone so the server
//! still sees what a well-behaved client meant. The original value is logged at
//! debug level.
//!
//! Once the rewriter decodes one header block, it must decode all of them: the
//! client's HPACK dynamic table now lives here, and the server only ever sees blocks
//! re-encoded without references to a dynamic table, so the two tables never need
//! to agree.

use loona_hpack::decoder::DecoderError;
use loona_hpack::{Decoder, Encoder};
use tracing::debug;

/// RFC 9113 §3.4: the client connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;

const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;

const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;

/// Length of the stream dependency and weight that the PRIORITY flag adds.
const PRIORITY_LEN: usize = 5;

/// SETTINGS_MAX_FRAME_SIZE can be raised by the server but never below this
/// (RFC 9113 §6.5.2), so frames of at most this size are legal whatever the server
/// advertised, and the rewriter never has to watch the server's SETTINGS.
const SAFE_FRAME_SIZE: usize = 16_384;

/// Largest decoded header list, counted as HPACK does (name + value + 32 per field):
/// the limit the servers behind the shim enforce (hyper's default, which
/// `serve_cmd` also sets explicitly). A request over it would only get a 431 from
/// the server, so the shim may as well refuse it before buffering more; and it
/// bounds what a small block of indexed references can expand into.
pub(crate) const MAX_HEADER_LIST: usize = 16 << 10;

/// Largest header block (sum of the HEADERS and CONTINUATION payloads) accepted
/// before the connection is closed. HPACK never needs more bytes for a block than
/// the list it encodes counts, so the list limit bounds the block too. Kubelet
/// requests carry a few hundred bytes.
pub(crate) const MAX_HEADER_BLOCK: usize = MAX_HEADER_LIST;

/// The largest frame the servers accept (they advertise the default
/// SETTINGS_MAX_FRAME_SIZE, and `serve_cmd` pins it). RFC 9113 §4.2: a larger frame
/// is a FRAME_SIZE_ERROR; the shim refuses header frames over it rather than
/// re-framing them into something the server would have accepted.
pub(crate) const MAX_FRAME_SIZE: usize = SAFE_FRAME_SIZE;

/// Highest dynamic table size a client may switch to. Servers here advertise the
/// 4096-byte default; this leaves room for one that advertises more while bounding
/// the memory a client can make us hold.
const MAX_DYNAMIC_TABLE: usize = 64 << 10;

/// What replaces an authority that h2 would reject.
pub(crate) const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

/// Why a connection had to be closed. Every variant is a connection error in HTTP/2
/// terms, so there is nothing to recover: the server sees the read fail.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ShimError {
    #[error("header block on stream {stream_id} exceeds {limit} bytes")]
    HeaderBlockTooLarge { stream_id: u32, limit: usize },
    #[error("decoded header list on stream {stream_id} exceeds {limit} bytes")]
    HeaderListTooLarge { stream_id: u32, limit: usize },
    #[error("cannot decode the header block on stream {stream_id}: {source}")]
    Hpack {
        stream_id: u32,
        #[source]
        source: DecoderError,
    },
    #[error(
        "expected CONTINUATION on stream {expected}, got frame type {frame_type:#x} on stream {stream_id}"
    )]
    ExpectedContinuation {
        expected: u32,
        frame_type: u8,
        stream_id: u32,
    },
    #[error("CONTINUATION on stream {stream_id} without an open header block")]
    UnexpectedContinuation { stream_id: u32 },
    #[error("HEADERS on stream {stream_id} is too short for its padding or priority fields")]
    MalformedHeaders { stream_id: u32 },
    #[error("frame of type {frame_type:#x} on stream {stream_id} has {len} bytes, over {limit}")]
    FrameTooLarge {
        frame_type: u8,
        stream_id: u32,
        len: usize,
        limit: usize,
    },
    #[error("header block on stream {stream_id} does not parse as HPACK representations")]
    Representation { stream_id: u32 },
}

#[derive(Debug, Clone, Copy)]
struct FrameHeader {
    raw: [u8; FRAME_HEADER_LEN],
    len: usize,
    kind: u8,
    flags: u8,
    stream_id: u32,
}

impl FrameHeader {
    fn parse(raw: [u8; FRAME_HEADER_LEN]) -> Self {
        Self {
            raw,
            len: usize::from(raw[0]) << 16 | usize::from(raw[1]) << 8 | usize::from(raw[2]),
            kind: raw[3],
            flags: raw[4],
            // The top bit is reserved and must be ignored on receipt.
            stream_id: u32::from_be_bytes([raw[5], raw[6], raw[7], raw[8]]) & 0x7fff_ffff,
        }
    }
}

#[derive(Debug)]
enum State {
    Preface {
        matched: usize,
    },
    /// Not an HTTP/2 prior-knowledge connection: relay it and let the server answer.
    Passthrough,
    FrameHeader {
        buf: [u8; FRAME_HEADER_LEN],
        filled: usize,
    },
    /// Relaying the payload of a frame that needs no rewriting.
    Forward {
        remaining: usize,
    },
    /// Buffering the payload of a HEADERS or CONTINUATION frame.
    Collect {
        header: FrameHeader,
        payload: Vec<u8>,
    },
}

/// A header block whose END_HEADERS has not arrived yet.
#[derive(Debug)]
struct PendingBlock {
    stream_id: u32,
    end_stream: bool,
    priority: Option<[u8; PRIORITY_LEN]>,
    fragment: Vec<u8>,
}

/// Sans-I/O rewriter for the client-to-server half of one HTTP/2 connection.
pub(crate) struct AuthorityRewriter {
    state: State,
    block: Option<PendingBlock>,
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
}

impl std::fmt::Debug for AuthorityRewriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorityRewriter")
            .field("state", &self.state)
            .field("block", &self.block)
            .finish_non_exhaustive()
    }
}

impl Default for AuthorityRewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl AuthorityRewriter {
    pub(crate) fn new() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(MAX_DYNAMIC_TABLE);
        let mut encoder = Encoder::new();
        // With an empty table the encoder never refers to dynamic entries, so its
        // output is valid whatever SETTINGS_HEADER_TABLE_SIZE the server chose;
        // literals it marks for indexing only churn the server's own table.
        encoder.set_max_table_size(0);
        Self {
            state: State::Preface { matched: 0 },
            block: None,
            decoder,
            encoder,
        }
    }

    /// Consumes bytes read from the client and appends what the server should read
    /// to `out`. Input may be split anywhere; output is produced as soon as a frame
    /// (or, for header blocks, the whole block) is complete.
    pub(crate) fn push(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), ShimError> {
        while !input.is_empty() {
            match &mut self.state {
                State::Preface { matched } => {
                    let take = (PREFACE.len() - *matched).min(input.len());
                    let (chunk, rest) = input.split_at(take);
                    out.extend_from_slice(chunk);
                    input = rest;
                    if chunk != &PREFACE[*matched..*matched + take] {
                        self.state = State::Passthrough;
                    } else if *matched + take == PREFACE.len() {
                        self.state = State::FrameHeader {
                            buf: [0; FRAME_HEADER_LEN],
                            filled: 0,
                        };
                    } else {
                        *matched += take;
                    }
                }
                State::Passthrough => {
                    out.extend_from_slice(input);
                    input = &[];
                }
                State::FrameHeader { buf, filled } => {
                    let take = (FRAME_HEADER_LEN - *filled).min(input.len());
                    buf[*filled..*filled + take].copy_from_slice(&input[..take]);
                    *filled += take;
                    input = &input[take..];
                    if *filled == FRAME_HEADER_LEN {
                        let header = FrameHeader::parse(*buf);
                        self.begin_frame(header, out)?;
                    }
                }
                State::Forward { remaining } => {
                    let take = (*remaining).min(input.len());
                    out.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    *remaining -= take;
                    if *remaining == 0 {
                        self.state = next_frame();
                    }
                }
                State::Collect { header, payload } => {
                    let take = (header.len - payload.len()).min(input.len());
                    payload.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    if payload.len() == header.len {
                        let header = *header;
                        let payload = std::mem::take(payload);
                        self.state = next_frame();
                        self.finish_frame(header, &payload, out)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn begin_frame(&mut self, header: FrameHeader, out: &mut Vec<u8>) -> Result<(), ShimError> {
        let is_header_frame = matches!(header.kind, TYPE_HEADERS | TYPE_CONTINUATION);
        // RFC 9113 §6.10: nothing may interleave with an open header block.
        if let Some(block) = &self.block
            && (header.kind != TYPE_CONTINUATION || header.stream_id != block.stream_id)
        {
            return Err(ShimError::ExpectedContinuation {
                expected: block.stream_id,
                frame_type: header.kind,
                stream_id: header.stream_id,
            });
        }
        if !is_header_frame {
            out.extend_from_slice(&header.raw);
            self.state = if header.len == 0 {
                next_frame()
            } else {
                State::Forward {
                    remaining: header.len,
                }
            };
            return Ok(());
        }
        if header.kind == TYPE_CONTINUATION && self.block.is_none() {
            return Err(ShimError::UnexpectedContinuation {
                stream_id: header.stream_id,
            });
        }
        if header.len > MAX_FRAME_SIZE {
            return Err(ShimError::FrameTooLarge {
                frame_type: header.kind,
                stream_id: header.stream_id,
                len: header.len,
                limit: MAX_FRAME_SIZE,
            });
        }
        let buffered = self.block.as_ref().map_or(0, |b| b.fragment.len());
        if buffered + header.len > MAX_HEADER_BLOCK {
            return Err(ShimError::HeaderBlockTooLarge {
                stream_id: header.stream_id,
                limit: MAX_HEADER_BLOCK,
            });
        }
        if header.len == 0 {
            self.state = next_frame();
            return self.finish_frame(header, &[], out);
        }
        self.state = State::Collect {
            header,
            payload: Vec::with_capacity(header.len),
        };
        Ok(())
    }

    fn finish_frame(
        &mut self,
        header: FrameHeader,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), ShimError> {
        match (header.kind, &mut self.block) {
            (TYPE_HEADERS, _) => {
                let (fragment, priority) = split_headers_payload(header.flags, payload).ok_or(
                    ShimError::MalformedHeaders {
                        stream_id: header.stream_id,
                    },
                )?;
                self.block = Some(PendingBlock {
                    stream_id: header.stream_id,
                    end_stream: header.flags & FLAG_END_STREAM != 0,
                    priority,
                    fragment: fragment.to_vec(),
                });
            }
            (_, Some(block)) => block.fragment.extend_from_slice(payload),
            // begin_frame only lets CONTINUATION through with an open block.
            (_, None) => {
                return Err(ShimError::UnexpectedContinuation {
                    stream_id: header.stream_id,
                });
            }
        }
        if header.flags & FLAG_END_HEADERS != 0
            && let Some(block) = self.block.take()
        {
            self.emit_block(block, out)?;
        }
        Ok(())
    }

    fn emit_block(&mut self, block: PendingBlock, out: &mut Vec<u8>) -> Result<(), ShimError> {
        let stream_id = block.stream_id;
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut list_size = 0usize;
        self.decoder
            .decode_with_cb(&block.fragment, |name, value| {
                list_size = list_size.saturating_add(name.len() + value.len() + 32);
                // The callback cannot stop the decoder; stop keeping fields instead
                // and fail once it returns.
                if list_size <= MAX_HEADER_LIST {
                    fields.push((name.into_owned(), value.into_owned()));
                }
            })
            .map_err(|source| ShimError::Hpack { stream_id, source })?;
        if list_size > MAX_HEADER_LIST {
            return Err(ShimError::HeaderListTooLarge {
                stream_id,
                limit: MAX_HEADER_LIST,
            });
        }

        for (name, value) in &mut fields {
            if name.as_slice() == b":authority" && !is_valid_authority(value) {
                debug!(
                    stream_id,
                    original = %String::from_utf8_lossy(value),
                    replacement = %String::from_utf8_lossy(REPLACEMENT_AUTHORITY),
                    "replacing an :authority that h2 would reject"
                );
                *value = REPLACEMENT_AUTHORITY.to_vec();
            }
        }

        // Fields the client sent as never-indexed stay never-indexed (RFC 7541
        // §6.2.3); the others go through the encoder, whose empty table makes each
        // field's encoding independent of the rest, so the two can interleave.
        let never = super::representation::never_indexed(&block.fragment)
            .filter(|flags| flags.len() == fields.len())
            .ok_or(ShimError::Representation { stream_id })?;
        let mut encoded = Vec::new();
        for ((name, value), never) in fields.iter().zip(never) {
            if never {
                super::representation::encode_never_indexed(&mut encoded, name, value);
            } else {
                // Writing into a Vec cannot fail.
                let _ = self
                    .encoder
                    .encode_header_into((name.as_slice(), value.as_slice()), &mut encoded);
            }
        }
        write_header_frames(out, &block, &encoded);
        Ok(())
    }
}

fn next_frame() -> State {
    State::FrameHeader {
        buf: [0; FRAME_HEADER_LEN],
        filled: 0,
    }
}

/// Mirrors the check h2 applies to `:authority` on the server side.
pub(crate) fn is_valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// Strips padding and the priority fields from a HEADERS payload (RFC 9113 §6.2);
/// `None` when the payload is too short for what its flags announce.
fn split_headers_payload(flags: u8, payload: &[u8]) -> Option<(&[u8], Option<[u8; PRIORITY_LEN]>)> {
    let mut body = payload;
    let mut pad_len = 0;
    if flags & FLAG_PADDED != 0 {
        let (&len, rest) = body.split_first()?;
        pad_len = usize::from(len);
        body = rest;
    }
    let mut priority = None;
    if flags & FLAG_PRIORITY != 0 {
        let (fields, rest) = body.split_first_chunk::<PRIORITY_LEN>()?;
        priority = Some(*fields);
        body = rest;
    }
    let fragment_len = body.len().checked_sub(pad_len)?;
    Some((&body[..fragment_len], priority))
}

/// Frames a re-encoded block as HEADERS plus as many CONTINUATION frames as needed.
/// Padding is dropped (it carries nothing); priority fields and END_STREAM are kept.
fn write_header_frames(out: &mut Vec<u8>, block: &PendingBlock, encoded: &[u8]) {
    let priority_len = if block.priority.is_some() {
        PRIORITY_LEN
    } else {
        0
    };
    let (first, mut rest) = encoded.split_at(encoded.len().min(SAFE_FRAME_SIZE - priority_len));

    let mut flags = 0;
    if block.end_stream {
        flags |= FLAG_END_STREAM;
    }
    if block.priority.is_some() {
        flags |= FLAG_PRIORITY;
    }
    if rest.is_empty() {
        flags |= FLAG_END_HEADERS;
    }
    write_frame_header(
        out,
        priority_len + first.len(),
        TYPE_HEADERS,
        flags,
        block.stream_id,
    );
    if let Some(priority) = &block.priority {
        out.extend_from_slice(priority);
    }
    out.extend_from_slice(first);

    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(SAFE_FRAME_SIZE));
        rest = tail;
        let flags = if rest.is_empty() { FLAG_END_HEADERS } else { 0 };
        write_frame_header(out, chunk.len(), TYPE_CONTINUATION, flags, block.stream_id);
        out.extend_from_slice(chunk);
    }
}

fn write_frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream_id: u32) {
    debug_assert!(len <= SAFE_FRAME_SIZE);
    let len = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream_id.to_be_bytes());
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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
            0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab,
            0x90, 0xf4, 0xff,
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
}
