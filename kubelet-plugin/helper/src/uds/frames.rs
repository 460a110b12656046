//! HTTP/2 framing as the `:authority` shim needs it (RFC 9113 §4): the frame header,
//! the types and flags of header frames, and the sizes the servers here accept.

/// RFC 9113 §3.4: the client connection preface.
pub(super) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub(super) const FRAME_HEADER_LEN: usize = 9;

pub(super) const TYPE_HEADERS: u8 = 0x1;
pub(super) const TYPE_CONTINUATION: u8 = 0x9;

pub(super) const FLAG_END_STREAM: u8 = 0x1;
pub(super) const FLAG_END_HEADERS: u8 = 0x4;
pub(super) const FLAG_PADDED: u8 = 0x8;
pub(super) const FLAG_PRIORITY: u8 = 0x20;

/// Length of the stream dependency and weight that the PRIORITY flag adds.
pub(super) const PRIORITY_LEN: usize = 5;

/// SETTINGS_MAX_FRAME_SIZE can be raised by the server but never below this
/// (RFC 9113 §6.5.2), so frames of at most this size are legal whatever the server
/// advertised, and the rewriter never has to watch the server's SETTINGS.
pub(super) const SAFE_FRAME_SIZE: usize = 16_384;

/// Largest decoded header list, counted as HPACK does (name + value + 32 per field):
/// the limit the servers behind the shim enforce (hyper's default, which
/// `grpc_server` also sets explicitly). A request over it would only get a 431 from
/// the server, so the shim may as well refuse it before buffering more; and it
/// bounds what a small block of indexed references can expand into.
pub const MAX_HEADER_LIST: usize = 16 << 10;

/// Largest header block (sum of the HEADERS and CONTINUATION payloads) accepted
/// before the connection is closed. HPACK never needs more bytes for a block than
/// the list it encodes counts, so the list limit bounds the block too. Kubelet
/// requests carry a few hundred bytes.
pub(super) const MAX_HEADER_BLOCK: usize = MAX_HEADER_LIST;

/// The largest frame the servers accept (they advertise the default
/// SETTINGS_MAX_FRAME_SIZE, and `grpc_server` pins it). RFC 9113 §4.2: a larger frame
/// is a FRAME_SIZE_ERROR; the shim refuses header frames over it rather than
/// re-framing them into something the server would have accepted.
pub const MAX_FRAME_SIZE: usize = SAFE_FRAME_SIZE;

#[derive(Debug, Clone, Copy)]
pub(super) struct FrameHeader {
    pub(super) raw: [u8; FRAME_HEADER_LEN],
    pub(super) len: usize,
    pub(super) kind: u8,
    pub(super) flags: u8,
    pub(super) stream_id: u32,
}

impl FrameHeader {
    pub(super) fn parse(raw: [u8; FRAME_HEADER_LEN]) -> Self {
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

/// Strips padding and the priority fields from a HEADERS payload (RFC 9113 §6.2);
/// `None` when the payload is too short for what its flags announce.
pub(super) fn split_headers_payload(
    flags: u8,
    payload: &[u8],
) -> Option<(&[u8], Option<[u8; PRIORITY_LEN]>)> {
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

pub(super) fn write_frame_header(
    out: &mut Vec<u8>,
    len: usize,
    kind: u8,
    flags: u8,
    stream_id: u32,
) {
    debug_assert!(len <= SAFE_FRAME_SIZE);
    let len = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream_id.to_be_bytes());
}

/// Frames a re-encoded block as HEADERS plus as many CONTINUATION frames as needed.
/// Padding is dropped (it carries nothing); priority fields and END_STREAM are kept.
pub(super) fn write_header_frames(
    out: &mut Vec<u8>,
    stream_id: u32,
    end_stream: bool,
    priority: Option<&[u8; PRIORITY_LEN]>,
    encoded: &[u8],
) {
    let priority_len = if priority.is_some() { PRIORITY_LEN } else { 0 };
    let (first, mut rest) = encoded.split_at(encoded.len().min(SAFE_FRAME_SIZE - priority_len));

    let mut flags = 0;
    if end_stream {
        flags |= FLAG_END_STREAM;
    }
    if priority.is_some() {
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
        stream_id,
    );
    if let Some(priority) = priority {
        out.extend_from_slice(priority);
    }
    out.extend_from_slice(first);

    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(SAFE_FRAME_SIZE));
        rest = tail;
        let flags = if rest.is_empty() { FLAG_END_HEADERS } else { 0 };
        write_frame_header(out, chunk.len(), TYPE_CONTINUATION, flags, stream_id);
        out.extend_from_slice(chunk);
    }
}
