"""bench_metrics.py — does /metrics slow the worker? Requests/s of `medley worker --model echo`
(no delay) over one batch of N requests, in three modes run alternately in the same session
on one redis-server (127.0.0.1, no persistence):

  off      no --metrics
  on       --metrics 127.0.0.1:PORT, nobody scraping
  scraped  --metrics, and a scraper GETting /metrics every 100 ms for the whole run

Each run: FLUSHALL, a fresh worker started and warm, then the clock runs from `medley submit`
to the batch being `completed`. Prints every run, the median req/s of each mode and the
ratios scraped/off and on/off (the target: scraped within 2% of off). On a shared machine
wall-clock rates swing by tens of percent from run to run, so each run also reads the
worker process's CPU time (user + system, /proc/PID/stat, its HTTP thread included) over the
same interval: CPU microseconds per request, and their ratio, is the cost the endpoint adds
to the worker whatever else the machine runs.

    python3 bench/metrics/bench_metrics.py --medley build/cli/medley -n 20000 --rounds 5
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import redis


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit("nothing listens on %d" % port)


def cpu_s(pid):
    """User + system CPU seconds of process pid, all its threads."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_once(medley, url, r, path, n, mode):
    r.flushall()
    mport = free_port()
    args = [medley, "worker", "--model", "echo", "--redis", url, "--log-text"]
    if mode != "off":
        args += ["--metrics", "127.0.0.1:%d" % mport]
    w = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stop = threading.Event()
    scrapes = [0]

    def scraper():
        while not stop.is_set():
            t = time.time()
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport, timeout=5) as resp:
                resp.read()
            scrapes[0] += 1
            stop.wait(max(0.0, 0.1 - (time.time() - t)))

    try:
        if mode != "off":
            wait_port(mport)
        time.sleep(0.5)  # warm: connected, groups made
        th = None
        if mode == "scraped":
            th = threading.Thread(target=scraper, daemon=True)
            th.start()
        t0 = time.time()
        c0 = cpu_s(w.pid)
        batch = subprocess.run([medley, "submit", path, "--redis", url], check=True,
                               capture_output=True, text=True).stdout.strip()
        meta = "medley:{%s}:meta" % batch
        while r.hget(meta, "status") != "completed":
            time.sleep(0.005)
        dt = time.time() - t0
        c1 = cpu_s(w.pid)
        stop.set()
        if th:
            th.join()
        return n / dt, scrapes[0], (c1 - c0) / n * 1e6
    finally:
        stop.set()
        w.terminate()
        w.wait(30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--medley", default="build/cli/medley")
    ap.add_argument("-n", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="medley-bench-metrics-")
    port = free_port()
    rs = subprocess.Popen([shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1",
                           "--save", "", "--appendonly", "no", "--dir", tmp],
                          stdout=subprocess.DEVNULL)
    try:
        wait_port(port)
        url = "redis://127.0.0.1:%d/0" % port
        r = redis.Redis(port=port, decode_responses=True)
        path = os.path.join(tmp, "in.jsonl")
        with open(path, "w") as f:
            for i in range(a.n):
                f.write(json.dumps({"custom_id": "r%d" % i, "method": "POST",
                                    "url": "/v1/chat/completions",
                                    "body": {"model": "echo", "messages": [
                                        {"role": "user", "content": "hello %d" % i}]}}) + "\n")
        modes = ["off", "on", "scraped"]
        got = {m: [] for m in modes}
        cpu = {m: [] for m in modes}
        for k in range(a.rounds):
            order = modes[k % 3:] + modes[:k % 3]  # rotate: no mode always first
            for m in order:
                rps, scrapes, us = run_once(a.medley, url, r, path, a.n, m)
                got[m].append(rps)
                cpu[m].append(us)
                print("round %d %-8s %8.0f req/s  %6.1f worker CPU us/request  (%d scrapes)" %
                      (k + 1, m, rps, us, scrapes), flush=True)
        med = {m: statistics.median(v) for m, v in got.items()}
        print("\nmedian req/s over %d rounds of %d requests:" % (a.rounds, a.n))
        for m in modes:
            print("  %-8s %8.0f" % (m, med[m]))
        print("ratio on/off       %.3f" % (med["on"] / med["off"]))
        print("ratio scraped/off  %.3f" % (med["scraped"] / med["off"]))
        print("ratio scraped/on   %.3f" % (med["scraped"] / med["on"]))
        mc = {m: statistics.median(v) for m, v in cpu.items()}
        print("\nmedian worker CPU per request (user + system, all threads):")
        for m in modes:
            print("  %-8s %8.1f us" % (m, mc[m]))
        print("CPU ratio on/off       %.3f" % (mc["on"] / mc["off"]))
        print("CPU ratio scraped/off  %.3f  (requests/s the worker can give, CPU-bound: %.3f)" %
              (mc["scraped"] / mc["off"], mc["off"] / mc["scraped"]))
    finally:
        rs.terminate()
        rs.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
