"""deploy_health.py — `medley health` (cli/cmd_health.c), the probe of deploy/k8s and
deploy/systemd, against a real redis-server and a real `medley worker`:

  no heartbeat (never started) -> 1 "no heartbeat"; no worker id -> 2;
  a running echo worker -> alive 0, ready 0 (the worker id from $MEDLEY_WORKER_ID too);
  the worker frozen (SIGSTOP): still alive while its key lives, not alive with --max-age-ms
  below the silence, then not alive once the key lapsed (3 heartbeat periods); SIGCONT ->
  alive again;
  the worker draining after SIGTERM (requests running, grace left) -> alive 0, ready 1
  "draining"; stopped -> 1 (it deleted its key);
  a heartbeat of the worker's format whose model has no slots yet -> ready 1 "loading", one
  whose sharded replica is not formed -> ready 1 naming the reason (each hand-written doc
  checked against schemas/worker-heartbeat.schema.json first);
  a --devices cpu,cpu supervisor: --children 2 checks both children (0), --children 3 names
  the missing third (1), the supervisor's own id has no heartbeat (1);
  Redis gone -> 3, and 0 with --redis-down-ok."""
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import MEDLEY, RedisServer, Worker, fail  # noqa: E402

# heartbeat period of the test worker: its key lives 3 periods, 7.5 s, room for two `medley
# health` runs on a loaded CI machine (at 1 s the key lapsed between them there)
HB_MS = 2500


def health(server, *args, env=None):
    e = dict(os.environ)
    e.pop("MEDLEY_WORKER_ID", None)
    e.update(env or {})
    url = server.url if server else "redis://127.0.0.1:%d/0" % harness.free_port()
    return subprocess.run([MEDLEY, "health", "--redis", url] + list(args), capture_output=True,
                          text=True, timeout=20, env=e)


def expect(p, rc, text, what):
    out = p.stdout + p.stderr
    if p.returncode != rc or text not in out:
        fail("%s: expected exit %d and %r, got exit %d: %s" % (what, rc, text, p.returncode, out))
    print("ok: %s -> %d (%s)" % (what, rc, out.strip().splitlines()[-1][:150]))


def wait_for(cond, what, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.05)
    fail("timed out waiting for " + what)


def main():
    srv = RedisServer()
    r = srv.client()
    try:
        expect(health(srv, "--worker-id", "w1"), 1, "no heartbeat at medley:worker:{w1}",
               "never started")
        expect(health(srv), 2, "MEDLEY_WORKER_ID", "no worker id")

        w = Worker(srv, args=["--id", "w1", "--heartbeat-ms", str(HB_MS), "--grace-ms", "20000"],
                   name="w1", env={"MEDLEY_ECHO_DELAY_MS": "10000"})
        wait_for(lambda: r.exists("medley:worker:{w1}"), "the first heartbeat")
        expect(health(srv, "--worker-id", "w1"), 0, "worker w1: alive (running", "alive")
        expect(health(srv, "--ready", env={"MEDLEY_WORKER_ID": "w1"}), 0, "echo (256 slots)",
               "ready, id from $MEDLEY_WORKER_ID")

        # frozen: no heartbeat writes; the key lives 3 periods
        w.signal(signal.SIGSTOP)
        time.sleep(1.6)
        expect(health(srv, "--worker-id", "w1"), 0, "alive", "frozen 1.6 s, key still alive")
        expect(health(srv, "--worker-id", "w1", "--max-age-ms", "1000"), 1, "s old (limit 1.0 s)",
               "frozen 1.6 s, --max-age-ms 1000")
        wait_for(lambda: not r.exists("medley:worker:{w1}"), "the key to lapse", 3 * HB_MS / 1000 + 4)
        expect(health(srv, "--worker-id", "w1"), 1, "no heartbeat", "frozen past 3 periods")
        w.signal(signal.SIGCONT)
        wait_for(lambda: r.exists("medley:worker:{w1}"), "the heartbeat after SIGCONT")
        expect(health(srv, "--worker-id", "w1", "--ready"), 0, "ready", "resumed")

        # draining: requests running (10 s each: draining outlasts a heartbeat period or two), SIGTERM with 20 s of grace
        d = os.path.join(srv.dir, "in")
        os.makedirs(d)
        path = harness.write_lines(d, "b.jsonl", [harness.chat_line("c%d" % i, "x")
                                                  for i in range(4)])
        batch = harness.submit(srv, path)
        wait_for(lambda: json.loads(r.hget("medley:worker:{w1}", "json") or "{}")
                 .get("in_flight", 0) > 0, "requests in flight")
        w.signal(signal.SIGTERM)
        wait_for(lambda: r.hget("medley:worker:{w1}", "state") == "draining", "state draining", 2 * HB_MS / 1000 + 3)
        expect(health(srv, "--worker-id", "w1"), 0, "alive (draining", "draining, alive")
        expect(health(srv, "--worker-id", "w1", "--ready"), 1, "state is draining",
               "draining, not ready")
        if w.wait(30) != 0:
            fail("worker exited non-zero after SIGTERM:\n" + w.logs()[-2000:])
        w.log.close()
        harness.wait_batch(srv, batch, 30)
        expect(health(srv, "--worker-id", "w1"), 1, "no heartbeat", "stopped")

        # the states a plan-following worker passes through, in the worker's own format
        schema = harness.schema_validator("worker-heartbeat")
        for doc, want, what in (
                ({"models": [{"model": "smollm2-135m", "runner": "engine", "capacity": 0,
                              "live": 0}]}, "model smollm2-135m is loading", "loading"),
                ({"models": [{"model": "big", "runner": "engine", "capacity": 0, "live": 0,
                              "stages": "cpu:0-11,tcp://h2:7701/cpu:12-29",
                              "not_serving": "waiting for stage 1"}]},
                 "model big is not serving: waiting for stage 1", "replica not formed")):
            now = int(time.time() * 1000)
            hb = {"worker": "w2", "host": "h", "pid": 1, "state": "running",
                  "devices": [{"type": "cpu", "memory_bytes": 1 << 30, "tokens_per_s": 0.0}],
                  "started_at": now, "last_seen": now, "completed": 0, "failed": 0,
                  "in_flight": 0, "tokens_per_s": 0.0, "usd_per_hour": 0.0, "answers_held": 0}
            hb.update(doc)
            harness.validate_all(schema, [hb], "hand-written heartbeat")
            r.hset("medley:worker:{w2}", mapping={"json": json.dumps(hb), "state": "running",
                                                  "last_seen": now})
            expect(health(srv, "--worker-id", "w2"), 0, "alive", what + ", alive")
            expect(health(srv, "--worker-id", "w2", "--ready"), 1, want, what + ", not ready")

        # a --devices supervisor: no heartbeat of its own, one per child
        sup = Worker(srv, args=["--id", "w3", "--devices", "cpu,cpu", "--heartbeat-ms", "500"],
                     name="w3")
        wait_for(lambda: r.exists("medley:worker:{w3.0}") and r.exists("medley:worker:{w3.1}"),
                 "both children's heartbeats", 20)
        expect(health(srv, "--worker-id", "w3", "--children", "2", "--ready"), 0,
               "worker w3.1: ready", "--devices, --children 2")
        expect(health(srv, "--worker-id", "w3", "--children", "3"), 1,
               "worker w3.2 is not alive: no heartbeat", "--devices, --children 3")
        expect(health(srv, "--worker-id", "w3"), 1, "no heartbeat at medley:worker:{w3}",
               "--devices without --children")
        sup.stop()

        srv.kill()
        expect(health(srv, "--worker-id", "w1"), 3, "cannot connect", "Redis gone")
        expect(health(srv, "--worker-id", "w1", "--redis-down-ok"), 0, "cannot tell",
               "Redis gone, --redis-down-ok")
    finally:
        srv.stop()
    print("deploy_health: ok")


if __name__ == "__main__":
    main()
