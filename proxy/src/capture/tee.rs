//! Body wrappers that forward every frame as it arrives and keep a reference-counted copy for capture:
//! nothing is buffered before forwarding, so an SSE chunk reaches the client as soon as it exists.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use super::exchange::{Captured, ExchangeGuard, Outcome};
use crate::body::ProxyBody;

/// The request body on its way upstream.
pub struct RequestTee {
    inner: ProxyBody,
    copy: Arc<Mutex<Captured>>,
    limit: usize,
}

impl RequestTee {
    pub fn new(inner: ProxyBody, copy: Arc<Mutex<Captured>>, limit: usize) -> RequestTee {
        RequestTee { inner, copy, limit }
    }
}

impl Body for RequestTee {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if let Ok(mut copy) = this.copy.lock() {
                        copy.push(data, this.limit);
                    }
                }
            }
            Poll::Ready(None) => {
                if let Ok(mut copy) = this.copy.lock() {
                    copy.complete = true;
                }
            }
            _ => {}
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

/// The response body on its way to the client; owns the exchange and finishes it at the end.
pub struct ResponseTee {
    inner: ProxyBody,
    guard: ExchangeGuard,
}

impl ResponseTee {
    pub fn new(inner: ProxyBody, guard: ExchangeGuard) -> ResponseTee {
        ResponseTee { inner, guard }
    }
}

impl Body for ResponseTee {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.guard.frame(data);
                }
                if this.inner.is_end_stream() {
                    this.guard.finish(Outcome::Complete);
                }
            }
            Poll::Ready(Some(Err(error))) => this.guard.finish(Outcome::UpstreamStreamError(error.to_string())),
            Poll::Ready(None) => this.guard.finish(Outcome::Complete),
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

impl Drop for ResponseTee {
    fn drop(&mut self) {
        // A body hyper never had to poll to its end (empty, or length-delimited and done) still completed.
        if self.inner.is_end_stream() {
            self.guard.finish(Outcome::Complete);
        }
    }
}
