//! Re-framing of the chat path's OpenAI SSE stream into another wire format (Ollama's NDJSON lines,
//! Responses events): the SSE parsing and the body plumbing live here once, each format only says
//! what a chat chunk becomes. Dropping the body drops the chat body, which cancels the sequence.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::Frame;
use serde_json::Value;

use super::body::Body;

/// What a wire format makes of the chat stream.
pub trait Translate: Send + Unpin + 'static {
    /// One `data:` payload of the chat stream, parsed (`[DONE]` is [`Translate::done`]).
    fn chunk(&mut self, chunk: Value, out: &mut VecDeque<Bytes>);
    /// The chat stream is over, once: `clean` when it said `data: [DONE]`, false when it ended
    /// without (the engine went away).
    fn done(&mut self, clean: bool, out: &mut VecDeque<Bytes>);
}

/// The chat SSE body, re-framed by `T`.
pub struct Reframed<T> {
    inner: Body,
    buffer: Vec<u8>,
    queue: VecDeque<Bytes>,
    translate: T,
    done: bool,
}

impl<T: Translate> Reframed<T> {
    pub fn new(inner: Body, translate: T) -> Reframed<T> {
        Reframed { inner, buffer: Vec::new(), queue: VecDeque::new(), translate, done: false }
    }

    /// Handles every complete SSE event in the buffer.
    fn drain(&mut self) {
        while let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.buffer.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
                if self.done {
                    continue;
                }
                if data == "[DONE]" {
                    self.done = true;
                    self.translate.done(true, &mut self.queue);
                } else if let Ok(chunk) = serde_json::from_str::<Value>(data) {
                    self.translate.chunk(chunk, &mut self.queue);
                }
            }
        }
    }
}

impl<T: Translate> hyper::body::Body for Reframed<T> {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        loop {
            if let Some(bytes) = self.queue.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
            if self.done && self.inner.is_end_stream() {
                return Poll::Ready(None);
            }
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                        self.drain();
                    }
                }
                Poll::Ready(Some(Err(never))) => match never {},
                Poll::Ready(None) => {
                    self.buffer.extend_from_slice(b"\n\n");
                    self.drain();
                    if !self.done {
                        let this = &mut *self;
                        this.done = true;
                        this.translate.done(false, &mut this.queue);
                    }
                    return match self.queue.pop_front() {
                        Some(bytes) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
                        None => Poll::Ready(None),
                    };
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.queue.is_empty() && self.inner.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// Echoes each chunk's `n` and says how the stream ended.
    struct Echo;

    impl Translate for Echo {
        fn chunk(&mut self, chunk: Value, out: &mut VecDeque<Bytes>) {
            out.push_back(Bytes::from(format!("{}\n", chunk["n"])));
        }
        fn done(&mut self, clean: bool, out: &mut VecDeque<Bytes>) {
            out.push_back(Bytes::from(if clean { "done\n" } else { "cut\n" }));
        }
    }

    async fn run(sse: &'static str) -> String {
        let inner = super::super::body::full(sse);
        let bytes = Reframed::new(inner, Echo).collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn chunks_then_done_once_whether_or_not_the_stream_says_so() {
        assert_eq!(run("data: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: [DONE]\n\n").await, "1\n2\ndone\n");
        assert_eq!(run("data: {\"n\":1}\n\ndata: [DONE]\n\ndata: {\"n\":3}\n\n").await, "1\ndone\n", "nothing after [DONE]");
        assert_eq!(run("data: {\"n\":1}\n\ndata: {\"n\":2}").await, "1\n2\ncut\n", "an unterminated last event still counts");
        assert_eq!(run("data: not json\n\n").await, "cut\n");
    }
}
