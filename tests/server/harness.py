"""What the server tests and the load test share: starting `kestrel serve`, raw HTTP, /metrics
through the official Prometheus client's OpenMetrics parser, and the CLI's own generation."""

import http.client
import json
import os
import re
import subprocess
import threading
from pathlib import Path

from prometheus_client.openmetrics.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
CLI = os.environ.get("KESTREL_CLI", str(ROOT / "target/debug/kestrel"))
API_KEY = "test-key"
PROMPT = "The capital of France is"
ENV = {"XDG_RUNTIME_DIR": "/tmp", **os.environ}


def start_server(*args):
    """Starts `kestrel serve` on a free port; returns (process, "host:port")."""
    process = subprocess.Popen(
        [CLI, "serve", "--port", "0", "--context", "512", *args],
        cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    for line in process.stderr:
        found = re.search(r"listening on http://(\S+) ", line)
        if found:
            # Keep draining stderr so the server never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in process.stderr], daemon=True).start()
            return process, found.group(1)
    raise RuntimeError(f"kestrel serve exited with {process.wait()} before listening")


def native_greedy(prompt, max_tokens, *options):
    """The CLI's own generation, greedy unless `options` say otherwise: what the server must
    reproduce."""
    greedy = [] if "--temperature" in options else ["--temperature", "0"]
    out = subprocess.run(
        [CLI, "generate", "--raw", "--json", *greedy, "--max-tokens", str(max_tokens), *options, prompt],
        cwd=ROOT, env=ENV, capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout)


def request(address, method, path, body=None, headers=None, key=API_KEY):
    """A raw HTTP request; returns (status, headers, parsed JSON or text)."""
    connection = http.client.HTTPConnection(address, timeout=120)
    headers = dict(headers or {})
    if key:
        headers["Authorization"] = f"Bearer {key}"
    payload = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
    connection.request(method, path, body=payload, headers=headers)
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    try:
        return response.status, response.headers, json.loads(text)
    except json.JSONDecodeError:
        return response.status, response.headers, text


def metrics(address):
    """/metrics parsed by the OpenMetrics parser: {(sample name, frozenset(labels)): value}."""
    status, headers, text = request(address, "GET", "/metrics")
    assert status == 200, text
    assert headers["Content-Type"].startswith("application/openmetrics-text"), headers["Content-Type"]
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def sample(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0)
