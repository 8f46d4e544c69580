//! A body wrapper that forwards every frame as it arrives and shows it to an observer that keeps a
//! reference-counted copy for capture: nothing is buffered before forwarding, so an SSE chunk reaches
//! the client as soon as it exists. Two observers: the request copy and the response's exchange.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use super::exchange::{Captured, Outcome};
use super::guard::ExchangeGuard;
use crate::body::{BodyError, ProxyBody};

/// What a tee tells its observer.
pub trait Observer: Send + Unpin {
    fn frame(&mut self, data: &Bytes);
    /// The body reached its end (also called when it is dropped already at its end).
    fn end(&mut self);
    fn error(&mut self, error: &BodyError);
}

/// Forwards `inner` unchanged while `observer` watches.
pub struct Tee<O: Observer> {
    inner: ProxyBody,
    observer: O,
}

impl<O: Observer> Tee<O> {
    pub fn new(inner: ProxyBody, observer: O) -> Tee<O> {
        Tee { inner, observer }
    }
}

impl<O: Observer> Body for Tee<O> {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.observer.frame(data);
                }
                if this.inner.is_end_stream() {
                    this.observer.end();
                }
            }
            Poll::Ready(Some(Err(error))) => this.observer.error(error),
            Poll::Ready(None) => this.observer.end(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<O: Observer> Drop for Tee<O> {
    fn drop(&mut self) {
        // A body hyper never had to poll to its end (empty, or length-delimited and done) still completed.
        if self.inner.is_end_stream() {
            self.observer.end();
        }
    }
}

/// The request body's copy, shared with the exchange.
pub struct RequestCopy {
    pub copy: Arc<Mutex<Captured>>,
    pub limit: usize,
}

impl Observer for RequestCopy {
    fn frame(&mut self, data: &Bytes) {
        if let Ok(mut copy) = self.copy.lock() {
            copy.push(data, self.limit);
        }
    }

    fn end(&mut self) {
        if let Ok(mut copy) = self.copy.lock() {
            copy.complete = true;
        }
    }

    fn error(&mut self, _error: &BodyError) {}
}

/// The response side owns the exchange and finishes it when the body ends, fails or is dropped.
impl Observer for ExchangeGuard {
    fn frame(&mut self, data: &Bytes) {
        ExchangeGuard::frame(self, data);
    }

    fn end(&mut self) {
        self.finish(Outcome::Complete);
    }

    fn error(&mut self, error: &BodyError) {
        self.finish(Outcome::UpstreamStreamError(error.to_string()));
    }
}
