//! GPT-2 byte-level encoding: every byte maps to one printable Unicode character, so byte-level
//! BPE vocabularies can store arbitrary bytes as text (a space is "Ġ", a newline "Ċ"). The
//! `tokenizers` library encodes; this turns a token's text back into bytes for `token_to_piece`.

use std::sync::OnceLock;

struct Tables {
    /// Only the tests encode; the library decodes.
    #[cfg_attr(not(test), allow(dead_code))]
    byte_to_char: [char; 256],
    /// Indexed by code point for the 0..=0x143 range the table uses.
    char_to_byte: Vec<Option<u8>>,
}

fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut byte_to_char = ['\0'; 256];
        let mut next = 256u32;
        for b in 0..=255u8 {
            let cp = if printable(b) {
                u32::from(b)
            } else {
                next += 1;
                next - 1
            };
            // Every code point here is below 0x144, a valid scalar value.
            byte_to_char[usize::from(b)] = char::from_u32(cp).unwrap_or('\u{FFFD}');
        }
        let mut char_to_byte = vec![None; next as usize];
        for (b, c) in byte_to_char.iter().enumerate() {
            char_to_byte[*c as usize] = u8::try_from(b).ok();
        }
        Tables { byte_to_char, char_to_byte }
    })
}

/// Byte-level encodes `text` into `out` (cleared first).
#[cfg(test)]
pub(crate) fn encode_into(text: &str, out: &mut String) {
    let t = tables();
    out.clear();
    out.extend(text.bytes().map(|b| t.byte_to_char[usize::from(b)]));
}

/// The byte-level character of one byte.
#[cfg(test)]
pub(crate) fn byte_char(b: u8) -> char {
    tables().byte_to_char[usize::from(b)]
}

/// Decodes byte-level text back into bytes. Characters outside the table (never produced by
/// byte-level encoding, but possible in a hand-written vocabulary) are kept as their UTF-8 bytes.
pub(crate) fn decode_into(text: &str, out: &mut Vec<u8>) {
    let t = tables();
    for c in text.chars() {
        match t.char_to_byte.get(c as usize).copied().flatten() {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        // Not valid UTF-8 as a whole, so go byte by byte through the table.
        let encoded: String = all.iter().map(|b| byte_char(*b)).collect();
        let mut back = Vec::new();
        decode_into(&encoded, &mut back);
        assert_eq!(back, all);
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        assert_eq!(byte_char(b'a'), 'a');
        let mut s = String::new();
        encode_into("é", &mut s);
        assert_eq!(s, "Ã©");
    }
}
