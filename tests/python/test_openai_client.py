"""The official `openai` Python client driving the real `ctxscope` proxy.

A scripted upstream (the `scripted-upstream` binary of testkit/, its own process) sits behind the real
proxy binary (its own process). Every test sends the same calls through the proxy and straight to the upstream and requires
the client to see exactly the same thing; the capture tests then read the proxy's admin API.

Ports: the upstream and the proxy both bind port 0 and report the ports they got (the upstream on its
first stdout line, the proxy in its "ctxscope proxy serving" log line), so there is no window in which
another process can take a port picked in advance.

    cargo build --workspace && python3 -m pytest -q tests/python
    CTXSCOPE_BIN=/path/to/ctxscope python3 -m pytest -q tests/python   (scripted-upstream beside it)
"""

import json
import os
import re
import select
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
API_KEY = "sk-test-secret-xyz"
MODEL = "scripted-model"
START_TIMEOUT_S = 20.0
CAPTURE_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 20.0

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location"],
        },
    },
}


# -- processes --------------------------------------------------------------------------------------


class OutputTail:
    """Drains a child's pipe on a thread (so the child never blocks on a full pipe) and keeps the lines."""

    def __init__(self, pipe, name):
        self.lines = []
        self.cond = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._run, args=(pipe,), name=name, daemon=True)
        self.thread.start()

    def _run(self, pipe):
        for raw in iter(pipe.readline, b""):
            with self.cond:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def wait_for(self, predicate, timeout):
        """The first line satisfying `predicate`, or None once the pipe closes or the time is up."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self.cond:
            while True:
                for line in self.lines[seen:]:
                    if predicate(line):
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if self.closed or left <= 0:
                    return None
                self.cond.wait(left)

    def text(self, last=40):
        with self.cond:
            return "\n".join(self.lines[-last:])


def stop_process(proc, name, tail=None, timeout=STOP_TIMEOUT_S):
    """SIGTERM, wait, and return the exit status (killing it if it does not stop in time)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        output = f"\n--- {name} output ---\n{tail.text()}" if tail else ""
        pytest.fail(f"{name} did not exit within {timeout} s of SIGTERM{output}")


class Upstream:
    def __init__(self):
        self.proc = subprocess.Popen(
            [str(built_binary("scripted-upstream")), "0", "--require-key", API_KEY],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.stderr = OutputTail(self.proc.stderr, "upstream-stderr")
        self.port = int(self._first_stdout_line(START_TIMEOUT_S))
        self.url = f"http://127.0.0.1:{self.port}"

    def _first_stdout_line(self, timeout):
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(left, 0))
            if not ready:
                self.proc.kill()
                pytest.fail(f"scripted upstream printed no port within {timeout} s:\n{self.stderr.text()}")
            byte = os.read(fd, 1)
            if not byte:
                self.proc.wait()
                pytest.fail(f"scripted upstream exited ({self.proc.returncode}) before printing its port:\n{self.stderr.text()}")
            line += byte
        return line.strip()

    def stop(self):
        stop_process(self.proc, "scripted upstream", self.stderr)
        self.proc.stdout.close()


def built_binary(name):
    """`ctxscope` (CTXSCOPE_BIN, default target/debug/ctxscope) or another binary of the workspace beside it."""
    configured = Path(os.environ.get("CTXSCOPE_BIN", "target/debug/ctxscope"))
    proxy = configured if configured.is_absolute() else REPO_ROOT / configured
    path = proxy if name == "ctxscope" else proxy.with_name(name)
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(
            f"{name} binary not found or not executable at {path}. "
            f"Build it with `cargo build --workspace` in {REPO_ROOT}, or point CTXSCOPE_BIN at ctxscope.",
            pytrace=False,
        )
    return path


def proxy_binary():
    return built_binary("ctxscope")


ANSI = re.compile(r"\x1b\[[0-9;]*m")
ADDR = r"(127\.0\.0\.1:\d+)"


class Proxy:
    """The real `ctxscope proxy` on ports it picks itself, capturing into `data`."""

    def __init__(self, upstream_url, data):
        self.data = data
        env = dict(os.environ, CTXSCOPE_LOG="info", NO_COLOR="1")
        self.proc = subprocess.Popen(
            [str(proxy_binary()), "proxy", "--upstream", upstream_url,
             "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
             "--data", str(data), "--flush-ms", "50"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.log = OutputTail(self.proc.stderr, "proxy-stderr")
        self.exit_status = None
        line = self.log.wait_for(lambda l: "ctxscope proxy serving" in l, START_TIMEOUT_S)
        if line is None:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"proxy never logged 'ctxscope proxy serving' (exit {self.proc.returncode}):\n{self.log.text()}")
        line = ANSI.sub("", line)
        listen = re.search(r"\bproxy=\D*" + ADDR, line)
        admin = re.search(r"\badmin=\D*" + ADDR, line)
        assert listen and admin, f"cannot read the bound addresses from the proxy's log line: {line!r}"
        self.url = f"http://{listen.group(1)}"
        self.admin_url = f"http://{admin.group(1)}"
        self._wait_healthy()

    def _wait_healthy(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                health = get_json(f"{self.admin_url}/healthz")
                assert health.get("capture") == "on", f"capture is not on: {health}"
                return
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    pytest.fail(f"proxy admin {self.admin_url} never became healthy:\n{self.log.text()}")
                time.sleep(0.02)

    def stop(self):
        """SIGTERM (the graceful path that drains capture); the proxy must exit 0. Idempotent."""
        if self.exit_status is None:
            self.exit_status = stop_process(self.proc, "ctxscope proxy", self.log)
            self.log.thread.join(timeout=5)
            assert self.exit_status == 0, f"proxy exited with {self.exit_status}:\n{self.log.text()}"
        return self.exit_status

    # -- admin API --

    def conversations(self):
        return get_json(f"{self.admin_url}/api/conversations")

    def conversation(self, cid):
        return get_json(f"{self.admin_url}/api/conversations/{cid}")

    def wait_turns(self, turns, timeout=CAPTURE_TIMEOUT_S):
        """Polls until the admin API lists at least `turns` captured turns in total; returns the list."""
        deadline = time.monotonic() + timeout
        while True:
            listed = self.conversations()
            total = sum(c.get("turns", 0) for c in listed)
            if total >= turns:
                return listed
            if time.monotonic() > deadline:
                pytest.fail(f"expected {turns} captured turns within {timeout} s, have {total}: {json.dumps(listed)}")
            time.sleep(0.02)


def get_json(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        assert response.status == 200, f"GET {url}: {response.status}"
        return json.loads(response.read())


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream():
    up = Upstream()
    yield up
    up.stop()


@pytest.fixture
def proxy(upstream, tmp_path):
    p = Proxy(upstream.url, tmp_path / "data")
    try:
        yield p
    finally:
        # Asserts a clean exit 0 on SIGTERM (a no-op when the test already stopped it).
        p.stop()


def make_client(base, api_key=API_KEY):
    return openai.OpenAI(base_url=f"{base}/v1", api_key=api_key, max_retries=0, timeout=15.0)


@pytest.fixture
def clients(proxy, upstream):
    """(through the proxy, straight to the upstream)"""
    via, direct = make_client(proxy.url), make_client(upstream.url)
    yield via, direct
    via.close()
    direct.close()


def dumps(chunks):
    return [c.model_dump() for c in chunks]


# -- tests ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "hello there"}],
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "You said: What is 2+2?"},
            {"role": "user", "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "times 3? ünïcödé ✓"}]},
        ],
    ],
    ids=["one-message", "history-and-parts"],
)
def test_non_streaming_is_identical_through_the_proxy(clients, messages):
    via, direct = clients
    got = via.chat.completions.create(model=MODEL, messages=messages, temperature=0)
    want = direct.chat.completions.create(model=MODEL, messages=messages, temperature=0)
    assert got.model_dump() == want.model_dump()
    last = messages[-1]["content"]
    text = last if isinstance(last, str) else "".join(p["text"] for p in last)
    assert got.choices[0].message.content == f"You said: {text}"
    assert got.choices[0].finish_reason == "stop"
    assert got.usage.prompt_tokens > 0 and got.usage.completion_tokens > 0
    assert got.usage.prompt_tokens_details.cached_tokens == (got.usage.prompt_tokens // 2 if len(messages) > 1 else 0)


@pytest.mark.parametrize("include_usage", [False, True], ids=["no-usage", "include-usage"])
def test_streamed_chunks_are_identical_through_the_proxy(clients, include_usage):
    via, direct = clients
    messages = [{"role": "user", "content": "stream me five words please"}]
    extra = {"stream_options": {"include_usage": True}} if include_usage else {}
    got = dumps(via.chat.completions.create(model=MODEL, messages=messages, stream=True, **extra))
    want = dumps(direct.chat.completions.create(model=MODEL, messages=messages, stream=True, **extra))
    assert got == want
    # And they are the real thing: role chunk, one per word, finish, optional usage chunk.
    text_chunks = [c for c in got if c["choices"]]
    assert text_chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"]["content"] or "" for c in text_chunks) == "You said: stream me five words please"
    assert len(text_chunks) == 1 + 7 + 1
    assert text_chunks[-1]["choices"][0]["finish_reason"] == "stop"
    usage_chunks = [c for c in got if c["usage"] is not None]
    if include_usage:
        assert len(usage_chunks) == 1 and got[-1] is usage_chunks[0] and got[-1]["choices"] == []
        assert got[-1]["usage"]["prompt_tokens"] > 0 and got[-1]["usage"]["completion_tokens"] == 7
    else:
        assert usage_chunks == []


def accumulate_tool_calls(chunks):
    calls = {}
    finish = None
    for chunk in chunks:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for fragment in choice.delta.tool_calls or []:
                call = calls.setdefault(fragment.index, {"id": None, "type": None, "name": "", "arguments": ""})
                call["id"] = fragment.id or call["id"]
                call["type"] = fragment.type or call["type"]
                if fragment.function is not None:
                    call["name"] += fragment.function.name or ""
                    call["arguments"] += fragment.function.arguments or ""
    return [calls[i] for i in sorted(calls)], finish


def test_streamed_tool_calls_accumulate_to_the_same_call_through_the_proxy(clients, proxy):
    via, direct = clients
    messages = [{"role": "user", "content": "What's the weather in Lisbon today?"}]
    kwargs = dict(model=MODEL, messages=messages, tools=[WEATHER_TOOL], stream=True, stream_options={"include_usage": True})
    got_chunks = list(via.chat.completions.create(**kwargs))
    want_chunks = list(direct.chat.completions.create(**kwargs))
    assert dumps(got_chunks) == dumps(want_chunks)
    got, got_finish = accumulate_tool_calls(got_chunks)
    want, want_finish = accumulate_tool_calls(want_chunks)
    assert (got, got_finish) == (want, want_finish)
    assert len(got) == 1 and got_finish == "tool_calls"
    assert got[0]["name"] == "get_weather" and got[0]["type"] == "function" and got[0]["id"].startswith("call_")
    assert json.loads(got[0]["arguments"]) == {"location": "Lisbon", "unit": "celsius"}
    # The arguments really were split over several chunks.
    assert sum(1 for c in got_chunks for ch in c.choices for t in ch.delta.tool_calls or [] if t.function and t.function.arguments) >= 3

    # Non-streamed, the same call.
    kwargs.pop("stream"), kwargs.pop("stream_options")
    plain_via = via.chat.completions.create(**kwargs)
    assert plain_via.model_dump() == direct.chat.completions.create(**kwargs).model_dump()
    call = plain_via.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"location": "Lisbon", "unit": "celsius"})

    # The capture reassembled the streamed call into the reply message.
    listed = proxy.wait_turns(2)
    details = [proxy.conversation(c["id"]) for c in listed]
    detail, streamed = next((d, t) for d in details for t in d["turns"] if t["stream"])
    assert streamed["finish_reason"] == "tool_calls", streamed
    captured = detail["messages"][streamed["reply"]]["tool_calls"][0]
    assert captured["function"]["name"] == "get_weather"
    assert json.loads(captured["function"]["arguments"]) == json.loads(got[0]["arguments"])
    assert captured["id"] == got[0]["id"]


def test_four_turn_conversation_is_captured_as_one_conversation(proxy):
    client = make_client(proxy.url)
    questions = ["What is 2+2?", "And times 3?", "Say it in French.", "Now spell it backwards, please."]
    streamed = [False, True, False, True]
    history = [{"role": "system", "content": "You are terse."}]
    seen = []  # (reply text, usage) as the client saw them
    for question, stream in zip(questions, streamed):
        history.append({"role": "user", "content": question})
        if stream:
            chunks = list(client.chat.completions.create(
                model=MODEL, messages=history, temperature=0, stream=True, stream_options={"include_usage": True}))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            usage = chunks[-1].usage
        else:
            response = client.chat.completions.create(model=MODEL, messages=history, temperature=0)
            text, usage = response.choices[0].message.content, response.usage
        assert text == f"You said: {question}"
        assert usage is not None
        seen.append((text, usage))
        history.append({"role": "assistant", "content": text})
    client.close()

    listed = proxy.wait_turns(4)
    assert len(listed) == 1, f"expected one conversation: {json.dumps(listed)}"
    conversation = listed[0]
    assert conversation["turns"] == 4
    assert conversation["model"] == MODEL
    assert conversation["branch_of"] is None
    detail = proxy.conversation(conversation["id"])
    turns = sorted(detail["turns"], key=lambda t: t["index"])
    assert [t["index"] for t in turns] == [0, 1, 2, 3]
    assert [t["relation"]["kind"] for t in turns] == ["new", "extend", "extend", "extend"]
    assert [t["stream"] for t in turns] == streamed
    assert [t["status"] for t in turns] == [200] * 4
    assert [t["reply_text"] for t in turns] == [text for text, _ in seen]
    assert [t["finish_reason"] for t in turns] == ["stop"] * 4
    assert [t["usage"]["prompt_tokens"] for t in turns] == [u.prompt_tokens for _, u in seen]
    assert [t["usage"]["completion_tokens"] for t in turns] == [u.completion_tokens for _, u in seen]
    assert [t["usage"]["cached_tokens"] for t in turns] == [u.prompt_tokens_details.cached_tokens for _, u in seen]
    assert [len(t["messages"]) for t in turns] == [2, 4, 6, 8]
    # Each turn's request messages are the previous turn's plus its reply plus one new question.
    for before, after in zip(turns, turns[1:]):
        assert after["messages"][: len(before["messages"])] == before["messages"]
    # Streamed turns counted their SSE events: role + words + finish + usage + [DONE] at least.
    for t in turns:
        if t["stream"]:
            assert t["chunks"] >= 1 + len(t["reply_text"].split()) + 2, t
    # Every message the turns reference is stored, and they read back as the client sent them.
    assert [detail["messages"][h]["content"] for h in turns[-1]["messages"]] == [m["content"] for m in history[:-1]]

    # After a graceful shutdown, nothing in the store holds the API key.
    proxy.stop()
    files = [p for p in proxy.data.rglob("*") if p.is_file()]
    assert files, f"no store files under {proxy.data}"
    leaks = [str(p) for p in files if API_KEY.encode() in p.read_bytes()]
    assert leaks == [], f"API key found in store files: {leaks}"


def test_models_list_through_the_proxy(clients):
    via, direct = clients
    got = via.models.list()
    assert [m.id for m in got.data] == [MODEL]
    assert [m.model_dump() for m in got.data] == [m.model_dump() for m in direct.models.list().data]


def test_upstream_auth_errors_reach_the_client_unchanged(proxy, upstream):
    # The upstream requires the key, so every other test passing shows the proxy forwards it;
    # a wrong key must come back as the same 401 the upstream gives.
    errors = []
    for base in (proxy.url, upstream.url):
        client = make_client(base, api_key="sk-wrong")
        with pytest.raises(openai.AuthenticationError) as caught:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        client.close()
        errors.append((caught.value.status_code, caught.value.body))
    assert errors[0] == errors[1]
    assert errors[0][0] == 401
