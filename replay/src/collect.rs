//! Turning finished requests into [`TurnResult`]s: compared with the capture at once, and with the
//! golden target's reply to the same turn as soon as that is in (a result waits for golden's; what
//! still waits when the run ends is released without the comparison).

use std::collections::HashMap;

use crate::compare::{divergence, text_match};
use crate::conversation::Conversation;
use crate::model::{Outcome, ProbeResult, TurnResult};

/// One finished (target, turn): target 0 is golden.
#[derive(Debug, Clone)]
pub(crate) struct Unit {
    pub target: usize,
    pub turn: u32,
    pub outcome: Outcome,
    pub probes: Vec<ProbeResult>,
}

pub(crate) struct Collector {
    names: Vec<String>,
    captured: HashMap<u32, String>,
    near_tie: f64,
    golden: HashMap<u32, Outcome>,
    waiting: Vec<Unit>,
    ready: Vec<TurnResult>,
    /// Results handed out so far.
    pub done: usize,
}

impl Collector {
    /// `names[0]` is the golden target.
    pub fn new(conversation: &Conversation, names: Vec<String>, near_tie: f64) -> Collector {
        let captured = conversation.turns.iter().filter_map(|t| Some((t.turn, t.captured_text.clone()?))).collect();
        Collector { names, captured, near_tie, golden: HashMap::new(), waiting: Vec::new(), ready: Vec::new(), done: 0 }
    }

    pub fn add(&mut self, unit: Unit) {
        if unit.target != 0 {
            if self.golden.contains_key(&unit.turn) {
                let result = self.finish(unit);
                self.ready.push(result);
            } else {
                self.waiting.push(unit);
            }
            return;
        }
        let turn = unit.turn;
        self.golden.insert(turn, unit.outcome.clone());
        let result = self.finish(unit);
        self.ready.push(result);
        let (released, waiting): (Vec<Unit>, Vec<Unit>) = std::mem::take(&mut self.waiting).into_iter().partition(|u| u.turn == turn);
        self.waiting = waiting;
        for unit in released {
            let result = self.finish(unit);
            self.ready.push(result);
        }
    }

    /// Releases everything still waiting for a golden reply that will not come.
    pub fn flush(&mut self) {
        for unit in std::mem::take(&mut self.waiting) {
            let result = self.finish(unit);
            self.ready.push(result);
        }
    }

    pub fn take_ready(&mut self) -> Vec<TurnResult> {
        std::mem::take(&mut self.ready)
    }

    fn finish(&self, unit: Unit) -> TurnResult {
        let golden = self.golden.get(&unit.turn).filter(|_| unit.target != 0);
        let vs_golden = match (golden, &unit.outcome) {
            (Some(Outcome::Ok(reference)), Outcome::Ok(reply)) => Some(divergence(reference, reply, self.near_tie)),
            _ => None,
        };
        let vs_captured = match (self.captured.get(&unit.turn), &unit.outcome) {
            (Some(captured), Outcome::Ok(reply)) => Some(text_match(captured, &reply.text)),
            _ => None,
        };
        TurnResult {
            turn: unit.turn,
            target: self.names.get(unit.target).cloned().unwrap_or_default(),
            outcome: unit.outcome,
            vs_golden,
            vs_captured,
            probes: unit.probes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::tests::detail;
    use crate::model::Reply;

    fn ok(text: &str) -> Outcome {
        Outcome::Ok(Reply {
            text: text.into(),
            tokens: Vec::new(),
            prompt_tokens: None,
            cached_tokens: None,
            completion_tokens: None,
            finish_reason: None,
            wall_ms: 0.0,
        })
    }

    fn unit(target: usize, turn: u32, outcome: Outcome) -> Unit {
        Unit { target, turn, outcome, probes: Vec::new() }
    }

    fn collector() -> Collector {
        Collector::new(&Conversation::from_detail(&detail(2)), vec!["golden".into(), "other".into()], 0.5)
    }

    #[test]
    fn a_result_waits_for_golden_then_compares() {
        let mut c = collector();
        c.add(unit(1, 0, ok("a b")));
        assert!(c.take_ready().is_empty());
        c.add(unit(0, 0, ok("a c")));
        let ready = c.take_ready();
        assert_eq!(ready.iter().map(|r| r.target.as_str()).collect::<Vec<_>>(), ["golden", "other"]);
        assert_eq!(ready[0].vs_golden, None);
        assert_eq!(ready[1].vs_golden.as_ref().map(|d| d.agreement), Some(0.5));
        assert_eq!(ready[1].vs_captured.as_ref().map(|m| m.captured_chars), Some("captured 0".len()));
    }

    #[test]
    fn failures_and_missing_golden_give_no_comparison() {
        let mut c = collector();
        c.add(unit(0, 1, Outcome::Failed { error: "x".into(), status: Some(400) }));
        c.add(unit(1, 1, ok("a")));
        c.add(unit(1, 0, ok("a")));
        let ready = c.take_ready();
        assert_eq!(ready.len(), 2);
        assert!(ready.iter().all(|r| r.vs_golden.is_none()));
        assert!(ready[0].vs_captured.is_none(), "golden failed");
        c.flush();
        let flushed = c.take_ready();
        assert_eq!((flushed.len(), flushed[0].turn), (1, 0));
        assert!(flushed[0].vs_golden.is_none());
    }
}
