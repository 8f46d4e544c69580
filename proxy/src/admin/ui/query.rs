//! Query strings of the UI's endpoints: `key=value` pairs, percent-decoded.

/// The pairs of a query string, decoded (`+` is a space).
pub fn pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(key), decode(value))
        })
        .collect()
}

/// Percent-decoding; malformed escapes are kept as they are.
pub fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_escapes_and_plus() {
        assert_eq!(decode("http%3A%2F%2Fa%3A1+b"), "http://a:1 b");
        assert_eq!(decode("100%"), "100%");
        assert_eq!(
            pairs("q=a%20b&kind=cache_miss&x"),
            vec![("q".into(), "a b".into()), ("kind".into(), "cache_miss".into()), ("x".into(), String::new())]
        );
    }
}
