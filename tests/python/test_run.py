"""`ctxscope run -- CMD ARGS...` around a real harness-like child: a Python script using the official
`openai` client, which finds its endpoint only through the OPENAI_BASE_URL that `run` sets.

The scripted upstream (testkit's `scripted-upstream`, its own process) is the engine; ctxscope runs
the proxy in-process on free loopback ports, runs the child, and returns its exit code. Each test
checks what a user relies on: turns captured, the exit code passed through, signals passed on once
(a terminal's Ctrl-C is not delivered twice), and no process left behind.

    cargo build --workspace && python3 -m pytest -q tests/python/test_run.py
"""

import json
import os
import pty
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from test_openai_client import API_KEY, MODEL, Upstream, built_binary

RUN_TIMEOUT_S = 60.0


def alive(pid):
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def wait_file(path, timeout=RUN_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while not path.exists() or path.stat().st_size == 0:
        if time.monotonic() > deadline:
            pytest.fail(f"{path} did not appear within {timeout} s")
        time.sleep(0.05)
    return path.read_text()


@pytest.fixture
def upstream():
    up = Upstream()
    yield up
    up.stop()


def child_env(upstream, **extra):
    """The user's environment: the engine in OPENAI_BASE_URL, nothing else pointing anywhere."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "OLLAMA_HOST")}
    env.update(OPENAI_BASE_URL=f"{upstream.url}/v1", OPENAI_API_KEY=API_KEY, NO_COLOR="1")
    env.update(extra)
    return env


def write_script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def ctxscope(*args, **kwargs):
    return subprocess.run([str(built_binary("ctxscope")), *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S, **kwargs)


CLIENT = f"""
    import json, os, sys
    import openai

    client = openai.OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment only
    with open(sys.argv[1], "w") as f:
        json.dump({{"pid": os.getpid(), "base_url": str(client.base_url)}}, f)
    messages = [{{"role": "system", "content": "You are terse."}}]
    for text in ["first question", "second question", "third question"]:
        messages.append({{"role": "user", "content": text}})
        reply = client.chat.completions.create(model="{MODEL}", messages=messages)
        messages.append({{"role": "assistant", "content": reply.choices[0].message.content}})
    print("replies:", [m["content"] for m in messages if m["role"] == "assistant"])
    sys.exit(3)
"""


def test_run_captures_an_openai_client_and_returns_its_exit_code(tmp_path, upstream):
    client = write_script(tmp_path, "client.py", CLIENT)
    data = tmp_path / "data"
    seen = tmp_path / "seen.json"
    done = ctxscope("run", "--data", str(data), "--", sys.executable, str(client), str(seen), env=child_env(upstream))
    assert done.returncode == 3, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "You said: third question" in done.stdout, done.stdout
    child = json.loads(seen.read_text())
    # The child saw the proxy, not the engine it was configured with.
    assert child["base_url"].startswith("http://127.0.0.1:"), child
    assert f":{upstream.port}/" not in child["base_url"], child
    assert "UI http://127.0.0.1:" in done.stderr, done.stderr
    assert not alive(child["pid"]), "the child is still running"
    # Captured and drained: the store, opened after run returned, holds the three turns.
    listed = ctxscope("conversations", "--data", str(data), "--json")
    assert listed.returncode == 0, listed.stderr
    conversations = json.loads(listed.stdout)
    assert [c["turns"] for c in conversations] == [3], conversations


SIGNALLED = """
    import os, signal, sys, time
    out, ready = sys.argv[1], sys.argv[2]
    got = []
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda n, f: got.append(signal.Signals(n).name))
    open(ready, "w").write(str(os.getpid()))
    deadline = time.monotonic() + float(sys.argv[3])
    while time.monotonic() < deadline and "SIGTERM" not in got:
        time.sleep(0.02)
    time.sleep(0.3)  # a duplicate would arrive in this time
    open(out, "w").write(",".join(got))
    sys.exit(42 if got else 0)
"""


def test_run_passes_signals_sent_to_it_on_to_the_child(tmp_path, upstream):
    script = write_script(tmp_path, "signalled.py", SIGNALLED)
    out, ready = tmp_path / "got", tmp_path / "ready"
    proc = subprocess.Popen(
        [str(built_binary("ctxscope")), "run", "--data", str(tmp_path / "data"), "--", sys.executable, str(script), str(out), str(ready), "30"],
        env=child_env(upstream), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    child = int(wait_file(ready))
    proc.send_signal(signal.SIGHUP)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    # Each signal once, in order; ctxscope kept running until the child chose to exit.
    assert out.read_text() == "SIGHUP,SIGINT,SIGTERM", stderr
    assert proc.returncode == 42, stderr
    assert wait_gone(child)


def test_a_terminal_ctrl_c_reaches_the_child_once(tmp_path, upstream):
    """Ctrl-C on a terminal signals the whole foreground group, the child included: not passed on again."""
    script = write_script(tmp_path, "signalled.py", SIGNALLED.replace('"SIGTERM" not in got', "not got"))
    out, ready = tmp_path / "got", tmp_path / "ready"
    argv = [str(built_binary("ctxscope")), "run", "--data", str(tmp_path / "data"), "--", sys.executable, str(script), str(out), str(ready), "30"]
    env = child_env(upstream)
    pid, master = pty.fork()
    if pid == 0:
        os.execve(argv[0], argv, env)
    try:
        wait_file(ready)
        os.write(master, b"\x03")  # the terminal's interrupt character: SIGINT to the foreground group
        assert wait_file(out) == "SIGINT"
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 42
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
        os.close(master)


def test_a_child_killed_by_a_signal_exits_as_a_shell_says(tmp_path, upstream):
    done = ctxscope("run", "--data", str(tmp_path / "data"), "--", "sh", "-c", "kill -KILL $$", env=child_env(upstream))
    assert done.returncode == 128 + 9, done.stderr


def test_no_child_is_left_when_ctxscope_is_killed(tmp_path, upstream):
    script = write_script(tmp_path, "signalled.py", SIGNALLED)
    out, ready = tmp_path / "got", tmp_path / "ready"
    proc = subprocess.Popen(
        [str(built_binary("ctxscope")), "run", "--data", str(tmp_path / "data"), "--", sys.executable, str(script), str(out), str(ready), "30"],
        env=child_env(upstream), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    child = int(wait_file(ready))
    proc.kill()
    proc.wait()
    # The child was told (SIGTERM as its parent died; Linux may send it once per dying thread of
    # the parent) and went.
    assert wait_gone(child), "the child outlived ctxscope"
    assert set(wait_file(out).split(",")) == {"SIGTERM"}


def test_clear_errors_before_any_child_runs(tmp_path, upstream):
    marker = tmp_path / "ran"
    env = {k: v for k, v in child_env(upstream).items() if k != "OPENAI_BASE_URL"}
    done = ctxscope("run", "--data", str(tmp_path / "data"), "--", "sh", "-c", f"touch {marker}", env=env)
    assert done.returncode == 1 and "no upstream" in done.stderr, done.stderr
    assert not marker.exists()
    missing = ctxscope("run", "--data", str(tmp_path / "data"), "--", "no-such-harness-xyz", env=child_env(upstream))
    assert missing.returncode == 127 and "no-such-harness-xyz" in missing.stderr, missing.stderr
