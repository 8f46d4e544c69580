//! The sweep's conversations, deterministic from a seed: a system prompt, `turns` user/assistant
//! exchanges of realistic filler (small talk, tool results, code) sized to about `length` tokens, with
//! facts planted at a depth (a name, a number, a code, a list that changes over later turns, and a
//! tic-tac-toe game played move by move), and one recall question per fact asked at the end.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Characters per token assumed when sizing filler (English text under a BPE tokenizer); the real
/// prompt size is measured from the golden target's answer.
pub const CHARS_PER_TOKEN: usize = 3;

/// The kinds of planted fact.
pub const FACT_KINDS: [&str; 5] = ["name", "number", "code", "list", "game"];

/// One recall question and how its answer is checked: every word of `expected` present (whole words,
/// case-insensitive) and none of `absent`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    pub fact: String,
    pub question: String,
    pub expected: Vec<String>,
    #[serde(default)]
    pub absent: Vec<String>,
    /// The turn (from 0) whose user message stated the fact (its first statement, for list and game).
    pub planted_turn: u32,
}

/// One generated conversation of the sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepConversation {
    /// Target size in tokens (approximate, see [`CHARS_PER_TOKEN`]).
    pub length: usize,
    pub turns: u32,
    /// Where the facts are planted: 0 the first turn, 1 the last.
    pub depth: f64,
    pub seed: u64,
    /// System, then user/assistant pairs (the probes' questions are not included).
    pub messages: Vec<Value>,
    pub probes: Vec<Probe>,
}

/// splitmix64: small, fast, and the same on every platform.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    pub fn pick<'a>(&mut self, list: &[&'a str]) -> &'a str {
        list[self.below(list.len())]
    }
}

const FIRST: [&str; 12] =
    ["Marguerite", "Thaddeus", "Ingrid", "Oswaldo", "Priya", "Lucian", "Beatrix", "Kenji", "Rosalind", "Emeka", "Svetlana", "Dorian"];
const SURNAME: [&str; 8] = ["Okafor", "Lindqvist", "Moreau", "Takahashi", "Castellano", "Whitcombe", "Novak", "Adeyemi"];
const ITEMS: [&str; 12] =
    ["apples", "rice", "soap", "candles", "lentils", "batteries", "yogurt", "pepper", "sponges", "oats", "honey", "tea"];
const SQUARES: [&str; 9] =
    ["top-left", "top-middle", "top-right", "middle-left", "center", "middle-right", "bottom-left", "bottom-middle", "bottom-right"];
const TOPICS: [&str; 8] = [
    "gardening",
    "the weekend hike",
    "a recipe for soup",
    "train timetables",
    "my cousin's wedding",
    "learning the violin",
    "the office move",
    "a board game night",
];
const CITIES: [&str; 6] = ["Lisbon", "Osaka", "Toronto", "Nairobi", "Oslo", "Santiago"];
const SMALL_TALK: [&str; 8] = [
    "I spent most of the morning thinking about {topic}, and I still have not decided what to do first.",
    "Could you give me a couple of ideas about {topic}? Nothing fancy, just something to get started.",
    "A friend told me that {topic} takes more patience than people expect, which sounds about right.",
    "I read an article about {topic} yesterday; it made a few good points about planning ahead.",
    "Honestly, {topic} is the thing I look forward to most this month.",
    "My neighbour keeps asking about {topic}, so I want to have a clear answer ready.",
    "Let us keep {topic} simple: one step at a time, and no rush.",
    "I wrote down three questions about {topic} but lost the note somewhere.",
];
const REPLIES: [&str; 6] = [
    "That sounds reasonable. Start small with {topic}, see what works, and adjust as you go.",
    "Good question. For {topic}, a short checklist usually helps more than a long plan.",
    "Understood. I will keep that in mind when we talk about {topic} again.",
    "Noted. If {topic} gets complicated, we can break it into smaller pieces.",
    "Sure. Many people find {topic} easier once the first step is done.",
    "Thanks for the context. It helps to know how you think about {topic}.",
];

/// Builds one conversation (all randomness from `seed`).
pub fn conversation(seed: u64, length: usize, turns: u32, depth: f64) -> SweepConversation {
    let turns = turns.max(1);
    let mut rng = Rng::new(seed ^ (length as u64).rotate_left(17) ^ u64::from(turns).rotate_left(33) ^ depth.to_bits());
    let planted = ((depth.clamp(0.0, 1.0) * f64::from(turns - 1)).round()) as u32;
    let per_turn = (length * CHARS_PER_TOKEN / turns as usize).max(80);

    // Facts and their statements, by turn.
    let name = format!("{} {}", rng.pick(&FIRST), rng.pick(&SURNAME));
    let number = format!("{}", 1000 + rng.below(9000));
    let code = format!("{}{}-{}", (b'A' + rng.below(26) as u8) as char, (b'A' + rng.below(26) as u8) as char, 100 + rng.below(900));
    let mut statements: Vec<Vec<String>> = vec![Vec::new(); turns as usize];
    let at = |t: u32| t.min(turns - 1) as usize;
    statements[at(planted)].push(format!("Please remember this: my new manager is called {name}."));
    statements[at(planted)].push(format!("Also, my locker number at the gym is {number}."));
    statements[at(planted)].push(format!("And the door code for the storage room is {code}."));

    // A list that changes over the turns after it is stated.
    let mut pool: Vec<&str> = ITEMS.to_vec();
    let mut list: Vec<&str> = (0..3).map(|_| pool.remove(rng.below(pool.len()))).collect();
    statements[at(planted)].push(format!("My shopping list is: {}.", list.join(", ")));
    let mut removed = Vec::new();
    for (step, t) in (planted + 1..turns).enumerate().take(4) {
        if step % 2 == 0 {
            let item = pool.remove(rng.below(pool.len()));
            list.push(item);
            statements[at(t)].push(format!("Add {item} to my shopping list."));
        } else {
            let item = list.remove(rng.below(list.len()));
            removed.push(item);
            statements[at(t)].push(format!("Remove {item} from my shopping list."));
        }
    }

    // Tic-tac-toe: the user plays X, the assistant O, one move each per turn from the planted turn.
    let mut free: Vec<usize> = (0..9).collect();
    let mut board: [Option<char>; 9] = [None; 9];
    let mut moves: Vec<(u32, char, usize)> = Vec::new();
    let game_turns = (turns - planted).max(1);
    for m in 0..4 {
        let t = planted + (m as u32 * game_turns / 4).min(game_turns - 1);
        for mark in ['X', 'O'] {
            let square = free.remove(rng.below(free.len()));
            board[square] = Some(mark);
            moves.push((t, mark, square));
        }
    }
    let mut replies_moves: Vec<Vec<String>> = vec![Vec::new(); turns as usize];
    for (i, (t, mark, square)) in moves.iter().enumerate() {
        if *mark == 'X' {
            let opening = if i == 0 { "Let us play tic-tac-toe: I am X and you are O. " } else { "" };
            statements[at(*t)].push(format!("{opening}Tic-tac-toe: I put X in the {} square.", SQUARES[*square]));
        } else {
            replies_moves[at(*t)].push(format!("Tic-tac-toe: I put O in the {} square.", SQUARES[*square]));
        }
    }
    let asked = moves[rng.below(moves.len())];

    let mut messages = vec![json!({"role": "system", "content": "You are a helpful assistant. Keep track of what the user tells you."})];
    for t in 0..turns as usize {
        let topic = rng.pick(&TOPICS);
        let mut user = statements[t].join(" ");
        let mut reply = replies_moves[t].join(" ");
        let budget = per_turn.saturating_sub(user.len() + reply.len());
        let (user_fill, reply_fill) = filler(&mut rng, topic, budget);
        if !user.is_empty() {
            user.push(' ');
        }
        user.push_str(&user_fill);
        if !reply.is_empty() {
            reply.push(' ');
        }
        reply.push_str(&reply_fill);
        messages.push(json!({"role": "user", "content": user}));
        messages.push(json!({"role": "assistant", "content": reply}));
    }

    let words = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let probes = vec![
        Probe {
            fact: "name".into(),
            question: "What is my new manager called? Answer with the full name only.".into(),
            expected: words(&name),
            absent: Vec::new(),
            planted_turn: planted,
        },
        Probe {
            fact: "number".into(),
            question: "What is my locker number at the gym? Answer with the number only.".into(),
            expected: vec![number],
            absent: Vec::new(),
            planted_turn: planted,
        },
        Probe {
            fact: "code".into(),
            question: "What is the door code for the storage room? Answer with the code only.".into(),
            expected: vec![code],
            absent: Vec::new(),
            planted_turn: planted,
        },
        Probe {
            fact: "list".into(),
            question: "What is on my shopping list now? List the items only.".into(),
            expected: list.iter().map(|s| s.to_string()).collect(),
            absent: removed.iter().map(|s| s.to_string()).collect(),
            planted_turn: planted,
        },
        Probe {
            fact: "game".into(),
            question: format!("In our tic-tac-toe game, which mark is in the {} square? Answer X or O only.", SQUARES[asked.2]),
            expected: vec![asked.1.to_string()],
            absent: vec![if asked.1 == 'X' { "O" } else { "X" }.to_string()],
            planted_turn: planted,
        },
    ];
    SweepConversation { length, turns, depth, seed, messages, probes }
}

/// Filler of about `budget` characters for one user message and its reply: small talk, a tool
/// result, or a piece of code, chosen by the generator.
fn filler(rng: &mut Rng, topic: &str, budget: usize) -> (String, String) {
    let (mut user, mut reply) = (String::new(), String::new());
    while user.len() + reply.len() + 120 < budget {
        match rng.below(4) {
            0 | 1 => {
                user.push_str(&rng.pick(&SMALL_TALK).replace("{topic}", topic));
                user.push(' ');
                reply.push_str(&rng.pick(&REPLIES).replace("{topic}", topic));
                reply.push(' ');
            }
            2 => {
                let city = rng.pick(&CITIES);
                user.push_str(&format!("What is the weather in {city}? "));
                reply.push_str(&format!(
                    "The weather tool returned: {{\"city\": \"{city}\", \"temp_c\": {}, \"humidity\": {}, \"wind_kmh\": {}, \"sky\": \"{}\"}}. ",
                    rng.below(35),
                    20 + rng.below(70),
                    rng.below(40),
                    rng.pick(&["clear", "cloudy", "rain", "fog"])
                ));
            }
            _ => {
                let n = 2 + rng.below(8);
                user.push_str("Can you show me a small Python function? ");
                reply.push_str(&format!(
                    "Here it is:\n```python\ndef scale(values, factor={n}):\n    total = 0\n    for v in values:\n        total += v * factor\n    return total / max(len(values), 1)\n```\n"
                ));
            }
        }
    }
    (user.trim_end().to_string(), reply.trim_end().to_string())
}

/// Whether `answer` passes `probe`: every expected word present, no absent one (whole words,
/// case-insensitive; a code like `QX-731` counts as one word).
pub fn passes(probe: &Probe, answer: &str) -> bool {
    let words: Vec<String> = answer
        .split(|c: char| !(c.is_alphanumeric() || c == '-'))
        .map(|w| w.trim_matches('-').to_lowercase())
        .filter(|w| !w.is_empty())
        .collect();
    let has = |w: &String| words.contains(&w.to_lowercase());
    probe.expected.iter().all(has) && !probe.absent.iter().any(has)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_sized_and_every_fact_stated() {
        let a = conversation(7, 1024, 4, 0.0);
        assert_eq!(a, conversation(7, 1024, 4, 0.0));
        assert_ne!(a.messages, conversation(8, 1024, 4, 0.0).messages);
        let chars: usize = a.messages.iter().map(|m| m["content"].as_str().unwrap().len()).sum();
        assert!((1024 * CHARS_PER_TOKEN * 8 / 10..1024 * CHARS_PER_TOKEN * 13 / 10).contains(&chars), "{chars}");
        assert_eq!(a.messages.len(), 1 + 2 * 4);
        let text: String = a.messages.iter().map(|m| m["content"].as_str().unwrap()).collect::<Vec<_>>().join("\n");
        for probe in &a.probes {
            for word in &probe.expected {
                assert!(text.contains(word.as_str()), "{} not stated: {word}", probe.fact);
            }
        }
        let late = conversation(7, 1024, 4, 1.0);
        assert_eq!(late.probes[0].planted_turn, 3);
    }

    #[test]
    fn answers_are_checked_by_whole_words() {
        let probe = Probe {
            fact: "code".into(),
            question: String::new(),
            expected: vec!["QX-731".into()],
            absent: vec!["soap".into()],
            planted_turn: 0,
        };
        assert!(passes(&probe, "The code is qx-731."));
        assert!(!passes(&probe, "The code is QX-7310."));
        assert!(!passes(&probe, "QX-731 and soap"));
    }
}
