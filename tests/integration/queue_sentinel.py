"""queue_sentinel.py — acceptance: Redis failover through Sentinel. A primary, one replica and
three Sentinels on loopback; two echo workers and every client command take
`--redis sentinel://.../mm`.

1. The primary is SIGKILLed mid-batch while the replica is frozen (SIGSTOP), so the replica
   misses the primary's last writes, as asynchronous replication allows. The Sentinels
   promote the replica; the workers follow it; the batch completes on the new primary with
   every custom_id exactly once in its {B}:out, the answers the failover lost written again
   from redelivered entries. A `medley results --wait` started before the kill reconnects
   through the Sentinels and writes every custom_id once.
2. The old primary comes back (the Sentinels make it a replica) and `SENTINEL FAILOVER`
   hands the primary role back to it mid-batch while the demoted node stays up: the workers
   get -READONLY / -UNBLOCKED or a killed connection, follow, and the second batch also
   completes exactly once; the first batch is still whole on the final primary.
3. Without Sentinel (which kills the demoted node's clients), a primary demoted by hand
   keeps a plain redis:// worker connected: its -READONLY / -UNBLOCKED replies are treated as
   a lost connection, the worker retries with backoff, and once the node is primary again
   the third batch completes exactly once.

The guarantee tested is the one docs/protocol.md states: on the surviving primary every
custom_id is in {B}:out exactly once."""
import json
import os
import shutil
import signal
import subprocess
import time

from harness import *

MASTER = "mm"
N1 = 4000
N2 = 4000
N3 = 2000
SENTINEL_BIN = shutil.which("redis-sentinel")


def info_offset(client):
    return int(client.info("replication")["master_repl_offset"])


class Sentinel:
    def __init__(self, primary_port, tmp, i):
        self.port = free_port()
        self.dir = os.path.join(tmp, "sentinel%d" % i)
        os.makedirs(self.dir)
        conf = os.path.join(self.dir, "sentinel.conf")
        with open(conf, "w") as f:
            f.write("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n" % (
                self.port, self.dir, os.path.join(self.dir, "sentinel.log")))
            f.write("sentinel monitor %s 127.0.0.1 %d 2\n" % (MASTER, primary_port))
            f.write("sentinel down-after-milliseconds %s 1000\n" % MASTER)
            f.write("sentinel failover-timeout %s 5000\n" % MASTER)
            f.write("sentinel parallel-syncs %s 1\n" % MASTER)
        cmd = [SENTINEL_BIN, conf] if SENTINEL_BIN else [REDIS_SERVER, conf, "--sentinel"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def client(self):
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True,
                           socket_timeout=5)

    def master_port(self):
        try:
            a = self.client().execute_command("SENTINEL", "get-master-addr-by-name", MASTER)
            return int(a[1]) if a else None
        except redis.exceptions.ConnectionError:
            return None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class Cluster:
    """What harness.Worker/submit/results/meta need (url, dir, client()), through Sentinel."""

    def __init__(self, sentinels, tmp):
        self.sentinels = sentinels
        self.dir = tmp
        self.url = "sentinel://%s/%s/0" % (
            ",".join("127.0.0.1:%d" % s.port for s in sentinels), MASTER)

    def primary_port(self):
        for s in self.sentinels:
            p = s.master_port()
            if p:
                return p
        fail("no Sentinel answers for master %s" % MASTER)

    def client(self):
        return redis.Redis(host="127.0.0.1", port=self.primary_port(), decode_responses=True,
                           socket_timeout=30)


def wait_for(what, cond, timeout, logs=lambda: ""):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if cond():
                return
        except redis.exceptions.ConnectionError:
            pass
        time.sleep(0.1)
    fail("%s: not within %d s\n%s" % (what, timeout, logs()))


def sentinel_logs(sentinels):
    out = []
    for s in sentinels:
        with open(os.path.join(s.dir, "sentinel.log")) as f:
            out.append("--- sentinel :%d\n%s" % (s.port, f.read()[-1500:]))
    return "\n".join(out)


def ready(sentinels, primary_port, n_replicas):
    """Every Sentinel monitors primary_port with n_replicas healthy replicas and knows the
    other two Sentinels (else it cannot reach a quorum or win the election)."""
    for s in sentinels:
        c = s.client()
        if s.master_port() != primary_port:
            return False
        reps = c.execute_command("SENTINEL", "replicas", MASTER)
        ok = [r for r in reps if "s_down" not in r["flags"] and "disconnected" not in r["flags"]
              and r.get("master-link-status") == "ok"]
        if len(ok) < n_replicas or len(c.execute_command("SENTINEL", "sentinels", MASTER)) < 2:
            return False
    return True


def check_output(cl, batch, ids, what):
    """{B}:out on the current primary holds every custom_id exactly once; `medley results`
    and `medley status` through the sentinel URL agree."""
    m = wait_batch(cl, batch, timeout=90)
    if m.get("status") != "completed" or int(m.get("completed", 0)) != len(ids):
        fail("%s: batch meta on the primary :%d is %s" % (what, cl.primary_port(), m))
    raw = cl.client().xrange("medley:{%s}:out" % batch, "-", "+")
    exactly_once([json.loads(f["line"]) for _, f in raw], ids)
    exactly_once(results(cl, batch), ids)
    st = medley("status", batch, "--redis", cl.url).stdout
    if "completed" not in st:
        fail("%s: `medley status` through Sentinel says: %s" % (what, st))


def main():
    if not REDIS_SERVER:
        fail("redis-server not found (apt-get install redis-server)")
    if not SENTINEL_BIN:
        print("redis-sentinel not found; running redis-server --sentinel")
    t_start = time.time()
    primary = RedisServer()
    replica = RedisServer(args=["--replicaof", "127.0.0.1", str(primary.port)])
    tmp = primary.dir
    sentinels, workers = [], []
    try:
        sentinels = [Sentinel(primary.port, tmp, i) for i in range(3)]
        cl = Cluster(sentinels, tmp)
        wait_for("Sentinels ready (replica seen, each other known)",
                 lambda: ready(sentinels, primary.port, 1), 30, lambda: sentinel_logs(sentinels))
        print("sentinels ready in %.1fs: %s" % (time.time() - t_start, cl.url))

        # --- 1: SIGKILL the primary while the replica lags -------------------------------
        ids1 = ["a%05d" % i for i in range(N1)]
        path = write_lines(tmp, "in1.jsonl", [chat_line(c, "text %s" % c) for c in ids1])
        batch1 = submit(cl, path, "--model", "echo")
        # submit returned, so WAIT said the replica holds every line: it must, now.
        n_on_replica = replica.client().xlen("medley:q:{echo}")
        if n_on_replica != N1:
            fail("submit returned but the replica holds %d of %d lines" % (n_on_replica, N1))
        args = ["--echo-delay-ms", "20", "--max-seqs", "16", "--visibility-ms", "2000",
                "--heartbeat-ms", "500"]
        workers = [Worker(cl, args=args, name="w%d" % i) for i in range(2)]
        wait_for("batch 1 under way", lambda: int(meta(primary, batch1).get("completed", 0))
                 >= N1 // 10, 60, lambda: workers[0].logs()[-2000:])
        # A client waiting for the batch through the failover (it reconnects, through the
        # Sentinels, and reads the results from the new primary once the batch completes).
        waiter_out = os.path.join(tmp, "waiter.jsonl")
        waiter = subprocess.Popen([MEDLEY, "results", batch1, "--wait", "-o", waiter_out,
                                   "--redis", cl.url], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        time.sleep(0.3)
        # Freeze the replica so that the primary's next writes reach only the primary, then
        # kill the primary: those writes are what asynchronous replication loses.
        # The replica's socket still holds what was sent before the freeze, so the link is
        # cut too: what the primary writes from then on stays in its backlog only.
        replica.proc.send_signal(signal.SIGSTOP)
        pc = primary.client()
        pc.execute_command("CLIENT", "KILL", "TYPE", "replica")
        time.sleep(0.4)
        done_before = int(meta(primary, batch1).get("completed", 0))
        off_before = info_offset(pc)
        primary.kill()
        replica.proc.send_signal(signal.SIGCONT)
        t_kill = time.time()
        if done_before >= N1:
            fail("batch 1 finished before the kill; the test would prove nothing")
        wait_for("failover to the replica :%d" % replica.port,
                 lambda: all(s.master_port() == replica.port for s in sentinels), 30,
                 lambda: sentinel_logs(sentinels))
        t_failover = time.time() - t_kill
        rc = replica.client()
        promoted_at = int(rc.info("replication").get("second_repl_offset", 0)) - 1
        done_after = int(meta(replica, batch1).get("completed", 0))
        print("primary killed at %d/%d answers; failover took %.1fs; the new primary had %d "
              "answers (%d lost) and %d of %d replication bytes (%d lost)" % (
                  done_before, N1, t_failover, done_after, done_before - done_after,
                  promoted_at, off_before, off_before - promoted_at))
        if promoted_at >= off_before:
            fail("the new primary lost nothing of the old one's writes; the test would not "
                 "show the recovery of a lost suffix")
        check_output(cl, batch1, ids1, "batch 1 after SIGKILL of the primary")
        print("batch 1: %d custom_ids exactly once on the new primary (%.1fs after the kill)"
              % (N1, time.time() - t_kill))
        for w in workers:
            if w.proc.poll() is not None:
                fail("a worker died across the failover:\n" + w.logs()[-2000:])
            if "followed a failover" not in w.logs():
                fail("a worker did not log following the failover:\n" + w.logs()[-2000:])
        try:
            _, werr = waiter.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            waiter.kill()
            fail("`medley results --wait` did not finish after the failover")
        if waiter.returncode != 0 or "reconnecting" not in werr:
            fail("`medley results --wait` across the failover exited %d:\n%s" % (
                waiter.returncode, werr[-2000:]))
        with open(waiter_out) as f:
            exactly_once([json.loads(l) for l in f if l.strip()], ids1)
        sch = medley("scheduler", "--once", "--redis", cl.url, check=False, timeout=60)
        if sch.returncode != 0 or ":%d" % replica.port not in sch.stderr:
            fail("medley scheduler --once through Sentinel exited %d:\n%s" % (
                sch.returncode, sch.stderr[-2000:]))

        # --- 2: SENTINEL FAILOVER with the old primary up (demoted, not killed) ----------
        # Back empty, as a replica of the new primary (as docs/operations.md tells operators;
        # the Sentinels would convert it, but only after several seconds).
        primary.args = ["--replicaof", "127.0.0.1", str(replica.port)]
        t_back = time.time()
        primary.start()
        wait_for("old primary back as a replica",
                 lambda: ready(sentinels, replica.port, 1), 40,
                 lambda: sentinel_logs(sentinels))
        print("old primary back as a replica in %.1fs" % (time.time() - t_back))
        ids2 = ["b%05d" % i for i in range(N2)]
        path = write_lines(tmp, "in2.jsonl", [chat_line(c, "text %s" % c) for c in ids2])
        batch2 = submit(cl, path, "--model", "echo")
        wait_for("batch 2 under way", lambda: int(meta(replica, batch2).get("completed", 0))
                 >= N2 // 10, 60, lambda: workers[0].logs()[-2000:])
        sentinels[0].client().execute_command("SENTINEL", "failover", MASTER)
        t_fo = time.time()
        wait_for("manual failover back to :%d" % primary.port,
                 lambda: all(s.master_port() == primary.port for s in sentinels), 30,
                 lambda: sentinel_logs(sentinels))
        done2 = int(meta(primary, batch2).get("completed", 0))
        print("manual failover took %.1fs; batch 2 at %d/%d on the new primary" % (
            time.time() - t_fo, done2, N2))
        if done2 >= N2:
            fail("batch 2 finished before the failover; the test would prove nothing")
        check_output(cl, batch2, ids2, "batch 2 after SENTINEL FAILOVER")
        check_output(cl, batch1, ids1, "batch 1 after the second failover")
        for w in workers:
            if w.proc.poll() is not None:
                fail("a worker died across the manual failover:\n" + w.logs()[-2000:])
        seen = [l for w in workers for l in w.logs().splitlines()
                if "treated as a lost connection" in l or "followed a failover" in l]
        print("worker lines about the failovers:\n  " + "\n  ".join(seen[:8]))

        # --- 3: a demoted primary that keeps its clients (no Sentinel to kill them) --------
        for w in workers:
            w.stop()
        for s in sentinels:
            s.stop()
        workers = [Worker(primary, args=args, name="plain")]
        ids3 = ["c%05d" % i for i in range(N3)]
        path = write_lines(tmp, "in3.jsonl", [chat_line(c, "text %s" % c) for c in ids3])
        batch3 = submit(primary, path, "--model", "echo")
        wait_for("batch 3 under way", lambda: int(meta(primary, batch3).get("completed", 0))
                 >= N3 // 5, 60, lambda: workers[0].logs()[-2000:])
        # A switchover by hand: the worker's connection to the demoted node stays open.
        replica.client().execute_command("REPLICAOF", "NO", "ONE")
        primary.client().execute_command("REPLICAOF", "127.0.0.1", str(replica.port))
        wait_for("the worker sees the demotion",
                 lambda: "treated as a lost connection" in workers[0].logs(), 10,
                 lambda: workers[0].logs()[-2000:])
        time.sleep(1.0)  # it retries the demoted node (its URL names only that one)
        primary.client().execute_command("REPLICAOF", "NO", "ONE")
        replica.client().execute_command("REPLICAOF", "127.0.0.1", str(primary.port))
        m = wait_batch(primary, batch3, timeout=60)
        if m.get("status") != "completed" or int(m.get("completed", 0)) != N3:
            fail("batch 3 after the demotion: %s" % m)
        exactly_once(results(primary, batch3), ids3)
        logs = workers[0].logs()
        if workers[0].proc.poll() is not None:
            fail("the worker died across the demotion:\n" + logs[-2000:])
        spins = logs.count("after reconnecting")
        if spins > 20:
            fail("the worker retried the demoted node %d times in ~1 s" % spins)
        print("batch 3: %d custom_ids exactly once across a demotion (%d setup retries); "
              "worker saw: %s" % (N3, spins, [l for l in logs.splitlines()
                                             if "treated as a lost" in l][0][-160:]))
        print("ok: two failovers and a demotion, %d + %d + %d custom_ids exactly once, %.1fs"
              % (N1, N2, N3, time.time() - t_start))
    finally:
        for w in workers:
            w.stop()
        for s in sentinels:
            s.stop()
        replica.proc.send_signal(signal.SIGCONT)
        replica.stop()
        primary.stop()


if __name__ == "__main__":  # tests/chaos/chaos.py imports Sentinel and ready()
    main()
