//! Synthetic exchanges for pipeline tests: a request and a response as the tee would have captured them.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use ctxscope_proxy::capture::exchange::{Captured, Exchange};
use ctxscope_store::Endpoint;
use serde_json::{json, Value};

pub fn captured(bytes: Vec<u8>) -> Captured {
    let mut c = Captured::default();
    c.push(&Bytes::from(bytes), usize::MAX);
    c.complete = true;
    c
}

pub fn exchange(request: Value, response: Value, name: Option<&str>) -> Exchange {
    let body = Arc::new(Mutex::new(captured(serde_json::to_vec(&request).unwrap())));
    let mut ex = Exchange::new(Endpoint::ChatCompletions, "POST", "/v1/chat/completions", body);
    ex.time_unix_ms = 1;
    ex.conversation_name = name.map(str::to_string);
    ex.status = Some(200);
    ex.response_content_type = Some("application/json".into());
    ex.response = captured(serde_json::to_vec(&response).unwrap());
    ex.headers_us = Some(10);
    ex.ttfb_us = Some(20);
    ex.total_us = 30;
    ex.frames = 1;
    ex
}

/// A non-streamed `/v1/responses` exchange.
pub fn responses_exchange(request: Value, response: Value) -> Exchange {
    let body = Arc::new(Mutex::new(captured(serde_json::to_vec(&request).unwrap())));
    let mut ex = Exchange::new(Endpoint::Responses, "POST", "/v1/responses", body);
    ex.status = Some(200);
    ex.response_content_type = Some("application/json".into());
    ex.response = captured(serde_json::to_vec(&response).unwrap());
    ex.frames = 1;
    ex
}

pub fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

pub fn assistant(text: &str) -> Value {
    json!({"role": "assistant", "content": text})
}

pub fn system() -> Value {
    json!({"role": "system", "content": "You are a helpful assistant."})
}

/// A capture pipeline over a real sled store in a temporary folder, fed synthetic exchanges one
/// second apart.
pub struct Capture {
    _dir: tempfile::TempDir,
    pub store: ctxscope_store::Store,
    pub pipeline: ctxscope_proxy::capture::pipeline::Pipeline,
    clock: u64,
}

impl Capture {
    /// A pipeline without a tokenizer in front of `upstream`.
    pub fn new(upstream: &str) -> Capture {
        let dir = tempfile::tempdir().unwrap();
        let store = ctxscope_store::Store::open(dir.path(), &ctxscope_store::StoreOptions::default()).unwrap();
        let retention = ctxscope_store::RetentionPolicy::default();
        let pipeline = ctxscope_proxy::capture::pipeline::Pipeline::new(store.clone(), upstream.into(), None, retention);
        Capture { _dir: dir, store, pipeline, clock: 1_000 }
    }

    /// Captures one chat exchange, a second after the previous one.
    pub fn send(&mut self, request: Value, response: Value) -> ctxscope_store::TurnRecord {
        let mut ex = exchange(request, response, None);
        self.clock += 1_000;
        ex.time_unix_ms = self.clock;
        self.pipeline.capture(&ex).expect("captured")
    }

    pub fn findings(&self) -> Vec<ctxscope_store::FindingRecord> {
        self.store.findings(&ctxscope_store::FindingFilter::default()).unwrap()
    }
}
