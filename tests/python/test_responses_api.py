"""The Responses API (`client.responses.create`) through the real `ctxscope proxy` binary.

In front of llama.cpp's `llama-server` (it serves /v1/responses, statelessly: it refuses
`previous_response_id` with a 400): streamed and whole responses and tool calls reach the client as
they do going direct, each is captured; with `--responses-state` a 10-response `previous_response_id`
chain works across a proxy restart, the upstream seeing stateless requests.

In front of a scripted double (in this file, deterministic, so bytes compare exactly): a stateful
double whose chains are captured, threaded and raise nothing, and a double that accepts
`previous_response_id` and ignores it, which must raise `engine_truncation`.

    cargo build && python3 -m pytest -q tests/python/test_responses_api.py
    LLAMA_SERVER=/path/to/llama-server CTXSCOPE_BIN=/path/to/ctxscope python3 -m pytest -q tests/python
"""

import hashlib
import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import openai
import pytest

from test_engine_openai import model_path
from test_openai_client import ADDR, ANSI, START_TIMEOUT_S, OutputTail, get_json, proxy_binary, stop_process

REPO_ROOT = Path(__file__).resolve().parents[2]
CAPTURE_TIMEOUT_S = 10.0

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


# -- processes --------------------------------------------------------------------------------------


def llama_server_binary():
    """$LLAMA_SERVER, else the build scripts/llama_cpp/install.sh made."""
    if os.environ.get("LLAMA_SERVER"):
        path = Path(os.environ["LLAMA_SERVER"])
    else:
        found = subprocess.run(["bash", str(REPO_ROOT / "scripts/llama_cpp/install.sh"), "--find"], capture_output=True, text=True)
        path = Path(found.stdout.strip()) / "llama-server"
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"llama-server not found at {path}: run scripts/llama_cpp/install.sh or set LLAMA_SERVER", pytrace=False)
    return path


class LlamaServer:
    def __init__(self):
        self.proc = subprocess.Popen(
            [str(llama_server_binary()), "-m", str(model_path()), "--port", "0", "--ctx-size", "4096", "-np", "1"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        self.log = OutputTail(self.proc.stderr, "llama-stderr")
        line = self.log.wait_for(lambda l: "listening on http://" in l, 60.0)
        if line is None:
            self.proc.kill()
            pytest.fail(f"llama-server did not start:\n{self.log.text()}")
        self.url = re.search(r"http://" + ADDR, line).group(0)
        deadline = time.monotonic() + 60.0
        while True:
            try:
                if get_json(f"{self.url}/health").get("status") == "ok":
                    return
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama-server never healthy:\n{self.log.text()}")
            time.sleep(0.1)

    def stop(self):
        stop_process(self.proc, "llama-server", self.log)


class Proxy:
    """The real `ctxscope proxy` on ports it picks itself; `restart` keeps the data directory."""

    def __init__(self, upstream_url, data, *extra):
        self.upstream_url, self.data, self.extra = upstream_url, data, extra
        self._start()

    def _start(self):
        env = dict(os.environ, CTXSCOPE_LOG="info", NO_COLOR="1")
        self.proc = subprocess.Popen(
            [str(proxy_binary()), "proxy", "--upstream", self.upstream_url, "--listen", "127.0.0.1:0",
             "--admin", "127.0.0.1:0", "--data", str(self.data), "--flush-ms", "50", *self.extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
        )
        self.log = OutputTail(self.proc.stderr, "proxy-stderr")
        line = self.log.wait_for(lambda l: "ctxscope proxy serving" in l, START_TIMEOUT_S)
        if line is None:
            self.proc.kill()
            pytest.fail(f"proxy did not start:\n{self.log.text()}")
        line = ANSI.sub("", line)
        listen, admin = re.search(r"\bproxy=\D*" + ADDR, line), re.search(r"\badmin=\D*" + ADDR, line)
        self.url, self.admin_url = f"http://{listen.group(1)}", f"http://{admin.group(1)}"

    def stop(self):
        status = stop_process(self.proc, "ctxscope proxy", self.log)
        assert status == 0, f"proxy exited with {status}:\n{self.log.text()}"

    def restart(self):
        self.stop()
        self._start()

    def wait_turns(self, turns, timeout=CAPTURE_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while True:
            listed = get_json(f"{self.admin_url}/api/conversations")
            if sum(c["turns"] for c in listed) >= turns:
                return listed
            if time.monotonic() > deadline:
                pytest.fail(f"expected {turns} captured turns, have {json.dumps(listed)}")
            time.sleep(0.05)

    def conversation(self, cid):
        return get_json(f"{self.admin_url}/api/conversations/{cid}")

    def findings(self):
        return get_json(f"{self.admin_url}/api/findings")


def client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="sk-none", max_retries=0, timeout=60.0)


def post_raw(base, body):
    """POST /v1/responses; (status, body bytes)."""
    request = urllib.request.Request(f"{base}/v1/responses", data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def normalize(raw):
    """llama.cpp's per-call parts: random ids, clock times, timings and how much its cache held."""
    text = raw.decode()
    text = re.sub(r'"(resp|msg|fc|rs)_[A-Za-z0-9]+"', r'"\1_"', text)
    text = re.sub(r'"call_id":"[^"]*"', '"call_id":""', text)
    text = re.sub(r'"(created_at|completed_at)":\d+', r'"\1":0', text)
    text = re.sub(r'"cached_tokens":\d+', '"cached_tokens":0', text)
    return re.sub(r'"timings":\{[^}]*\}', '"timings":{}', text)


def turns_of(proxy, cid):
    return proxy.conversation(cid)["turns"]


# -- the scripted double --------------------------------------------------------------------------


class Double:
    """A Responses API upstream. `stateful`: it keeps responses and answers previous_response_id;
    otherwise it accepts previous_response_id and ignores it (the fault). Input tokens are words."""

    def __init__(self, stateful):
        self.stateful, self.responses, self.requests = stateful, {}, []
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                double.requests.append(body)
                self.respond(body)

            def respond(self, body):
                words = lambda text: len(text.split())
                new = body["input"] if isinstance(body["input"], str) else " ".join(i.get("content", "") for i in body["input"] if isinstance(i.get("content"), str))
                previous = double.responses.get(body.get("previous_response_id")) if double.stateful else None
                context = (previous["context"] + " " if previous else "") + new
                reply = f"noted {words(new)} words"
                rid = "resp_" + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
                double.responses[rid] = {"context": context + " " + reply}
                response = {
                    "id": rid, "object": "response", "created_at": 1, "status": "completed", "model": "double",
                    "output": [{"type": "message", "id": "msg_" + rid[5:], "role": "assistant", "status": "completed",
                                "content": [{"type": "output_text", "text": reply, "annotations": []}]}],
                    "usage": {"input_tokens": words(context), "input_tokens_details": {"cached_tokens": 0},
                              "output_tokens": words(reply), "total_tokens": words(context) + words(reply)},
                }
                if body.get("stream"):
                    events = [("response.created", {"response": dict(response, status="in_progress", output=[])})]
                    events += [("response.output_text.delta", {"output_index": 0, "content_index": 0, "delta": piece})
                               for piece in re.findall(r"\S+\s*", reply)]
                    events.append(("response.completed", {"response": response}))
                    payload = "".join(f"event: {name}\ndata: {json.dumps(dict(type=name, **data))}\n\n" for name, data in events).encode()
                    content_type = "text/event-stream"
                else:
                    payload, content_type = json.dumps(response).encode(), "application/json"
                self.send_response(200)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama():
    server = LlamaServer()
    yield server
    server.stop()


@pytest.fixture
def proxy(llama, tmp_path):
    p = Proxy(llama.url, tmp_path / "data")
    yield p
    p.stop()


# -- llama.cpp ----------------------------------------------------------------------------------------


def test_whole_streamed_and_tool_responses_match_going_direct(llama, proxy):
    bodies = [
        {"model": "m", "instructions": "Answer in one word.", "input": "What is the capital of France?", "max_output_tokens": 8, "temperature": 0},
        {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "Count to three."}]}], "max_output_tokens": 8, "temperature": 0, "stream": True},
        {"model": "m", "input": "What is the weather in Paris?", "tools": [TOOL], "max_output_tokens": 16, "temperature": 0},
    ]
    for body in bodies:
        direct, through = post_raw(llama.url, body), post_raw(proxy.url, body)
        assert direct[0] == through[0] == 200
        assert normalize(through[1]) == normalize(direct[1])
    # The official client, streamed and not, sees the same text.
    for stream in (False, True):
        texts = []
        for base in (llama.url, proxy.url):
            kwargs = dict(model="m", input="Name a colour.", max_output_tokens=8, temperature=0)
            if stream:
                events = list(client(base).responses.create(stream=True, **kwargs))
                assert events[-1].type == "response.completed"
                texts.append("".join(e.delta for e in events if e.type == "response.output_text.delta"))
            else:
                texts.append(client(base).responses.create(**kwargs).output_text)
        assert texts[0] == texts[1] and texts[0]
    listed = proxy.wait_turns(5)
    turns = [t for c in listed for t in turns_of(proxy, c["id"])]
    assert all(t["endpoint"] == "responses" and t["status"] == 200 for t in turns)
    assert all(t["responses"]["response_id"].startswith("resp_") for t in turns)
    streamed = [t for t in turns if t["stream"]]
    assert len(streamed) == 2 and all(t["usage"]["prompt_tokens"] > 0 for t in turns)
    assert any(t["reply_text"] == texts[1] for t in streamed)


def test_without_the_flag_previous_response_id_reaches_llama_cpp_untouched(llama, proxy):
    first = client(proxy.url).responses.create(model="m", input="Hello.", max_output_tokens=4)
    body = {"model": "m", "input": "Again.", "previous_response_id": first.id, "max_output_tokens": 4}
    direct, through = post_raw(llama.url, body), post_raw(proxy.url, body)
    assert direct == through and direct[0] == 400, through
    listed = proxy.wait_turns(2)
    assert len(listed) == 1, "the refused request threads to its parent exactly"
    second = turns_of(proxy, listed[0]["id"])[1]
    assert second["responses"]["parent_turn"] == turns_of(proxy, listed[0]["id"])[0]["id"]
    assert "previous_response_id" in second["error"]


def test_responses_state_chains_ten_responses_across_a_restart(llama, tmp_path):
    proxy = Proxy(llama.url, tmp_path / "data", "--responses-state")
    try:
        c = client(proxy.url)
        previous, usages = None, []
        for i in range(10):
            if i == 5:
                proxy.restart()
                c = client(proxy.url)
            kwargs = dict(model="m", instructions="Be brief.", max_output_tokens=8, temperature=0,
                          input="The secret word is pineapple." if i == 0 else f"Say the number {i}.")
            if previous:
                kwargs["previous_response_id"] = previous
            if i % 2:
                events = list(c.responses.create(stream=True, **kwargs))
                response = events[-1].response
            else:
                response = c.responses.create(**kwargs)
            previous = response.id
            usages.append((response.usage.input_tokens, response.usage.output_tokens))
        # llama.cpp refuses previous_response_id, so each 200 was a stateless request, and its input
        # held the whole chain: more than the previous response's input and output together.
        for (before_in, before_out), (now_in, _) in zip(usages, usages[1:]):
            assert now_in > before_in + before_out - 1, usages
        listed = proxy.wait_turns(10)
        assert len(listed) == 1 and listed[0]["turns"] == 10, listed
        turns = turns_of(proxy, listed[0]["id"])
        assert [t["relation"]["kind"] for t in turns] == ["new"] + ["extend"] * 9
        assert turns[-1]["message_count"] == 1 + 10 + 9
        assert not proxy.findings(), proxy.findings()
        missing = post_raw(proxy.url, {"model": "m", "input": "x", "previous_response_id": "resp_unknown"})
        assert missing[0] == 404
        assert json.loads(missing[1])["error"]["code"] == "previous_response_not_found"
    finally:
        proxy.stop()


# -- the scripted double ----------------------------------------------------------------------------


def chain(base, n, stream_every=2):
    c, previous, ids = client(base), None, []
    for i in range(n):
        kwargs = dict(model="double", input=f"turn {i} adds these five words", **({"previous_response_id": previous} if previous else {}))
        if i % stream_every:
            response = list(c.responses.create(stream=True, **kwargs))[-1].response
        else:
            response = c.responses.create(**kwargs)
        previous = response.id
        ids.append(previous)
    return ids


def test_clean_chains_are_captured_threaded_and_silent(tmp_path):
    double = Double(stateful=True)
    proxy = Proxy(double.url, tmp_path / "data")
    try:
        for stream in (False, True):
            body = {"model": "double", "input": "hello there", "stream": stream}
            assert post_raw(proxy.url, body) == post_raw(double.url, body)
        ids = chain(proxy.url, 6)
        listed = proxy.wait_turns(8)
        conversation = next(c for c in listed if c["turns"] == 6)
        turns = turns_of(proxy, conversation["id"])
        assert [t["responses"]["response_id"] for t in turns] == ids
        looked_up = get_json(f"{proxy.admin_url}/api/responses/{ids[3]}")
        assert (looked_up["id"], looked_up["conversation"]) == (turns[3]["id"], conversation["id"])
        with pytest.raises(urllib.error.HTTPError) as missing:
            get_json(f"{proxy.admin_url}/api/responses/resp_never")
        assert missing.value.code == 404
        assert [t["relation"]["kind"] for t in turns] == ["new"] + ["extend"] * 5
        assert not proxy.findings()
    finally:
        proxy.stop()
        double.stop()


def test_an_upstream_that_ignores_previous_response_id_raises_engine_truncation(tmp_path):
    double = Double(stateful=False)
    proxy = Proxy(double.url, tmp_path / "data")
    try:
        chain(proxy.url, 3)
        proxy.wait_turns(3)
        deadline = time.monotonic() + CAPTURE_TIMEOUT_S
        while not (found := [f for f in proxy.findings() if f["kind"] == "engine_truncation"]):
            assert time.monotonic() < deadline, "no engine_truncation"
            time.sleep(0.05)
        evidence = found[0]["evidence"]
        assert evidence["method"] == "responses_chain_usage" and evidence["confidence"] == "high"
        assert found[0]["turn_index"] == 1
        assert evidence["engine_prompt_tokens"] < evidence["expected_at_least"]
        assert all("previous_response_id" in r for r in double.requests[1:]), "the proxy forwarded the requests as sent"
    finally:
        proxy.stop()
        double.stop()


# -- this engine ------------------------------------------------------------------------------------


class Engine:
    """The real `ctxscope engine` (the default model, golden path) on a port it picks itself."""

    def __init__(self, *extra):
        env = dict(os.environ, CTXSCOPE_LOG="info", NO_COLOR="1")
        self.proc = subprocess.Popen(
            [str(proxy_binary()), "engine", "--model", str(model_path()), "--listen", "127.0.0.1:0", *extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
        )
        self.log = OutputTail(self.proc.stderr, "engine-stderr")
        line = self.log.wait_for(lambda l: "ctxscope engine serving" in l, 120.0)
        if line is None:
            self.proc.kill()
            pytest.fail(f"ctxscope engine did not start:\n{self.log.text()}")
        self.url = "http://" + re.search(r"\blisten=\D*" + ADDR, ANSI.sub("", line)).group(1)

    def stop(self):
        assert stop_process(self.proc, "ctxscope engine", self.log) == 0


@pytest.fixture(scope="module")
def engine():
    server = Engine()
    yield server
    server.stop()


def engine_normalize(raw):
    """The engine's ids carry the clock and a counter, and its prefix cache fills as requests come."""
    text = re.sub(r'"(resp|msg)_[0-9a-f]+"', r'"\1_"', raw.decode())
    text = re.sub(r'"created_at":\d+', '"created_at":0', text)
    return re.sub(r'"cached_tokens":\d+', '"cached_tokens":0', text)


def test_the_engine_serves_responses_through_the_proxy_as_directly(engine, tmp_path):
    proxy = Proxy(engine.url, tmp_path / "data")
    try:
        for body in [
            {"model": "m", "instructions": "Answer briefly.", "input": "What is the capital of France?", "max_output_tokens": 12, "temperature": 0},
            {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "Say hi."}]}], "max_output_tokens": 6, "temperature": 0, "stream": True},
            {"model": "m", "input": "Weather in Paris?", "tools": [TOOL], "max_output_tokens": 6, "temperature": 0},
        ]:
            direct, through = post_raw(engine.url, body), post_raw(proxy.url, body)
            assert direct[0] == through[0] == 200, through
            assert engine_normalize(through[1]) == engine_normalize(direct[1])
        events = list(client(proxy.url).responses.create(model="m", input="Say hi.", max_output_tokens=6, temperature=0, stream=True))
        streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert streamed and events[-1].response.output_text == streamed
        # The engine keeps no state and says so; truncation "disabled" refuses an overflow as chat does.
        refused = post_raw(engine.url, {"model": "m", "input": "x", "previous_response_id": "resp_1"})
        assert refused[0] == 400 and b"--responses-state" in refused[1]
        overflow = post_raw(engine.url, {"model": "m", "input": "word " * 9000, "truncation": "disabled"})
        assert overflow[0] == 400 and json.loads(overflow[1])["error"]["code"] == "context_length_exceeded"
        listed = proxy.wait_turns(4)
        turns = [t for c in listed for t in turns_of(proxy, c["id"])]
        assert len(turns) == 4 and sum(t["stream"] for t in turns) == 2 and all(t["endpoint"] == "responses" for t in turns)
    finally:
        proxy.stop()


def test_responses_state_gives_the_engine_a_memory(tmp_path):
    """A 10-response chain recalls a fact from its first response, on the golden path, with a proxy
    restart in the middle; the engine refuses previous_response_id, so every 200 was stateless.
    Its own engine: a prefix cache filled by traffic the proxy never saw is (rightly) a finding."""
    question = "What is the capital of my country?"
    engine = Engine()
    proxy = Proxy(engine.url, tmp_path / "data", "--responses-state")
    try:
        previous = None
        for i in range(10):
            if i == 5:
                proxy.restart()
            text = "The capital of my country is Rome." if i == 0 else (question if i == 9 else "Thanks.")
            kwargs = dict(model="m", input=text, max_output_tokens=16, temperature=0)
            if previous:
                kwargs["previous_response_id"] = previous
            if i % 2:
                response = list(client(proxy.url).responses.create(stream=True, **kwargs))[-1].response
            else:
                response = client(proxy.url).responses.create(**kwargs)
            previous = response.id
        assert "Rome" in response.output_text, response.output_text
        listed = proxy.wait_turns(10)
        assert len(listed) == 1 and listed[0]["turns"] == 10
        assert not proxy.findings(), proxy.findings()
        control = client(engine.url).responses.create(model="m", input=question, max_output_tokens=16, temperature=0)
        assert "Rome" not in control.output_text, "the fact must come from the chain, not the question"
    finally:
        proxy.stop()
        engine.stop()


def test_the_engine_keeps_responses_across_its_restart(tmp_path):
    """`ctxscope engine --responses-store DIR` answers previous_response_id itself, across an engine
    restart; through a plain proxy the chain is captured, threaded and raises nothing."""
    store, data = tmp_path / "responses", tmp_path / "data"
    previous, response = None, None
    for half in range(2):
        engine = Engine("--responses-store", str(store))
        proxy = Proxy(engine.url, data)
        try:
            for i in range(5 * half, 5 * half + 5):
                text = "The capital of my country is Rome." if i == 0 else ("What is the capital of my country?" if i == 9 else "Thanks.")
                kwargs = dict(model="m", input=text, max_output_tokens=16, temperature=0)
                if previous:
                    kwargs["previous_response_id"] = previous
                if i % 2:
                    response = list(client(proxy.url).responses.create(stream=True, **kwargs))[-1].response
                else:
                    response = client(proxy.url).responses.create(**kwargs)
                assert response.store and response.previous_response_id == previous
                previous = response.id
            unknown = {"model": "m", "input": "x", "previous_response_id": "resp_unknown"}
            direct, through = post_raw(engine.url, unknown), post_raw(proxy.url, unknown)
            assert direct == through and direct[0] == 404
            assert json.loads(direct[1])["error"]["code"] == "previous_response_not_found"
            listed = proxy.wait_turns(6 * (half + 1))  # 5 chained and 1 unknown id per half
            chained = max(listed, key=lambda c: c["turns"])
            kinds = [t["relation"]["kind"] for t in turns_of(proxy, chained["id"])]
            assert not proxy.findings(), proxy.findings()
        finally:
            proxy.stop()
            engine.stop()
    assert "Rome" in response.output_text, response.output_text
    assert kinds == ["new"] + ["extend"] * 9


def test_the_engine_serves_back_and_forgets_stored_responses(tmp_path):
    """GET /v1/responses/{id}, its input_items and DELETE, through the official client, across an
    engine restart; the proxy forwards them untouched and captures no turn for them."""
    store = tmp_path / "responses"
    engine = Engine("--responses-store", str(store))
    c = client(engine.url)
    first = c.responses.create(model="m", input="The capital of my country is Rome.", max_output_tokens=8, temperature=0)
    events = list(c.responses.create(model="m", input="Thanks.", previous_response_id=first.id, max_output_tokens=8, temperature=0, stream=True))
    second = events[-1].response
    engine.stop()
    engine = Engine("--responses-store", str(store))
    proxy = Proxy(engine.url, tmp_path / "data")
    try:
        for base in (engine.url, proxy.url):
            got = client(base).responses.retrieve(second.id)
            assert (got.id, got.output_text, got.previous_response_id) == (second.id, second.output_text, first.id)
            assert got.usage.input_tokens == second.usage.input_tokens
        items = client(proxy.url).responses.input_items.list(second.id)
        texts = [item.content[0].text for item in items.data]
        assert texts == ["Thanks.", first.output_text, "The capital of my country is Rome."], texts
        oldest = client(proxy.url).responses.input_items.list(second.id, order="asc", limit=1)
        assert [i.content[0].text for i in oldest.data] == ["The capital of my country is Rome."] and oldest.has_more
        client(proxy.url).responses.delete(first.id)
        for base in (engine.url, proxy.url):
            with pytest.raises(openai.NotFoundError):
                client(base).responses.retrieve(first.id)
        with pytest.raises(openai.NotFoundError):
            client(proxy.url).responses.delete(first.id)
        # The deleted response's descendant still stands on what it stored.
        assert client(engine.url).responses.retrieve(second.id).id == second.id
        time.sleep(0.5)
        assert get_json(f"{proxy.admin_url}/api/conversations") == []
    finally:
        proxy.stop()
        engine.stop()
    stateless = Engine()
    try:
        with pytest.raises(openai.NotFoundError) as refused:
            client(stateless.url).responses.retrieve(second.id)
        assert "--responses-store" in str(refused.value)
    finally:
        stateless.stop()


def test_auto_truncation_drops_the_oldest_turns_and_the_proxy_reports_which(tmp_path):
    """A context of 192 tokens: "disabled" refuses the overflow as chat does; "auto" drops the oldest
    turns, says which in `ctxscope.dropped_items`, and the capture raises engine_truncation naming them."""
    engine = Engine("--ctx", "192")
    proxy = Proxy(engine.url, tmp_path / "data")
    try:
        history = []
        for i in range(4):
            history += [{"role": "user", "content": f"Fact {i}: " + "the quick brown fox jumps over the lazy dog " * 3},
                        {"role": "assistant", "content": f"Noted fact {i}."}]
        body = {"model": "m", "input": history + [{"role": "user", "content": "Which facts do you know?"}], "max_output_tokens": 8}
        refused = post_raw(proxy.url, dict(body, truncation="disabled"))
        assert refused[0] == 400 and json.loads(refused[1])["error"]["code"] == "context_length_exceeded"
        status, raw = post_raw(proxy.url, dict(body, truncation="auto"))
        assert status == 200, raw
        answer = json.loads(raw)
        dropped = answer["ctxscope"]["dropped_items"]
        assert dropped[:2] == [{"index": 0, "role": "user"}, {"index": 1, "role": "assistant"}]
        assert len(dropped) % 2 == 0 and len(dropped) < len(history)
        assert answer["truncation"] == "auto" and answer["usage"]["input_tokens"] + 8 <= 192
        proxy.wait_turns(2)
        deadline = time.monotonic() + CAPTURE_TIMEOUT_S
        while not (found := [f for f in proxy.findings() if f["kind"] == "engine_truncation"]):
            assert time.monotonic() < deadline, proxy.findings()
            time.sleep(0.05)
        assert found[0]["evidence"]["method"] == "response_reported"
        assert found[0]["evidence"]["dropped_items"] == dropped
        assert found[0]["severity"] == "warning"
    finally:
        proxy.stop()
        engine.stop()
