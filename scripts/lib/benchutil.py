"""Helpers the benchmark scripts' Python share: progress on stderr, a free loopback port, waiting
for a URL to answer 200."""
import socket
import sys
import time
import urllib.request


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ok(url, within=60):
    deadline = time.time() + within
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.time() > deadline:
            raise SystemExit(f"{url} never answered 200")
        time.sleep(0.05)
