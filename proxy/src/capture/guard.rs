//! The hand-off from the request path to the capture queue: a guard owns an exchange in flight,
//! records its response frames, and sends it to the queue exactly once, when it ends or is dropped.

use bytes::Bytes;

use super::exchange::{Exchange, Outcome};
use super::queue::CaptureSender;

/// Owns an exchange in flight; sends it to the capture queue once, on [`finish`] or on drop.
pub struct ExchangeGuard {
    exchange: Option<Exchange>,
    sender: CaptureSender,
    pub limit: usize,
}

impl ExchangeGuard {
    pub fn new(exchange: Exchange, sender: CaptureSender, limit: usize) -> ExchangeGuard {
        ExchangeGuard { exchange: Some(exchange), sender, limit }
    }

    pub fn get(&mut self) -> Option<&mut Exchange> {
        self.exchange.as_mut()
    }

    /// Records a response body frame.
    pub fn frame(&mut self, data: &Bytes) {
        let limit = self.limit;
        if let Some(ex) = self.exchange.as_mut() {
            if ex.ttfb_us.is_none() {
                ex.ttfb_us = Some(ex.started.elapsed().as_micros() as u64);
            }
            ex.frames += 1;
            ex.response.push(data, limit);
        }
    }

    /// Ends the exchange with `outcome` and hands it to the pipeline.
    pub fn finish(&mut self, outcome: Outcome) {
        if let Some(mut ex) = self.exchange.take() {
            ex.total_us = ex.started.elapsed().as_micros() as u64;
            if outcome == Outcome::Complete {
                ex.response.complete = true;
            }
            if ex.outcome == Outcome::Complete {
                ex.outcome = outcome;
            }
            self.sender.send(ex);
        }
    }
}

impl Drop for ExchangeGuard {
    fn drop(&mut self) {
        self.finish(Outcome::ClientGone);
    }
}
