"""metrics_prometheus.py — `medley worker --metrics` and `medley scheduler --metrics` as a real
Prometheus sees them (docs/operations.md, "Metrics"): a worker serving the echo model runs a
batch of good and malformed lines; its /metrics text passes `promtool check metrics`; a real
`prometheus` server on loopback scrapes the worker and the scheduler every second, and the
counters queried back through its HTTP API equal what the batch's output lines say
(requests succeeded and failed by code, prompt and completion tokens). The scheduler's text
passes promtool too; other paths answer 404, other methods 405, and a port already taken
stops a second worker with that said.

Slowloris (issue 39 item 17): while Prometheus scrapes, 64 connections from two other
loopback addresses (127.0.0.2, 127.0.0.3) send a request's headers a byte at a time and never
finish; every scrape must still succeed (`min_over_time(up[...])` stays 1), and `medley
dashboard` must keep answering beside them. A flood of 300 connections logs a handful of
warnings, not one per connection. The vLLM-style families (end-to-end latency, time per
output token, finish reasons, prompt and generation lengths, process_*, medley_build_info,
the heartbeat age) are read back through Prometheus too.

Needs prometheus and promtool (Debian's prometheus package; scripts/setup.sh installs it):
missing, the test fails."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (MEDLEY, RedisServer, Worker, chat_line, fail, free_port, results, submit,
                     wait_batch, write_lines)
import socket

N_GOOD = 30


def get(url, method="GET"):
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(port, timeout=10):
    deadline = time.time() + timeout
    while True:
        try:
            status, text = get("http://127.0.0.1:%d/metrics" % port)
            if status == 200:
                return text
        except (urllib.error.URLError, ConnectionError):
            pass
        if time.time() > deadline:
            fail("nothing answered on 127.0.0.1:%d/metrics" % port)
        time.sleep(0.1)


def promtool_check(text, what):
    p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=30)
    if p.returncode != 0:
        fail("promtool check metrics on the %s's text: %s%s" % (what, p.stdout, p.stderr))


def sample(text, name, labels=""):
    """The value of the series `name{labels}` in an exposition text, or None."""
    want = name + ("{%s}" % labels if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return None


def query(prom_port, expr):
    """Instant query through Prometheus's HTTP API: [(labels, value)]."""
    url = "http://127.0.0.1:%d/api/v1/query?%s" % (prom_port, urllib.parse.urlencode({"query": expr}))
    status, body = get(url)
    if status != 200:
        fail("Prometheus query %s: HTTP %d %s" % (expr, status, body[:300]))
    doc = json.loads(body)
    return [(r["metric"], float(r["value"][1])) for r in doc["data"]["result"]]


def slowloris(port, source, n):
    """n connections from source that send headers slowly and never end them."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind((source, 0))
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        except OSError:
            pass
        socks.append(s)
    return socks


def trickle(socks):
    for s in socks:
        try:
            s.sendall(b"X-a: b\r\n")
        except OSError:
            pass


def main():
    for tool in ("prometheus", "promtool"):
        if not shutil.which(tool):
            fail("%s not found: install Debian's prometheus package (scripts/setup.sh)" % tool)
    server = RedisServer()
    tmp = tempfile.mkdtemp(prefix="medley-it-prom-")
    procs = []
    worker = None
    try:
        wport, sport, pport = free_port(), free_port(), free_port()
        worker = Worker(server, args=["--metrics", "127.0.0.1:%d" % wport, "--id", "w-metrics",
                                      "--usd-per-hour", "3.6"], name="metrics")
        text = scrape(wport)
        if sample(text, "medley_worker_info", 'worker="w-metrics"') != 1:
            fail("no medley_worker_info for w-metrics:\n" + text[:1000])
        if get("http://127.0.0.1:%d/other" % wport)[0] != 404:
            fail("/other did not answer 404")
        if get("http://127.0.0.1:%d/metrics" % wport, method="POST")[0] != 405:
            fail("POST /metrics did not answer 405")

        # A second worker on the same port stops at once, saying why.
        p = subprocess.run([MEDLEY, "worker", "--model", "echo", "--redis", server.url,
                            "--metrics", "127.0.0.1:%d" % wport, "--log-text"],
                           capture_output=True, text=True, timeout=30)
        if p.returncode == 0 or "is taken" not in p.stdout + p.stderr:
            fail("a worker on a taken port: exit %d, %s" % (p.returncode, p.stdout + p.stderr))

        lines = [chat_line("ok-%d" % i, "hello number %d" % i) for i in range(N_GOOD)]
        lines.append(chat_line("hot", "x", temperature=7))          # invalid_value
        lines.append(chat_line("typed", "x", max_tokens="ten"))     # invalid_type
        batch = submit(server, write_lines(server.dir, "in.jsonl", lines))
        m = wait_batch(server, batch, timeout=60)
        if m.get("status") != "completed":
            fail("batch ended %s" % m)
        out = results(server, batch)
        ok = [l for l in out if l["error"] is None and l["response"]["status_code"] == 200]
        bad = [l for l in out if l not in ok]
        codes = {}
        for l in bad:
            c = l["response"]["body"]["error"]["code"] if l["response"] else l["error"]["code"]
            codes[c] = codes.get(c, 0) + 1
        prompt = sum(l["response"]["body"]["usage"]["prompt_tokens"] for l in ok)
        completion = sum(l["response"]["body"]["usage"]["completion_tokens"] for l in ok)
        if len(ok) != N_GOOD or sum(codes.values()) != 2:
            fail("expected %d good and 2 failed lines, got %d and %s" % (N_GOOD, len(ok), codes))

        text = scrape(wport)
        promtool_check(text, "worker")
        for name in ("medley_requests_started_total", "medley_requests_succeeded_total"):
            if sample(text, name, 'model="echo"') != N_GOOD:
                fail("%s is %s, not %d" % (name, sample(text, name, 'model="echo"'), N_GOOD))
        if sample(text, "medley_time_to_first_token_seconds_count", 'model="echo"') != N_GOOD:
            fail("time to first token observed %s times" %
                 sample(text, "medley_time_to_first_token_seconds_count", 'model="echo"'))
        deadline = time.time() + 5  # queue gauges are read from Redis once a second
        while sample(text, "medley_queue_lag_entries", 'stream="medley:q:{echo}"') != 0:
            if time.time() > deadline:
                fail("queue lag of medley:q:{echo} is not 0 after the batch:\n" + text)
            time.sleep(0.2)
            text = scrape(wport)

        # The scheduler: its text passes promtool, and it is scraped beside the worker.
        sched_log = open(os.path.join(tmp, "scheduler.log"), "w")
        sched = subprocess.Popen([MEDLEY, "scheduler", "--redis", server.url, "--interval", "0.2",
                                  "--metrics", "127.0.0.1:%d" % sport],
                                 stdout=sched_log, stderr=subprocess.STDOUT)
        procs.append(sched)
        stext = scrape(sport)
        deadline = time.time() + 10
        while sample(stext, "medley_scheduler_rounds_total") in (None, 0.0):
            if time.time() > deadline:
                fail("the scheduler ran no round:\n" + stext)
            time.sleep(0.2)
            stext = scrape(sport)
        promtool_check(stext, "scheduler")
        if sample(stext, "medley_scheduler_leader") != 1:
            fail("the only scheduler is not the leader:\n" + stext)

        # A real Prometheus scraping both every second.
        cfg = os.path.join(tmp, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n"
                    "  - job_name: medley-worker\n    static_configs:\n"
                    "      - targets: ['127.0.0.1:%d']\n"
                    "  - job_name: medley-scheduler\n    static_configs:\n"
                    "      - targets: ['127.0.0.1:%d']\n" % (wport, sport))
        prom_log = open(os.path.join(tmp, "prometheus.log"), "w")
        prom = subprocess.Popen(["prometheus", "--config.file", cfg,
                                 "--storage.tsdb.path", os.path.join(tmp, "tsdb"),
                                 "--web.listen-address", "127.0.0.1:%d" % pport],
                                stdout=prom_log, stderr=subprocess.STDOUT)
        procs.append(prom)
        deadline = time.time() + 40
        got = []
        while time.time() < deadline:
            try:
                got = query(pport, 'medley_requests_succeeded_total{model="echo"}')
                if got and query(pport, "medley_scheduler_leader"):
                    break
            except (urllib.error.URLError, ConnectionError, ValueError, KeyError):
                pass
            if prom.poll() is not None:
                break
            time.sleep(0.5)
        if not got:
            prom_log.flush()
            with open(os.path.join(tmp, "prometheus.log")) as f:
                fail("Prometheus never scraped the worker:\n" + f.read()[-3000:])

        def one(expr):
            r = query(pport, expr)
            if len(r) != 1:
                fail("%s: expected one series, got %s" % (expr, r))
            return r[0][1]

        checks = [
            ('medley_requests_succeeded_total{job="medley-worker",model="echo"}', N_GOOD),
            ('medley_requests_started_total{model="echo"}', N_GOOD),
            ('sum(medley_requests_failed_total{model="echo"})', 2),
            ('medley_prompt_tokens_total{model="echo"}', prompt),
            ('medley_completion_tokens_total{model="echo"}', completion),
            ('medley_time_to_first_token_seconds_count{model="echo"}', N_GOOD),
            ('medley_dead_letters_total{model="echo"}', 0),
            ("medley_device_usd_per_hour", 3.6),
            ("medley_scheduler_leader", 1),
        ]
        for expr, want in checks:
            v = one(expr)
            if v != want:
                fail("Prometheus says %s = %s; the batch says %s" % (expr, v, want))
        for code, n in codes.items():
            v = one('medley_requests_failed_total{model="echo",code="%s"}' % code)
            if v != n:
                fail("failed{code=%s} = %s, the batch has %d" % (code, v, n))
        if one('medley_worker_info{worker="w-metrics"}') != 1:
            fail("medley_worker_info missing")
        for expr, want in (
                ('medley_e2e_request_latency_seconds_count{model="echo"}', N_GOOD),
                ('medley_time_to_first_token_seconds_count{model="echo"}', N_GOOD),
                ('sum(medley_requests_finished_total{model="echo"})', N_GOOD),
                ('medley_request_prompt_tokens_sum{model="echo"}', prompt),
                ('medley_request_generation_tokens_sum{model="echo"}', completion),
                ('count(medley_build_info{job="medley-worker"})', 1),
                ('count(medley_build_info{job="medley-scheduler"})', 1),
                ('count(process_start_time_seconds > 0)', 2)):
            v = one(expr)
            if v != want:
                fail("Prometheus says %s = %s, want %s" % (expr, v, want))
        if not one('process_resident_memory_bytes{job="medley-worker"}') > 1e6:
            fail("process_resident_memory_bytes of the worker is implausible")
        if not one("medley_worker_heartbeat_age_seconds") < 10:
            fail("the heartbeat age of a live worker is over 10 s")

        # Slowloris: 64 slow connections from two other addresses; scrapes go on.
        dash_log = open(os.path.join(tmp, "dashboard.log"), "w")
        dport = free_port()
        dash = subprocess.Popen([MEDLEY, "dashboard", "--listen", "127.0.0.1:%d" % dport,
                                 "--redis", server.url], stdout=dash_log,
                                stderr=subprocess.STDOUT)
        procs.append(dash)
        for _ in range(100):
            try:
                if get("http://127.0.0.1:%d/api/config" % dport)[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        socks = (slowloris(wport, "127.0.0.2", 32) + slowloris(wport, "127.0.0.3", 32)
                 + slowloris(dport, "127.0.0.2", 32) + slowloris(dport, "127.0.0.3", 32))
        t0 = time.time()
        try:
            while time.time() - t0 < 8:
                trickle(socks)
                t = time.time()
                try:
                    st, _ = get("http://127.0.0.1:%d/api/config" % dport)
                except (OSError, urllib.error.URLError):
                    st = None
                if st != 200 or time.time() - t > 2:
                    fail("the dashboard did not answer within 2 s beside 64 slow connections")
                time.sleep(1)
            v = one('min_over_time(up{job="medley-worker"}[6s])')
            if v != 1:
                fail("a scrape failed while 64 slow connections were open (up fell to %s)" % v)
            # a flood: 300 connections from one address, opened and closed at once
            for _ in range(300):
                s = socket.socket()
                s.bind(("127.0.0.4", 0))
                try:
                    s.connect(("127.0.0.1", wport))
                except OSError:
                    pass
                socks.append(s)
            time.sleep(1)
        finally:
            for s in socks:
                s.close()
        n_warn = worker.logs().count("HTTP server:")
        if n_warn > 5:
            fail("a connection flood wrote %d HTTP warnings (want at most 5):\n%s"
                 % (n_warn, worker.logs()[-2000:]))
        print("ok: scrapes and the dashboard kept answering beside 64 slow connections each; "
              "the flood logged %d warnings" % n_warn)
        if not one("medley_device_cost_usd_total") > 0:
            fail("medley_device_cost_usd_total did not grow at $3.6/h")
        print("ok: promtool passes worker and scheduler text; Prometheus reads back %d "
              "succeeded, failed %s, %d prompt and %d completion tokens" %
              (N_GOOD, codes, prompt, completion))
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if worker:
            worker.stop()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
