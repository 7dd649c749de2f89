"""The live app against the command line, side by side in one run: a warm request to `attnviz serve` for a
short sentence on MiniLM (the model loaded once) against the whole process of `attnviz view TEXT -o page.html`
(Python, torch and transformers imported, the model loaded, the same page written). The goal: the warm request
at least 20× faster. Then a load of REQUESTS requests from CLIENTS clients at once: latency percentiles, the
server's resident memory before and after, and whether every request was answered.

    python benchmarks/bench_serve.py [--repeats 20] [--cli-runs 3] [--clients 8] [--requests 200]
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

TEXT = "The cat sat on the mat"


def post(port: int, body: dict) -> tuple[int, float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    started = time.perf_counter()
    connection.request("POST", "/api/capture", json.dumps(body), {"content-type": "application/json"})
    answer = connection.getresponse()
    answer.read()
    connection.close()
    return answer.status, time.perf_counter() - started


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as handle:
        return int(next(line for line in handle if line.startswith("VmRSS")).split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--cli-runs", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()

    exe = [sys.executable, "-m", "attnviz"]
    cli = []
    with tempfile.TemporaryDirectory() as folder:
        for n in range(args.cli_runs):
            started = time.perf_counter()
            subprocess.run([*exe, "view", TEXT, "-o", str(Path(folder) / f"page{n}.html")], check=True,
                           capture_output=True)
            cli.append(time.perf_counter() - started)
    server = subprocess.Popen([*exe, "serve", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        line = server.stdout.readline()
        port = int(re.search(r"127\.0\.0\.1:(\d+)", line).group(1))
        for _ in range(3):
            post(port, {"text": TEXT})  # warm
        warm = []
        for _ in range(args.repeats):
            status, seconds = post(port, {"text": TEXT})
            assert status == 200
            warm.append(seconds)
        cli_s, warm_s = float(np.median(cli)), float(np.median(warm))
        print(f"attnviz view, whole process (median of {len(cli)}): {cli_s * 1000:.0f} ms")
        print(f"warm request to attnviz serve (median of {len(warm)}): {warm_s * 1000:.1f} ms")
        print(f"ratio: {cli_s / warm_s:.0f}× faster (goal ≥ 20×)")

        before = rss_mib(server.pid)
        statuses, latencies = [], []
        lock = threading.Lock()
        per_client = args.requests // args.clients

        def client(k: int) -> None:
            for n in range(per_client):
                status, seconds = post(port, {"text": f"client {k} sentence {n}: {TEXT}"})
                with lock:
                    statuses.append(status)
                    latencies.append(seconds)

        started = time.perf_counter()
        threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - started
        after = rss_mib(server.pid)
        ms = np.array(latencies) * 1000
        print(f"{len(statuses)} requests from {args.clients} clients in {wall:.1f} s ({len(statuses) / wall:.1f}/s): "
              f"{statuses.count(200)} answered 200; latency p50 {np.percentile(ms, 50):.0f} ms, "
              f"p90 {np.percentile(ms, 90):.0f} ms, p99 {np.percentile(ms, 99):.0f} ms; "
              f"server memory {before:.0f} → {after:.0f} MiB")
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(60)


if __name__ == "__main__":
    main()
