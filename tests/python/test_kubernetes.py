"""deploy/kubernetes checked three ways: against Kubernetes' own schemas, against itself, and by running it.

1. The kustomization is rendered here (the files it lists, its `images:` entries; the SGLang patch
   applied for the second variant) and every object is validated against the Kubernetes OpenAPI
   schemas that `kubernetes-validate` bundles (strict: an unknown field fails), offline.
2. Cross-references: the sidecar's --upstream is the engine's port, the probes and the scrape
   annotations name the admin port with /healthz and /metrics, the Service reaches the proxy port,
   the Secret and ConfigMap keys it reads exist, the store volume is mounted at --data, the process
   namespace is shared, and the image (deploy/container/Containerfile) has the user and ports the
   pod expects.
3. The real `ctxscope` binary is started with exactly the sidecar's arguments and environment from the
   manifest (the token read from the example Secret), rewriting only the addresses (--listen, --admin,
   --upstream, the OTLP endpoint) to loopback ones and --data to a temporary directory, in front of a
   fake engine; then the probe path, /metrics, the admin API with and without the token, one chat
   completion through the proxy, its capture, and its OTLP span.

    CTXSCOPE_BIN=$PWD/target/debug/ctxscope python3 -m pytest -q tests/python/test_kubernetes.py
"""

import base64
import copy
import http.server
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
K8S = REPO_ROOT / "deploy" / "kubernetes"
CONTAINERFILE = REPO_ROOT / "deploy" / "container" / "Containerfile"
SGLANG_PATCH = K8S / "engine-sglang.yaml"

# The oldest Kubernetes release still commonly run and the newest the pinned package bundles.
KUBERNETES_VERSIONS = ("1.29", "1.37")
# What the renderer below implements; a kustomization using anything else must fail here rather than
# be validated as something it is not.
KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "images", "patches"}
KINDS = {"Deployment", "Service", "PersistentVolumeClaim", "Secret", "ConfigMap"}

START_TIMEOUT_S = 20.0
CAPTURE_TIMEOUT_S = 10.0
OTLP_TIMEOUT_S = 15.0


# -- rendering ---------------------------------------------------------------------------------------


def load_yaml_docs(path):
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def kustomization():
    docs = load_yaml_docs(K8S / "kustomization.yaml")
    assert len(docs) == 1, f"kustomization.yaml holds {len(docs)} documents"
    return docs[0]


def pod_containers(obj):
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("containers", []) + spec.get("initContainers", [])


def image_name(image):
    """`name` of `name:tag` / `name@digest` (a registry port's colon is not a tag)."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name[: len(name) - len(last) + last.index(":")] if ":" in last else name


def strategic_merge(base, patch):
    """The part of Kubernetes' strategic merge this patch needs: maps merge, `containers` merge by name,
    other lists are replaced."""
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if key in ("containers", "initContainers") and isinstance(value, list):
            merged = list(out.get(key, []))
            for item in value:
                at = [i for i, c in enumerate(merged) if c.get("name") == item.get("name")]
                if at:
                    merged[at[0]] = strategic_merge(merged[at[0]], item)
                else:
                    merged.append(copy.deepcopy(item))
            out[key] = merged
        elif key in out:
            out[key] = strategic_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def render(extra_patches=()):
    """The objects `kubectl apply -k deploy/kubernetes` applies (plus `extra_patches`)."""
    k = kustomization()
    unknown = set(k) - KUSTOMIZATION_KEYS
    assert not unknown, f"kustomization.yaml uses {sorted(unknown)}, which this test does not render"
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization"
    objects = []
    for resource in k["resources"]:
        path = K8S / resource
        assert path.is_file(), f"kustomization.yaml lists {resource}, which is not a file in {K8S}"
        objects.extend(load_yaml_docs(path))
    patches = [K8S / p["path"] for p in k.get("patches") or []] + list(extra_patches)
    for path in patches:
        for patch in load_yaml_docs(path):
            targets = [o for o in objects if o["kind"] == patch["kind"] and o["metadata"]["name"] == patch["metadata"]["name"]]
            assert len(targets) == 1, f"{path.name} patches {patch['kind']}/{patch['metadata']['name']}, found {len(targets)}"
            objects[objects.index(targets[0])] = strategic_merge(targets[0], patch)
    images = k.get("images") or []
    for entry in images:
        used = False
        for obj in objects:
            for container in pod_containers(obj):
                if image_name(container["image"]) == entry["name"]:
                    container["image"] = f"{entry.get('newName', entry['name'])}:{entry['newTag']}"
                    used = True
        assert used, f"images: entry {entry['name']!r} matches no container image"
    return objects


VARIANTS = {"vllm": (), "sglang": (SGLANG_PATCH,)}


@pytest.fixture(params=sorted(VARIANTS), scope="module")
def rendered(request):
    return request.param, render(VARIANTS[request.param])


def one(objects, kind):
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
    return found[0]


def named(objects, kind, name):
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name} is referenced but rendered {len(found)} times"
    return found[0]


def container(pod, name):
    found = [c for c in pod["containers"] if c["name"] == name]
    assert len(found) == 1, f"the pod has {len(found)} containers named {name!r}"
    return found[0]


def flags(args):
    """`--flag value` and `--flag=value` pairs of a command line (a flag followed by a flag: True)."""
    out = {}
    i = 0
    while i < len(args):
        arg = str(args[i])
        if arg.startswith("--"):
            if "=" in arg:
                name, value = arg.split("=", 1)
            elif i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
                name, value = arg, str(args[i + 1])
                i += 1
            else:
                name, value = arg, True
            assert name not in out, f"{name} given twice in {args}"
            out[name] = value
        i += 1
    return out


def port_number(c, port):
    """A probe's or Service's port (a number or a container port's name) as a number in container `c`."""
    if isinstance(port, int):
        return port
    found = [p["containerPort"] for p in c.get("ports", []) if p.get("name") == port]
    assert len(found) == 1, f"container {c['name']} has no port named {port!r}"
    return found[0]


def host_port(addr):
    host, _, port = addr.rpartition(":")
    return host, int(port)


def secret_value(objects, ref):
    secret = named(objects, "Secret", ref["name"])
    if ref["key"] in secret.get("stringData", {}):
        return secret["stringData"][ref["key"]]
    assert ref["key"] in secret.get("data", {}), f"Secret {ref['name']} has no key {ref['key']!r}"
    return base64.b64decode(secret["data"][ref["key"]]).decode()


def env_of(objects, c):
    """The container's environment as the kubelet would give it (value, secretKeyRef, configMapKeyRef)."""
    env = {}
    for item in c.get("env", []):
        source = item.get("valueFrom")
        if source is None:
            env[item["name"]] = str(item.get("value", ""))
        elif "secretKeyRef" in source:
            env[item["name"]] = secret_value(objects, source["secretKeyRef"])
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            data = named(objects, "ConfigMap", ref["name"]).get("data", {})
            assert ref["key"] in data, f"ConfigMap {ref['name']} has no key {ref['key']!r}"
            env[item["name"]] = data[ref["key"]]
        else:
            pytest.fail(f"env {item['name']}: a source this test does not resolve: {source}")
    assert "envFrom" not in c, "envFrom is not resolved by this test"
    return env


class Pod:
    """The Deployment's pod, its two containers and the sidecar's flags."""

    def __init__(self, objects):
        self.objects = objects
        self.deployment = one(objects, "Deployment")
        self.template = self.deployment["spec"]["template"]
        self.spec = self.template["spec"]
        self.engine = container(self.spec, "engine")
        self.sidecar = container(self.spec, "ctxscope")
        args = [str(a) for a in self.sidecar["args"]]
        assert args[0] == "proxy", f"the sidecar does not run `ctxscope proxy`: {args}"
        self.args = args
        self.flags = flags(args[1:])


# -- 1. schemas --------------------------------------------------------------------------------------


def test_the_kustomization_renders_the_expected_objects():
    objects = render()
    assert sorted(o["kind"] for o in objects) == sorted(KINDS)
    assert all(":" in c["image"] for o in objects for c in pod_containers(o))
    images = {c["name"]: c["image"] for c in pod_containers(one(objects, "Deployment"))}
    entries = {e["name"]: f"{e['newName']}:{e['newTag']}" for e in kustomization()["images"]}
    assert images == {"engine": entries["engine-image"], "ctxscope": entries["ctxscope-image"]}
    assert entries["engine-image"].startswith("vllm/vllm-openai:"), "vLLM is the default engine"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schema(rendered, version):
    variant, objects = rendered
    for obj in objects:
        where = f"{variant}: {obj['kind']}/{obj['metadata']['name']} against Kubernetes {version}"
        try:
            checked = kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(f"{where}: {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            pytest.fail(f"{where}: {e.message}")
        assert checked == version, f"{where}: validated against {checked} instead"


def test_the_validator_rejects_what_is_wrong():
    """The schema check above can fail: a misspelled field, a wrong type, a missing required field."""
    deployment = one(render(), "Deployment")
    typo = copy.deepcopy(deployment)
    typo["spec"]["template"]["spec"]["shareProcessNamespaces"] = True
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "8000"
    missing = copy.deepcopy(deployment)
    del missing["spec"]["selector"]
    for broken in (typo, wrong_type, missing):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


# -- 2. cross-references -----------------------------------------------------------------------------


def test_the_sidecar_forwards_to_the_engine_port(rendered):
    variant, objects = rendered
    pod = Pod(objects)
    upstream = urlsplit(pod.flags["--upstream"])
    assert upstream.scheme == "http" and upstream.hostname in ("127.0.0.1", "localhost"), upstream
    engine_port = port_number(pod.engine, "engine")
    assert upstream.port == engine_port
    # The engine listens where its container port says (vLLM: `vllm serve MODEL --port N`, SGLang:
    # `--port N`), on all addresses so that its probes reach it.
    engine_flags = flags([str(a) for a in pod.engine["args"]])
    assert int(engine_flags["--port"]) == engine_port, f"{variant}: engine --port"
    assert engine_flags["--host"] == "0.0.0.0"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        check = pod.engine[probe]["httpGet"]
        assert port_number(pod.engine, check["port"]) == engine_port and check["path"] == "/health"
    # Reported cached tokens (README, "In front of each engine").
    expected = {"vllm": "--enable-prompt-tokens-details", "sglang": "--enable-cache-report"}[variant]
    assert expected in engine_flags
    command = {"vllm": ["vllm", "serve"], "sglang": ["python3", "-m", "sglang.launch_server"]}[variant]
    assert pod.engine["command"] == command
    assert pod.engine["resources"]["limits"]["nvidia.com/gpu"] >= 1


def test_probes_annotations_and_service_name_the_right_ports(rendered):
    _, objects = rendered
    pod = Pod(objects)
    listen_host, listen_port = host_port(pod.flags["--listen"])
    admin_host, admin_port = host_port(pod.flags["--admin"])
    assert listen_host == admin_host == "0.0.0.0"
    assert port_number(pod.sidecar, "proxy") == listen_port
    assert port_number(pod.sidecar, "admin") == admin_port
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        check = pod.sidecar[probe]["httpGet"]
        assert check["path"] == "/healthz", probe
        assert port_number(pod.sidecar, check["port"]) == admin_port, probe
    annotations = pod.template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(admin_port)
    assert annotations["prometheus.io/path"] == "/metrics"

    service = one(objects, "Service")
    labels = pod.template["metadata"]["labels"]
    assert service["spec"]["selector"] and service["spec"]["selector"].items() <= labels.items()
    assert pod.deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    targets = {p["name"]: port_number(pod.sidecar, p["targetPort"]) for p in service["spec"]["ports"]}
    assert targets == {"proxy": listen_port, "admin": admin_port}
    assert port_number(pod.engine, "engine") not in targets.values(), "clients must go through ctxscope"


def test_secrets_config_volume_and_security(rendered):
    _, objects = rendered
    pod = Pod(objects)
    assert pod.spec["shareProcessNamespace"] is True
    # The token comes from the Secret, never from the command line.
    assert "--admin-token" not in pod.flags and "--otlp-endpoint" not in pod.flags
    env = env_of(objects, pod.sidecar)
    token = env["CTXSCOPE_ADMIN_TOKEN"]
    assert len(token) >= 16 and all(33 <= ord(ch) <= 126 and ch not in ";," for ch in token)
    assert "REPLACE" in token, "the shipped token must be an obvious placeholder"
    assert urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"]).scheme in ("http", ""), "ctxscope exports over http:// only"

    mounts = [m for m in pod.sidecar["volumeMounts"] if m["mountPath"] == pod.flags["--data"]]
    assert len(mounts) == 1, f"nothing is mounted at --data {pod.flags['--data']}"
    volume = [v for v in pod.spec["volumes"] if v["name"] == mounts[0]["name"]]
    assert len(volume) == 1 and "persistentVolumeClaim" in volume[0]
    claim = named(objects, "PersistentVolumeClaim", volume[0]["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    # One pod per store: a rolling update would start a second one on the same volume.
    assert pod.deployment["spec"]["replicas"] == 1 and pod.deployment["spec"]["strategy"]["type"] == "Recreate"

    pod_security = pod.spec.get("securityContext", {})
    sidecar_security = pod.sidecar["securityContext"]
    assert sidecar_security["readOnlyRootFilesystem"] is True
    assert sidecar_security["allowPrivilegeEscalation"] is False
    assert sidecar_security["capabilities"]["drop"] == ["ALL"]

    def effective(c, key):
        return c.get("securityContext", {}).get(key, pod_security.get(key))

    # Reading the engine's /proc entries takes the same user on both sides (or CAP_SYS_PTRACE).
    assert effective(pod.sidecar, "runAsNonRoot") is True
    assert effective(pod.sidecar, "runAsUser") == effective(pod.engine, "runAsUser") != 0
    for c in (pod.engine, pod.sidecar):
        for key in ("requests", "limits"):
            assert c["resources"][key].get("memory"), f"{c['name']}: no {key} memory"


def containerfile():
    text = CONTAINERFILE.read_text()
    # Continuation lines joined; comments dropped.
    lines = [l for l in text.splitlines() if not l.lstrip().startswith("#")]
    return re.sub(r"\\\n", " ", "\n".join(lines))


def test_the_image_matches_the_pod():
    pod = Pod(render())
    text = containerfile()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M | re.I)
    assert stages[-1][0] in ("scratch",) or stages[-1][0].startswith("gcr.io/distroless/static"), stages
    user = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert user, "no USER in the final stage"
    uid, _, gid = user[-1].partition(":")
    assert int(uid) == pod.sidecar["securityContext"]["runAsUser"] and int(uid) != 0
    exposed = {int(p.split("/")[0]) for line in re.findall(r"^EXPOSE\s+(.+)$", text, re.M) for p in line.split()}
    assert exposed == {port_number(pod.sidecar, "proxy"), port_number(pod.sidecar, "admin")}
    assert re.search(r'^ENTRYPOINT\s+\["/ctxscope"\]', text, re.M)
    assert "command" not in pod.sidecar, "the sidecar's args go to the image's ENTRYPOINT"
    build = re.findall(r"cargo build ([^&\n]+)", text)
    assert build and all(f in build[0] for f in ("--release", "--locked", "--bin ctxscope", "--target"))


# -- 3. the real binary with the sidecar's arguments ---------------------------------------------------


CHAT_REPLY = {
    "id": "chatcmpl-k8s",
    "object": "chat.completion",
    "created": 1764415200,
    "model": "fake-engine",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14},
}


class Recorder(http.server.ThreadingHTTPServer):
    """A loopback HTTP server that keeps every request it gets; `answer(method, path, body)` replies."""

    daemon_threads = True

    def __init__(self, answer):
        self.requests = []
        self.lock = threading.Condition()
        self.answer = answer
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self):
                length = int(self.headers.get("content-length", 0))
                body = self.rfile.read(length) if length else b""
                with server.lock:
                    server.requests.append((self.command, self.path, dict(self.headers), body))
                    server.lock.notify_all()
                status, content_type, payload = server.answer(self.command, self.path, body)
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _handle

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def wait_for(self, predicate, timeout):
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                found = [r for r in self.requests if predicate(r)]
                left = deadline - time.monotonic()
                if found or left <= 0:
                    return found
                self.lock.wait(left)

    def stop(self):
        self.shutdown()
        self.server_close()


def fake_engine_answer(method, path, body):
    if method == "POST" and path == "/v1/chat/completions":
        return 200, "application/json", json.dumps(CHAT_REPLY).encode()
    return 404, "application/json", b'{"error":{"message":"not here"}}'


class Logs:
    """Drains a pipe on a thread and keeps its lines."""

    def __init__(self, pipe):
        self.lines = []
        self.cond = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._run, args=(pipe,), daemon=True)
        self.thread.start()

    def _run(self, pipe):
        for raw in iter(pipe.readline, b""):
            with self.cond:
                self.lines.append(re.sub(r"\x1b\[[0-9;]*m", "", raw.decode("utf-8", "replace").rstrip("\n")))
                self.cond.notify_all()
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def wait_for(self, needle, timeout):
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines:
                    if needle in line:
                        return line
                left = deadline - time.monotonic()
                if self.closed or left <= 0:
                    return None
                self.cond.wait(left)

    def text(self):
        with self.cond:
            return "\n".join(self.lines[-60:])


def ctxscope_binary():
    configured = Path(os.environ.get("CTXSCOPE_BIN", "target/debug/ctxscope"))
    path = configured if configured.is_absolute() else REPO_ROOT / configured
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"ctxscope not found at {path}: `cargo build` it, or point CTXSCOPE_BIN at it", pytrace=False)
    return path


def rewrite(args, replacements):
    """`args` with the value of each flag in `replacements` replaced; every one of them must be there."""
    out, seen, i = [], set(), 0
    while i < len(args):
        arg = args[i]
        name = arg.split("=", 1)[0]
        if name in replacements:
            seen.add(name)
            out.append(f"{name}={replacements[name]}")
            i += 1 if "=" in arg else 2
            continue
        out.append(arg)
        i += 1
    assert seen == set(replacements), f"the sidecar's args lack {sorted(set(replacements) - seen)}"
    return out


def pod_env(extra):
    """What a container in the pod starts with: the runtime's PATH and HOME, then the manifest's env."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/", **extra}


def request(method, url, body=None, headers=None, timeout=10.0):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def stop(proc, logs):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"ctxscope did not exit within 20 s of SIGTERM:\n{logs.text()}")


def test_the_manifest_admin_address_needs_the_secret_token(tmp_path):
    """With the manifest's own --admin 0.0.0.0:9090 and no CTXSCOPE_ADMIN_TOKEN, ctxscope refuses to
    start (before binding anything): the Secret is what makes the exposed admin port acceptable."""
    pod = Pod(render())
    args = rewrite(pod.args, {"--data": str(tmp_path / "data"), "--listen": "127.0.0.1:0"})
    env = env_of(pod.objects, pod.sidecar)
    del env["CTXSCOPE_ADMIN_TOKEN"]
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = ""
    proc = subprocess.run([str(ctxscope_binary()), *args], env=pod_env(env), capture_output=True, timeout=30)
    assert proc.returncode != 0, f"started without a token on {pod.flags['--admin']}:\n{proc.stderr.decode()}"
    assert b"token" in proc.stderr.lower(), proc.stderr.decode()


def test_the_sidecar_runs_with_the_manifest_arguments(tmp_path):
    pod = Pod(render())
    env = env_of(pod.objects, pod.sidecar)
    token = env["CTXSCOPE_ADMIN_TOKEN"]
    assert token == secret_value(pod.objects, {"name": "ctxscope-admin-token", "key": "token"})
    engine = Recorder(fake_engine_answer)
    collector = Recorder(lambda method, path, body: (200, "application/x-protobuf", b""))
    proc = None
    try:
        args = rewrite(
            pod.args,
            {
                "--listen": "127.0.0.1:0",
                "--admin": "127.0.0.1:0",
                "--upstream": engine.url,
                "--data": str(tmp_path / "data"),
            },
        )
        # The collector's address is rewritten like the others; the variable is the manifest's.
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"], "the manifest's OTLP endpoint is empty"
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.url
        env["CTXSCOPE_LOG"] = "info"
        proc = subprocess.Popen(
            [str(ctxscope_binary()), *args],
            env=pod_env(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        logs = Logs(proc.stderr)
        line = logs.wait_for("ctxscope proxy serving", START_TIMEOUT_S)
        assert line, f"ctxscope did not start (exit {proc.poll()}):\n{logs.text()}"
        proxy = re.search(r"\bproxy=\D*(127\.0\.0\.1:\d+)", line)
        admin = re.search(r"\badmin=\D*(127\.0\.0\.1:\d+)", line)
        assert proxy and admin, line
        proxy_url, admin_url = f"http://{proxy.group(1)}", f"http://{admin.group(1)}"
        # The token must not be on the command line the engine container can see.
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            assert token.encode() not in f.read()

        # Probes: the paths the manifest's probes use, on the admin port, without credentials.
        paths = {pod.sidecar[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe", "startupProbe")}
        assert paths == {"/healthz"}
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            status, body = request("GET", admin_url + "/healthz")
            assert status == 200, f"/healthz: {status} {body!r}"
            if json.loads(body)["capture"] == "on":
                break
            assert time.monotonic() < deadline, f"capture never came on: {body!r}\n{logs.text()}"
            time.sleep(0.05)
        status, body = request("GET", admin_url + pod.template["metadata"]["annotations"]["prometheus.io/path"])
        assert status == 200 and b"ctxscope_" in body

        # The admin API: 401 without the Secret's token, 200 with it.
        status, body = request("GET", f"{admin_url}/api/conversations")
        assert status == 401, f"the admin API answered {status} without the token: {body[:200]!r}"
        status, body = request("GET", f"{admin_url}/api/conversations", headers={"authorization": "Bearer not-the-token-0000"})
        assert status == 401
        auth = {"authorization": f"Bearer {token}"}
        status, body = request("GET", f"{admin_url}/api/conversations", headers=auth)
        assert status == 200 and json.loads(body) == [], body

        # One chat completion through the proxy port reaches the engine unchanged and comes back unchanged.
        chat = {"model": "fake-engine", "messages": [{"role": "user", "content": "What is the capital of France?"}]}
        sent = json.dumps(chat).encode()
        status, body = request(
            "POST", f"{proxy_url}/v1/chat/completions", sent, {"content-type": "application/json", "authorization": "Bearer sk-client"}
        )
        assert status == 200 and json.loads(body) == CHAT_REPLY, body
        got = engine.wait_for(lambda r: r[0] == "POST" and r[1] == "/v1/chat/completions", 5)
        assert len(got) == 1 and got[0][3] == sent

        # Captured: listed with the token, its turn holding the question and the reply.
        deadline = time.monotonic() + CAPTURE_TIMEOUT_S
        while True:
            status, body = request("GET", f"{admin_url}/api/conversations", headers=auth)
            listed = json.loads(body) if status == 200 else []
            if listed and listed[0].get("turns", 0) >= 1:
                break
            assert time.monotonic() < deadline, f"no captured turn within {CAPTURE_TIMEOUT_S} s: {status} {body!r}\n{logs.text()}"
            time.sleep(0.05)
        assert len(listed) == 1 and listed[0]["upstream"] == engine.url
        status, body = request("GET", f"{admin_url}/api/conversations/{listed[0]['id']}", headers=auth)
        assert status == 200
        detail = json.loads(body)
        text = json.dumps(detail)
        assert "What is the capital of France?" in text and "Paris." in text
        assert "sk-client" not in text, "API keys are forwarded, never stored"
        assert len(detail["turns"]) == 1

        # Exported as a span to the endpoint from OTEL_EXPORTER_OTLP_ENDPOINT.
        spans = collector.wait_for(lambda r: r[0] == "POST" and r[1] == "/v1/traces", OTLP_TIMEOUT_S)
        assert spans, f"no POST /v1/traces reached {collector.url}: {[r[:2] for r in collector.requests]}\n{logs.text()}"
        assert spans[0][2].get("Content-Type", spans[0][2].get("content-type")) == "application/x-protobuf"
        assert b"What is the capital of France?" not in spans[0][3], "content is exported only with --otlp-content"

        status = stop(proc, logs)
        assert status == 0, f"ctxscope exited with {status}:\n{logs.text()}"
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        engine.stop()
        collector.stop()
