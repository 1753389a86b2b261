"""chaos.py — the queue under random faults (issue 25 item 9): echo requests through real
`medley worker` processes and a real redis-server while a seeded fault injector SIGKILLs and
SIGSTOPs workers, restarts Redis, drops every client connection (CLIENT KILL) and fills
Redis's memory; then every request must be answered exactly once, successfully.

Phases:
  1. baseline: --baseline-requests echo requests, no faults: throughput (req/s).
  2. chaos: --requests requests in batches of --batch-size, submitted at --load x the
     baseline throughput (0.8: the workers have free slots, as in a steady state; 0: all at
     once, a backlog), while the injector
     injects one fault at a time (rounds of the selected kinds in a seeded random order, so
     every kind comes up as often as the others) with a random gap; with probability
     --overlap (0.3) a fault runs in the background so the next one overlaps it (a connection
     drop during a memory-full episode, a kill while Redis is away); until --max-faults faults,
     --duration seconds, or the work is done, whichever comes first.
  3. drain: after the last fault is undone (worker resumed, Redis up, maxmemory restored),
     wait up to --drain-timeout s for every batch to reach a terminal state and the queue
     stream to have nothing pending.

Fault kinds (--kinds, comma list; default all):
  kill      SIGKILL a worker; restarted after 0-1 s like a supervisor would, half the time
            with the same --id (it re-reads its own pending entries), half with a new one
            (its entries are taken over after --visibility-ms)
  stop      SIGSTOP a worker for 0.3-2.5 x the visibility timeout, then SIGCONT (so its
            entries are sometimes taken over while it sleeps, and it wakes up holding them)
  restart   Redis (appendonly yes, appendfsync always: every acknowledged write survives)
            stopped by SIGTERM or SIGKILL, started again after 0.3-2 s on the same port
  clientkill  CLIENT KILL TYPE normal: the server closes every client connection: once
            (40%), a burst of 3-5 drops 0.1-0.5 s apart (35%), or such a burst and then a
            worker stalled by SIGSTOP past the visibility timeout (25%: what it held through
            the burst is taken over)
  oom       CONFIG SET maxmemory <used_memory> with maxmemory-policy noeviction for 1.5-4 s,
            then maxmemory 0 again
  failover  Sentinel failover (class Failover): with this kind the run's Redis is two nodes
            (a primary and its replica, `min-replicas-to-write 1`) and three redis-sentinel,
            and the workers and submits take the sentinel:// URL; the other kinds hit
            whichever node is primary. SENTINEL FAILOVER (the primary demoted, still up) or
            SIGKILL of the primary (the replica promoted; it may miss the last writes), then
            the killed node back as a replica. Skipped with a note where `medley worker
            --help` names no sentinel:// URL.

Counts, per batch then summed: lost (a submitted custom_id with no line in {B}:out of a batch
that is terminal), doubled (a custom_id with more than one line), stuck (a custom_id with no
line in a batch that is not terminal at the drain timeout, plus entries still pending or left
in the queue stream), error answers by error code, the DLQ's length, and the attempts
histogram of the answers. Worker logs go to files in the run's temp dir (a worker in a hot
loop cannot flood the console); the summary prints their sizes and most frequent messages.

Failure rule (exit 1): any lost, doubled or stuck request; any error answer (every request
is a valid echo request, so an error line means a fault reached the client: with the default
--max-attempts 3 a request is dead-lettered as max_attempts_exceeded only after three
deliveries without an answer, which these faults must not cause, a handful at a time; give
--allow-error CODE to tolerate a code while a known defect is being fixed); a batch whose
meta counters disagree with its lines; a max_attempts_exceeded answer without its DLQ entry;
a worker that exited without being killed by us; a worker process that logged more than
--max-log-lines lines (2,000: a healthy one logs a few dozen here; one in a hot loop logged
tens of thousands a second before issue 25's fixes).

Runs:
  CI (ctest -L chaos):  python3 tests/chaos/chaos.py --short
      5,000 requests, 3 workers, 3 faults of each kind (18), about 2 minutes on two cores
  long, by hand:        MEDLEY_BIN=build/cli/medley python3 tests/chaos/chaos.py \\
                            --requests 50000 --workers 4 --seed 7 --json /tmp/chaos.json
      faults until the work is done; about 10 minutes (tests/chaos/README.md)

Environment: MEDLEY_BIN, MEDLEY_REDIS_SERVER (as tests/integration/harness.py)."""
import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import MEDLEY, RedisServer, chat_line, write_lines  # noqa: E402

import redis  # noqa: E402

TERMINAL = ("completed", "failed", "cancelled", "expired")
MODEL = "echo"
QUEUE = "medley:q:{%s}" % MODEL
DLQ = "medley:dlq:{%s}" % MODEL


def log(msg):
    print("[%7.1fs] %s" % (time.time() - T0, msg), flush=True)


T0 = time.time()


class Worker:
    """One worker slot: a `medley worker` process restarted as a supervisor would; each
    incarnation writes its own log file in the run dir."""

    def __init__(self, chaos, slot):
        self.chaos = chaos
        self.slot = slot
        self.incarnation = 0
        self.proc = None
        self.log_paths = []
        self.expected_exit = False
        self.stopped = False
        self.id = "w%d" % slot
        self.start()

    def start(self, new_id=False):
        if new_id:
            self.id = "w%d-%d" % (self.slot, self.incarnation)
        path = os.path.join(self.chaos.dir, "worker-%s.%d.log" % (self.id, self.incarnation))
        self.log_paths.append(path)
        self.incarnation += 1
        a = self.chaos.args
        cmd = [MEDLEY, "worker", "--redis", self.chaos.srv.url, "--model", MODEL, "--id", self.id,
               "--echo-delay-ms", str(a.echo_delay_ms), "--max-seqs", str(a.max_seqs),
               "--visibility-ms", str(a.visibility_ms), "--heartbeat-ms", "500",
               "--max-attempts", str(a.max_attempts), "--block-ms", "200"]
        with open(path, "w") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        self.expected_exit = False
        self.stopped = False

    def alive(self):
        return self.proc.poll() is None


class Chaos:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        kinds = args.kinds.split(",")
        self.sentinel = None
        if "failover" in kinds:
            ok, note = Failover.available()
            if ok:
                self.sentinel = Failover()
            else:
                log("failover: skipped: " + note)
        # self.srv: url, port, proc of the Redis the faults hit (the current primary)
        self.srv = self.sentinel or RedisServer(appendonly=True)
        self.dir = self.srv.dir
        self.node_lock = threading.Lock()  # restart and failover: one at a time
        self.workers = []
        self.faults = collections.Counter()  # kind or kind:variant -> count
        self.faults_busy = 0  # faults injected while work was outstanding
        self.fault_log = []
        self.unexpected_exits = []
        self.lock = threading.Lock()
        self.stop_inject = threading.Event()
        self.busy = collections.defaultdict(threading.Lock)  # kind -> held while injecting
        self.bg = []  # threads of overlapping faults
        self.inject_err = []
        self.redis_faults = 0  # Redis restarts and memory-full episodes under way
        self.submit_failed = []
        self.takeovers = []  # (killed consumer, entries it held, seconds until taken over)
        self.submitting = threading.Event()

    # --- Redis access that survives the faults -----------------------------------------
    def client(self):
        return redis.Redis(host="127.0.0.1", port=self.srv.port, decode_responses=True,
                           socket_timeout=10, socket_connect_timeout=2)

    def retry(self, fn, what, timeout=60):
        deadline = time.time() + timeout
        while True:
            try:
                return fn(self.client())
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                    redis.exceptions.BusyLoadingError) as e:
                if time.time() > deadline:
                    raise RuntimeError("%s: Redis unreachable for %d s: %s" % (what, timeout, e))
                time.sleep(0.1)

    # --- workload ---------------------------------------------------------------------
    def submit(self, tag, n, size, batches, rate=0):
        """Batches of `size` echo requests, n in all, into `batches` ({batch: [custom_ids]});
        with a rate (req/s), paced so that the workers are not saturated. A submission that
        fails (a fault hit it) is set aside in self.submit_failed and sent again under a new
        batch id: its requests are not counted, the new batch's are."""
        t0 = time.time()
        for b0 in range(0, n, size):
            if rate:
                time.sleep(max(0.0, t0 + b0 / rate - time.time()))
            ids = ["%s-%06d" % (tag, i) for i in range(b0, min(n, b0 + size))]
            for attempt in range(20):
                while self.redis_faults:
                    time.sleep(0.05)
                bid = "chaos-%s-s%d-%d%s" % (tag, self.args.seed, b0 // size,
                                              "-r%d" % attempt if attempt else "")
                path = write_lines(self.dir, bid + ".jsonl",
                                   [chat_line(c, "chaos %s" % c) for c in ids])
                p = subprocess.run([MEDLEY, "submit", path, "--redis", self.srv.url, "--model",
                                    MODEL, "--batch-id", bid], capture_output=True, text=True,
                                   timeout=300)
                os.unlink(path)
                m = {} if p.returncode == 0 else self.retry(
                    lambda c: c.hgetall("medley:{%s}:meta" % bid), "meta")
                if p.returncode == 0 or (m.get("status") not in (None, "failed", "validating")
                                         and m.get("total") == str(len(ids))):
                    with self.lock:
                        batches[bid] = ids
                    break
                self.submit_failed.append((bid, p.stderr.strip()[:200], m.get("status")))
                log("submit %s failed (%s); again as a new batch" % (bid, p.stderr.strip()[:120]))
                time.sleep(0.5)
            else:
                raise RuntimeError("medley submit failed 20 times for one batch")
        return batches

    def progress(self, batches):
        with self.lock:
            batches = list(batches)

        def f(c):
            pipe = c.pipeline(transaction=False)
            for b in batches:
                pipe.hmget("medley:{%s}:meta" % b, "status", "completed", "failed", "total")
            return pipe.execute()
        done, terminal = 0, 0
        for st, comp, failed, _ in self.retry(f, "progress"):
            done += int(comp or 0) + int(failed or 0)
            terminal += st in TERMINAL
        return done, terminal

    def queue_left(self):
        def f(c):
            try:
                pend = c.xpending(QUEUE, "workers")["pending"]
            except redis.exceptions.ResponseError:
                pend = 0
            return pend, c.xlen(QUEUE)
        return self.retry(f, "queue")

    def wait_done(self, batches, timeout, total):
        """Until every batch is terminal and nothing is pending; returns seconds waited, or
        None at the timeout."""
        t0 = time.time()
        last = 0
        while time.time() - t0 < timeout:
            done, terminal = self.progress(batches)
            if terminal == len(batches) and self.queue_left() == (0, 0):
                return time.time() - t0
            if time.time() - last > 5:
                last = time.time()
                pend, qlen = self.queue_left()
                log("progress %d/%d answered, %d/%d batches terminal, %d pending, %d in stream"
                    % (done, total, terminal, len(batches), pend, qlen))
            self.supervise()
            time.sleep(0.2)
        return None

    def supervise(self):
        """Restart a worker that died without being killed by the injector, and note it."""
        with self.lock:
            for w in self.workers:
                if not w.alive() and not w.expected_exit:
                    rc = w.proc.returncode
                    with open(w.log_paths[-1], errors="replace") as f:
                        last = (f.read().strip().splitlines() or [""])[-1][:300]
                    self.unexpected_exits.append((w.id, rc, os.path.basename(w.log_paths[-1]),
                                                  last))
                    log("worker %s exited by itself (rc %d); restarting it" % (w.id, rc))
                    w.start()

    # --- faults -----------------------------------------------------------------------
    def fault_kill(self, rng):
        with self.lock:
            w = rng.choice(self.workers)
            if w.stopped:
                os.kill(w.proc.pid, signal.SIGCONT)
            w.expected_exit = True
            w.proc.send_signal(signal.SIGKILL)
            w.proc.wait()
        t_kill = time.time()
        time.sleep(rng.uniform(0, 1))
        new_id = rng.random() < 0.5
        old = w.id
        with self.lock:
            w.start(new_id=new_id)
        if new_id:
            threading.Thread(target=self.watch_takeover, args=(old, t_kill),
                             daemon=True).start()
        return "kill:" + ("new-id" if new_id else "same-id"), "%s -> %s" % (old, w.id)

    def watch_takeover(self, consumer, t0):
        """Seconds until nothing is pending for a killed consumer name (its entries taken
        over by the others) from the kill at t0, into self.takeovers; None after 120 s."""
        def held(c):
            try:
                return len(c.xpending_range(QUEUE, "workers", min="-", max="+", count=100000,
                                            consumername=consumer))
            except redis.exceptions.ResponseError:
                return 0
        n0 = None
        while time.time() - t0 < 120:
            n = self.retry(held, "takeover watch")
            n0 = n if n0 is None else n0
            if n == 0:
                with self.lock:
                    self.takeovers.append((consumer, n0, round(time.time() - t0, 2)))
                return
            time.sleep(0.1)
        with self.lock:
            self.takeovers.append((consumer, n0, None))

    def fault_stop(self, rng):
        w = rng.choice(self.workers)
        secs = rng.uniform(0.3, 2.5) * self.args.visibility_ms / 1000.0
        with self.lock:
            w.proc.send_signal(signal.SIGSTOP)
            w.stopped = True
        long_ = secs * 1000 > self.args.visibility_ms
        self.stop_inject.wait(secs)
        with self.lock:
            if w.alive():
                w.proc.send_signal(signal.SIGCONT)
            w.stopped = False
        return "stop:" + ("past-visibility" if long_ else "short"), "%s %.1fs" % (w.id, secs)

    def redis_fault(self, d):
        with self.lock:
            self.redis_faults += d

    def fault_restart(self, rng):
        hard = rng.random() < 0.5
        with self.node_lock:
            self.redis_fault(1)
            node = self.sentinel.primary() if self.sentinel else self.srv
            p = node.proc
            p.send_signal(signal.SIGKILL if hard else signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            down = rng.uniform(0.3, 2.0)
            time.sleep(down)
            if self.sentinel:
                self.sentinel.restart(node)  # a replica if the Sentinels promoted the other
            else:
                node.start()
            self.redis_fault(-1)
        return "restart:" + ("sigkill" if hard else "sigterm"), "down %.1fs" % down

    def fault_failover(self, rng):
        with self.node_lock:
            self.redis_fault(1)
            try:
                return self.sentinel.failover(rng)
            finally:
                self.redis_fault(-1)

    def fault_clientkill(self, rng):
        """Once; or a burst of 3-5 drops 0.1-0.5 s apart (a flapping network: the workers
        reconnect between the drops while holding the same entries); or such a burst and then
        one worker stalled (SIGSTOP) for 1.5-2.5 x the visibility timeout, so the entries it
        held through the burst are taken over by the others."""
        r = rng.random()
        variant = "once" if r < 0.4 else "burst" if r < 0.75 else "burst-stall"
        times = 1 if variant == "once" else rng.randint(3, 5)
        closed = []
        for i in range(times):
            if i:
                time.sleep(rng.uniform(0.1, 0.5))
            closed.append(self.retry(
                lambda c: c.execute_command("CLIENT", "KILL", "TYPE", "normal"), "client kill"))
        detail = "connections closed: %s" % "+".join(map(str, closed))
        if variant == "burst-stall":
            time.sleep(0.3)  # the workers reconnect after the last drop
            w = rng.choice(self.workers)
            secs = rng.uniform(1.5, 2.5) * self.args.visibility_ms / 1000.0
            with self.lock:
                w.proc.send_signal(signal.SIGSTOP)
                w.stopped = True
            self.stop_inject.wait(secs)
            with self.lock:
                if w.alive():
                    w.proc.send_signal(signal.SIGCONT)
                w.stopped = False
            detail += "; then %s stopped %.1fs" % (w.id, secs)
        return "clientkill:" + variant, detail

    def fault_oom(self, rng):
        secs = rng.uniform(1.5, 4.0)

        def fill(c):
            used = int(c.info("memory")["used_memory"])
            c.config_set("maxmemory-policy", "noeviction")
            c.config_set("maxmemory", used)
            return used
        self.redis_fault(1)
        used = self.retry(fill, "oom")
        self.stop_inject.wait(secs)
        self.retry(lambda c: c.config_set("maxmemory", 0), "oom restore")
        if self.sentinel:
            self.sentinel.unlimit()
        self.redis_fault(-1)
        return "oom", "maxmemory %d B for %.1fs" % (used, secs)

    def injector(self, batches, total):
        kinds = list(self.kinds)
        t_end = time.time() + self.args.duration if self.args.duration else None
        n = 0
        order = []
        while not self.stop_inject.is_set():
            if self.args.max_faults is not None and n >= self.args.max_faults:
                break
            if t_end and time.time() > t_end:
                break
            done, terminal = self.progress(batches)
            if terminal == len(batches) and not self.submitting.is_set():
                break
            if not order:
                order = kinds[:]
                self.rng.shuffle(order)
            kind = order.pop()
            # Overlap: in the background, so the next fault lands while this one lasts (a
            # connection drop during a memory-full episode, a kill while Redis is away); never
            # two of one kind at once.
            bg = self.rng.random() < self.args.overlap
            rng = random.Random(self.rng.getrandbits(64))
            self.busy[kind].acquire()
            n += 1
            th = threading.Thread(target=self.inject, args=(kind, rng, done, total, bg),
                                  daemon=True)
            th.start()
            if bg:
                self.bg.append(th)
            else:
                th.join()
            if self.inject_err:
                raise self.inject_err[0]
            self.stop_inject.wait(self.rng.uniform(0.2, 2 * self.args.fault_gap))
        for th in self.bg:
            th.join()
        if self.inject_err:
            raise self.inject_err[0]

    def inject(self, kind, rng, done, total, bg):
        t = time.time()
        try:
            variant, detail = getattr(self, "fault_" + kind)(rng)
        except Exception as e:  # a fault that could not be injected is a harness error
            log("fault %s failed to inject: %r" % (kind, e))
            self.inject_err.append(e)
            return
        finally:
            self.busy[kind].release()
        with self.lock:
            self.faults[kind] += 1
            if variant != kind:
                self.faults[variant] += 1
            if bg:
                self.faults["overlapping"] += 1
            self.faults_busy += done < total
            self.fault_log.append((round(t - T0, 1), variant, detail, bg))
        log("fault %-22s %s (%.1fs%s; at %d/%d answered)" % (
            variant, detail, time.time() - t, ", overlapped" if bg else "", done, total))

    # --- checks -----------------------------------------------------------------------
    def read_out(self, batch):
        """[(custom_id, line dict)] of {B}:out, in order."""
        key = "medley:{%s}:out" % batch
        out, start = [], "-"
        c = self.client()
        while True:
            chunk = c.xrange(key, min=start, max="+", count=5000)
            for eid, f in chunk:
                out.append((f.get("custom_id"), json.loads(f["line"])))
            if len(chunk) < 5000:
                return out
            start = "(" + chunk[-1][0]

    def check(self, batches, drained):
        r = {"lost": 0, "doubled": 0, "stuck": 0, "stuck_batches": 0, "errors": {},
             "attempts": {}, "meta_mismatch": [], "examples": {}}
        errors, attempts = collections.Counter(), collections.Counter()
        examples = collections.defaultdict(list)
        dead = set()  # (batch, custom_id) answered max_attempts_exceeded
        c = self.client()
        for b, ids in batches.items():
            m = c.hgetall("medley:{%s}:meta" % b)
            lines = self.read_out(b)
            seen = collections.Counter(cid for cid, _ in lines)
            missing = [i for i in ids if i not in seen]
            doubled = [k for k, v in seen.items() if v > 1]
            r["doubled"] += sum(seen[k] - 1 for k in doubled)
            examples["doubled"] += doubled[:3]
            if m.get("status") in TERMINAL:
                r["lost"] += len(missing)
                examples["lost"] += missing[:3]
            else:
                r["stuck"] += len(missing)
                r["stuck_batches"] += 1
                examples["stuck"] += missing[:3]
            for cid, l in lines:
                attempts[l.get("medley", {}).get("attempt", 0)] += 1
                if l.get("error") is not None:
                    code = l["error"].get("code", "?")
                    errors[code] += 1
                    if code == "max_attempts_exceeded":
                        dead.add((b, cid))
                    if len(examples[code]) < 2:
                        examples[code].append(json.dumps(l)[:400])
            comp, failed, total = (int(m.get(k, 0)) for k in ("completed", "failed", "total"))
            n_err = sum(1 for _, l in lines if l.get("error") is not None)
            if m.get("status") in TERMINAL and (total != len(ids) or comp + failed != len(seen)
                                                or failed != n_err):
                r["meta_mismatch"].append("%s: %s, %d distinct lines, %d submitted" % (
                    b, {k: m.get(k) for k in ("status", "total", "completed", "failed")},
                    len(seen), len(ids)))
        pend, qlen = self.queue_left()
        r["pending_left"], r["stream_left"] = pend, qlen
        r["stuck"] += pend
        r["dlq"] = c.xlen(DLQ)
        dlq = [f for _, f in c.xrange(DLQ, count=100000)]
        r["dlq_reasons"] = dict(collections.Counter(
            re.sub(r"\d+", "N", f.get("reason", "?")) for f in dlq))
        # every max_attempts_exceeded answer has its dead letter (docs/protocol.md §6: XADD to
        # the DLQ, then the answer)
        in_dlq = set()
        for f in dlq:
            try:
                in_dlq.add((f.get("batch"), json.loads(f.get("line", ""))["custom_id"]))
            except (ValueError, KeyError, TypeError):
                pass
        r["dlq_missing"] = len(dead - in_dlq)
        r["errors"] = dict(errors)
        r["attempts"] = {str(k): v for k, v in sorted(attempts.items())}
        r["examples"] = dict(examples)
        r["drained"] = drained
        return r

    def log_report(self):
        """Per worker log file: bytes, lines, most frequent messages (numbers folded)."""
        rep = []
        for w in self.workers:
            for p in w.log_paths:
                size = os.path.getsize(p)
                msgs = collections.Counter()
                n = 0
                with open(p, errors="replace") as f:
                    for line in f:
                        n += 1
                        try:
                            d = json.loads(line)
                            text = str(d.get("msg", line))
                        except ValueError:
                            text = line
                        msgs[re.sub(r"\d+", "N", text.strip())[:110]] += 1
                rep.append({"file": os.path.basename(p), "bytes": size, "lines": n,
                            "top": msgs.most_common(4)})
        return rep

    # --- run --------------------------------------------------------------------------
    def run(self):
        a = self.args
        res = {"seed": a.seed, "workers": a.workers, "max_attempts": a.max_attempts,
               "visibility_ms": a.visibility_ms, "echo_delay_ms": a.echo_delay_ms,
               "max_seqs": a.max_seqs, "kinds": self.kinds, "dir": self.dir}
        self.workers = [Worker(self, i) for i in range(a.workers)]
        # baseline
        if a.baseline_requests:
            base = self.submit("base", a.baseline_requests, a.batch_size, {})
            t = time.time()
            took = self.wait_done(base, 300, a.baseline_requests)
            if took is None:
                raise RuntimeError("the baseline (no faults) did not finish in 300 s")
            took = time.time() - t
            res["baseline"] = {"requests": a.baseline_requests, "seconds": round(took, 2),
                               "req_per_s": round(a.baseline_requests / took, 1)}
            log("baseline: %d requests in %.1fs, %.0f req/s" % (
                a.baseline_requests, took, a.baseline_requests / took))
        # chaos
        rate = a.load * res["baseline"]["req_per_s"] if a.load and a.baseline_requests else 0
        res["offered_req_per_s"] = round(rate, 1) if rate else "all at once"
        batches = {}
        self.submitting.set()
        sub_err = []

        def sub():
            try:
                self.submit("chaos", a.requests, a.batch_size, batches, rate)
            except Exception as e:
                sub_err.append(e)
            self.submitting.clear()
        t_chaos = time.time()
        ts = threading.Thread(target=sub, daemon=True)
        ts.start()
        if not rate:
            ts.join()
        log("chaos: %d requests in batches of %d, %s; faults: %s" % (
            a.requests, a.batch_size, "%.0f req/s offered" % rate if rate else "all submitted",
            ",".join(self.kinds)))
        inj_err = []

        def inj():
            try:
                self.injector(batches, a.requests)
            except Exception as e:
                inj_err.append(e)
        th = threading.Thread(target=inj, daemon=True)
        th.start()
        while th.is_alive() or ts.is_alive():
            self.supervise()
            th.join(0.25)
            ts.join(0.25)
        if inj_err or sub_err:
            raise (inj_err + sub_err)[0]
        t_faults_over = time.time()
        left = a.requests - self.progress(batches)[0]
        log("injector done: %d faults (%d while work was left); draining %d requests" % (
            sum(self.faults[k] for k in self.kinds), self.faults_busy, left))
        drain = self.wait_done(batches, a.drain_timeout, a.requests)
        t_end = time.time()
        res["chaos"] = {"requests": a.requests, "batches": len(batches),
                        "fault_window_s": round(t_faults_over - t_chaos, 2),
                        "left_after_faults": left,
                        "drain_s": round(drain, 2) if drain is not None else None,
                        "total_s": round(t_end - t_chaos, 2),
                        "req_per_s": round(a.requests / (t_end - t_chaos), 1)}
        res["submit_failed"] = self.submit_failed
        res["takeovers"] = self.takeovers
        res["faults"] = dict(self.faults)
        res["faults_while_busy"] = self.faults_busy
        res["fault_log"] = self.fault_log
        res["check"] = self.check(batches, drain is not None)
        res["unexpected_exits"] = self.unexpected_exits
        res["logs"] = self.stop_workers()
        return res

    def select_kinds(self):
        kinds = []
        for k in self.args.kinds.split(","):
            if k == "failover" and not self.sentinel:
                continue  # skipped, said at start
            if not hasattr(self, "fault_" + k):
                raise SystemExit("unknown fault kind %r" % k)
            kinds.append(k)
        if not kinds:
            raise SystemExit("no fault kinds selected")
        return kinds

    def stop_workers(self):
        for w in self.workers:
            if w.alive():
                w.expected_exit = True
                if w.stopped:
                    w.proc.send_signal(signal.SIGCONT)
                w.proc.terminate()
        for w in self.workers:
            try:
                rc = w.proc.wait(40)
                if rc != 0:
                    self.unexpected_exits.append((w.id, rc, "after SIGTERM"))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
                self.unexpected_exits.append((w.id, "no exit 40 s after SIGTERM", ""))
        return self.log_report()

    def close(self, keep):
        for w in self.workers:
            if w.proc and w.alive():
                w.proc.kill()
                w.proc.wait()
        if self.sentinel:
            self.sentinel.close()
        elif self.srv.proc and self.srv.proc.poll() is None:
            self.srv.proc.terminate()
            self.srv.proc.wait(30)
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


class Failover:
    """Sentinel topology for the failover kind: two redis-server nodes (appendonly, appendfsync
    always, `min-replicas-to-write 1` as docs/operations.md recommends: a primary cut from its
    replica refuses writes instead of accepting ones a failover would drop), the second a
    replica of the first, and three redis-sentinel (down-after 1 s). Workers and submits take
    the sentinel:// URL. `port`, `proc` and `client()` are the current primary's, so the other
    fault kinds hit whichever node is primary; `restart()` brings a stopped node back as a
    replica of the current primary when it no longer is one (as Sentinel would reconfigure
    it)."""

    BASE = ["--min-replicas-to-write", "1", "--min-replicas-max-lag", "10"]

    @staticmethod
    def available():
        p = subprocess.run([MEDLEY, "worker", "--help"], capture_output=True, text=True)
        if "sentinel" in (p.stdout + p.stderr).lower():
            return True, ""
        return False, "`medley worker --help` names no sentinel:// URL (no Sentinel support)"

    def __init__(self):
        import queue_sentinel as qs  # the Sentinel helpers of tests/integration
        self.qs = qs
        a = RedisServer(appendonly=True, args=self.BASE)
        b = RedisServer(appendonly=True, args=self.BASE + ["--replicaof", "127.0.0.1",
                                                           str(a.port)])
        self.nodes = [a, b]
        self.dir = a.dir
        self.sentinels = [qs.Sentinel(a.port, a.dir, i) for i in range(3)]
        self.url = "sentinel://%s/%s/0" % (
            ",".join("127.0.0.1:%d" % x.port for x in self.sentinels), qs.MASTER)
        deadline = time.time() + 60
        while not self.ready(a.port):
            if time.time() > deadline:
                raise RuntimeError("Sentinels not ready in 60 s")
            time.sleep(0.2)

    def ready(self, port):
        try:
            return self.qs.ready(self.sentinels, port, 1)
        except redis.exceptions.RedisError:
            return False

    def primary_port(self):
        for x in self.sentinels:
            p = x.master_port()
            if p:
                return p
        raise redis.exceptions.ConnectionError("no Sentinel answers")

    def primary(self):
        port = self.primary_port()
        return next(n for n in self.nodes if n.port == port)

    @property
    def port(self):
        return self.primary_port()

    @property
    def proc(self):
        return self.primary().proc

    def restart(self, node):
        """Start a stopped node again: as a replica of the current primary when another node
        is primary now, else as it was."""
        cur = self.primary_port()
        node.args = self.BASE + (["--replicaof", "127.0.0.1", str(cur)] if cur != node.port
                                 else [])
        node.start()

    def failover(self, rng):
        """SENTINEL FAILOVER (the primary hands over and stays up, demoted), or SIGKILL of the
        primary (the Sentinels find it down and promote the replica, which may miss the
        primary's last writes); then the killed node comes back as a replica. Waits until the
        Sentinels name the new primary and it has its replica again."""
        t0 = time.time()
        while not self.ready(self.primary_port()):  # a restart may still be settling
            if time.time() - t0 > 60:
                raise RuntimeError("the topology did not settle in 60 s before a failover")
            time.sleep(0.2)
        old = self.primary()
        t0 = time.time()
        hard = rng.random() < 0.5
        if hard:
            old.proc.send_signal(signal.SIGKILL)
            old.proc.wait()
        else:
            self.sentinels[rng.randrange(3)].client().execute_command(
                "SENTINEL", "FAILOVER", self.qs.MASTER)
        while True:
            try:
                if self.primary_port() != old.port:
                    break
            except redis.exceptions.RedisError:
                pass
            if time.time() - t0 > 60:
                raise RuntimeError("no new primary 60 s after the failover began")
            time.sleep(0.1)
        promoted = time.time() - t0
        new = self.primary()
        if hard:
            self.restart(old)
        while not self.ready(new.port):
            if time.time() - t0 > 90:
                raise RuntimeError("the topology did not settle 90 s after the failover")
            time.sleep(0.2)
        return ("failover:" + ("sigkill" if hard else "sentinel"),
                ":%d -> :%d, promoted in %.1fs, settled in %.1fs" % (
                    old.port, new.port, promoted, time.time() - t0))

    def unlimit(self):
        """maxmemory 0 on every node reachable (a memory-full episode may outlive a
        failover: its node is a replica by then)."""
        for n in self.nodes:
            try:
                n.client().config_set("maxmemory", 0)
            except redis.exceptions.RedisError:
                pass

    def close(self):
        for x in self.sentinels:
            try:
                x.stop()
            except subprocess.TimeoutExpired:
                x.proc.kill()
        for n in self.nodes:
            if n.proc and n.proc.poll() is None:
                n.proc.terminate()
                n.proc.wait(30)


def takeover_row(tk, visibility_ms):
    """After each kill with a new id: how long until the dead name held nothing."""
    if not tk:
        return "-"
    done = sorted(t for _, _, t in tk if t is not None)
    held = [n for _, n, _ in tk]
    return "%d killed names holding %d entries (max %d): all taken over in %s s (median), " \
        "%s s (max)%s; visibility %s" % (
            len(tk), sum(held), max(held), done[len(done) // 2] if done else "-",
            done[-1] if done else "-",
            ", %d not within 120 s" % (len(tk) - len(done)) if len(done) < len(tk) else "",
            "%.1f s" % (visibility_ms / 1000.0))


def summary(res, allow, max_log_lines):
    c = res["check"]
    b, ch = res.get("baseline", {}), res["chaos"]
    rows = [
        ("requests", "%d in %d batches (+%d baseline)" % (ch["requests"], ch["batches"],
                                                          b.get("requests", 0))),
        ("offered load", "%s req/s" % res["offered_req_per_s"]),
        ("submits failed", "%d (sent again as new batches)" % len(res["submit_failed"])),
        ("workers", "%d (max-seqs %d, echo %d ms, visibility %d ms, max-attempts %d)" % (
            res["workers"], res["max_seqs"], res["echo_delay_ms"], res["visibility_ms"],
            res["max_attempts"])),
        ("faults", ", ".join("%s %d" % kv for kv in sorted(res["faults"].items())) +
         " (%d while work was left)" % res["faults_while_busy"]),
        ("lost", c["lost"]), ("doubled", c["doubled"]),
        ("stuck", "%d (%d batches not terminal, %d pending, %d in stream)" % (
            c["stuck"], c["stuck_batches"], c["pending_left"], c["stream_left"])),
        ("error answers", json.dumps(c["errors"]) if c["errors"] else 0),
        ("dlq", "%d %s; %d max_attempts_exceeded answers without a dead letter" % (
            c["dlq"], json.dumps(c["dlq_reasons"]) if c["dlq"] else "", c["dlq_missing"])),
        ("attempts", json.dumps(c["attempts"])),
        ("meta mismatch", len(c["meta_mismatch"])),
        ("worker exits", len(res["unexpected_exits"])),
        ("takeover", takeover_row(res["takeovers"], res["visibility_ms"])),
        ("fault window", "%.1f s" % ch["fault_window_s"]),
        ("drain time", ("%.1f s" % ch["drain_s"] if ch["drain_s"] is not None else "TIMEOUT")
         + " (%d requests unanswered after the last fault)" % ch["left_after_faults"]),
        ("throughput", "%s req/s without faults, %.1f req/s with faults" % (
            b.get("req_per_s", "-"), ch["req_per_s"])),
        ("worker logs", "%d files, %.1f MB, %d lines" % (
            len(res["logs"]), sum(l["bytes"] for l in res["logs"]) / 1e6,
            sum(l["lines"] for l in res["logs"]))),
    ]
    print("\n== chaos summary (seed %d)" % res["seed"])
    for k, v in rows:
        print("  %-14s %s" % (k, v))
    big = sorted(res["logs"], key=lambda l: -l["bytes"])[:4]
    print("  largest worker logs:")
    for l in big:
        print("    %-28s %10d B %8d lines; top: %s" % (l["file"], l["bytes"], l["lines"],
                                                       "; ".join("%dx %s" % (n, m) for m, n in
                                                                 l["top"][:2])))
    for k, ex in c["examples"].items():
        if ex:
            print("  example %s: %s" % (k, ex[0] if isinstance(ex[0], str) else ex))
    for e in res["unexpected_exits"]:
        print("  worker exit: %s" % (e,))
    for m in c["meta_mismatch"][:5]:
        print("  meta mismatch: %s" % m)
    reasons = []
    if c["lost"]:
        reasons.append("%d lost" % c["lost"])
    if c["doubled"]:
        reasons.append("%d doubled" % c["doubled"])
    if c["stuck"]:
        reasons.append("%d stuck" % c["stuck"])
    bad_err = {k: v for k, v in c["errors"].items() if k not in allow}
    if bad_err:
        reasons.append("error answers %s" % json.dumps(bad_err))
    if c["dlq_missing"]:
        reasons.append("%d dead-lettered answers missing from the DLQ" % c["dlq_missing"])
    if c["meta_mismatch"]:
        reasons.append("%d batches with wrong counters" % len(c["meta_mismatch"]))
    flood = [l for l in res["logs"] if l["lines"] > max_log_lines]
    if flood:
        reasons.append("%d worker logs over %d lines (hot loop: %s)" % (
            len(flood), max_log_lines, flood[0]["top"][0][0][:60]))
    if res["unexpected_exits"]:
        reasons.append("%d unexpected worker exits" % len(res["unexpected_exits"]))
    return reasons


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--short", action="store_true", help="the CI form (about 60-90 s)")
    ap.add_argument("--requests", type=int, help="chaos-phase requests (50000; --short 5000)")
    ap.add_argument("--baseline-requests", type=int, help="no-fault phase (5000; --short 1000)")
    ap.add_argument("--batch-size", type=int, help="requests per batch (1000; --short 250)")
    ap.add_argument("--workers", type=int, help="worker processes (4; --short 3)")
    ap.add_argument("--kinds", default="kill,stop,restart,clientkill,oom,failover")
    ap.add_argument("--max-faults", type=int, help="stop injecting after N faults "
                    "(default: until the work is done; --short 3 per kind)")
    ap.add_argument("--duration", type=float, help="stop injecting after S seconds")
    ap.add_argument("--fault-gap", type=float, default=1.0, help="mean seconds between faults")
    ap.add_argument("--overlap", type=float, default=0.3,
                    help="probability that a fault runs in the background, overlapping the next")
    ap.add_argument("--load", type=float, default=0.8,
                    help="offered load, a fraction of the baseline throughput (0: every "
                    "request submitted at once, a backlog; 0.8: the workers have free slots, "
                    "as in a steady state)")
    ap.add_argument("--drain-timeout", type=float, default=120)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--echo-delay-ms", type=int, default=1000,
                    help="seconds-long requests, as an engine's are")
    ap.add_argument("--max-seqs", type=int, default=64, help="slots per worker (engine on cpu)")
    ap.add_argument("--visibility-ms", type=int, default=2000)
    ap.add_argument("--max-attempts", type=int, default=3, help="the worker's default")
    ap.add_argument("--allow-error", action="append", default=[], metavar="CODE",
                    help="do not fail on error answers with this code")
    ap.add_argument("--max-log-lines", type=int, default=2000,
                    help="fail when one worker process logs more lines than this (a hot loop)")
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs) on success")
    a = ap.parse_args()
    dflt = dict(requests=5000, baseline_requests=1000, workers=3, batch_size=250) if a.short \
        else dict(requests=50000, baseline_requests=5000, workers=4, batch_size=1000)
    for k, v in dflt.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    ch = Chaos(a)
    ch.kinds = ch.select_kinds()
    if a.short and a.max_faults is None:
        a.max_faults = 3 * len(ch.kinds)
    ok = False
    try:
        res = ch.run()
        reasons = summary(res, set(a.allow_error), a.max_log_lines)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
        if reasons:
            print("FAIL: " + "; ".join(reasons) + " (logs and Redis data kept in %s)" % ch.dir)
        else:
            ok = True
            print("ok: every request answered exactly once, successfully")
    finally:
        ch.close(keep=not ok or a.keep)
    sys.exit(0 if ok else 1)


main()
