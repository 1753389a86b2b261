"""plan_stages.py — a sharded replica under a plan (docs/protocol.md §6, "Sharded replicas"),
the acceptance of issue 24, against a real redis-server and the real binary on SmolLM2-135M:

A hand-written plan (valid against schemas/plan.schema.json) has one replica p0 of two
stages: layers [0, 7) on "{H}/0" and [7, 30) on "{S}/0". Two `medley worker --follow-plan`
processes, H and S, on one CPU thread each.

1. H alone: it heads p0 and reads nothing; its heartbeat says it waits for stage 2 (no key
   P replica:{p0}:stage:1). S starts: it runs a `medley stage` child and advertises it under
   that key; H forms the replica (its heartbeat: capacity > 0, the stages), S's heartbeat
   lists the stage server, ready. Both heartbeats follow schemas/worker-heartbeat.
2. A batch of 2,000 short requests (a one-token prompt, max_tokens 2) completes: every custom_id exactly once,
   none failed, every answer from H.
3. Again, with S SIGKILLed mid-batch (its `medley stage` child dies with it) and restarted:
   H hands back what it ran, waits for the new endpoint, forms again; the batch completes with
   every custom_id exactly once and none failed. S's stage key names the new server, and after
   SIGTERM to both workers (exit 0) the key is gone.

Skipped (exit 77) when the model is not fetched or this build has no `medley stage`."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from harness import (MEDLEY, RedisServer, Worker, exactly_once, fail, meta, results,
                     schema_validator, submit, validate_all, wait_batch, write_lines)

MODEL = "smollm2-135m"
# The replica's stage secret (docs/sharding.md "Authentication"), given to both workers by
# --stage-secret-file: the head signs its HELLO with it, the stage worker's `medley stage`
# child serves heads holding it (and MODEL only).
SECRET = os.path.join(tempfile.mkdtemp(prefix="medley-plan-stages-"), "stage.secret")
KEY = "medley:replica:{p0}:stage:1"
N = 2000


def model_path():
    d = os.environ.get("MEDLEY_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "medley", "models")
    return os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")


def plan(version):
    stage = lambda gpu, lo, hi: {"gpu_type": "cpu", "gpus": [gpu], "tp": 1, "layers": [lo, hi]}
    return {
        "schema_version": 1, "kind": "medley.plan", "version": version,
        "created_at": "2026-12-06T09:00:00Z", "objective": "max_tokens_per_usd",
        "reason": "written by plan_stages.py",
        "replicas": [{"id": "p0", "model": MODEL, "candidate": "pp2",
                      "stages": [stage("{H}/0", 0, 7), stage("{S}/0", 7, 30)],
                      "classes": [], "routing": {}, "predicted_tokens_per_s": 100.0,
                      "usd_per_hour": 0.0, "usd_per_mtok": 0.0}],
        "models": [{"model": MODEL, "demand_tokens_per_s": 0, "predicted_tokens_per_s": 100.0,
                    "deadline_met": True}],
        "idle_gpus": [], "totals": {"tokens_per_s": 100.0, "usd_per_hour": 0, "usd_per_mtok": 0,
                                    "tokens_per_usd": 0},
        "notes": []}


def lines(prefix):
    """N completions of a one-token prompt and two tokens each: a prefill and a decode step
    per request, so that 2,000 of them pass two stages on two shared cores in about 30 s."""
    out = []
    words = ["Hi", "The", "A", "In", "It"]
    for i in range(N):
        body = {"model": MODEL, "prompt": words[i % len(words)], "max_tokens": 2,
                "temperature": 0}
        out.append(json.dumps({"custom_id": "%s-%04d" % (prefix, i), "method": "POST",
                               "url": "/v1/completions", "body": body}))
    return out


def heartbeat(srv, wid):
    h = srv.client().hget("medley:worker:{%s}" % wid, "json")
    return json.loads(h) if h else None


def wait_for(what, cond, timeout, logs=lambda: ""):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    fail("timed out after %ds waiting for %s\n%s" % (timeout, what, logs()[-3000:]))


def worker(srv, wid):
    """H runs stage 0 (7 layers) on one thread, S's stage server the other 23 and the output
    head on two: the cores go where the work is."""
    return Worker(srv, models=(), name=wid,
                  args=["--follow-plan", "--id", wid, "--device", "cpu",
                        "--threads", "1" if wid == "H" else "2",
                        "--plan-check-ms", "100", "--heartbeat-ms", "300",
                        "--visibility-ms", "20000", "--log-text",
                        "--stage-secret-file", SECRET])


def formed(srv):
    h = heartbeat(srv, "H")
    if not h or not h["models"]:
        return None
    m = h["models"][0]
    return h if m["capacity"] > 0 and not m.get("not_serving") else None


def children(pid):
    kids = []
    for d in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % d) as f:
                if int(f.read().split(")")[-1].split()[1]) == pid:
                    kids.append(int(d))
        except (OSError, ValueError):
            pass
    return kids


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def run_batch(srv, prefix, during=None):
    ids = [l for l in lines(prefix)]
    b = submit(srv, write_lines(srv.dir, prefix + ".jsonl", ids))
    t0 = time.time()
    extra = during(b) if during else None
    m = wait_batch(srv, b, timeout=240)
    dt = time.time() - t0
    out = results(srv, b)
    exactly_once(out, [json.loads(l)["custom_id"] for l in ids])
    if m["status"] != "completed" or m["failed"] != "0" or m["completed"] != str(N):
        fail("batch %s: %s" % (prefix, m))
    by = {}
    for l in out:
        by[l["medley"]["worker"]] = by.get(l["medley"]["worker"], 0) + 1
    return dt, by, out, extra


def main():
    if not os.path.exists(model_path()):
        print("SKIP: %s not fetched (scripts/fetch-model.sh)" % model_path())
        sys.exit(77)
    p = subprocess.run([MEDLEY, "stage", "--help"], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        print("SKIP: this build has no `medley stage` (TCP transport)")
        sys.exit(77)
    with open(os.open(SECRET, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(os.urandom(24).hex() + "\n")
    srv = RedisServer()
    workers = {}
    try:
        r = srv.client()
        hv = schema_validator("worker-heartbeat")
        doc = plan(1)
        validate_all(schema_validator("plan"), [doc], "plan")
        r.set("medley:plan", json.dumps(doc))
        r.set("medley:plan:version", 1)

        # 1. The head waits for its stage; the stage worker advertises it; the replica forms.
        workers["H"] = worker(srv, "H")
        hb = wait_for("H waiting for stage 2", lambda: (lambda h: h if h and h["models"] and
                      KEY in h["models"][0].get("not_serving", "") else None)(
                      heartbeat(srv, "H")), 30, workers["H"].logs)
        validate_all(hv, [hb], "heartbeat of a head waiting for its stage")
        print("1. H alone: %s" % hb["models"][0]["not_serving"])
        t0 = time.time()
        workers["S"] = worker(srv, "S")
        hb_h = wait_for("the replica formed", lambda: formed(srv), 60, workers["H"].logs)
        hb_s = heartbeat(srv, "S")
        validate_all(hv, [hb_h, hb_s], "heartbeats of a formed replica")
        ep = r.get(KEY)
        ss = hb_s.get("stage_servers") or [{}]
        if not ep or ss[0].get("endpoint") != ep or not ss[0].get("ready") or hb_s["models"]:
            fail("S must serve stage 1 of p0 at %s and no model: %s" % (ep, hb_s))
        if ep not in hb_h["models"][0].get("stages", ""):
            fail("H's stages must name S's endpoint %s: %s" % (ep, hb_h["models"][0]))
        print("   formed in %.1f s over %s" % (time.time() - t0, hb_h["models"][0]["stages"]))

        # 2. A batch through the pipeline.
        dt, by, _, _ = run_batch(srv, "a")
        if set(by) != {"H"}:
            fail("the head answers every request: %s" % by)
        print("2. %d requests through two stages: exactly once in %.1f s (%.0f req/s)" % (
            N, dt, N / dt))

        # 3. The stage worker SIGKILLed mid-batch and restarted.
        def kill_stage(b):
            wait_for("a quarter of the batch", lambda: int(meta(srv, b).get("completed", 0)) >=
                     N // 4, 120, workers["H"].logs)
            kids = children(workers["S"].proc.pid)
            workers["S"].signal(signal.SIGKILL)
            workers["S"].wait()
            at = int(meta(srv, b).get("completed", 0))
            wait_for("S's stage server gone with it", lambda: not any(alive(k) for k in kids),
                     10)
            time.sleep(0.5)
            workers["S"].log.close()
            workers["S"] = worker(srv, "S")
            return at, kids
        dt, by, out, (at, kids) = run_batch(srv, "b", kill_stage)
        logs = workers["H"].logs()
        if "handed back" not in logs or logs.count("formed; serving") < 2:
            fail("H should hand back and form the replica again:\n" + logs[-3000:])
        again = sum(1 for l in out if l["medley"]["attempt"] >= 2)
        if not again or max(l["medley"]["attempt"] for l in out) > 2:
            fail("the requests H held at the kill are redelivered once: %d with attempt >= 2, "
                 "most %d" % (again, max(l["medley"]["attempt"] for l in out)))
        for l in logs.splitlines():
            if "handed back" in l or "formed" in l:
                print("   H: " + l[:220])
        ep2 = r.get(KEY)
        if not ep2 or ep2 == ep:
            fail("the restarted stage worker must advertise its new server (%s, was %s)" % (
                ep2, ep))
        print("3. S SIGKILLed at %d/%d (stage server pid %s gone), restarted: exactly once in "
              "%.1f s, %d answered on their second delivery; stage now at %s" % (
                  at, N, kids, dt, again, ep2))

        for w in ("H", "S"):
            workers.pop(w).stop()
        if r.exists(KEY):
            fail("a stopped stage worker must delete its key")
    finally:
        for w in workers.values():
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
        srv.stop()
    print("ok")


main()
