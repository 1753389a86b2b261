"""dashboard_actions.py — `medley dashboard`'s actions and bad input over HTTP, against a
real redis-server, real batches and a real `medley worker` (docs/operations.md "Dashboard"):

1. Without an admin token every action is refused (403) and changes nothing.
2. With --admin-token-file: no Authorization header, a wrong token of the right length, a
   token as a prefix, and another scheme are each refused (403) and change nothing; the
   right token cancels an in-progress batch (of a model nobody serves: the dashboard
   answers its lines, so it is cancelled at once), and says 404 for an unknown batch and 409 for a finished one.
   A long unserved batch (2,500 lines behind 1,500 of another batch) is answered 2,000 queue
   entries per request: `cancelling` after the cancel, `cancelled` after one listing.
3. Drain: the right token asks a running worker to drain; it stops by itself (exit 10,
   final for the systemd unit) and its heartbeat key goes; an unknown worker is 404 and no key is created.
4. Bad input: malformed ?limit, unknown paths and methods get 4xx, not a crash; a batch id
   and a DLQ line holding markup and invalid UTF-8 come back as valid JSON, the markup
   unchanged (escaping is the page's job), invalid bytes as U+FFFD.
5. A short token file and a short $MEDLEY_DASHBOARD_TOKEN are refused at start."""
import json
import os
import subprocess
import time

from dashboard_util import Dashboard, wait_for
from harness import *

TOKEN = "tok-0123456789abcdef0123"


def main():
    srv = RedisServer()
    workers, dashes = [], []
    try:
        r = srv.client()
        # a batch nobody serves (model "idle"): stays in_progress until cancelled
        path = write_lines(srv.dir, "idle.jsonl",
                           [chat_line("i%d" % i, "x", model="idle") for i in range(3)])
        idle = submit(srv, path, "--batch-id", "idle-batch")
        w = Worker(srv, args=["--id", "dash-act-w", "--heartbeat-ms", "300", "--grace-ms",
                              "2000"])
        workers.append(w)
        path = write_lines(srv.dir, "done.jsonl", [chat_line("d%d" % i, "hi") for i in range(4)])
        done = submit(srv, path, "--batch-id", "done-batch")
        wait_batch(srv, done, timeout=30)
        wait_for("the worker's heartbeat", lambda: r.exists("medley:worker:{dash-act-w}"))

        # 1. read-only
        ro = Dashboard(srv)
        dashes.append(ro)
        if ro.get("/api/config")["actions"] is not False:
            fail("a dashboard without a token must say actions: false")
        for p in ("/api/cancel?batch=" + idle, "/api/drain?worker=dash-act-w"):
            st, doc = ro.post(p, token=TOKEN)
            if st != 403 or "disabled" not in doc.get("error", ""):
                fail("POST %s without --admin-token-file: expected 403 'disabled', got %d %s"
                     % (p, st, doc))
        if meta(srv, idle)["status"] != "in_progress":
            fail("a refused cancel changed the batch: %s" % meta(srv, idle))
        if r.hget("medley:worker:{dash-act-w}", "drain") is not None:
            fail("a refused drain wrote the drain field")

        # 2. token checks and cancel
        tf = os.path.join(srv.dir, "token")
        with open(tf, "w") as f:
            f.write(TOKEN + "\n")
        rw = Dashboard(srv, ["--admin-token-file", tf, "--dlq-lines"])
        dashes.append(rw)
        if rw.get("/api/config")["actions"] is not True:
            fail("a dashboard with a token must say actions: true")
        cancel = "/api/cancel?batch=" + idle
        for desc, kw in (("no header", {}),
                         ("wrong token", {"token": TOKEN[:-1] + "x"}),
                         ("token prefix", {"token": TOKEN[:-1]}),
                         ("token plus a byte", {"token": TOKEN + "x"}),
                         ("basic scheme", {"header": "Basic " + TOKEN}),
                         ("empty bearer", {"header": "Bearer "})):
            st, doc = rw.post(cancel, **kw)
            if st != 403:
                fail("cancel with %s: expected 403, got %d %s" % (desc, st, doc))
        if meta(srv, idle)["status"] != "in_progress":
            fail("a cancel with a bad token changed the batch: %s" % meta(srv, idle))
        st, doc = rw.post(cancel, token=TOKEN)
        # nobody serves model "idle": the dashboard answers its 3 lines batch_cancelled itself
        if st != 200 or doc != {"batch": idle, "status": "cancelled"}:
            fail("cancel with the token: expected 200 cancelled, got %d %s" % (st, doc))
        if meta(srv, idle)["status"] != "cancelled":
            fail("after the cancel the batch must be cancelled: %s" % meta(srv, idle))
        # a cancel reads a bounded number of queue entries in the HTTP thread (2,000): a
        # batch of 2,500 queued behind 1,500 lines of another batch of the same model ends
        # over later listings of the batches, every line answered once, the other untouched
        other = submit(srv, write_lines(srv.dir, "other.jsonl", [chat_line(
            "o%d" % i, "x", model="idle2") for i in range(1500)]), "--batch-id", "other-b")
        big = submit(srv, write_lines(srv.dir, "big.jsonl", [chat_line(
            "b%d" % i, "x", model="idle2") for i in range(2500)]), "--batch-id", "big-b")
        t0 = time.monotonic()
        st, doc = rw.post("/api/cancel?batch=" + big, token=TOKEN)
        took = time.monotonic() - t0
        if st != 200 or doc != {"batch": big, "status": "cancelling"}:
            fail("cancel of a long unserved batch: expected 200 cancelling (lines left for the "
                 "next looks), got %d %s" % (st, doc))
        answered = len(results(srv, big))
        if answered != 500:
            fail("the cancel request read 2,000 entries (1,500 of the other batch): expected "
                 "500 lines answered, got %d" % answered)
        looks = 0
        while meta(srv, big)["status"] != "cancelled" and looks < 5:
            rw.get("/api/batches")
            looks += 1
        if meta(srv, big)["status"] != "cancelled" or looks != 1:
            fail("the listing after the cancel should end it (2,000 more entries): %s after %d "
                 "looks" % (meta(srv, big)["status"], looks))
        out = results(srv, big)
        exactly_once(out, ["b%d" % i for i in range(2500)])
        if {l["error"]["code"] for l in out} != {"batch_cancelled"}:
            fail("the long cancel's lines are not all batch_cancelled")
        if meta(srv, other)["status"] != "in_progress" or r.xlen("medley:q:{idle2}") != 1500:
            fail("the other batch of the model was touched: %s, %d queued" % (
                meta(srv, other)["status"], r.xlen("medley:q:{idle2}")))
        print("ok: a 2,500-line unserved cancel answered 500 lines in the request (%.2f s) and "
              "the rest in one listing" % took)
        st, doc = rw.post("/api/cancel?batch=no-such-batch", token=TOKEN)
        if st != 404:
            fail("cancel of an unknown batch: expected 404, got %d %s" % (st, doc))
        st, doc = rw.post("/api/cancel?batch=" + done, token=TOKEN)
        if st != 409 or "already completed" not in doc.get("error", ""):
            fail("cancel of a completed batch: expected 409, got %d %s" % (st, doc))
        st, doc = rw.post("/api/cancel", token=TOKEN)
        if st != 400:
            fail("cancel without ?batch=: expected 400, got %d %s" % (st, doc))

        # 3. drain
        st, doc = rw.post("/api/drain?worker=no-such-worker", token=TOKEN)
        if st != 404 or r.exists("medley:worker:{no-such-worker}"):
            fail("drain of an unknown worker: expected 404 and no key, got %d %s" % (st, doc))
        st, doc = rw.post("/api/drain?worker=dash-act-w", token=TOKEN)
        if st != 200 or doc.get("status") != "draining":
            fail("drain with the token: expected 200 draining, got %d %s" % (st, doc))
        try:
            rc = w.wait(15)
        except subprocess.TimeoutExpired:
            fail("the drained worker did not stop within 15 s:\n" + w.logs()[-2000:])
        if rc != 10:  # final for the systemd unit (deploy_drain.py)
            fail("the drained worker exited %d, not 10:\n%s" % (rc, w.logs()[-2000:]))
        if "drain asked" not in w.logs():
            fail("the worker's log must say why it stopped:\n" + w.logs()[-2000:])
        if r.exists("medley:worker:{dash-act-w}"):
            fail("a drained worker must delete its heartbeat key")

        # 4. bad input
        for method, p, want in (("GET", "/api/batches?limit=abc", 400),
                                ("GET", "/api/batches?limit=0", 400),
                                ("GET", "/api/dlq?limit=100000", 400),
                                ("GET", "/api/nope", 404),
                                ("GET", "/../../etc/passwd", 404),
                                ("PUT", "/api/batches", 405),
                                ("DELETE", "/", 405),
                                ("POST", "/api/reboot", 404)):
            st, doc = rw.request(method, p, {"Authorization": "Bearer " + TOKEN})
            if st != want:
                fail("%s %s: expected %d, got %d %s" % (method, p, want, st, doc))
        hostile = '<img src=x onerror=alert(1)>"\\'
        r.hset("medley:{%s}:meta" % hostile, mapping={
            "status": "in_progress", "model": "<b>m</b>", "total": 4, "completed": 1,
            "failed": 0, "created_at": int(time.time() * 1000), "started_at": 0,
            "finished_at": 0, "deadline": 0, "priority": 0})
        r.zadd("medley:batches", {hostile: time.time() * 1000})
        raw = redis_bytes(srv)
        bad = b"bad-\xff\xfe-utf8"
        raw.hset(b"medley:{" + bad + b"}:meta", mapping={"status": "in_progress", "total": 1})
        raw.zadd("medley:batches", {bad: time.time() * 1000})
        cid = "</td><script>window.__pwned=1</script>"
        raw.xadd("medley:dlq:{echo}", {
            "id": "1-0", "batch": hostile, "reason": "delivered 4 times <i>x</i>",
            "worker": "w<u>1</u>", "stream": "medley:q:{echo}",
            "line": json.dumps({"custom_id": cid, "body": {}}).encode() + b"\xff"})
        raw.xadd("medley:dlq:{echo}", {"id": "2-0", "batch": "b", "line": b"\xff\xfe not json"})
        docs = {b["id"]: b for b in rw.get("/api/batches")["batches"]}
        if hostile not in docs or docs[hostile]["model"] != "<b>m</b>":
            fail("the hostile batch id must come back unchanged: %s" % list(docs))
        if docs[hostile]["done"] != 1 or docs[hostile]["total"] != 4:
            fail("hostile batch counts: %s" % docs[hostile])
        if "bad-\ufffd\ufffd-utf8" not in docs:
            fail("invalid UTF-8 in a batch id must come back as U+FFFD: %s" % list(docs))
        q = rw.get("/api/dlq")["queues"]
        ents = {e["id"]: e for e in q[0]["entries"]} if q else {}
        if ents.get("1-0", {}).get("custom_id") != cid or \
                ents["1-0"]["reason"] != "delivered 4 times <i>x</i>":
            fail("the DLQ entry's custom_id and reason must come back unchanged: %s" % ents)
        if ents.get("2-0", {}).get("custom_id") is not None or \
                not ents["2-0"]["line_head"].startswith("\ufffd\ufffd"):
            fail("an unreadable DLQ line: custom_id null, head with U+FFFD: %s" % ents)
        # keys of the wrong type or shape, documents that are not what their schema says
        r.set("medley:worker:{as-string}", "x")
        r.hset("medley:worker:{no-json}", mapping={"state": "running", "last_seen": "soon"})
        r.hset("medley:worker:{array-json}", mapping={"json": "[1,2]", "replicas": ",,r1,"})
        r.hset("medley:dlq:{as-hash}", "a", "b")
        fleet = {w["id"]: w for w in rw.get("/api/fleet")["workers"]}
        if set(fleet) != {"no-json", "array-json"} or not fleet["no-json"]["stale"] or \
                fleet["array-json"]["replicas"] != ["r1"] or \
                "not a JSON object" not in fleet["array-json"]["heartbeat_error"]:
            fail("malformed worker hashes: %s" % fleet)
        for bad_plan, err in (("not json", "is not JSON"), ("[1]", "no replicas array"),
                              (json.dumps({"replicas": [1, {"id": 5}, {"id": "x",
                                                                   "stages": "bad"}]}), None)):
            r.set("medley:plan", bad_plan)
            p = rw.get("/api/plan")
            if err and (p["plan"] is not None or err not in p.get("error", "")):
                fail("plan %r: expected error %r, got %s" % (bad_plan, err, p))
            if not err and list(p["measured"]) != ["x"]:
                fail("plan %r: expected measured for replica x only: %s" % (bad_plan, p))
        rw.get("/api/dlq")
        if rw.proc.poll() is not None:
            fail("the dashboard died on bad input:\n" + rw.logs())

        # 5. short tokens are refused at start
        with open(tf, "w") as f:
            f.write("short\n")
        p = medley("dashboard", "--admin-token-file", tf, "--redis", srv.url, check=False,
                   timeout=10)
        if p.returncode != 2 or "at least 16" not in p.stderr:
            fail("a 5-byte token file must be refused (exit 2): %d %s" % (p.returncode,
                                                                          p.stderr))
        env = dict(os.environ, MEDLEY_DASHBOARD_TOKEN="short")
        p = subprocess.run([MEDLEY, "dashboard", "--redis", srv.url], capture_output=True,
                           text=True, env=env, timeout=10)
        if p.returncode != 2:
            fail("a short $MEDLEY_DASHBOARD_TOKEN must be refused (exit 2): %d %s"
                 % (p.returncode, p.stderr))
        print("dashboard_actions: ok (403 without/with bad tokens, cancel, drain, bad input)")
    finally:
        for d in dashes:
            d.stop()
        for w in workers:
            if w.proc.poll() is None:
                w.stop()
        srv.stop()


def redis_bytes(srv):
    import redis
    return redis.Redis(host="127.0.0.1", port=srv.port, socket_timeout=30)


if __name__ == "__main__":
    main()
