//! Incremental detokenization: token pieces are bytes, and one UTF-8 character may span several
//! tokens. The decoder accumulates bytes and releases the longest valid UTF-8 prefix, so no chunk
//! ever carries half a character; bytes that can never become valid turn into U+FFFD.

/// Turns a stream of token byte pieces into text without splitting characters.
#[derive(Debug, Default)]
pub struct Utf8Decoder {
    pending: Vec<u8>,
}

impl Utf8Decoder {
    /// Adds one token's bytes; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(text) => {
                    out.push_str(text);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // `valid_up_to` marks a prefix that is valid UTF-8, so this never falls back.
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // An incomplete character at the end: wait for the next token.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        // Bytes that no continuation can fix.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Bytes still waiting for the rest of their character.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Ends the stream: an unfinished character becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_splits_a_character() {
        let text = "é😀x";
        let bytes = text.as_bytes();
        let mut d = Utf8Decoder::default();
        let mut out = Vec::new();
        for b in bytes {
            out.push(d.push(&[*b]));
        }
        assert!(out.iter().all(|s| s.is_empty() || s.chars().all(|c| c != char::REPLACEMENT_CHARACTER)));
        assert_eq!(out.concat(), text);
        assert_eq!(out, vec!["", "é", "", "", "", "😀", "x"]);
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut d = Utf8Decoder::default();
        assert_eq!(d.push(&[b'a', 0xff, b'b']), "a\u{fffd}b");
        assert_eq!(d.push(&[0xe2, 0x82]), "");
        assert_eq!(d.pending_len(), 2);
        assert_eq!(d.finish(), "\u{fffd}");
    }
}
