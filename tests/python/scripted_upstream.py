#!/usr/bin/env python3
"""A scripted, deterministic OpenAI-compatible upstream for end-to-end tests (standard library only).

    python3 scripted_upstream.py [PORT] [--require-key KEY]

Binds 127.0.0.1:PORT (0, the default, picks a free port) and prints the bound port as the first line
of stdout. Serves HTTP/1.1 with keep-alive:

* ``POST /v1/chat/completions``: replies "You said: <text of the last user message>". Non-streaming
  replies are one JSON body with ``usage``; streaming replies (``"stream": true``) are server-sent
  events in chunked transfer-encoding, flushed one event at a time: a role chunk, one chunk per word,
  a finish chunk, a usage chunk (``choices: []``) only when ``stream_options.include_usage`` is true,
  then ``data: [DONE]``. When the request has ``tools`` and the last user message mentions "weather",
  the reply is a ``get_weather`` tool call instead (streamed as fragments: index/id/name first, the
  arguments over several chunks).
* ``GET /v1/models``: a one-model list.

Everything in a reply is a function of the request body (ids included), so the same request sent
directly and through a proxy gets the same bytes back. ``prompt_tokens`` is ``len(body) // 4``;
``cached_tokens`` is half of it once the conversation has more than one message.

With ``--require-key KEY`` any request without ``Authorization: Bearer KEY`` gets a 401.
"""

import argparse
import hashlib
import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "scripted-model"
CREATED = 1_700_000_000


def last_user_text(messages):
    for message in reversed(messages or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return ""
    return ""


def words(text):
    """Pieces that concatenate back to `text` exactly, one per word (trailing whitespace attached)."""
    return [w for w in re.findall(r"\S*\s*", text) if w]


def weather_arguments(text):
    match = re.search(r"weather in ([A-Z][\w'-]*(?: [A-Z][\w'-]*)*)", text)  # capitalised words: "New York"
    location = match.group(1) if match else "Paris"
    return json.dumps({"location": location, "unit": "celsius"})


def fragments(text, n=4):
    size = max(1, -(-len(text) // n))
    return [text[i : i + size] for i in range(0, len(text), size)]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "scripted-upstream/1"
    require_key = None

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass

    # -- plumbing -------------------------------------------------------------------------------

    def read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def send_json(self, status, value):
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Upstream-Id", "scripted")
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def send_events(self, events):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Upstream-Id", "scripted")
        self.end_headers()
        self.wfile.flush()
        for event in events:
            payload = event if isinstance(event, str) else json.dumps(event)
            data = f"data: {payload}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def authorized(self):
        if self.require_key is None:
            return True
        if self.headers.get("Authorization") == f"Bearer {self.require_key}":
            return True
        self.send_json(401, {"error": {"message": "missing or wrong API key", "type": "invalid_request_error", "code": 401}})
        return False

    # -- routes ---------------------------------------------------------------------------------

    def do_GET(self):
        if not self.authorized():
            return
        if self.path.split("?")[0] == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "created": CREATED, "owned_by": "ctxscope-tests"}]})
        else:
            self.send_json(404, {"error": {"message": f"no route GET {self.path}", "code": 404}})

    def do_POST(self):
        body = self.read_body()
        if not self.authorized():
            return
        if self.path.split("?")[0] != "/v1/chat/completions":
            self.send_json(404, {"error": {"message": f"no route POST {self.path}", "code": 404}})
            return
        try:
            request = json.loads(body)
            assert isinstance(request, dict)
        except (ValueError, AssertionError):
            self.send_json(400, {"error": {"message": "invalid JSON body", "code": 400}})
            return
        self.chat(request, body)

    def chat(self, request, body):
        messages = request.get("messages") or []
        text = last_user_text(messages)
        digest = hashlib.sha256(body).hexdigest()
        cid = "chatcmpl-" + digest[:24]
        model = request.get("model") or MODEL
        prompt_tokens = len(body) // 4
        cached_tokens = prompt_tokens // 2 if len(messages) > 1 else 0
        tool_call = bool(request.get("tools")) and "weather" in text.lower()
        if tool_call:
            call_id = "call_" + digest[24:40]
            arguments = weather_arguments(text)
            pieces = fragments(arguments)
            completion_tokens = len(pieces) + 1
            finish = "tool_calls"
        else:
            reply = f"You said: {text}"
            pieces = words(reply)
            completion_tokens = len(pieces)
            finish = "stop"
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
        }

        if not request.get("stream"):
            if tool_call:
                message = {"role": "assistant", "content": None, "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]}
            else:
                message = {"role": "assistant", "content": reply}
            self.send_json(200, {"id": cid, "object": "chat.completion", "created": CREATED, "model": model,
                                 "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
                                 "usage": usage})
            return

        def chunk(delta, finish_reason=None):
            return {"id": cid, "object": "chat.completion.chunk", "created": CREATED, "model": model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}

        if tool_call:
            events = [chunk({"role": "assistant", "content": None, "tool_calls": [
                {"index": 0, "id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": ""}}]})]
            events += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}) for p in pieces]
        else:
            events = [chunk({"role": "assistant", "content": ""})]
            events += [chunk({"content": p}) for p in pieces]
        events.append(chunk({}, finish))
        if (request.get("stream_options") or {}).get("include_usage") is True:
            events.append({"id": cid, "object": "chat.completion.chunk", "created": CREATED, "model": model,
                           "choices": [], "usage": usage})
        events.append("[DONE]")
        self.send_events(events)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("port", nargs="?", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--require-key")
    args = parser.parse_args(argv)
    Handler.require_key = args.require_key
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
