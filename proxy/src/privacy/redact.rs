//! Masks secrets and personal data in text (`--capture redacted`): API keys and tokens, private key
//! blocks, credential assignments, e-mail addresses, payment card numbers (Luhn-checked, card-brand
//! prefixes and lengths only) and phone numbers (international `+...` and a few national layouts with
//! separators). Each match is replaced by a typed marker, `[redacted:KIND]`. The patterns lean to
//! precision for numbers (timestamps, ids and version numbers are left alone) and to recall for
//! credentials (a key-shaped string is masked whatever surrounds it).

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::{Captures, Regex};
use serde_json::Value;

/// What a marker says was there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    PrivateKey,
    Jwt,
    AnthropicKey,
    OpenaiKey,
    GithubToken,
    SlackToken,
    AwsKey,
    GoogleKey,
    BearerToken,
    Secret,
    Email,
    Card,
    Phone,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::PrivateKey => "private_key",
            Kind::Jwt => "jwt",
            Kind::AnthropicKey => "anthropic_key",
            Kind::OpenaiKey => "openai_key",
            Kind::GithubToken => "github_token",
            Kind::SlackToken => "slack_token",
            Kind::AwsKey => "aws_key",
            Kind::GoogleKey => "google_key",
            Kind::BearerToken => "bearer_token",
            Kind::Secret => "secret",
            Kind::Email => "email",
            Kind::Card => "card",
            Kind::Phone => "phone",
        }
    }

    /// The text put in place of a match.
    pub fn marker(self) -> String {
        format!("[redacted:{}]", self.as_str())
    }
}

/// A rule: a pattern, and what to put in place of a match (`None`: leave it, a near miss).
struct Rule {
    pattern: Regex,
    replace: fn(&Captures<'_>, &str) -> Option<String>,
}

fn rule(pattern: &str, replace: fn(&Captures<'_>, &str) -> Option<String>) -> Rule {
    Rule { pattern: Regex::new(pattern).expect("redaction patterns are valid"), replace }
}

/// The whole match, as `kind`.
macro_rules! whole {
    ($kind:expr) => {
        |_: &Captures<'_>, _: &str| Some($kind.marker())
    };
}

/// The rules, in order: a later rule sees the text with earlier markers in place (a key inside a
/// PEM block is gone before the key rules run; `api_key=sk-...` is masked as an OpenAI key, and the
/// assignment rule leaves a marker alone).
static RULES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    vec![
        // PEM private keys: the whole block, or its base64 lines when the block is cut short.
        rule(
            r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----(?:[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|(?:\s*[A-Za-z0-9+/=]{16,})*)",
            whole!(Kind::PrivateKey),
        ),
        rule(r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*", whole!(Kind::Jwt)),
        rule(r"\bsk-ant-[A-Za-z0-9_-]{16,}", whole!(Kind::AnthropicKey)),
        rule(r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}", whole!(Kind::OpenaiKey)),
        rule(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})", whole!(Kind::GithubToken)),
        rule(r"\bxox[abposre]-[A-Za-z0-9-]{10,}", whole!(Kind::SlackToken)),
        rule(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b", whole!(Kind::AwsKey)),
        rule(r"\bAIza[0-9A-Za-z_-]{35}", whole!(Kind::GoogleKey)),
        rule(r"\b([Bb]earer|BEARER)(\s+)[A-Za-z0-9._~+/=-]{16,}", |c, _| Some(format!("{}{}{}", &c[1], &c[2], Kind::BearerToken.marker()))),
        // `password=...`, `"api_key": "..."`, `client_secret: ...`: the name and separator stay.
        rule(
            r#"(?i)\b([a-z0-9_.-]*(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?key|auth[_-]?token|access[_-]?token|refresh[_-]?token|token|private[_-]?key|credentials?))(["']?[ \t]*[:=][ \t]*["']?)([^\s"',;{}\[\]<>]+)"#,
            |c, _| Some(format!("{}{}{}", &c[1], &c[2], Kind::Secret.marker())),
        ),
        rule(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b", whole!(Kind::Email)),
        rule(r"\b\d(?:[ -]?\d){12,18}\b", |c, _| card(&c[0]).then(|| Kind::Card.marker())),
        // International: `+` and a country code, 8 to 15 digits in all, in groups.
        rule(r"\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?)(?:[ .-]?\d{2,5}){1,5}\b", |c, text| {
            let m = c.get(0).expect("the whole match");
            let digits = c[0].chars().filter(char::is_ascii_digit).count();
            let joined = text[..m.start()].chars().next_back().is_some_and(|p| p.is_alphanumeric() || p == '+' || p == '/');
            ((8..=15).contains(&digits) && !joined).then(|| Kind::Phone.marker())
        }),
        // North American with separators: (555) 123-4567, 555-123-4567, 555.123.4567, 1-555-123-4567.
        rule(r"(?:\b1[ .-])?(?:\(\d{3}\)[ ]?\d{3}[ .-]\d{4}|\b\d{3}-\d{3}-\d{4}|\b\d{3}\.\d{3}\.\d{4})\b", whole!(Kind::Phone)),
        // French and similar: 06 12 34 56 78, 06.12.34.56.78; UK mobiles: 07700 900123.
        rule(r"\b(?:0[1-9](?:[ .]\d{2}){4}|07\d{3} \d{6})\b", whole!(Kind::Phone)),
    ]
});

/// Whether `text` (digits, spaces and dashes) is a payment card number: 13 to 19 digits with a card
/// brand's prefix and length (Visa, Mastercard, American Express, Diners, JCB, Discover, UnionPay),
/// one kind of separator at most, and a valid Luhn check digit. Timestamps (they start with 1),
/// counters and most ids fail one of these.
pub fn card(text: &str) -> bool {
    let digits: Vec<u32> = text.chars().filter_map(|c| c.to_digit(10)).collect();
    let separators = (text.contains(' '), text.contains('-'));
    if separators == (true, true) || digits.iter().all(|&d| d == digits[0]) {
        return false;
    }
    let n = digits.len();
    let prefix = |k: usize| digits.iter().take(k).fold(0, |acc, d| acc * 10 + d);
    let brand = match digits.first() {
        Some(4) => matches!(n, 13 | 16 | 19),
        Some(5) => (51..=55).contains(&prefix(2)) && n == 16,
        Some(2) => (2221..=2720).contains(&prefix(4)) && n == 16,
        Some(3) => match prefix(2) {
            34 | 37 => n == 15,
            36 | 38 | 30 => (14..=16).contains(&n),
            35 => (16..=19).contains(&n),
            _ => false,
        },
        Some(6) => (16..=19).contains(&n),
        _ => false,
    };
    brand && luhn(&digits)
}

/// The Luhn checksum holds.
fn luhn(digits: &[u32]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            if i % 2 == 1 {
                if d * 2 > 9 {
                    d * 2 - 9
                } else {
                    d * 2
                }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// `text` with every secret and personal datum masked (borrowed when nothing was).
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut current = Cow::Borrowed(text);
    for rule in RULES.iter() {
        if !rule.pattern.is_match(&current) {
            continue;
        }
        let mut out = String::with_capacity(current.len());
        let mut last = 0;
        let mut changed = false;
        for caps in rule.pattern.captures_iter(&current) {
            let m = caps.get(0).expect("the whole match");
            if let Some(replacement) = (rule.replace)(&caps, &current) {
                out.push_str(&current[last..m.start()]);
                out.push_str(&replacement);
                last = m.end();
                changed = true;
            }
        }
        if changed {
            out.push_str(&current[last..]);
            current = Cow::Owned(out);
        }
    }
    current
}

/// Masks every string in `value` in place (object keys are structure, and stay); whether any changed.
pub fn redact_value(value: &mut Value) -> bool {
    match value {
        Value::String(text) => match redact(text) {
            Cow::Owned(masked) => {
                *text = masked;
                true
            }
            Cow::Borrowed(_) => false,
        },
        Value::Array(items) => items.iter_mut().fold(false, |changed, item| redact_value(item) | changed),
        Value::Object(map) => map.values_mut().fold(false, |changed, item| redact_value(item) | changed),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masked(text: &str) -> String {
        redact(text).into_owned()
    }

    /// `text` with `secret` in it comes out with `marker` in its place and no trace of it.
    fn hides(text: &str, secret: &str, kind: Kind) {
        let out = masked(text);
        assert!(!out.contains(secret), "{secret:?} survived in {out:?}");
        assert!(out.contains(&kind.marker()), "no {} marker in {out:?}", kind.as_str());
    }

    fn keeps(text: &str) {
        assert_eq!(masked(text), text, "a near miss was masked");
    }

    #[test]
    fn api_keys_and_tokens() {
        let openai = "sk-abcdefghijklmnopqrstuvwxyz0123456789ABCD";
        hides(&format!("my key is {openai}, thanks"), openai, Kind::OpenaiKey);
        let project = "sk-proj-Ab3dEfGhIjKlMnOpQrStUvWxYz_0123456789-abcdef";
        hides(&format!("OPENAI_API_KEY={project}"), project, Kind::OpenaiKey);
        let anthropic = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789";
        hides(&format!("use {anthropic} here"), anthropic, Kind::AnthropicKey);
        assert!(!masked(anthropic).contains("openai"), "an Anthropic key is named as one");
        let ghp = "ghp_ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghij";
        hides(&format!("token {ghp}"), ghp, Kind::GithubToken);
        let gho = "gho_ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghij";
        hides(gho, gho, Kind::GithubToken);
        let pat = "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz";
        hides(&format!("git clone https://{pat}@github.com/o/r"), pat, Kind::GithubToken);
        let slack = "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOp";
        hides(&format!("slack: {slack}"), slack, Kind::SlackToken);
        let aws = "AKIAIOSFODNN7EXAMPLE";
        hides(&format!("aws_access_key_id {aws}"), aws, Kind::AwsKey);
        let google = "AIzaSyA-1234567890abcdefghijklmnopqrstu";
        hides(&format!("maps key {google}"), google, Kind::GoogleKey);
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
        hides(&format!("cookie={jwt}; path=/"), jwt, Kind::Jwt);
        let bearer = "Authorization: Bearer abc123DEF456ghi789JKL";
        let out = masked(bearer);
        assert_eq!(out, "Authorization: Bearer [redacted:bearer_token]");
    }

    #[test]
    fn private_key_blocks_whole_or_cut_short() {
        let pem = "before\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx2\nQ9Zq==\n-----END RSA PRIVATE KEY-----\nafter";
        let out = masked(pem);
        assert_eq!(out, "before\n[redacted:private_key]\nafter");
        let cut = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC";
        hides(cut, "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC", Kind::PrivateKey);
        keeps("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----");
    }

    #[test]
    fn credential_assignments_keep_their_names() {
        assert_eq!(masked("password=hunter2"), "password=[redacted:secret]");
        assert_eq!(masked(r#"{"api_key": "abc123xyz"}"#), r#"{"api_key": "[redacted:secret]"}"#);
        assert_eq!(masked("DB_PASSWORD: s3cr3t!"), "DB_PASSWORD: [redacted:secret]");
        assert_eq!(masked("client_secret='q1w2e3'"), "client_secret='[redacted:secret]'");
        // A key already masked is not masked again.
        assert_eq!(masked("api_key=sk-abcdefghijklmnopqrstuvwxyz0123"), "api_key=[redacted:openai_key]");
    }

    #[test]
    fn emails() {
        hides("write to jane.doe+news@mail.example.co.uk today", "jane.doe+news@mail.example.co.uk", Kind::Email);
        hides("<bob@example.org>", "bob@example.org", Kind::Email);
    }

    #[test]
    fn card_numbers_that_pass_luhn() {
        hides("card 4111 1111 1111 1111 exp 12/29", "4111 1111 1111 1111", Kind::Card);
        hides("4111-1111-1111-1111", "4111-1111-1111-1111", Kind::Card);
        hides("5555555555554444", "5555555555554444", Kind::Card);
        hides("amex 378282246310005", "378282246310005", Kind::Card);
        hides("6011111111111117", "6011111111111117", Kind::Card);
    }

    #[test]
    fn phone_numbers() {
        hides("call +1 415 555 2671 now", "415 555 2671", Kind::Phone);
        hides("+44 20 7946 0958", "7946 0958", Kind::Phone);
        hides("+49-30-1234567", "1234567", Kind::Phone);
        hides("(415) 555-2671", "555-2671", Kind::Phone);
        hides("415-555-2671", "415-555-2671", Kind::Phone);
        hides("415.555.2671", "415.555.2671", Kind::Phone);
        hides("06 12 34 56 78", "12 34 56 78", Kind::Phone);
        hides("07700 900123", "07700 900123", Kind::Phone);
    }

    #[test]
    fn near_misses_survive() {
        // Keys too short, or words that only look like the start of one.
        keeps("sk-learn is a library; task-runner-config; the sk-1234 sample");
        keeps("ghp_short and xoxb-1 and AKIA123");
        keeps("the bearer of bad news");
        keeps("eyJ alone, a.b.c");
        // Assignments without a value, and prose about passwords.
        keeps("reset your password now; max_tokens: 16; tokens: 5");
        keeps("password=");
        // Not e-mail addresses.
        keeps("@decorator, user@localhost, a@b, version 1.2@3");
        // Numbers that are not cards: a millisecond timestamp, a Luhn-failing 16 digits, an id of
        // one repeated digit, a run too long, mixed separators.
        keeps("at 1717171717171 ms");
        keeps("4111 1111 1111 1112");
        keeps("0000000000000000 and 4444444444444444");
        keeps("41111111111111111111111");
        keeps("4111 1111-1111 1111");
        keeps("order 1234567890123");
        // Not phone numbers: versions, dates, times, IPs, sums, short codes, ids.
        keeps("version 1.2.3, v10.20.30, 2024-01-15 12:30:45, 192.168.100.200");
        keeps("3+4=7, +12 34, x+15, 100 200 3000, 12:30:45.123");
        keeps("uuid 550e8400-e29b-41d4-a716-446655440000, commit 4b825dc642cb6eb9a060e54bf8d69288fbee4904");
        keeps("pid 12345, port 8080, 1,234,567 tokens, $1,299.99");
        keeps("ISBN 978-3-16-148410-0");
        keeps("nothing here at all");
    }

    #[test]
    fn json_values_are_masked_in_every_string_and_keys_stay() {
        let mut message = serde_json::json!({
            "role": "user",
            "content": [{"type": "text", "text": "mail me at a@example.com"}],
            "tool_calls": [{"function": {"name": "send", "arguments": "{\"to\": \"+1 415 555 2671\"}"}}],
            "a@example.com": 5,
        });
        assert!(redact_value(&mut message));
        assert_eq!(message["a@example.com"], 5, "keys are structure");
        assert!(!message.to_string().contains("415 555 2671"), "{message}");
        assert_eq!(message["content"][0]["text"], "mail me at [redacted:email]");
        let mut plain = serde_json::json!({"role": "user", "content": "hello"});
        assert!(!redact_value(&mut plain));
    }
}
