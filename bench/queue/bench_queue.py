"""bench_queue.py — requests/s through the queue with the echo model (no delay): medley vs RQ
vs Celery (Redis broker + Redis result backend) doing the same no-op on the same machine in
the same run, each with ONE worker process that is started and warm before the clock starts.
Throughput = N / (first enqueue -> last result stored). Also the per-request overhead (p50/p99
ms): one request at a time, enqueue -> result readable by the client.

Install and run (Debian 12; medley built in build/):
    apt-get install -y redis-server
    python3 -m venv /opt/medley-venv && /opt/medley-venv/bin/pip install redis rq celery packaging
    /opt/medley-venv/bin/python bench/queue/bench_queue.py --medley build/cli/medley [-n 10000]

Prints one table with the ratios medley/RQ and medley/Celery."""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def body(i):
    return {"model": "echo", "max_tokens": 32, "messages": [{"role": "user", "content": "req %d" % i}]}


def line(i):
    return json.dumps({"custom_id": "b%d" % i, "method": "POST", "url": "/v1/chat/completions",
                       "body": body(i)})


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


class Server:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="medley-bench-")
        self.port = free_port()
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--save", "",
                                      "--appendonly", "no", "--dir", self.dir],
                                     stdout=subprocess.DEVNULL)
        self.url = "redis://127.0.0.1:%d/0" % self.port
        r = redis.Redis(port=self.port)
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)

    def flush(self):
        redis.Redis(port=self.port).flushall()

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def bench_medley(srv, medley, n, n_lat):
    r = redis.Redis(port=srv.port, decode_responses=True)
    w = subprocess.Popen([medley, "worker", "--redis", srv.url, "--model", "echo",
                          "--max-seqs", "256", "--log-text"], stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        path = os.path.join(srv.dir, "in.jsonl")
        with open(path, "w") as f:
            for i in range(n):
                f.write(line(i) + "\n")
        t0 = time.perf_counter()
        b = subprocess.run([medley, "submit", path, "--redis", srv.url, "--model", "echo"],
                           capture_output=True, text=True, check=True).stdout.strip()
        meta = "medley:{%s}:meta" % b
        while r.hget(meta, "status") != "completed":
            time.sleep(0.005)
        dt = time.perf_counter() - t0
        if int(r.hget(meta, "completed")) != n:
            raise SystemExit("medley lost requests")
        # latency: one request at a time through the protocol (docs/protocol.md §3, §5)
        lb = "lat1"
        now = int(time.time() * 1000)
        r.hset("medley:{%s}:meta" % lb, mapping={"status": "in_progress", "model": "echo",
                                                  "total": n_lat, "completed": 0, "failed": 0,
                                                  "created_at": now, "deadline": 0})
        lat, last = [], "0-0"
        for i in range(n_lat):
            t = time.perf_counter()
            r.xadd("medley:q:{echo}", {"batch": lb, "line": line(i)})
            got = r.xread({"medley:{%s}:out" % lb: last}, count=1, block=5000)
            lat.append((time.perf_counter() - t) * 1000)
            last = got[0][1][0][0]
        return n / dt, lat
    finally:
        w.terminate()
        w.wait()


def bench_rq(srv, n, n_lat):
    from rq import Queue, SimpleWorker
    from rq.registry import FinishedJobRegistry
    import peer_tasks
    r = redis.Redis(port=srv.port)
    env = dict(os.environ, PYTHONPATH=HERE)
    w = subprocess.Popen([sys.executable, "-m", "rq.cli", "worker", "-w", "rq.worker.SimpleWorker",
                          "-u", srv.url, "bench", "-q"], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        q = Queue("bench", connection=r)
        time.sleep(1.5)
        reg = FinishedJobRegistry(queue=q)
        t0 = time.perf_counter()
        for s in range(0, n, 1000):
            with r.pipeline() as pipe:
                q.enqueue_many([Queue.prepare_data(peer_tasks.echo, args=(body(i),),
                                                   result_ttl=3600)
                                for i in range(s, min(n, s + 1000))], pipeline=pipe)
                pipe.execute()
        while reg.count < n:
            time.sleep(0.005)
        dt = time.perf_counter() - t0
        lat = []
        for i in range(n_lat):
            t = time.perf_counter()
            job = q.enqueue(peer_tasks.echo, body(i))
            res = job.latest_result(timeout=10)
            if res is None:
                raise SystemExit("rq: no result")
            lat.append((time.perf_counter() - t) * 1000)
        return n / dt, lat
    finally:
        w.terminate()
        w.wait()


def bench_celery(srv, n, n_lat):
    env = dict(os.environ, PYTHONPATH=HERE, BENCH_REDIS=srv.url)
    os.environ["BENCH_REDIS"] = srv.url
    import importlib
    import peer_tasks
    importlib.reload(peer_tasks)
    from celery.result import ResultSet
    w = subprocess.Popen([sys.executable, "-m", "celery", "-A", "peer_tasks", "worker", "-P", "solo",
                          "-Q", "bench", "--without-heartbeat", "--without-gossip",
                          "--without-mingle", "-l", "ERROR"], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        app = peer_tasks.app
        time.sleep(3)
        t0 = time.perf_counter()
        rs = ResultSet([peer_tasks.celery_echo.delay(body(i)) for i in range(n)], app=app)
        rs.join_native(timeout=600)
        dt = time.perf_counter() - t0
        lat = []
        for i in range(n_lat):
            t = time.perf_counter()
            peer_tasks.celery_echo.delay(body(i)).get(timeout=10)
            lat.append((time.perf_counter() - t) * 1000)
        return n / dt, lat
    finally:
        w.terminate()
        w.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--medley", default=os.path.join(HERE, "..", "..", "build", "cli", "medley"))
    ap.add_argument("-n", type=int, default=10000, help="requests per system")
    ap.add_argument("--latency-n", type=int, default=300)
    ap.add_argument("--peers", default="rq,celery")
    a = ap.parse_args()
    srv = Server()
    rows = []
    try:
        rps, lat = bench_medley(srv, a.medley, a.n, a.latency_n)
        rows.append(("medley", rps, lat))
        for peer in a.peers.split(","):
            if not peer:
                continue
            srv.flush()
            fn = {"rq": bench_rq, "celery": bench_celery}[peer]
            rps_p, lat_p = fn(srv, a.n, a.latency_n)
            rows.append((peer, rps_p, lat_p))
    finally:
        srv.stop()
    print("queue throughput, echo model without delay, %d requests, one worker process each, "
          "Redis on 127.0.0.1 (%s)" % (a.n, time.strftime("%Y-%m-%d")))
    print("%-8s %12s %10s %10s %10s" % ("system", "req/s", "p50 ms", "p99 ms", "medley x"))
    for name, rps, lat in rows:
        print("%-8s %12.0f %10.2f %10.2f %10.1f" % (name, rps, pct(lat, 50), pct(lat, 99),
                                                    rows[0][1] / rps))


main()
