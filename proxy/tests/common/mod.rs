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

pub fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

pub fn assistant(text: &str) -> Value {
    json!({"role": "assistant", "content": text})
}

pub fn system() -> Value {
    json!({"role": "system", "content": "You are a helpful assistant."})
}
