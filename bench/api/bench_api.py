"""bench_api.py — a 50,000-line echo batch through `medley api` (the openai SDK: files.create,
batches.create, batches.retrieve until completed, files.content of the output) against the
same batch through `medley submit` + `medley results --wait`, on one redis-server and one
warm `medley worker --model echo` (no delay), alternating the two paths; then API requests/s
for GET /v1/batches/{id} (keep-alive HTTP clients in threads).

Run (Debian 12; medley built in build/; redis-server and the openai SDK of
scripts/requirements-test.txt installed):
    python3 bench/api/bench_api.py --medley build/cli/medley [-n 50000] [--reps 2]

Prints each path's seconds, the ratio submit/api (1.0 = the API costs nothing; goal >= 0.9),
the CPU seconds medley's client side used in each (the `medley submit` and `medley results`
processes; the `medley api` process: less noisy than wall time on a shared machine) and GET
requests/s.

medley_stack() starts the redis-server, worker and `medley api`; bench_online.py uses it too.
ctest -R bench_api_small runs this at 200 lines."""
import argparse
import contextlib
import http.client
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types

import redis

KEY = "sk-bench-0123456789abcdef0123"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def proc_cpu(pid):
    """CPU seconds (user + system) a process has used so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu():
    """CPU seconds of this process (the openai SDK's side of the API path)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def children_cpu():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def via_submit(medley, url, path, out):
    t0 = time.time()
    b = subprocess.run([medley, "submit", path, "--redis", url], capture_output=True, text=True,
                       check=True).stdout.strip()
    subprocess.run([medley, "results", b, "-o", out, "--wait", "--redis", url], check=True,
                   capture_output=True)
    return time.time() - t0


def via_api(client, path, out):
    t0 = time.time()
    f = client.files.create(file=open(path, "rb"), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                              completion_window="24h")
    while b.status not in ("completed", "failed"):
        time.sleep(0.05)
        b = client.batches.retrieve(b.id)
    with open(out, "wb") as o:
        o.write(client.files.content(b.output_file_id).content)
    return time.time() - t0, b.id


def get_rps(host, port, batch, seconds=5, threads=4):
    count = [0] * threads
    stop = time.time() + seconds

    def run(i):
        c = http.client.HTTPConnection(host, port, timeout=10)
        while time.time() < stop:
            c.request("GET", "/v1/batches/" + batch, headers={"Authorization": "Bearer " + KEY})
            r = c.getresponse()
            r.read()
            if r.status != 200:
                raise SystemExit("GET answered %d" % r.status)
            count[i] += 1

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(count) / seconds


@contextlib.contextmanager
def medley_stack(medley, model, prefix):
    """One redis-server on loopback without persistence, one `medley worker --model model` and
    one `medley api` that accepts KEY, in a temporary folder. Yields a namespace: tmp (the
    folder), url (Redis), r (a redis-py client), api (the `medley api` process), base (its
    http://host:port), host, port. On exit the three are stopped (killed after 30 s) and the
    folder removed. The worker may still be loading its model when this yields."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    port = free_port()
    procs = []
    try:
        procs.append(subprocess.Popen(["redis-server", "--port", str(port), "--save", "",
                                       "--appendonly", "no", "--dir", tmp],
                                      stdout=subprocess.DEVNULL))
        url = "redis://127.0.0.1:%d/0" % port
        r = redis.Redis(port=port)
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        with open(os.path.join(tmp, "keys"), "w") as f:
            f.write("bench %s\n" % KEY)
        procs.append(subprocess.Popen([medley, "worker", "--redis", url, "--model", model],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        api = subprocess.Popen([medley, "api", "--listen", "127.0.0.1:0", "--redis", url,
                                "--api-keys", os.path.join(tmp, "keys")],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(api)
        base = api.stdout.readline().split("serving ", 1)[1].strip()
        host, aport = base.rsplit("/", 1)[1].split(":")
        yield types.SimpleNamespace(tmp=tmp, url=url, r=r, api=api, base=base, host=host,
                                    port=int(aport))
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--medley", default="build/cli/medley")
    ap.add_argument("-n", type=int, default=50000)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    from openai import OpenAI  # here: bench_online.py imports this module without the SDK

    with medley_stack(a.medley, "echo", "bench-api-") as st:
        tmp, url, api = st.tmp, st.url, st.api
        client = OpenAI(base_url=st.base + "/v1", api_key=KEY, max_retries=0)
        path = os.path.join(tmp, "in.jsonl")
        with open(path, "w") as f:
            for i in range(a.n):
                f.write(json.dumps({"custom_id": "r%d" % i, "method": "POST",
                                    "url": "/v1/chat/completions",
                                    "body": {"model": "echo", "max_tokens": 32, "messages": [
                                        {"role": "user", "content": "request number %d" % i}]}})
                        + "\n")
        via_submit(a.medley, url, path, os.path.join(tmp, "warm.jsonl"))  # warm the worker
        sub, apis, sub_cpu, api_cpu, sdk_cpu = [], [], [], [], []
        for rep in range(a.reps):
            order = [0, 1] if rep % 2 == 0 else [1, 0]
            for which in order:
                if which == 0:
                    c0 = children_cpu()
                    sub.append(via_submit(a.medley, url, path, os.path.join(tmp, "s.jsonl")))
                    sub_cpu.append(children_cpu() - c0)
                else:
                    c0, s0 = proc_cpu(api.pid), self_cpu()
                    t, batch = via_api(client, path, os.path.join(tmp, "a.jsonl"))
                    apis.append(t)
                    api_cpu.append(proc_cpu(api.pid) - c0)
                    sdk_cpu.append(self_cpu() - s0)
        lines = sum(1 for _ in open(os.path.join(tmp, "a.jsonl")))
        if lines != a.n:
            raise SystemExit("the API's output file has %d lines, not %d" % (lines, a.n))
        rps = get_rps(st.host, st.port, batch)
        bs, ba = min(sub), min(apis)
        print("%d-line echo batch, best of %d: submit+results %.2f s, api %.2f s; "
              "ratio submit/api %.2fx" % (a.n, a.reps, bs, ba, bs / ba))
        ms, ma = statistics.median(sub), statistics.median(apis)
        print("median: submit+results %.2f s, api %.2f s; ratio %.2fx" % (ms, ma, ms / ma))
        print("all runs: submit %s, api %s" % (["%.2f" % x for x in sub],
                                               ["%.2f" % x for x in apis]))
        print("load average at the end: %.2f %.2f %.2f" % os.getloadavg())
        print("CPU seconds of medley's side (the worker's excluded, the same in both): "
              "submit+results %s, medley api %s" % (["%.2f" % x for x in sub_cpu],
                                                   ["%.2f" % x for x in api_cpu]))
        print("CPU seconds of the openai SDK client (Python, this process) in the API path: %s"
              % ["%.2f" % x for x in sdk_cpu])
        print("GET /v1/batches/{id}: %.0f requests/s (4 keep-alive clients, 5 s)" % rps)


if __name__ == "__main__":
    sys.exit(main())
