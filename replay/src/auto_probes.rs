//! `--probes auto`: recall probes proposed from facts the user stated in a captured conversation
//! ("my locker number is 4821", "my manager is called Ana Ruiz", "the door code is QX-731"). Each
//! becomes a question asked after the last replayable turn, checked against the words that stated it.

use serde_json::Value;

use crate::conversation::Conversation;
use crate::model::ProbeSpec;

/// Probes proposed at most.
pub const MAX_PROBES: usize = 8;

/// Proposes probes from the user messages of `conversation`'s last replayable turn (which carries the
/// whole history), oldest fact first, one per subject.
pub fn propose(conversation: &Conversation) -> Vec<ProbeSpec> {
    let Some(last) = conversation.turns.last() else {
        return Vec::new();
    };
    let mut probes: Vec<ProbeSpec> = Vec::new();
    let mut subjects: Vec<String> = Vec::new();
    let user_texts = last.messages.iter().filter(|m| m["role"] == "user").filter_map(text);
    for text in user_texts {
        for sentence in text.split(['.', '!', '?', '\n', ';', ',']) {
            let Some((subject, value, named)) = fact(sentence) else {
                continue;
            };
            if probes.len() >= MAX_PROBES || subjects.contains(&subject) {
                continue;
            }
            // The plain question is the one a small model answers best.
            let question = if named { format!("What is my {subject} called?") } else { format!("What is my {subject}?") };
            probes.push(ProbeSpec { after_turn: last.turn, question, expected: value });
            subjects.push(subject);
        }
    }
    probes
}

fn text(message: &Value) -> Option<String> {
    match &message["content"] {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => Some(parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join(" ")),
        _ => None,
    }
}

/// `my SUBJECT is VALUE` / `my SUBJECT is called VALUE`, with a short subject and a value worth
/// asking for: a number, a code, or one to three capitalised words (a name).
/// The bool: the value is a name (`is called`, `is named`).
fn fact(sentence: &str) -> Option<(String, String, bool)> {
    let lower = sentence.to_lowercase();
    let start = lower.find("my ")? + 3;
    let rest = &sentence[start..];
    let rest_lower = &lower[start..];
    let (cut, verb) = [" is called ", " is named ", " is ", " are "].iter().find_map(|v| rest_lower.find(v).map(|i| (i, v.len())))?;
    // `is called` and `is named` are the only verbs longer than ` is ` that start with it.
    let named = verb > " is ".len() && rest_lower[cut..].starts_with(" is ");
    let subject = rest[..cut].trim();
    let words = subject.split_whitespace().count();
    if subject.is_empty() || words > 5 || subject.contains(',') {
        return None;
    }
    let value = rest[cut + verb..].trim().trim_end_matches([',', ':']).trim();
    let tokens: Vec<&str> = value.split_whitespace().collect();
    let valuable =
        |t: &str| t.chars().any(|c| c.is_ascii_digit()) || (t.len() >= 3 && t.chars().all(|c| c.is_ascii_uppercase() || c == '-'));
    if let Some(code) = tokens.iter().find(|t| valuable(t)) {
        return Some((subject.to_string(), code.trim_matches(|c: char| !c.is_alphanumeric() && c != '-').to_string(), named));
    }
    let capitalised = !tokens.is_empty() && tokens.len() <= 3 && tokens.iter().all(|t| t.chars().next().is_some_and(char::is_uppercase));
    capitalised.then(|| (subject.to_string(), value.to_string(), named))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::TurnRequest;
    use serde_json::json;

    #[test]
    fn three_stated_facts_give_three_probes() {
        let messages = vec![
            json!({"role": "system", "content": "You are helpful. My rules are strict."}),
            json!({"role": "user", "content": "Hi! My locker number is 4821. I like tea."}),
            json!({"role": "assistant", "content": "Noted, my friend is here."}),
            json!({"role": "user", "content": "Also my new manager is called Ana Ruiz, and my door code is QX-731. My day is going well."}),
        ];
        let turn = TurnRequest {
            turn: 1,
            messages,
            model: None,
            params: Default::default(),
            captured_max_tokens: None,
            captured_text: None,
            captured_message: None,
        };
        let conversation = Conversation { id: 1, total_turns: 2, turns: vec![turn], notes: Vec::new() };
        let probes = propose(&conversation);
        let got: Vec<(&str, &str)> = probes.iter().map(|p| (p.question.as_str(), p.expected.as_str())).collect();
        assert_eq!(got.len(), 3, "{got:#?}");
        assert_eq!(probes[0].expected, "4821");
        assert_eq!(probes[0].question, "What is my locker number?");
        assert_eq!(probes[1].question, "What is my new manager called?");
        assert_eq!(probes[1].expected, "Ana Ruiz");
        assert_eq!(probes[2].expected, "QX-731");
        assert!(probes.iter().all(|p| p.after_turn == 1));
    }
}
