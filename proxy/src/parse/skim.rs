//! Where a request's messages lie in its bytes, found without parsing them: the byte span of each
//! element of the top-level `"messages"` array. Spans are trusted only on bytes serde_json accepted
//! (or, element by element, accepts next); on anything else the scan gives up (`None`).

use memchr::memchr2;

/// The top-level `"messages"` array of a body: its brackets and its elements' spans (`start..end`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Offset of the array's `[`.
    pub open: usize,
    /// Offset of its `]`.
    pub close: usize,
    pub spans: Vec<(usize, usize)>,
}

/// The layout of the top-level `"messages"` array, the last such key as serde_json keeps it. `None`
/// when the body is not an object holding one, or a top-level key is escaped (it could spell
/// `messages` in a way this scan would not see).
pub fn layout(body: &[u8]) -> Option<Layout> {
    let mut i = ws(body, 0);
    if body.get(i) != Some(&b'{') {
        return None;
    }
    i = ws(body, i + 1);
    let mut found = None;
    loop {
        if body.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(body, i)?;
        let key = &body[i + 1..key_end - 1];
        if key.contains(&b'\\') {
            return None;
        }
        i = ws(body, key_end);
        if body.get(i) != Some(&b':') {
            return None;
        }
        i = ws(body, i + 1);
        if key == b"messages" && body.get(i) == Some(&b'[') {
            let (spans, close) = elements(body, ws(body, i + 1), true)?;
            found = Some(Layout { open: i, close, spans });
            i = close + 1;
        } else {
            found = if key == b"messages" { None } else { found };
            i = value_end(body, i)?;
        }
        i = ws(body, i);
        match body.get(i) {
            Some(b',') => i = ws(body, i + 1),
            Some(b'}') => return found,
            _ => return None,
        }
    }
}

/// The elements of an array after the one ending at `after`: their spans and the offset of `]`.
pub fn rest_of_array(body: &[u8], after: usize) -> Option<(Vec<(usize, usize)>, usize)> {
    let i = ws(body, after);
    match body.get(i) {
        Some(b']') => Some((Vec::new(), i)),
        Some(b',') => elements(body, ws(body, i + 1), false),
        _ => None,
    }
}

/// Elements from `i` (the first byte of one, or `]` when `may_be_empty`) to the closing `]`.
fn elements(body: &[u8], mut i: usize, may_be_empty: bool) -> Option<(Vec<(usize, usize)>, usize)> {
    let mut spans = Vec::new();
    if may_be_empty && body.get(i) == Some(&b']') {
        return Some((spans, i));
    }
    loop {
        let end = value_end(body, i)?;
        spans.push((i, end));
        i = ws(body, end);
        match body.get(i) {
            Some(b',') => i = ws(body, i + 1),
            Some(b']') => return Some((spans, i)),
            _ => return None,
        }
    }
}

fn ws(body: &[u8], mut i: usize) -> usize {
    while matches!(body.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// The offset just past the string starting at `i` (a `"`).
fn string_end(body: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        let k = j + memchr2(b'"', b'\\', body.get(j..)?)?;
        if body[k] == b'"' {
            return Some(k + 1);
        }
        j = k + 2;
    }
}

/// The offset just past the value starting at `i`.
fn value_end(body: &[u8], i: usize) -> Option<usize> {
    match *body.get(i)? {
        b'"' => string_end(body, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while let Some(&byte) = body.get(j) {
                match byte {
                    b'"' => {
                        j = string_end(body, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let mut j = i;
            while !matches!(body.get(j), None | Some(b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r')) {
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn texts<'a>(body: &'a [u8], layout: &Layout) -> Vec<&'a str> {
        layout.spans.iter().map(|&(s, e)| std::str::from_utf8(&body[s..e]).unwrap()).collect()
    }

    #[test]
    fn spans_are_the_elements_serde_json_sees() {
        let body = br#" { "model" : "m", "tools":[{"a":"]}\"{"}], "messages" : [ {"role":"user","content":"a \"quoted\" ] } \\"} ,
            {"role":"assistant","content":[1, 2.5e3, true, null]}, "x" ], "stream":false } "#;
        let layout = layout(body).unwrap();
        let parsed: Value = serde_json::from_slice(body).unwrap();
        let expected: Vec<String> = parsed["messages"].as_array().unwrap().iter().map(Value::to_string).collect();
        let found: Vec<String> = texts(body, &layout).iter().map(|t| serde_json::from_str::<Value>(t).unwrap().to_string()).collect();
        assert_eq!(found, expected);
        assert_eq!(body[layout.open], b'[');
        assert_eq!(body[layout.close], b']');
        let (rest, close) = rest_of_array(body, layout.spans[0].1).unwrap();
        assert_eq!((rest.as_slice(), close), (&layout.spans[1..], layout.close));
    }

    #[test]
    fn the_last_messages_key_wins_and_doubtful_bodies_give_up() {
        let twice = br#"{"messages":[{"a":1}],"messages":[{"b":2},{"c":3}]}"#;
        assert_eq!(layout(twice).unwrap().spans.len(), 2);
        assert_eq!(layout(br#"{"messages":[{"a":1}],"messages":null}"#), None);
        assert_eq!(layout(br#"{"mess\u0061ges":[{"a":1}]}"#), None, "escaped keys");
        assert_eq!(layout(br#"{"messages":[]}"#).unwrap().spans, vec![]);
        for bad in [&br#"[1]"#[..], br#"{"messages":[{"a":1}"#, br#"{"messages":[{"a":"1}]}"#, b"", br#"{"messages":[1 2]}"#] {
            assert_eq!(layout(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }
}
