//! Which fields of an HPACK header block were sent as never-indexed literals.
//!
//! RFC 7541 §6.2.3: a field represented as "literal never indexed" (a secret the
//! client does not want any table to keep, such as an authorization token) must keep
//! that representation when an intermediary re-encodes it. The HPACK decoder only
//! hands back names and values, so this walks the block's representations on its
//! own, without decoding any string, to learn the flag of each field in order.

/// One flag per field of the block, in order: `true` where the field was a
/// never-indexed literal. `None` when the block does not parse as representations;
/// the HPACK decoder rejects such a block anyway.
pub(crate) fn never_indexed(block: &[u8]) -> Option<Vec<bool>> {
    let mut flags = Vec::new();
    let mut pos = 0;
    while pos < block.len() {
        let first = block[pos];
        if first & 0x80 != 0 {
            // Indexed field: an index with a 7-bit prefix.
            integer(block, &mut pos, 7)?;
            flags.push(false);
        } else if first & 0xc0 == 0x40 {
            // Literal with incremental indexing: 6-bit name index, name if 0, value.
            literal(block, &mut pos, 6)?;
            flags.push(false);
        } else if first & 0xe0 == 0x20 {
            // Dynamic table size update: no field.
            integer(block, &mut pos, 5)?;
        } else {
            // Literal without indexing (0000) or never indexed (0001): 4-bit prefix.
            let never = first & 0x10 != 0;
            literal(block, &mut pos, 4)?;
            flags.push(never);
        }
    }
    Some(flags)
}

/// A literal representation: name index (with `prefix` bits), the name as a string
/// when the index is 0, then the value.
fn literal(block: &[u8], pos: &mut usize, prefix: u8) -> Option<()> {
    if integer(block, pos, prefix)? == 0 {
        string(block, pos)?;
    }
    string(block, pos)
}

/// Skips a string literal: Huffman bit and a 7-bit-prefix length, then the bytes.
fn string(block: &[u8], pos: &mut usize) -> Option<()> {
    let len = integer(block, pos, 7)?;
    *pos = pos.checked_add(len).filter(|end| *end <= block.len())?;
    Some(())
}

/// RFC 7541 §5.1 integer with an N-bit prefix; bounded like the decoder's.
fn integer(block: &[u8], pos: &mut usize, prefix: u8) -> Option<usize> {
    let mask = (1usize << prefix) - 1;
    let mut value = usize::from(*block.get(*pos)?) & mask;
    *pos += 1;
    if value < mask {
        return Some(value);
    }
    let mut shift = 0u32;
    loop {
        let b = *block.get(*pos)?;
        *pos += 1;
        // Five continuation bytes already exceed any length a block can hold.
        if shift > 28 {
            return None;
        }
        value = value.checked_add(usize::from(b & 0x7f) << shift)?;
        shift += 7;
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
}

/// Appends a never-indexed literal with a literal name (`0001 0000`), strings
/// without Huffman coding: valid whatever the server's table holds.
pub(crate) fn encode_never_indexed(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x10);
    for s in [name, value] {
        // Writing into a Vec cannot fail.
        let _ = loona_hpack::encoder::encode_integer_into(s.len(), 7, 0, out);
        out.extend_from_slice(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loona_hpack::Decoder;

    #[test]
    fn flags_follow_each_representation() {
        let mut block = vec![0x3f, 0x01]; // size update to 32, first as required
        block.push(0x82); // indexed :method GET
        block.extend([0x41, 3, b'a', b'.', b'b']); // incremental, :authority a.b
        encode_never_indexed(&mut block, b"authorization", b"secret");
        block.extend([0x04, 1, b'/']); // without indexing, :path /
        block.extend([0x1f, 0x09, 2, b'x', b'y']); // never indexed, name index 24
        assert_eq!(
            never_indexed(&block),
            Some(vec![false, false, true, false, true])
        );
        // What the decoder reads from the same block, field by field.
        let fields = Decoder::new().decode(&block).unwrap();
        assert_eq!(fields.len(), 5);
        assert_eq!(fields[2], (b"authorization".to_vec(), b"secret".to_vec()));
    }

    #[test]
    fn truncated_or_oversized_blocks_do_not_parse() {
        assert_eq!(never_indexed(&[0x41, 5, b'a']), None);
        assert_eq!(never_indexed(&[0x10, 0x7f]), None);
        assert_eq!(
            never_indexed(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
            None
        );
        assert_eq!(never_indexed(&[]), Some(vec![]));
    }
}
