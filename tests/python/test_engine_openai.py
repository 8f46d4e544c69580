"""The official `openai` Python client against the real `ctxscope serve`: the self-hosted engine on the
default model with the capture proxy in front of it, in one process. The client talks to the proxy port;
the tests check the answers (non-streaming, streaming, a three-turn conversation with prefix reuse) and
what the proxy captured.

The process binds port 0 for the engine, the proxy and the admin API and the tests read the bound
addresses from its log lines ("ctxscope engine serving listen=...", "ctxscope proxy serving proxy=...
admin=..."), as test_openai_client.py does.

    cargo build && python3 -m pytest -q tests/python/test_engine_openai.py
    CTXSCOPE_BIN=/path/to/ctxscope CTXSCOPE_MODEL=/path/to/model.gguf python3 -m pytest -q tests/python
"""

import os
import re
import subprocess
import time
from pathlib import Path

import openai
import pytest

from test_openai_client import ANSI, OutputTail, get_json, proxy_binary, stop_process

START_TIMEOUT_S = 120.0
QUESTION = "What is the capital of France?"


def model_path():
    """$CTXSCOPE_MODEL, else the default model where `ctxscope models fetch` puts it."""
    if os.environ.get("CTXSCOPE_MODEL"):
        path = Path(os.environ["CTXSCOPE_MODEL"])
    else:
        home = os.environ.get("CTXSCOPE_HOME") or None
        if home is None and os.environ.get("XDG_CACHE_HOME"):
            home = os.path.join(os.environ["XDG_CACHE_HOME"], "ctxscope")
        if home is None:
            home = os.path.join(os.environ.get("HOME", ""), ".cache", "ctxscope")
        path = Path(home) / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.fail(f"model {path} missing: run `ctxscope models fetch` (or scripts/fetch-model.sh), or set CTXSCOPE_MODEL", pytrace=False)
    return path


class Serve:
    """The real `ctxscope serve` on ports it picks itself."""

    def __init__(self, data):
        env = dict(os.environ, CTXSCOPE_LOG="info", NO_COLOR="1")
        self.proc = subprocess.Popen(
            [str(proxy_binary()), "serve", "--model", str(model_path()),
             "--listen", "127.0.0.1:0", "--proxy", "127.0.0.1:0", "--admin", "127.0.0.1:0",
             "--data", str(data), "--flush-ms", "50"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.log = OutputTail(self.proc.stderr, "serve-stderr")
        engine = self._line("ctxscope engine serving")
        proxy = self._line("ctxscope proxy serving")
        self.engine_url = "http://" + re.search(r"\blisten=\D*(127\.0\.0\.1:\d+)", engine).group(1)
        self.url = "http://" + re.search(r"\bproxy=\D*(127\.0\.0\.1:\d+)", proxy).group(1)
        self.admin_url = "http://" + re.search(r"\badmin=\D*(127\.0\.0\.1:\d+)", proxy).group(1)
        assert get_json(f"{self.admin_url}/healthz")["capture"] == "on"

    def _line(self, marker):
        line = self.log.wait_for(lambda l: marker in l, START_TIMEOUT_S)
        if line is None:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"ctxscope serve never logged {marker!r} (exit {self.proc.returncode}):\n{self.log.text()}")
        return ANSI.sub("", line)

    def stop(self):
        status = stop_process(self.proc, "ctxscope serve", self.log)
        assert status == 0, f"ctxscope serve exited with {status}:\n{self.log.text()}"

    def conversation(self, name, turns, timeout=10.0):
        """The captured conversations once the one named `name` has `turns` turns in (capture is
        asynchronous: a reply can reach the client before its turn is stored)."""
        deadline = time.monotonic() + timeout
        while True:
            listed = get_json(f"{self.admin_url}/api/conversations")
            if any(c.get("name") == name and c.get("turns", 0) >= turns for c in listed):
                return listed
            if time.monotonic() > deadline:
                pytest.fail(f"expected {turns} captured turns in {name!r}, have: {listed}")
            time.sleep(0.05)


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    s = Serve(tmp_path_factory.mktemp("serve") / "data")
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def client(serve):
    c = openai.OpenAI(base_url=f"{serve.url}/v1", api_key="sk-unused", max_retries=0, timeout=60.0)
    yield c
    c.close()


def model_id(client):
    return client.models.list().data[0].id


def test_models_lists_the_served_model(client):
    assert model_id(client) == "SmolLM2-135M-Instruct.Q4_1"


def test_non_streaming_answers(client):
    reply = client.chat.completions.create(
        model=model_id(client), messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=16)
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 10 and 0 < reply.usage.completion_tokens <= 16
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streaming_matches_non_streaming(client):
    messages = [{"role": "user", "content": "Name a color."}]
    whole = client.chat.completions.create(model=model_id(client), messages=messages, temperature=0, max_tokens=12)
    chunks = list(client.chat.completions.create(
        model=model_id(client), messages=messages, temperature=0, max_tokens=12,
        stream=True, stream_options={"include_usage": True}))
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == whole.choices[0].message.content
    assert with_choices[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (whole.usage.prompt_tokens, whole.usage.completion_tokens)
    # The same prompt again: everything but its last token came from the prefix cache.
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1


def test_three_turn_conversation_reuses_its_prefix_and_is_captured(client, serve):
    messages = []
    usages = []
    for question in ["Hi! What is the capital of France?", "And what is the capital of Germany?", "Thanks. Which one is bigger?"]:
        messages.append({"role": "user", "content": question})
        reply = client.chat.completions.create(
            model=model_id(client), messages=messages, temperature=0, max_tokens=16,
            extra_headers={"x-ctxscope-conversation": "three-turns"})
        answer = reply.choices[0].message.content
        assert answer
        messages.append({"role": "assistant", "content": answer})
        usages.append(reply.usage)
    assert usages[0].prompt_tokens < usages[1].prompt_tokens < usages[2].prompt_tokens
    for previous, usage in zip(usages, usages[1:]):
        # The new turn's prompt starts with the previous prompt and reply, which the engine kept.
        assert usage.prompt_tokens_details.cached_tokens >= previous.prompt_tokens, (previous, usage)

    # Waiting for this conversation's own turns (not a total over all of them: earlier tests'
    # captures may still be landing) before reading it.
    listed = serve.conversation("three-turns", 3)
    named = [c for c in listed if c.get("name") == "three-turns"]
    assert len(named) == 1 and named[0]["turns"] == 3, listed
    shown = get_json(f"{serve.admin_url}/api/conversations/{named[0]['id']}")
    turns = shown["turns"]
    assert [t["relation"]["kind"] for t in turns] == ["new", "extend", "extend"], turns
    for turn, usage in zip(turns, usages):
        assert turn["usage"]["prompt_tokens"] == usage.prompt_tokens
        assert turn["usage"]["cached_tokens"] == usage.prompt_tokens_details.cached_tokens
        # The proxy counts with the same model file as the engine.
        assert turn["local_tokens"]["prompt"] == usage.prompt_tokens


def test_bad_requests_are_clear_400s(client):
    with pytest.raises(openai.BadRequestError) as empty:
        client.chat.completions.create(model=model_id(client), messages=[], max_tokens=4)
    assert "at least one message" in str(empty.value)
    with pytest.raises(openai.BadRequestError) as zero:
        client.chat.completions.create(model=model_id(client), messages=[{"role": "user", "content": "hi"}], max_tokens=0)
    assert "max_tokens" in str(zero.value)
    # And it keeps answering.
    ok = client.chat.completions.create(model=model_id(client), messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert ok.usage.completion_tokens >= 1
