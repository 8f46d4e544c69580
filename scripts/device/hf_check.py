# Runs on the device machine (it has PyTorch and transformers; this machine has neither), from the folder
# scripts/device/prepare.sh fills: a random-weight Llama with SmolLM2-135M's shapes built by
# transformers, saved as safetensors, served by our engine over HTTP (`ctxscope engine --model DIR`, on
# the CPU or, with `--device cuda`, on the GPU: golden path); greedy tokens and top-5 logprobs compared
# with transformers' own fp32 forward on the same token ids, and a request that extends an earlier one
# must report reused tokens (`usage.prompt_tokens_details.cached_tokens`). Prints a table last; exits
# non-zero when a check fails. Run: `python3 devcheck/hf_check.py [--device cuda]` with `devcheck` carried.
import json, os, shutil, subprocess, sys, time, urllib.request
import torch
from transformers import LlamaConfig, LlamaForCausalLM

here = os.path.dirname(os.path.abspath(__file__))
out = os.environ.get("OUT", "/tmp")
d = "/tmp/hf_smollm2_random"
shutil.rmtree(d, ignore_errors=True)
os.makedirs(d)
cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                  num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
                  rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu", initializer_range=0.08,
                  bos_token_id=1, eos_token_id=2)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).float().eval()
model.save_pretrained(d, safe_serialization=True)
for f in ["tokenizer.json", "tokenizer_config.json"]:
    shutil.copy(os.path.join(here, f), d)
print("files:", sorted(os.listdir(d)), flush=True)
print(open(os.path.join(d, "config.json")).read(), flush=True)

port = 31777
device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu"
engine = subprocess.Popen([os.path.join(here, "ctxscope"), "engine", "--model", d, "--listen", f"127.0.0.1:{port}", "--device", device],
                          stdout=subprocess.DEVNULL, stderr=open(os.path.join(out, "engine.log"), "w"))
def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=300))
for _ in range(600):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2); break
    except Exception:
        time.sleep(0.2)

# GPT-2 byte-level: token string -> bytes.
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs = bs[:]; n = 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
byte_of = {chr(c): b for b, c in zip(bs, cs)}
vocab = json.load(open(os.path.join(d, "tokenizer.json")))["model"]["vocab"]
piece = {i: t for t, i in vocab.items()}
def text_of(i):
    t = piece[i]
    try:
        return bytes(byte_of[ch] for ch in t).decode("utf-8", errors="replace")
    except KeyError:
        return t

id_of = {}
for i in sorted(piece):
    id_of.setdefault(text_of(i), i)

prompts = ["The secret word is banana.", "Once upon a time, in a land far away,", "def fibonacci(n):\n    return", "1, 2, 3, 4, 5,"]
rows = []
worst = 0.0
for p in prompts:
    ids = post("/tokenize", {"content": p})["tokens"]
    ours = post("/v1/completions", {"prompt": p, "max_tokens": 8, "temperature": 0, "logprobs": 5})
    assert ours["usage"]["prompt_tokens"] == len(ids), (ours["usage"], len(ids))
    lp = ours["choices"][0]["logprobs"]
    x = torch.tensor([ids])
    theirs_tok, theirs_lp, diffs, agree = [], [], [], 0
    with torch.no_grad():
        for step in range(len(lp["tokens"])):
            logits = model(x).logits[0, -1].double()
            logp = torch.log_softmax(logits, -1)
            nxt = int(torch.argmax(logp))
            theirs_tok.append(text_of(nxt)); theirs_lp.append(float(logp[nxt]))
            # our top-5 map vs their logprobs of the same tokens
            top = lp["top_logprobs"][step]
            for tok, v in top.items():
                if tok in id_of:
                    diffs.append(abs(v - float(logp[id_of[tok]])))
            if lp["tokens"][step] == theirs_tok[-1]:
                agree += 1
            else:
                break
            x = torch.cat([x, torch.tensor([[nxt]])], 1)
    m = max(diffs) if diffs else float("nan")
    worst = max(worst, m)
    rows.append((p[:28].replace("\n", "\\n"), len(ids), agree, len(lp["tokens"]), m))
# Prefix reuse over HTTP: the second request extends the first one's prompt.
first = "The secret word is banana. Remember it, because later I will ask you about it."
post("/v1/completions", {"prompt": first, "max_tokens": 4, "temperature": 0})
again = post("/v1/completions", {"prompt": first + " What was the word?", "max_tokens": 4, "temperature": 0})
cached = again["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
models = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30))
engine.terminate(); engine.wait(timeout=30)
print(f"device {device}; backend reported by /v1/models: {models['data'][0].get('backend')}; cached tokens on the extending request: {cached} of {again['usage']['prompt_tokens']}")
print("| prompt | prompt tokens | greedy tokens agreeing (of ours) | max abs logprob diff, top-5 |")
print("|---|---|---|---|")
for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]}/{r[3]} | {r[4]:.2e} |")
print("worst", worst, "torch", torch.__version__)
failed = worst > 1e-3 or cached == 0 or any(r[2] < r[3] for r in rows)
print("hf_check:", "FAILED" if failed else "ok")
sys.exit(1 if failed else 0)
