//! Turns the scheduler's events for one request into what a response needs: text deltas that never
//! split a UTF-8 character and never contain (part of) a stop string, the log-probabilities of the
//! tokens whose text has been released, the finish reason and the usage counts.

use crate::model::Model;
use crate::scheduler::{Event, Finish};

use super::detok::Utf8Decoder;
use super::stop::StopMatcher;

/// Why a choice ended, as OpenAI spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Token counts for `usage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

/// One generated token with its log-probability and alternatives, and where its text sits in the
/// reply (in characters).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub piece: Vec<u8>,
    pub logprob: f32,
    pub top: Vec<(Vec<u8>, f32)>,
    pub text_offset: usize,
    text_end: usize,
}

/// What an event produced.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// The sequence was admitted.
    Started,
    /// Text (possibly empty) and the log-probabilities of tokens now fully released.
    Delta { text: String, logprobs: Vec<TokenLogprob> },
    /// The choice is over; no more output follows.
    Finished(FinishReason),
    /// The engine gave up on the request.
    Failed(String),
}

/// The per-request translation state.
pub struct Generation {
    decoder: Utf8Decoder,
    stops: StopMatcher,
    logprobs: bool,
    pending: Vec<TokenLogprob>,
    decoded_chars: usize,
    released_chars: usize,
    pub usage: Usage,
    pub finish: Option<FinishReason>,
}

impl Generation {
    pub fn new(stops: Vec<String>, logprobs: bool) -> Generation {
        Generation {
            decoder: Utf8Decoder::default(),
            stops: StopMatcher::new(stops),
            logprobs,
            pending: Vec::new(),
            decoded_chars: 0,
            released_chars: 0,
            usage: Usage::default(),
            finish: None,
        }
    }

    /// True once the choice is over (the caller should drop the event receiver, which cancels the
    /// sequence if a stop string ended it early).
    pub fn is_finished(&self) -> bool {
        self.finish.is_some()
    }

    /// Handles one scheduler event.
    pub fn on_event(&mut self, model: &Model, event: Event) -> Vec<Output> {
        if self.finish.is_some() {
            return Vec::new();
        }
        match event {
            Event::Started { prompt_tokens, cached_tokens } => {
                self.usage.prompt_tokens = prompt_tokens;
                self.usage.cached_tokens = cached_tokens;
                vec![Output::Started]
            }
            Event::Token(sampled) => {
                self.usage.completion_tokens += 1;
                let piece = model.tokenizer.token_to_piece(sampled.token).unwrap_or_default();
                let text = self.decoder.push(&piece);
                if self.logprobs {
                    let start = self.decoded_chars;
                    let top = sampled.top.iter().map(|(id, lp)| (model.tokenizer.token_to_piece(*id).unwrap_or_default(), *lp)).collect();
                    let end = start + text.chars().count();
                    self.pending.push(TokenLogprob { piece, logprob: sampled.logprob, top, text_offset: start, text_end: end });
                }
                self.decoded_chars += text.chars().count();
                self.release(&text, None)
            }
            Event::Done { finish, completion_tokens } => {
                self.usage.completion_tokens = completion_tokens;
                let tail = self.decoder.finish();
                let reason = match finish {
                    Finish::Stop => FinishReason::Stop,
                    Finish::Length => FinishReason::Length,
                };
                self.release(&tail, Some(reason))
            }
            Event::Error(message) => {
                self.finish = Some(FinishReason::Stop);
                vec![Output::Failed(message)]
            }
        }
    }

    /// The engine went away without finishing.
    pub fn on_closed(&mut self) -> Vec<Output> {
        if self.finish.is_some() {
            return Vec::new();
        }
        self.finish = Some(FinishReason::Stop);
        vec![Output::Failed("the engine stopped before the reply was complete".into())]
    }

    /// Passes new text through the stop matcher; `end` is the engine's finish when the text is the last.
    fn release(&mut self, text: &str, end: Option<FinishReason>) -> Vec<Output> {
        let scan = self.stops.push(text);
        let mut out_text = scan.text;
        let reason = if scan.stopped {
            Some(FinishReason::Stop)
        } else if let Some(reason) = end {
            out_text.push_str(&self.stops.finish());
            Some(reason)
        } else {
            None
        };
        self.released_chars += out_text.chars().count();
        let logprobs = match reason {
            // Every token that contributed released text, none that lie wholly in a stop string.
            Some(_) if scan.stopped => {
                let released = self.released_chars;
                let mut all = std::mem::take(&mut self.pending);
                all.retain(|t| t.text_offset < released);
                all
            }
            Some(_) => std::mem::take(&mut self.pending),
            None => {
                let released = self.released_chars;
                let ready = self.pending.iter().take_while(|t| t.text_end <= released).count();
                self.pending.drain(..ready).collect()
            }
        };
        let mut outputs = Vec::new();
        if !out_text.is_empty() || !logprobs.is_empty() {
            outputs.push(Output::Delta { text: out_text, logprobs });
        }
        if let Some(reason) = reason {
            self.finish = Some(reason);
            outputs.push(Output::Finished(reason));
        }
        outputs
    }
}
