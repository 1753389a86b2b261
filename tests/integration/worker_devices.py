"""worker_devices.py — `medley worker --devices D0,D1`: one supervisor, one child worker per
device (worker/supervise.h).

Default run (integration, echo model, ~30 s):
  - bad input: GPUs this machine cannot use -> exit 1 naming the device, nothing started;
    "cpu,,cpu", "" and --device with --devices -> usage error, exit 2;
  - 2,000 echo requests over `--devices cpu:1,cpu:1 --id W`: children W.0 and W.1 heartbeat as
    their own workers and both answer; W.0 SIGKILLed mid-batch is restarted by the supervisor
    (log line) and the batch completes with every custom_id exactly once; SIGTERM to the
    supervisor stops both children, it exits 0 and no child process is left;
  - a hand-written plan naming "{F.1}/0" is served by child F.1 of `--id F` alone;
  - a supervisor whose children cannot start (Redis unreachable) gives up on each after 5
    quick failures in a row and exits 1 (runs alongside the batch).
With --engine (e2e): 8 short requests on the real SmolLM2 engine over `--devices cpu:1,cpu:1`;
every answer arrives. Exit 77 (skip) when the model file is not fetched."""
import json
import os
import re
import signal
import subprocess
import sys
import time

from harness import (MEDLEY, RedisServer, Worker, chat_line, exactly_once, fail, free_port, meta,
                     results, schema_validator, submit, validate_all, wait_batch, write_lines)


def model_path():
    d = os.environ.get("MEDLEY_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "medley", "models")
    return os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")


def heartbeat(srv, wid):
    h = srv.client().hget("medley:worker:{%s}" % wid, "json")
    return json.loads(h) if h else None


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not running; the supervisor's own children are reaped by it
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(what, cond, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    fail("timed out after %ds waiting for %s" % (timeout, what))


def worker_cmd(srv, *args):
    return [MEDLEY, "worker", "--redis", srv.url] + [str(a) for a in args]


def bad_input(srv):
    c = srv.client()
    cases = [
        # (argv, exit code, what stderr must say)
        (["--devices", "cuda:0,cuda:1,cuda:4095", "--model", "echo", "--id", "B"], 1,
         r'device \\?"cuda:\d+\\?": .+; nothing started'),
        (["--devices", "cpu:1,cpu:x", "--model", "echo", "--id", "B"], 1,
         r'entry 2 of 2: device \\?"cpu:x'),
        (["--devices", "cpu,,cpu", "--model", "echo", "--id", "B"], 2, r"entry 2 is empty"),
        (["--devices", "", "--model", "echo", "--id", "B"], 2, r"at least one device"),
        (["--device", "cpu", "--devices", "cpu,cpu", "--model", "echo", "--id", "B"], 2,
         r"--device and --devices exclude each other"),
        (["--devices", "cpu:1,cpu:1", "--model", "echo", "--id", "x" * 151], 2,
         r"--id is 151 bytes; with --devices at most 150"),
    ]
    for argv, code, msg in cases:
        p = subprocess.run(worker_cmd(srv, *argv), capture_output=True, text=True, timeout=30)
        if p.returncode != code or not re.search(msg, p.stderr):
            fail("%s: exit %d (want %d), stderr %r (want /%s/)" % (" ".join(argv), p.returncode,
                                                                  code, p.stderr, msg))
        if '"supervise"' in p.stderr or c.keys("medley:worker:*"):
            fail("%s started something: %s" % (" ".join(argv), p.stderr))
        print("ok: %s -> exit %d: %s" % (" ".join(argv), code, p.stderr.strip().splitlines()[-1]))


def log_lines(w):
    return [json.loads(l) for l in w.logs().splitlines() if l.strip()]


def echo_batch(srv):
    n = 2000
    ids = ["req-%04d" % i for i in range(n)]
    path = write_lines(srv.dir, "in.jsonl", [chat_line(c, "text %s" % c) for c in ids])
    batch = submit(srv, path, "--model", "echo")
    # 8 slots x 40 ms per answer: ~200 answers/s per child, so the batch lasts ~5 s and the
    # kill lands mid-run; a short visibility timeout keeps any takeover quick
    w = Worker(srv, args=["--devices", "cpu:1,cpu:1", "--id", "W", "--echo-delay-ms", "40",
                          "--max-seqs", "8", "--heartbeat-ms", "300", "--visibility-ms", "1500",
                          "--usd-per-hour", "2"], name="W")
    try:
        def both_answering():
            hb = [heartbeat(srv, "W.%d" % i) for i in range(2)]
            return hb if all(h and h["completed"] > 0 for h in hb) else None

        hb = wait_for("both children to heartbeat and answer", both_answering, 30)
        done = int(meta(srv, batch).get("completed", 0))
        if done >= n:
            fail("batch finished before the kill; the test would prove nothing")
        for h in hb:
            if h["usd_per_hour"] != 1.0:
                fail("child %s heartbeats usd_per_hour %s, want 2/2" % (h["worker"],
                                                                     h["usd_per_hour"]))
        pid0, pid1 = hb[0]["pid"], hb[1]["pid"]
        os.kill(pid0, signal.SIGKILL)
        print("SIGKILL W.0 (pid %d) at %d/%d" % (pid0, done, n))
        wait_for("the supervisor to restart W.0",
                 lambda: re.search(r"W\.0 \(cpu:1\) died: signal 9 .*restarting it in 1\.0 s",
                                   w.logs()) and w.logs().count("started W.0 on cpu:1") == 2,
                 15)
        m = wait_batch(srv, batch, timeout=60)
        lines = results(srv, batch)
        exactly_once(lines, ids)
        if m["status"] != "completed" or int(m["completed"]) != n or int(m["failed"]) != 0:
            fail("batch meta wrong: %s" % m)
        by = {}
        for l in lines:
            by[l["medley"]["worker"]] = by.get(l["medley"]["worker"], 0) + 1
        if set(by) != {"W.0", "W.1"}:
            fail("answers by worker: %s (want both W.0 and W.1)" % by)
        h0 = wait_for("W.0's new heartbeat", lambda: (heartbeat(srv, "W.0") or {}).get("pid")
                      not in (None, pid0) and heartbeat(srv, "W.0"), 10)
        print("ok: %d lines exactly once, by worker %s; W.0 restarted as pid %d" % (
            len(lines), by, h0["pid"]))
        w.signal(signal.SIGTERM)
        rc = w.wait(40)
        if rc != 0:
            fail("supervisor exited %d after SIGTERM:\n%s" % (rc, w.logs()[-3000:]))
        left = [p for p in (h0["pid"], pid1) if alive(p)]
        if left:
            fail("child processes %s left after the supervisor exited" % left)
        logs = log_lines(w)
        tagged = [l for l in logs if l.get("component") == "worker" and "worker" in l]
        if {l["worker"] for l in tagged} != {"W.0", "W.1"}:
            fail("children's log lines are not tagged with their ids: %s" % tagged[:4])
        if not any("every per-device worker stopped cleanly" in l["msg"] for l in logs):
            fail("no clean-stop line:\n" + w.logs()[-2000:])
        print("ok: SIGTERM -> supervisor exit 0, children %d and %d gone" % (h0["pid"], pid1))
    finally:
        w.stop()


def follow_plan(srv):
    """A plan naming "{F.1}/0" reaches exactly child F.1 of `--devices cpu:1,cpu:1 --id F`."""
    doc = {
        "schema_version": 1, "kind": "medley.plan", "version": 1,
        "created_at": "2026-12-02T14:00:00Z", "objective": "max_tokens_per_usd",
        "reason": "written by worker_devices.py",
        "replicas": [{"id": "r0", "model": "echo", "candidate": "1xcpu",
                      "stages": [{"gpu_type": "cpu", "gpus": ["{F.1}/0"], "tp": 1,
                                  "layers": [0, 30]}],
                      "classes": [], "routing": {},
                      "predicted_tokens_per_s": 100.0, "usd_per_hour": 0.5,
                      "usd_per_mtok": 1.0}],
        "models": [{"model": "echo", "demand_tokens_per_s": 0, "predicted_tokens_per_s": 0,
                    "deadline_met": True}],
        "idle_gpus": [], "totals": {"tokens_per_s": 0, "usd_per_hour": 0, "usd_per_mtok": 0,
                                    "tokens_per_usd": 0},
        "notes": []}
    validate_all(schema_validator("plan"), [doc], "hand-written plan")
    r = srv.client()
    r.set("medley:plan", json.dumps(doc))
    r.set("medley:plan:version", 1)
    ids = ["p-%03d" % i for i in range(300)]
    path = write_lines(srv.dir, "plan.jsonl", [chat_line(c, "text %s" % c) for c in ids])
    batch = submit(srv, path, "--model", "echo")
    w = Worker(srv, models=(), name="F",
               args=["--devices", "cpu:1,cpu:1", "--id", "F", "--plan-check-ms", "100",
                     "--heartbeat-ms", "300", "--echo-delay-ms", "5"])
    try:
        m = wait_batch(srv, batch, timeout=60)
        lines = results(srv, batch)
        exactly_once(lines, ids)
        by = {l["medley"]["worker"] for l in lines}
        if m["status"] != "completed" or by != {"F.1"}:
            fail("plan naming {F.1}/0: batch %s answered by %s (want F.1 only)" % (m, by))
        wait_for("F.0 to heartbeat plan v1", lambda: r.hget("medley:worker:{F.0}",
                                                             "plan_version") == "1", 10)
        for wid, want in (("F.0", ""), ("F.1", "r0")):
            got = r.hget("medley:worker:{%s}" % wid, "replicas")
            if want not in (got or "") or (not want and got not in ("", "[]")):
                fail("%s heartbeats replicas %r (want %r)" % (wid, got, want or "none"))
        w.signal(signal.SIGTERM)
        if w.wait(40) != 0:
            fail("supervisor did not exit 0 after SIGTERM:\n" + w.logs()[-3000:])
        print("ok: a plan naming {F.1}/0 is served by child F.1 alone (%d lines)" % len(lines))
    finally:
        w.stop()


def engine_batch(srv):
    if not os.path.exists(model_path()):
        print("SKIP: %s not fetched (scripts/fetch-model.sh)" % model_path())
        sys.exit(77)
    ids = ["q%d" % i for i in range(8)]
    path = write_lines(srv.dir, "in.jsonl", [
        chat_line(c, "Name a colour. (%s)" % c, model="smollm2-135m", max_tokens=8,
                  temperature=0) for c in ids])
    batch = submit(srv, path, "--model", "smollm2-135m")
    w = Worker(srv, models=("smollm2-135m",), name="E",
               args=["--devices", "cpu:1,cpu:1", "--id", "E", "--max-seqs", "4",
                     "--heartbeat-ms", "500"])
    try:
        m = wait_batch(srv, batch, timeout=240)
        lines = results(srv, batch)
        exactly_once(lines, ids)
        if m["status"] != "completed" or int(m["failed"]) != 0:
            fail("batch meta wrong: %s\n%s" % (m, w.logs()[-3000:]))
        for l in lines:
            body = l["response"]["body"]
            u = body["usage"]
            if u["completion_tokens"] < 1 or u["completion_tokens"] > 8:
                fail("bad answer: %s" % json.dumps(l)[:600])
            print("%s by %s: %r" % (l["custom_id"], l["medley"]["worker"],
                                    body["choices"][0]["message"]["content"]))
        for i in range(2):
            if not heartbeat(srv, "E.%d" % i):
                fail("child E.%d has no heartbeat" % i)
        w.signal(signal.SIGTERM)
        if w.wait(60) != 0:
            fail("supervisor did not exit 0 after SIGTERM:\n" + w.logs()[-3000:])
        print("ok: %d answers on the engine over 2 devices" % len(lines))
    finally:
        w.stop()


def main():
    srv = RedisServer()
    giveup = None
    try:
        if "--engine" in sys.argv:
            engine_batch(srv)
            return
        bad_input(srv)
        # a port with nothing listening: every start of G.0 and G.1 fails at once
        t0 = time.time()
        giveup = subprocess.Popen(
            [MEDLEY, "worker", "--devices", "cpu:1,cpu:1", "--model", "echo", "--id", "G",
             "--redis", "redis://127.0.0.1:%d/0" % free_port(), "--connect-timeout-ms", "200"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        echo_batch(srv)
        follow_plan(srv)
        _, err = giveup.communicate(timeout=60)
        took = time.time() - t0
        for k in range(2):
            if "giving up on G.%d (cpu:1): it failed 5 times in a row" % k not in err:
                fail("no give-up line for G.%d:\n%s" % (k, err[-3000:]))
        if giveup.returncode != 1 or took < 15:
            fail("give-up supervisor: exit %d after %.1fs (want 1, after the 1+2+4+8 s "
                 "backoffs):\n%s" % (giveup.returncode, took, err[-2000:]))
        print("ok: unstartable children given up after %.1fs, exit 1" % took)
    finally:
        if giveup and giveup.poll() is None:
            giveup.kill()
            giveup.wait()
        srv.stop()


main()
