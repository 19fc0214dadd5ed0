"""A bounded load test of `kestrel serve` on loopback: REQUESTS streamed requests of random
lengths from CLIENTS concurrent clients (OpenAI's Python client), about a quarter of them
abandoned mid-stream. Asserts that none is lost or stuck and that every slot and the queue are
free at the end; reports P50/P99 time to first token and inter-token latency as the clients saw
them, and the total throughput.

    python load.py [--requests 64] [--clients 16] [--seed 1]

`./build.sh load` runs the full size; `./build.sh test` a small one.
"""

import argparse
import random
import signal
import statistics
import sys
import threading
import time

import openai

from harness import API_KEY, metrics, request, sample, start_server

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "List three colours:",
    "The quick brown fox",
    "def fibonacci(n):",
    "In 1492,",
]


def percentile(values, p):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def run_client(client, jobs, results, lock):
    while True:
        with lock:
            if not jobs:
                return
            job = jobs.pop()
        try:
            result = run_request(client, *job)
        except Exception as e:  # anything but the answer is a lost request
            result = {"outcome": "lost", "error": repr(e), "finish": None, "start": 0, "times": [], "retries": 0}
        with lock:
            results.append(result)


def run_request(client, prompt, max_tokens, abandon_after):
    started = time.perf_counter()
    times = []
    retries = 0
    while True:
        try:
            stream = client.completions.create(
                model="m", prompt=prompt, max_tokens=max_tokens, temperature=0.7, seed=len(prompt), extra_body={"ignore_eos": True},
                stream=True, extra_headers={"Cache-Control": "no-store"},
            )
            break
        except openai.RateLimitError as e:
            # Queue full: wait as the server says, as a real client would.
            retries += 1
            time.sleep(float(e.response.headers.get("Retry-After", "1")))
    outcome = "complete"
    finish = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            times.append(time.perf_counter())
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
        if abandon_after is not None and len(times) >= abandon_after:
            stream.close()
            outcome = "abandoned"
            break
    if outcome == "complete" and finish is None:
        outcome = "lost"
    return {"outcome": outcome, "finish": finish, "start": started, "times": times, "retries": retries}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--slots", type=int, default=None, help="the server's --slots (default: its own)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    jobs = []
    for _ in range(args.requests):
        max_tokens = rng.randint(1, 16)
        abandon = rng.randint(1, max_tokens) if rng.random() < 0.25 else None
        jobs.append((rng.choice(PROMPTS), max_tokens, abandon))

    slots = ["--slots", str(args.slots)] if args.slots else []
    process, address = start_server("--api-key", API_KEY, "--queue", str(args.clients), *slots)
    client = openai.OpenAI(base_url=f"http://{address}/v1", api_key=API_KEY, max_retries=0, timeout=600)
    results, lock = [], threading.Lock()
    started = time.perf_counter()
    threads = [threading.Thread(target=run_client, args=(client, jobs, results, lock)) for _ in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=1800)
    elapsed = time.perf_counter() - started
    stuck = sum(thread.is_alive() for thread in threads)

    # The engine retires an abandoned request at its next token: wait for it to drain.
    deadline = time.time() + 60
    while request(address, "GET", "/health")[2]["pending_requests"] > 0 and time.time() < deadline:
        time.sleep(0.1)
    samples = metrics(address)
    process.send_signal(signal.SIGTERM)
    exit_code = process.wait(timeout=60)
    process.stderr.close()

    ttft = [r["times"][0] - r["start"] for r in results if r["times"]]
    itl = [b - a for r in results for a, b in zip(r["times"], r["times"][1:])]
    tokens = sum(len(r["times"]) for r in results)
    outcomes = {o: sum(r["outcome"] == o for r in results) for o in ("complete", "abandoned", "lost")}
    print(f"{args.requests} requests from {args.clients} clients in {elapsed:.1f} s: {outcomes['complete']} complete, "
          f"{outcomes['abandoned']} abandoned, {outcomes['lost']} lost, {len(jobs)} never sent, {stuck} clients stuck, "
          f"{sum(r['retries'] for r in results)} retries after 429")
    print(f"time to first token: P50 {percentile(ttft, 50) * 1e3:.0f} ms, P99 {percentile(ttft, 99) * 1e3:.0f} ms")
    print(f"inter-token latency: P50 {percentile(itl, 50) * 1e3:.0f} ms, P99 {percentile(itl, 99) * 1e3:.0f} ms")
    durations = [r["times"][-1] - r["start"] for r in results if r["times"]]
    print(f"throughput: {tokens} streamed text chunks, {tokens / elapsed:.2f} per second; "
          f"mean request {statistics.mean(durations) if durations else float('nan'):.2f} s")
    for r in results:
        if r.get("error"):
            print(f"lost: {r['error']}")
    failures = []
    if len(results) != args.requests or outcomes["lost"] or stuck or jobs:
        failures.append("requests lost or stuck")
    for name in ("kestrel_slots_in_use", "kestrel_queue_depth"):
        if sample(samples, name) != 0:
            failures.append(f"{name} is {sample(samples, name)} at the end")
    if exit_code != 0:
        failures.append(f"the server exited with {exit_code}")
    if failures:
        print("FAILED: " + "; ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
