"""queue_hostile.py CASE — the queue under the conditions issue 25 found it failing in, each a
regression test that failed before its fix (against a real redis-server and the real binary):

  dupid      a custom_id hidden in a line too large to parse (a truncated 2 MiB line naming
             an id another line has; a >1 MiB line whose nested body holds another line's
             custom_id before its own): `medley submit` refuses the first and the batch of
             the second finishes, each line answered under its own id
  reconnect  three dropped connections (CLIENT KILL) and a crash: the requests that were
             running are answered normally on their second delivery, none in the DLQ, and
             the worker does not claim to "resume" entries it is still running
  refused    Redis refuses the completion script (OOM under noeviction) for 4 s: the worker
             logs a few lines (not a hot loop), says so in its heartbeat, reads nothing new,
             and finishes the batch once Redis accepts writes again — nothing lost
  takeover   a SIGKILLed worker's 64 entries under a backlog come back in full within the
             visibility timeout + 2.5 s, not in small groups at each periodic check
  classes    a plan with size classes routes lines to q:{M}:<class>; a worker started with
             --model M reads those streams too, and the batch finishes
"""
import json
import os
import signal
import sys
import time

from harness import *

Q = "medley:q:{echo}"


def pending_of(c, stream, consumer):
    return c.xpending_range(stream, "workers", min="-", max="+", count=100000,
                            consumername=consumer)


def wait_for(what, cond, timeout):
    t_end = time.time() + timeout
    while time.time() < t_end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    fail("timed out after %ds waiting for %s" % (timeout, what))


def case_dupid(srv):
    # (a) a valid line for "x" and a truncated 2 MiB line that starts with custom_id "x"
    good = chat_line("x", "hello")
    trunc = '{"custom_id": "x", "pad": "' + "P" * (2 << 20)
    path = write_lines(srv.dir, "a.jsonl", [good, trunc])
    p = medley("submit", path, "--redis", srv.url, "--model", "echo", check=False)
    if p.returncode == 0 or "custom_id 'x' appears more than once" not in p.stderr:
        fail("a duplicate custom_id in a line too large to parse was accepted (exit %d): %s%s"
             % (p.returncode, p.stdout, p.stderr))
    print("ok: submit refused the hidden duplicate: %s" % p.stderr.strip()[:160])
    # (b) a line for "victim" and a >1 MiB line whose body holds "custom_id":"victim" before
    # its own top-level "custom_id":"mine": the worker must answer it as "mine"
    big = json.dumps({"body": {"custom_id": "victim", "model": "echo",
                               "messages": [{"role": "user", "content": "hi"}]},
                      "custom_id": "mine", "method": "POST", "url": "/v1/chat/completions",
                      "pad": "P" * (1 << 20) + "X" * 1000})
    path = write_lines(srv.dir, "b.jsonl", [chat_line("victim", "hello"), big])
    batch = submit(srv, path, "--model", "echo")
    w = Worker(srv, args=["--heartbeat-ms", "500"], name="dupid")
    try:
        m = wait_batch(srv, batch, timeout=30)
        if m["status"] != "completed":
            fail("batch ended %s" % m)
        lines = results(srv, batch)
        exactly_once(lines, ["victim", "mine"])
        byid = {l["custom_id"]: l for l in lines}
        if (byid["mine"]["response"] or {}).get("body", {}).get("error", {}).get("code") != \
                "line_too_large":
            fail("the oversized line was not answered line_too_large: %s" % byid["mine"])
        if byid["victim"]["response"]["status_code"] != 200:
            fail("victim was not answered normally: %s" % byid["victim"])
        print("ok: the oversized line answered as 'mine' (line_too_large), 'victim' as itself")
    finally:
        w.stop()


def case_reconnect(srv):
    n = 8
    ids = ["r-%d" % i for i in range(n)]
    batch = submit(srv, write_lines(srv.dir, "in.jsonl", [chat_line(i, "t " + i) for i in ids]),
                   "--model", "echo")
    c = srv.client()
    args = ["--visibility-ms", "3000", "--heartbeat-ms", "500", "--max-attempts", "3"]
    w = Worker(srv, args=args + ["--id", "wA", "--echo-delay-ms", "6000"], name="wA")
    wait_for("wA to hold every entry", lambda: len(pending_of(c, Q, "wA")) == n, 30)
    for k in range(3):  # three connection drops while the requests run
        killed = c.client_kill_filter(_type="normal", skipme=True)
        if not killed:
            fail("CLIENT KILL found no client to drop")
        time.sleep(0.7)  # it reconnects within ~50 ms
    counts = {p["message_id"]: p["times_delivered"] for p in pending_of(c, Q, "wA")}
    if len(counts) != n or max(counts.values()) != 1:
        fail("three reconnects changed the delivery counts: %s" % counts)
    w.signal(signal.SIGKILL)
    w.wait()
    w2 = Worker(srv, args=args + ["--id", "wB", "--echo-delay-ms", "10"], name="wB")
    try:
        m = wait_batch(srv, batch, timeout=60)
        lines = results(srv, batch)
        exactly_once(lines, ids)
        bad = [l for l in lines if l["error"] is not None]
        if bad or int(m["failed"]) != 0:
            fail("%d requests failed after reconnects and one crash: %s" % (len(bad), bad[:2]))
        att = sorted(l["medley"]["attempt"] for l in lines)
        if att != [2] * n:
            fail("attempts should all be 2 (one crash), got %s" % att)
        if c.xlen("medley:dlq:{echo}"):
            fail("the DLQ holds %d entries" % c.xlen("medley:dlq:{echo}"))
        if "resuming" in open(w.log_path).read():
            fail("wA logged 'resuming' for entries it was running:\n" +
                 "\n".join(l for l in open(w.log_path) if "resuming" in l))
        print("ok: 3 reconnects + 1 crash: %d answered on attempt 2, DLQ empty" % n)
    finally:
        w2.stop()


def case_refused(srv):
    n = 400
    ids = ["o-%03d" % i for i in range(n)]
    batch = submit(srv, write_lines(srv.dir, "in.jsonl", [chat_line(i, "t " + i) for i in ids]),
                   "--model", "echo")
    c = srv.client()
    c.config_set("maxmemory-policy", "noeviction")
    w = Worker(srv, args=["--echo-delay-ms", "300", "--max-seqs", "16", "--heartbeat-ms", "300",
                          "--visibility-ms", "20000", "--id", "wO"], name="wO")
    try:
        wait_for("the first answers", lambda: int(meta(srv, batch).get("completed", 0)) > 0, 30)
        size0 = os.path.getsize(w.log_path)
        c.config_set("maxmemory", "1")  # any write that may grow memory is refused: OOM
        t0 = time.time()
        time.sleep(4)
        done_during = int(meta(srv, batch).get("completed", 0))
        c.config_set("maxmemory", "0")
        grown = os.path.getsize(w.log_path) - size0
        with open(w.log_path) as f:
            text = f.read()
        refusals = text.count("Redis refuses answers")
        print("log grew %d bytes over %.1f s of OOM (%d 'refuses answers' lines)" % (
            grown, time.time() - t0, refusals))
        if grown > 20000:
            fail("the worker wrote %d bytes of log in 4 s of OOM (a hot loop)" % grown)
        if refusals < 1:
            fail("the worker never said Redis refuses its answers:\n" + text[-2000:])
        m = wait_batch(srv, batch, timeout=60)
        lines = results(srv, batch)
        exactly_once(lines, ids)
        if int(m["failed"]) != 0:
            fail("requests failed: %s" % m)
        if "Redis accepts answers again" not in open(w.log_path).read():
            fail("the worker did not say when Redis accepted answers again")
        print("ok: OOM for 4 s, %d answered before it, all %d exactly once after" % (
            done_during, n))
    finally:
        c.config_set("maxmemory", "0")
        w.stop()


def case_refused_heartbeat(srv):
    """NOPERM on EVALSHA (an ACL without it) leaves HSET allowed: the heartbeat shows it."""
    c = srv.client()
    batch = submit(srv, write_lines(srv.dir, "in.jsonl", [chat_line("h-1", "x")]),
                   "--model", "echo")
    c.execute_command("ACL", "SETUSER", "w", "on", ">pw", "~*", "&*", "+@all", "-evalsha")
    url = "redis://w:pw@127.0.0.1:%d/0" % srv.port
    log = os.path.join(srv.dir, "worker-noperm.log")
    with open(log, "w") as lf:
        p = subprocess.Popen([MEDLEY, "worker", "--redis", url, "--model", "echo", "--id", "wN",
                              "--heartbeat-ms", "300"], stdout=lf, stderr=subprocess.STDOUT)
    try:
        hb = wait_for("a heartbeat with answers_refused", lambda: json.loads(
            c.hget("medley:worker:{wN}", "json") or "{}").get("answers_refused"), 20)
        if "NOPERM" not in hb["error"] or hb["refusals"] < 1:
            fail("answers_refused does not say why: %s" % hb)
        doc = json.loads(c.hget("medley:worker:{wN}", "json"))
        validate_all(schema_validator("worker-heartbeat"), [doc], "the heartbeat")
        if doc.get("answers_held") != 1:
            fail("answers_held should be 1: %s" % doc)
        time.sleep(2)
        size = os.path.getsize(log)
        if size > 20000:
            fail("%d bytes of log in ~3 s of NOPERM" % size)
        c.execute_command("ACL", "SETUSER", "w", "+evalsha")
        m = wait_batch(srv, batch, timeout=30)
        exactly_once(results(srv, batch), ["h-1"])
        print("ok: NOPERM shown in the heartbeat (%s), %d bytes of log; answered after the "
              "grant (%s)" % (hb["error"][:60], size, m["status"]))
    finally:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            fail("the worker did not stop within 30 s of SIGTERM")


def case_takeover(srv):
    n = 6000
    ids = ["k-%05d" % i for i in range(n)]
    batch = submit(srv, write_lines(srv.dir, "in.jsonl", [chat_line(i, "t") for i in ids]),
                   "--model", "echo")
    c = srv.client()
    vis = 2000
    common = ["--visibility-ms", str(vis), "--heartbeat-ms", "500"]
    dead = Worker(srv, args=common + ["--id", "w0", "--max-seqs", "64", "--echo-delay-ms",
                                      "60000"], name="w0")
    wait_for("w0 to hold 64 entries", lambda: len(pending_of(c, Q, "w0")) == 64, 30)
    live = [Worker(srv, args=common + ["--id", "w%d" % k, "--max-seqs", "16",
                                       "--echo-delay-ms", "150"], name="w%d" % k)
            for k in (1, 2)]
    wait_for("the live workers to run", lambda: int(meta(srv, batch).get("completed", 0)) > 50,
             30)
    held = set(p["message_id"] for p in pending_of(c, Q, "w0"))
    dead.signal(signal.SIGKILL)
    t_kill = time.time()
    dead.wait()
    try:
        wait_for("every entry of w0 to be taken over",
                 lambda: not pending_of(c, Q, "w0"), 60)
        took = time.time() - t_kill
        left = int(meta(srv, batch).get("total", n)) - int(meta(srv, batch).get("completed", 0))
        print("took over all %d entries of the killed worker %.2f s after the kill "
              "(visibility %.1f s; %d requests still queued)" % (len(held), took, vis / 1e3,
                                                                 left))
        if left < 200:
            fail("the backlog drained before the takeover; the case proves nothing")
        if took > vis / 1e3 + 2.5:
            fail("takeover took %.2f s after the kill; want <= visibility + 2.5 s" % took)
        wait_batch(srv, batch, timeout=120)
        exactly_once(results(srv, batch), ids)
    finally:
        for w in live:
            w.stop()


def case_classes(srv):
    c = srv.client()
    plan = {"schema_version": 1, "kind": "medley.plan", "version": 3,
            "created_at": "2026-12-06T12:00:00Z", "objective": "max_tokens_per_usd",
            "classes": [{"model": "echo", "name": "short", "max_tokens": 64},
                        {"model": "echo", "name": "long", "max_tokens": 4096}],
            "replicas": [], "models": [], "idle_gpus": [],
            "totals": {"tokens_per_s": 0, "usd_per_hour": 0, "usd_per_mtok": 0,
                       "tokens_per_usd": 0}, "notes": []}
    c.set("medley:plan", json.dumps(plan))
    c.set("medley:plan:version", 3)
    ids = ["c-%d" % i for i in range(40)]
    ls = [chat_line(i, "x" * (10 if k % 2 else 2000), max_tokens=16) for k, i in enumerate(ids)]
    batch = submit(srv, write_lines(srv.dir, "in.jsonl", ls), "--model", "echo")
    routing = json.loads(meta(srv, batch)["routing"])
    if routing.get("short", 0) == 0 or routing.get("long", 0) == 0:
        fail("the plan should route to both classes: %s" % routing)
    w = Worker(srv, args=["--heartbeat-ms", "500", "--plan-check-ms", "200"], name="cls")
    try:
        m = wait_batch(srv, batch, timeout=30)
        exactly_once(results(srv, batch), ids)
        if "reading their streams too" not in open(w.log_path).read():
            fail("the worker did not say it reads the class streams")
        print("ok: routed %s, a --model worker answered all %d (%s)" % (routing, len(ids),
                                                                       m["status"]))
    finally:
        w.stop()


CASES = {"dupid": case_dupid, "reconnect": case_reconnect, "refused": case_refused,
         "refused_heartbeat": case_refused_heartbeat, "takeover": case_takeover,
         "classes": case_classes}


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in CASES:
        fail("usage: queue_hostile.py %s" % "|".join(CASES))
    srv = RedisServer()
    try:
        CASES[sys.argv[1]](srv)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
