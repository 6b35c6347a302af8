//! GPT-2's reversible byte <-> unicode alphabet: byte-level BPE vocabularies store every byte as
//! a printable character so that token texts are valid strings without whitespace or controls.
//!
//! The printable bytes `!`..=`~`, `¡`..=`¬` and `®`..=`ÿ` (188 of them) stand for themselves;
//! the other 68 bytes, in increasing order, take the code points U+0100, U+0101, ... (so the
//! space 0x20 becomes `Ġ` U+0120 and the newline 0x0A becomes `Ċ` U+010A).

/// The characters standing for the bytes 0..=255, and the way back.
pub struct ByteUnicode {
    to_char: [char; 256],
    /// Indexed by code point below U+0144; -1 where the code point is outside the alphabet.
    from_char: [i16; ALPHABET_END],
}

const ALPHABET_END: usize = 256 + 68;

fn stands_for_itself(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

impl ByteUnicode {
    pub fn new() -> ByteUnicode {
        let mut to_char = ['\0'; 256];
        let mut next = 256u32;
        for b in 0..=255u8 {
            to_char[b as usize] = if stands_for_itself(b) {
                b as char
            } else {
                next += 1;
                char::from_u32(next - 1).expect("U+0100..U+0143 are valid chars")
            };
        }
        let mut from_char = [-1i16; ALPHABET_END];
        for (b, &c) in to_char.iter().enumerate() {
            from_char[c as usize] = b as i16;
        }
        ByteUnicode { to_char, from_char }
    }

    /// The character standing for `b`.
    pub fn char_of(&self, b: u8) -> char {
        self.to_char[b as usize]
    }

    /// The byte `c` stands for, if `c` is in the alphabet.
    pub fn byte_of(&self, c: char) -> Option<u8> {
        let b = *self.from_char.get(c as usize)?;
        (b >= 0).then_some(b as u8)
    }

    /// Decodes a byte-level token text; a character outside the alphabet keeps its UTF-8 bytes.
    pub fn decode_text(&self, text: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(text.len());
        for c in text.chars() {
            match self.byte_of(c) {
                Some(b) => out.push(b),
                None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
        out
    }
}

impl Default for ByteUnicode {
    fn default() -> Self {
        ByteUnicode::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_points_and_bijection() {
        let bu = ByteUnicode::new();
        assert_eq!(bu.char_of(b' '), 'Ġ');
        assert_eq!(bu.char_of(b'\n'), 'Ċ');
        assert_eq!(bu.char_of(b'a'), 'a');
        assert_eq!(bu.char_of(0), '\u{100}');
        assert_eq!(bu.char_of(0xAD), '\u{143}');
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = bu.char_of(b);
            assert!(seen.insert(c));
            assert_eq!(bu.byte_of(c), Some(b));
        }
        assert_eq!(bu.byte_of(' '), None);
        assert_eq!(bu.byte_of('\u{144}'), None);
    }
}
