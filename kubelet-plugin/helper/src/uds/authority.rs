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

use super::frames::{
    FLAG_END_HEADERS, FLAG_END_STREAM, FRAME_HEADER_LEN, FrameHeader, MAX_FRAME_SIZE,
    MAX_HEADER_BLOCK, MAX_HEADER_LIST, PREFACE, PRIORITY_LEN, TYPE_CONTINUATION, TYPE_HEADERS,
    split_headers_payload, write_header_frames,
};

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
        write_header_frames(
            out,
            block.stream_id,
            block.end_stream,
            block.priority.as_ref(),
            &encoded,
        );
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

#[cfg(test)]
mod tests;
