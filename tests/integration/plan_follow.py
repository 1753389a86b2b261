"""plan_follow.py — request-size classes and `medley worker --follow-plan` against a real
redis-server and the real binary, with plans written by hand (valid against
schemas/plan.schema.json; devices named "{W}/0" as the scheduler names them, and "W/0"):

1. A batch submitted before any plan goes to the plain stream q:{echo} (plan_version -1)
   and a --follow-plan worker serves it once a plan names it.
2. With a plan defining two classes for echo (short <= 300 tokens, long <= 4096), a mixed
   batch lands in q:{echo}:short and q:{echo}:long by estimated size (ceil(bytes/4) +
   max_tokens); the meta records plan_version and the routing counts.
3. Mid-batch, plan v3 moves echo from worker wA to worker wB: wA finishes what it runs and
   then answers nothing more, idles and keeps heartbeating (plan_version 3, no replica); wB
   takes the rest. Every custom_id is answered exactly once.
4. Reclaiming and the DLQ cover class streams: a worker SIGKILLed while running class-stream
   entries; its peer (max_attempts 1) takes them over from the class streams and moves them
   to dlq:{echo} with the stream named; the batch still answers every line exactly once."""
import json
import signal
import time

from harness import *


def plan(version, replicas, classes=True):
    doc = {
        "schema_version": 1, "kind": "medley.plan", "version": version,
        "created_at": "2026-12-02T14:00:00Z", "objective": "max_tokens_per_usd",
        "reason": "written by plan_follow.py",
        "replicas": [], "models": [{"model": "echo", "demand_tokens_per_s": 0,
                                    "predicted_tokens_per_s": 0, "deadline_met": True}],
        "idle_gpus": [], "totals": {"tokens_per_s": 0, "usd_per_hour": 0, "usd_per_mtok": 0,
                                    "tokens_per_usd": 0},
        "notes": []}
    if classes:
        doc["classes"] = [{"model": "echo", "name": "long", "max_tokens": 4096},
                          {"model": "echo", "name": "short", "max_tokens": 300}]
    for i, (gpu, served) in enumerate(replicas):
        doc["replicas"].append({
            "id": "r%d" % i, "model": "echo", "candidate": "1xL4",
            "stages": [{"gpu_type": "L4", "gpus": [gpu], "tp": 1, "layers": [0, 30]}],
            "classes": served, "routing": {c: 1.0 / len(served) for c in served},
            "predicted_tokens_per_s": 100.0, "usd_per_hour": 0.8, "usd_per_mtok": 1.0})
    return doc


def publish(srv, doc, validator):
    validate_all(validator, [doc], "hand-written plan v%d" % doc["version"])
    r = srv.client()
    r.set("medley:plan", json.dumps(doc))
    r.set("medley:plan:version", doc["version"])
    r.publish("medley:events", json.dumps({"type": "plan", "version": doc["version"]}))


def mixed_lines(prefix, n):
    """Alternating short (tiny prompt, max_tokens 16) and long (2000-byte prompt, or
    max_tokens 1000) requests; returns (lines, ids of short, ids of long)."""
    lines, short, long_ = [], [], []
    for i in range(n):
        cid = "%s-%04d" % (prefix, i)
        if i % 2 == 0:
            lines.append(chat_line(cid, "hi %d" % i, max_tokens=16))
            short.append(cid)
        elif i % 4 == 1:
            lines.append(chat_line(cid, "x" * 2000, max_tokens=16))  # 500 + 16 tokens
            long_.append(cid)
        else:
            lines.append(chat_line(cid, "y %d" % i, max_tokens=1000))
            long_.append(cid)
    return lines, short, long_


def stream_ids(r, key):
    return [json.loads(f["line"])["custom_id"] for _, f in r.xrange(key)]


def answered_by(lines):
    by = {}
    for l in lines:
        by.setdefault(l["medley"]["worker"], []).append(l["custom_id"])
    return by


def main():
    srv = RedisServer()
    workers = []
    pv = schema_validator("plan")
    try:
        r = srv.client()
        common = ["--follow-plan", "--plan-check-ms", "100", "--heartbeat-ms", "300",
                  "--device-type", "L4", "--log-text"]

        # 1. No plan: the plain stream.
        ids0 = ["pre-%02d" % i for i in range(6)]
        b0 = submit(srv, write_lines(srv.dir, "b0.jsonl", [chat_line(c, c) for c in ids0]))
        m0 = meta(srv, b0)
        if m0.get("plan_version") != "-1" or r.xlen("medley:q:{echo}") != 6:
            fail("without a plan the batch must go to q:{echo} with plan_version -1: %s" % m0)

        # 2. Plan v2 with classes; wA named by it. The mixed batch is routed by size.
        publish(srv, plan(2, [("{wA}/0", ["short", "long"])]), pv)
        lines, short, long_ = mixed_lines("mix", 80)
        b1 = submit(srv, write_lines(srv.dir, "b1.jsonl", lines))
        m1 = meta(srv, b1)
        if m1.get("plan_version") != "2" or json.loads(m1.get("routing", "{}")) != {
                "short": len(short), "long": len(long_)}:
            fail("batch meta must record plan v2 and the routing: %s" % m1)
        got_s = stream_ids(r, "medley:q:{echo}:short")
        got_l = stream_ids(r, "medley:q:{echo}:long")
        if sorted(got_s) != sorted(short) or sorted(got_l) != sorted(long_):
            fail("class streams hold the wrong entries: short %s..., long %s..." % (
                got_s[:4], got_l[:4]))
        print("routed: %d short, %d long; plain stream %d" % (len(got_s), len(got_l),
                                                              r.xlen("medley:q:{echo}")))

        # wA follows the plan: 4 slots x 150 ms per answer, so the batch lasts ~3 s.
        wa = Worker(srv, models=(), name="wA",
                    args=common + ["--id", "wA", "--echo-delay-ms", "150", "--max-seqs", "4"])
        workers.append(wa)
        wait_batch(srv, b0, timeout=30)
        deadline = time.time() + 30
        while int(meta(srv, b1).get("completed", 0)) < 12 and time.time() < deadline:
            time.sleep(0.05)
        done = int(meta(srv, b1).get("completed", 0))
        if done >= 80 or done < 12:
            fail("the move must land mid-batch (completed %d of 80)" % done)

        # 3. Plan v3 moves echo (both classes) to wB.
        publish(srv, plan(3, [("wB/0", ["short", "long"])]), pv)
        t_move = time.time()
        wb = Worker(srv, models=(), name="wB",
                    args=common + ["--id", "wB", "--echo-delay-ms", "20", "--max-seqs", "8"])
        workers.append(wb)
        print("moved echo to wB at %d/80" % done)
        m1 = wait_batch(srv, b1, timeout=60)
        out1 = results(srv, b1)
        exactly_once(out1, short + long_)
        exactly_once(results(srv, b0), ids0)
        if m1["status"] != "completed" or int(m1["completed"]) != 80:
            fail("batch b1 meta wrong: %s" % m1)
        by = answered_by(out1)
        if not by.get("wA") or not by.get("wB"):
            fail("both workers should have answered part of the batch: %s" % {
                k: len(v) for k, v in by.items()})
        # wA drains: after the move it finishes what it runs (4 slots; its plan check every
        # 100 ms lets about one more round of 4 start; slack for a loaded machine), then reads
        # nothing more.
        if len(by["wA"]) > done + 12:
            fail("wA answered %d lines, more than the %d done at the move + 12 it could have "
                 "been running" % (len(by["wA"]), done))
        hb = {}
        deadline = time.time() + 10
        while time.time() < deadline:
            hb = r.hgetall("medley:worker:{wA}")
            if hb.get("plan_version") == "3" and "echo" not in hb.get("json", ""):
                break
            time.sleep(0.1)
        if hb.get("plan_version") != "3" or hb.get("replicas") != "" or \
                json.loads(hb["json"])["models"] != []:
            fail("wA must idle under plan v3 and keep heartbeating: %s" % hb)
        hbb = r.hgetall("medley:worker:{wB}")
        if hbb.get("replicas") != "r0" or hbb.get("plan_version") != "3":
            fail("wB heartbeat must name replica r0 of plan v3: %s" % hbb)
        if "moves echo away" not in wa.logs():
            fail("wA did not log the move:\n" + wa.logs()[-2000:])
        print("move ok: wA %d, wB %d answers; wA idles (%.1fs after the move)" % (
            len(by["wA"]), len(by["wB"]), time.time() - t_move))

        # 4. Reclaim and DLQ on class streams: wB slow and SIGKILLed with entries running;
        # wC (also named by plan v4) takes them over and, at max_attempts 1, dead-letters them.
        wb.stop()
        workers.remove(wb)
        publish(srv, plan(4, [("wB/0", ["short", "long"]), ("{wC}/0", ["short", "long"])]), pv)
        wb2 = Worker(srv, models=(), name="wB2",
                     args=common + ["--id", "wB", "--echo-delay-ms", "60000", "--max-seqs", "4",
                                    "--visibility-ms", "1000"])
        lines2, s2, l2 = mixed_lines("kill", 8)
        b2 = submit(srv, write_lines(srv.dir, "b2.jsonl", lines2))
        deadline = time.time() + 20
        while time.time() < deadline:
            pend = sum(r.xpending("medley:q:{echo}:%s" % c, "workers")["pending"]
                       for c in ("short", "long"))
            if pend >= 4:
                break
            time.sleep(0.05)
        if pend < 4:
            fail("wB did not take 4 class-stream entries:\n" + wb2.logs()[-2000:])
        wb2.signal(signal.SIGKILL)
        wb2.wait(10)
        wb2.log.close()
        wc = Worker(srv, models=(), name="wC",
                    args=common + ["--id", "wC", "--echo-delay-ms", "10", "--max-attempts", "1",
                                   "--visibility-ms", "1000"])
        workers.append(wc)
        m2 = wait_batch(srv, b2, timeout=60)
        out2 = results(srv, b2)
        exactly_once(out2, s2 + l2)
        dead = [l for l in out2 if l["error"] and l["error"]["code"] == "max_attempts_exceeded"]
        dlq = r.xrange("medley:dlq:{echo}")
        streams = sorted({f.get("stream") for _, f in dlq})
        if len(dead) != 4 or len(dlq) != 4 or not set(streams) <= {
                "medley:q:{echo}:short", "medley:q:{echo}:long"}:
            fail("the 4 killed entries must be dead-lettered from the class streams: %d error "
                 "lines, DLQ %s" % (len(dead), dlq))
        if int(m2["failed"]) != 4 or int(m2["completed"]) != 4:
            fail("batch b2 meta wrong: %s" % m2)
        for c in ("short", "long", None):
            key = "medley:q:{echo}" + (":" + c if c else "")
            p = r.xpending(key, "workers")["pending"]
            if p:
                fail("%d entries still pending in %s" % (p, key))
        print("reclaim ok: 4 entries taken over from %s and dead-lettered" % streams)
        print("ok")
    finally:
        for w in workers:
            w.stop()
        srv.stop()


if __name__ == "__main__":
    main()
