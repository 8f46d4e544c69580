//! `POST /api/import`: the body is checked against its Content-Length before anything is read, then
//! streamed line by line into the store on the blocking pool through a small bounded channel, so
//! memory is bounded by the store's line limit (`MAX_IMPORT_LINE`, a longer line is a 413 as soon as
//! it passes the limit), not by the body.

use std::io::{BufReader, Read};
use std::sync::Arc;

use crate::admin::AdminBody;
use bytes::{Buf, Bytes};
use http::{header, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::json;

use crate::admin::{with_store, AdminState};
use crate::body::{json_error, ProxyBody};

/// Largest import body accepted.
pub const MAX_IMPORT_BYTES: u64 = 512 << 20;

/// Chunks in flight between the connection and the store.
const CHANNEL_CHUNKS: usize = 8;

pub async fn import(state: &Arc<AdminState>, request: Request<AdminBody>) -> Response<ProxyBody> {
    let announced = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if let Some(length) = announced.filter(|&l| l > MAX_IMPORT_BYTES) {
        let message = format!("import body of {length} bytes is over the limit of {MAX_IMPORT_BYTES}");
        return json_error(StatusCode::PAYLOAD_TOO_LARGE, "bad_import", &message, None);
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, String>>(CHANNEL_CHUNKS);
    let mut body = request.into_body();
    let feed = async move {
        let mut total = 0u64;
        while let Some(frame) = body.frame().await {
            let chunk = match frame {
                Ok(frame) => match frame.into_data() {
                    Ok(data) => Ok(data),
                    Err(_) => continue,
                },
                Err(e) => Err(format!("cannot read import body: {e}")),
            };
            total += chunk.as_ref().map_or(0, |c| c.len() as u64);
            let chunk = chunk.and_then(|c| match total > MAX_IMPORT_BYTES {
                true => Err(format!("import body over the limit of {MAX_IMPORT_BYTES} bytes")),
                false => Ok(c),
            });
            let over = total > MAX_IMPORT_BYTES;
            let stop = chunk.is_err();
            // The store side stopped (a bad line): nothing more to send.
            if tx.send(chunk).await.is_err() || stop {
                return over;
            }
        }
        false
    };
    let store = with_store(state, move |s| {
        let mut reader = BufReader::with_capacity(64 << 10, ChannelReader { rx, current: Bytes::new() });
        s.import_conversation(&mut reader).map(|id| json!({"conversation": id}).to_string())
    });
    let (over, response) = tokio::join!(feed, store);
    if over {
        let message = format!("import body over the limit of {MAX_IMPORT_BYTES} bytes");
        return json_error(StatusCode::PAYLOAD_TOO_LARGE, "bad_import", &message, None);
    }
    response
}

/// Reads the chunks the connection sends (on a blocking thread).
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, String>>,
    current: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(message)) => return Err(std::io::Error::other(message)),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current.advance(n);
        Ok(n)
    }
}
