"""worker_stages.py — `medley worker --model smollm2-135m --stages SPEC` (sharded replicas,
docs/protocol.md §6) against a real redis-server and the real binary:

1. In-process stages: a batch of 24 greedy requests (chat and completions) served by a worker
   with --stages cpu:0-6,cpu:7-29 gets the same answers, token for token, as the same batch
   served by a plain worker; its heartbeat (schemas/worker-heartbeat) names the stages.
2. A remote stage that does not answer: a worker with --stages cpu:0-6,tcp://127.0.0.1:P/
   cpu:7-29 and nothing listening on P stays up, reads nothing (the batch stays in the stream,
   no entry pending for it), says in its heartbeat why ("not formed" and the reason), retries
   with backoff, and stops cleanly on SIGTERM.
3. With the TCP transport (`medley stage`; skipped while this build has none): a worker whose
   stage 2 is a `medley stage --listen` process completes a batch of 200 requests while the
   stage process is SIGKILLed mid-batch and restarted: every custom_id answered exactly once,
   none failed, the worker's log shows the hand-back and the re-forming.

Skipped (exit 77) when the model file is not fetched (scripts/fetch-model.sh)."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from harness import (MEDLEY, RedisServer, Worker, exactly_once, fail, free_port, meta, results,
                     schema_validator, submit, validate_all, wait_batch, write_lines)

MODEL = "smollm2-135m"
# The stage secret (docs/sharding.md "Authentication") of the head (--stage-secret-file) and
# its `medley stage` (--secret-file).
SECRET = os.path.join(tempfile.mkdtemp(prefix="medley-worker-stages-"), "stage.secret")


def model_path():
    d = os.environ.get("MEDLEY_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "medley", "models")
    return os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")


def line(cid, i, max_tokens):
    if i % 2:
        body = {"model": MODEL, "prompt": "Fact %d: the capital of France is" % i}
        url = "/v1/completions"
    else:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Count to %d." % i}]}
        url = "/v1/chat/completions"
    body.update(max_tokens=max_tokens, temperature=0)
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body})


def answer(l):
    c = l["response"]["body"]["choices"][0]
    return c["message"]["content"] if "message" in c else c["text"]


def heartbeat(srv, wid):
    h = srv.client().hget("medley:worker:{%s}" % wid, "json")
    return json.loads(h) if h else None


def wait_for(what, cond, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    fail("timed out after %ds waiting for %s" % (timeout, what))


def serve(srv, name, lines, args):
    """One batch of lines served by one worker started with args; its answers by custom_id."""
    b = submit(srv, write_lines(srv.dir, name + ".jsonl", lines))
    w = Worker(srv, models=(MODEL,), name=name,
               args=["--id", name, "--threads", "1", "--heartbeat-ms", "300", "--log-text"] + args)
    try:
        m = wait_batch(srv, b, timeout=120)
        hb = heartbeat(srv, name)
    finally:
        w.stop()
    if m["status"] != "completed" or m["failed"] != "0":
        fail("%s: batch %s: %s\n%s" % (name, b, m, w.logs()[-3000:]))
    out = results(srv, b)
    exactly_once(out, [json.loads(l)["custom_id"] for l in lines])
    return {l["custom_id"]: answer(l) for l in out}, hb


def same_answers(srv, hv):
    lines = [line("q%02d" % i, i, 12) for i in range(24)]
    t0 = time.time()
    plain, _ = serve(srv, "plain", lines, [])
    t1 = time.time()
    staged, hb = serve(srv, "staged", lines, ["--stages", "cpu:0-6,cpu:7-29"])
    t2 = time.time()
    diff = [k for k in plain if plain[k] != staged.get(k)]
    if diff:
        fail("%d of %d answers differ with stages, e.g. %s: %r vs %r" % (
            len(diff), len(plain), diff[0], plain[diff[0]], staged.get(diff[0])))
    validate_all(hv, [hb], "heartbeat of the staged worker")
    mj = hb["models"][0]
    if mj.get("stages") or mj.get("not_serving"):
        fail("in-process stages are no sharded replica to form: %s" % mj)
    print("1. %d greedy answers equal with --stages cpu:0-6,cpu:7-29 (plain %.1f s, staged "
          "%.1f s)" % (len(plain), t1 - t0, t2 - t1))


def stage_unreachable(srv, hv):
    port = free_port()
    spec = "cpu:0-6,tcp://127.0.0.1:%d/cpu:7-29" % port
    ids = ["u%02d" % i for i in range(4)]
    b = submit(srv, write_lines(srv.dir, "u.jsonl", [line(c, i, 4) for i, c in enumerate(ids)]))
    w = Worker(srv, models=(MODEL,), name="lonely",
               args=["--id", "lonely", "--threads", "1", "--heartbeat-ms", "300", "--stages", spec,
                     "--log-text", "--stage-secret-file", SECRET])
    try:
        hb = wait_for("a heartbeat saying why the replica is not formed",
                      lambda: (lambda h: h if h and h["models"] and
                               "not formed" in h["models"][0].get("not_serving", "") and
                               "127.0.0.1:%d" % port in h["models"][0]["not_serving"]
                               else None)(heartbeat(srv, "lonely")), 30)
        validate_all(hv, [hb], "heartbeat of a worker whose replica is not formed")
        time.sleep(2)  # a few tries (0.5 s, then 1 s): still nothing read
        r = srv.client()
        pend = r.xpending("medley:q:{%s}" % MODEL, "workers")
        if pend["pending"] or r.xlen("medley:q:{%s}" % MODEL) != len(ids) or \
                meta(srv, b).get("completed") != "0":
            fail("a worker whose replica is not formed must read nothing: pending %s, meta %s" % (
                pend, meta(srv, b)))
        mj = heartbeat(srv, "lonely")["models"][0]
        if mj["capacity"] != 0 or mj.get("stages") != spec:
            fail("heartbeat of the unformed replica: %s" % mj)
        print("2. unreachable stage: not serving (%s)" % mj["not_serving"][-200:])
    finally:
        w.stop()
    tries = w.logs().count("forming replica")
    if tries < 2:
        fail("the worker should have retried forming the replica:\n" + w.logs()[-2000:])
    # the batch is left to the next test's worker (the queue outlives the worker)
    return b, ids


def has_tcp_transport():
    p = subprocess.run([MEDLEY, "stage", "--help"], capture_output=True, text=True, timeout=30)
    return p.returncode == 0 and "--listen" in p.stdout + p.stderr


def stage_proc(port, log):
    return subprocess.Popen([MEDLEY, "stage", "--listen", "127.0.0.1:%d" % port, "--device", "cpu",
                             "--threads", "1", "--secret-file", SECRET, "--model", MODEL],
                            stdout=log, stderr=subprocess.STDOUT)


def stage_killed(srv, leftover):
    port = free_port()
    spec = "cpu:0-6,tcp://127.0.0.1:%d/cpu:7-29" % port
    slog = open(os.path.join(srv.dir, "stage.log"), "w")
    st = stage_proc(port, slog)
    ids = ["k%03d" % i for i in range(200)]
    b = submit(srv, write_lines(srv.dir, "k.jsonl", [line(c, i, 4) for i, c in enumerate(ids)]))
    w = Worker(srv, models=(MODEL,), name="head",
               args=["--id", "head", "--threads", "1", "--heartbeat-ms", "300", "--stages", spec,
                     "--log-text", "--stage-secret-file", SECRET])
    try:
        t0 = time.time()
        wait_for("40 answers", lambda: int(meta(srv, b).get("completed", 0)) >= 40, 60)
        st.send_signal(signal.SIGKILL)
        st.wait()
        at = int(meta(srv, b).get("completed", 0))
        time.sleep(1.0)
        st = stage_proc(port, slog)
        m = wait_batch(srv, b, timeout=120)
        t1 = time.time()
        lb = wait_batch(srv, leftover[0], timeout=60)
    finally:
        w.stop()
        st.terminate()
        st.wait()
        slog.close()
    out = results(srv, b)
    exactly_once(out, ids)
    exactly_once(results(srv, leftover[0]), leftover[1])
    if m["status"] != "completed" or m["failed"] != "0" or lb["failed"] != "0":
        fail("batch with a killed stage: %s / %s\n%s" % (m, lb, w.logs()[-3000:]))
    logs = w.logs()
    if "handed back" not in logs or logs.count("formed; serving") < 2:
        fail("the head should hand back and form again:\n" + logs[-3000:])
    print("3. stage SIGKILLed at %d/200 and restarted: 200 answered exactly once in %.1f s" % (
        at, t1 - t0))


def main():
    if not os.path.exists(model_path()):
        print("SKIP: %s not fetched (scripts/fetch-model.sh)" % model_path())
        sys.exit(77)
    with open(os.open(SECRET, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(os.urandom(24).hex() + "\n")
    srv = RedisServer()
    try:
        hv = schema_validator("worker-heartbeat")
        same_answers(srv, hv)
        leftover = stage_unreachable(srv, hv)
        if has_tcp_transport():
            stage_killed(srv, leftover)
        else:
            print("3. skipped: this build has no `medley stage` (TCP transport)")
    finally:
        srv.stop()
    print("ok")


main()
