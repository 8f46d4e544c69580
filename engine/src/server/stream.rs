//! Server-sent events for `"stream": true`: a body that pulls the scheduler's events as hyper asks
//! for the next frame and turns them into OpenAI chunks, ending with the optional usage chunk and
//! `data: [DONE]`. Dropping the body (the client went away) drops the event receiver, which cancels
//! the sequence in the scheduler.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::Frame;
use tokio::sync::mpsc::UnboundedReceiver;

use super::error::ApiError;
use super::generation::{Generation, Output};
use super::response::Meta;
use super::state::InFlight;
use crate::model::Model;
use crate::scheduler::Event;

/// The SSE body of one streaming request.
pub struct SseBody {
    events: Option<UnboundedReceiver<Event>>,
    model: Arc<Model>,
    generation: Generation,
    meta: Meta,
    include_usage: bool,
    queue: VecDeque<Bytes>,
    _in_flight: InFlight,
}

impl SseBody {
    /// `first` holds what the events received before the response started produced.
    pub fn new(
        events: UnboundedReceiver<Event>,
        model: Arc<Model>,
        generation: Generation,
        meta: Meta,
        include_usage: bool,
        in_flight: InFlight,
        first: Vec<Output>,
    ) -> SseBody {
        let mut body =
            SseBody { events: Some(events), model, generation, meta, include_usage, queue: VecDeque::new(), _in_flight: in_flight };
        body.translate(first);
        body
    }

    fn push(&mut self, value: &serde_json::Value) {
        let mut line = Vec::with_capacity(256);
        line.extend_from_slice(b"data: ");
        line.extend(serde_json::to_vec(value).unwrap_or_default());
        line.extend_from_slice(b"\n\n");
        self.queue.push_back(Bytes::from(line));
    }

    fn translate(&mut self, outputs: Vec<Output>) {
        let usage = self.include_usage;
        for output in outputs {
            match output {
                Output::Started => {
                    if self.meta.endpoint == super::request::Endpoint::Chat {
                        let chunk = self.meta.chunk(Some(""), true, &[], None, usage);
                        self.push(&chunk);
                    }
                }
                Output::Delta { text, logprobs } => {
                    let chunk = self.meta.chunk(Some(&text), false, &logprobs, None, usage);
                    self.push(&chunk);
                }
                Output::Finished(reason) => {
                    let text = match self.meta.endpoint {
                        super::request::Endpoint::Chat => None,
                        super::request::Endpoint::Completion => Some(""),
                    };
                    let chunk = self.meta.chunk(text, false, &[], Some(reason), usage);
                    self.push(&chunk);
                    if usage {
                        let chunk = self.meta.usage_chunk(&self.generation.usage);
                        self.push(&chunk);
                    }
                    self.queue.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                }
                Output::Failed(message) => {
                    self.push(&ApiError::Engine(message).body());
                    self.queue.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                }
            }
        }
        if self.generation.is_finished() {
            // Ends (or, after a stop string, cancels) the sequence.
            self.events = None;
        }
    }
}

impl hyper::body::Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        loop {
            if let Some(bytes) = this.queue.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
            let Some(events) = this.events.as_mut() else { return Poll::Ready(None) };
            let outputs = match events.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(event)) => this.generation.on_event(&this.model, event),
                Poll::Ready(None) => this.generation.on_closed(),
            };
            this.translate(outputs);
        }
    }
}
