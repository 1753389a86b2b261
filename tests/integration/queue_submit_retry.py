#!/usr/bin/env python3
"""queue_submit_retry.py — `medley submit --batch-id B` is idempotent (docs/protocol.md §3,
"Submitting again"), against a real redis-server and a real echo worker serving meanwhile:

1. At least eight times, and until the kills have landed in every phase (before the batch
   exists, twice while its lines are queued, after the seal), a 2,000-line submit under its
   own --batch-id is SIGKILLed at a random point of a submit's length (after eight, while
   fewer than two landed in the thin validating phase, as soon as the batch's record appears),
   then the same command runs to its end: exit 0, one batch of total 2,000, every
   custom_id exactly once in the output, one batch per id in the batch index.
2. The same command once more: exit 0, the batch reported, nothing queued again.
3. Another file under the same id: refused (exit 1, the sentence says another input).
4. Under a user refused ROLE: the sentence names +role +wait and --no-replica-check, and
   --no-replica-check exits 0. ~10 s."""
import json
import os
import random
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (MEDLEY, RedisServer, Worker, chat_line, exactly_once, fail, medley,  # noqa
                     meta, results, wait_batch, write_lines)

N = 2000
KILLS = 8


def enough(states):
    phase = [st.split("/")[0] for st in states]
    return (phase.count("validating") >= 2 and "absent" in phase
            and any(p not in ("absent", "validating") for p in phase))


def validating_missing(k, states):
    """After the first KILLS random kills: is the validating phase (the batch recorded, its
    lines being queued) still short of two hits? It is a thin slice of a submit on a fast
    machine, and random points can miss it in 30 trials (seen on a fresh-clone CI run)."""
    return k >= KILLS and [st.split("/")[0] for st in states].count("validating") < 2


def kill_when_validating(srv, b, p, deadline_s=10.0):
    """Watch the batch's record and kill the submit as soon as it says validating (or the
    submit has gone past it, or ended): a kill that lands in that phase by construction."""
    cl = srv.client()
    end = time.time() + deadline_s
    while time.time() < end and p.poll() is None:
        if cl.hget("medley:{%s}:meta" % b, "status") is not None:
            break
    p.send_signal(signal.SIGKILL)


def main():
    random.seed(int(os.environ.get("MEDLEY_TEST_SEED", "38")))
    srv = RedisServer()
    w = Worker(srv, args=["--echo-delay-ms", "2"], name="retry")
    try:
        ids = ["r%05d" % i for i in range(N)]
        path = write_lines(srv.dir, "in.jsonl", [chat_line(c, "line %s" % c) for c in ids])
        cmd = [MEDLEY, "submit", path, "--redis", srv.url, "--batch-id", "retry-1"]
        # (each trial uses its own id, retry-<k>; the later checks use retry-1)
        t0 = time.time()
        full = subprocess.run(cmd[:-1] + ["timing-probe"], capture_output=True, text=True)
        span = max(time.time() - t0, 0.05)
        if full.returncode:
            fail("a plain submit failed: %s" % full.stderr)
        states = []
        k = 0
        # until the kills have landed before the batch exists, while its lines are queued
        # (twice) and after the seal, at most 30 trials
        while k < KILLS or not enough(states):
            if k >= 30:
                fail("30 kills did not land in every phase: %s" % states)
            b = "retry-%d" % k
            run = cmd[:-1] + [b]
            watch = validating_missing(k, states)
            p = subprocess.Popen(run, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if watch:
                kill_when_validating(srv, b, p)
            else:
                time.sleep(random.uniform(0.1, 1.0) * span)
                p.send_signal(signal.SIGKILL)
            k += 1
            p.wait()
            m = meta(srv, b)
            states.append("%s/%d" % (m.get("status", "absent"),
                                     srv.client().scard("medley:{%s}:sent" % b)))
            p = subprocess.run(run, capture_output=True, text=True)
            if p.returncode != 0 or p.stdout.strip() != b:
                fail("the submit after a kill (%s) exited %d: %s" % (states[-1], p.returncode,
                                                                    p.stderr))
            m = wait_batch(srv, b, timeout=60)
            if m["status"] != "completed" or int(m["total"]) != N or int(m["completed"]) != N:
                fail("after a kill (%s) and a full run the batch is %s" % (states[-1], m))
            exactly_once(results(srv, b), ids)
        print("killed at (status/lines recorded): %s" % " ".join(states))
        names = srv.client().zrange("medley:batches", 0, -1)
        if names.count("retry-1") != 1 or len(names) != k + 1:
            fail("the batch index should hold each trial's batch once: %s" % names)

        again = subprocess.run(cmd, capture_output=True, text=True)
        if again.returncode != 0 or "submitted before" not in again.stderr:
            fail("the same submit again: exit %d: %s" % (again.returncode, again.stderr))
        if int(meta(srv, "retry-1")["total"]) != N:
            fail("the same submit again changed the batch: %s" % meta(srv, "retry-1"))

        other = write_lines(srv.dir, "other.jsonl", [chat_line("x%d" % i, "y") for i in range(5)])
        p = subprocess.run([MEDLEY, "submit", other, "--redis", srv.url, "--batch-id",
                            "retry-1"], capture_output=True, text=True)
        if p.returncode != 1 or "another input" not in p.stderr:
            fail("another file under the same --batch-id: exit %d: %s" % (p.returncode, p.stderr))

        r = srv.client()
        r.execute_command("ACL", "SETUSER", "norole", "on", ">pw-norole-0123", "~*", "&*",
                          "+@all", "-role")
        url = "redis://norole:pw-norole-0123@127.0.0.1:%d/0" % srv.port
        small = write_lines(srv.dir, "small.jsonl", [chat_line("s%d" % i, "z") for i in range(3)])
        p = subprocess.run([MEDLEY, "submit", small, "--redis", url, "--batch-id", "norole"],
                           capture_output=True, text=True)
        for want in ("+role +wait", "--no-replica-check"):
            if p.returncode != 1 or want not in p.stderr:
                fail("submit refused ROLE: exit %d, expected %r in: %s" % (
                    p.returncode, want, p.stderr))
        p = subprocess.run([MEDLEY, "submit", small, "--redis", url, "--batch-id", "norole",
                            "--no-replica-check"], capture_output=True, text=True)
        if p.returncode != 0:
            fail("--no-replica-check under a user refused ROLE: exit %d: %s" % (
                p.returncode, p.stderr))
        print("ok submit_retry: %d kills then one batch of %d, each custom_id once; a second "
              "run reports it; another input refused; ROLE refusal explained" % (k, N))
    finally:
        w.stop()
        srv.stop()


if __name__ == "__main__":
    main()
