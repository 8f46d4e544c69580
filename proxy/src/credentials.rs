//! Credentials in the upstream URL (`http://user:secret@host`): taken out of the authority, sent to
//! the upstream as HTTP Basic auth, and shown nowhere else (logs, metric labels, `/healthz`, stored
//! records see the URL with its user information replaced by `***`).

use http::HeaderValue;

/// What replaces the user information in every shown form of the URL.
pub const REDACTED: &str = "***";

/// The URL's user information split off its authority.
#[derive(Debug, PartialEq, Eq)]
pub struct Split<'a> {
    /// `host[:port]`, without user information.
    pub host: &'a str,
    /// `Basic base64(user:password)`, percent-decoded first; `None` without user information.
    pub basic: Option<HeaderValue>,
}

/// Splits `user:password@host:port` (the password is optional).
pub fn split(authority: &str) -> Split<'_> {
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return Split { host: authority, basic: None };
    };
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let plain = [percent_decode(user), b":".to_vec(), percent_decode(password)].concat();
    let mut value = HeaderValue::from_str(&format!("Basic {}", base64(&plain))).ok();
    if let Some(value) = &mut value {
        value.set_sensitive(true);
    }
    Split { host, basic: value }
}

/// `scheme://***@host/path` for a URL whose authority had user information, else the URL unchanged.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://{REDACTED}@{host}{}", &rest[end..]),
        None => url.to_string(),
    }
}

fn percent_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (chunk[0] as u32) << 16 | (*chunk.get(1).unwrap_or(&0) as u32) << 8 | *chunk.get(2).unwrap_or(&0) as u32;
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> shift) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_decodes_and_encodes_basic_auth() {
        let s = split("alice:s%40cret@127.0.0.1:8000");
        assert_eq!(s.host, "127.0.0.1:8000");
        // base64("alice:s@cret")
        assert_eq!(s.basic.unwrap().to_str().unwrap(), "Basic YWxpY2U6c0BjcmV0");
        assert_eq!(split("h:1").basic, None);
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abc"), "YWJj");
    }

    #[test]
    fn redacts_user_information_only() {
        assert_eq!(redact_url("http://u:SECRET@h:1/v1?q=a@b"), "http://***@h:1/v1?q=a@b");
        assert_eq!(redact_url("http://h:1/v1"), "http://h:1/v1");
    }
}
