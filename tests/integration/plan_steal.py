"""plan_steal.py — routing is a preference (issue 39 item 11): against a real redis-server and
the real binary, a hand-written plan routes echo's short class to worker wA (which may steal
long) and its long class to worker wB (which may steal short); only wA runs. wA answers the
whole mixed batch, long lines included, by reading the long stream when its own has nothing.
Before, the long lines waited for wB forever (wA read q:{echo}:short only)."""
import json
import time

from harness import *


def plan():
    doc = {
        "schema_version": 1, "kind": "medley.plan", "version": 1,
        "created_at": "2026-12-07T14:00:00Z", "objective": "max_tokens_per_usd",
        "reason": "written by plan_steal.py",
        "classes": [{"model": "echo", "name": "long", "max_tokens": 4096},
                    {"model": "echo", "name": "short", "max_tokens": 300}],
        "replicas": [], "models": [{"model": "echo", "demand_tokens_per_s": 0,
                                    "predicted_tokens_per_s": 0, "deadline_met": True}],
        "idle_gpus": [], "totals": {"tokens_per_s": 0, "usd_per_hour": 0, "usd_per_mtok": 0,
                                    "tokens_per_usd": 0},
        "notes": []}
    for i, (gpu, own, other) in enumerate([("{wA}/0", "short", "long"),
                                           ("{wB}/0", "long", "short")]):
        doc["replicas"].append({
            "id": "r%d" % i, "model": "echo", "candidate": "1xL4",
            "stages": [{"gpu_type": "L4", "gpus": [gpu], "tp": 1, "layers": [0, 30]}],
            "classes": [own], "routing": {own: 1.0}, "steal": [other],
            "predicted_tokens_per_s": 100.0, "usd_per_hour": 0.8, "usd_per_mtok": 1.0})
    return doc


def main():
    srv = RedisServer()
    workers = []
    try:
        doc = plan()
        validate_all(schema_validator("plan"), [doc], "hand-written plan")
        r = srv.client()
        r.set("medley:plan", json.dumps(doc))
        r.set("medley:plan:version", 1)
        ids, lines = [], []
        for i in range(24):
            cid = "mix-%02d" % i
            ids.append(cid)
            lines.append(chat_line(cid, "hi %d" % i, max_tokens=16) if i % 2 == 0 else
                         chat_line(cid, "y %d" % i, max_tokens=1000))
        b = submit(srv, write_lines(srv.dir, "b.jsonl", lines))
        if r.xlen("medley:q:{echo}:long") != 12 or r.xlen("medley:q:{echo}:short") != 12:
            fail("the batch should be routed 12 short, 12 long")
        t0 = time.time()
        wa = Worker(srv, models=(), name="wA",
                    args=["--follow-plan", "--plan-check-ms", "100", "--heartbeat-ms", "300",
                          "--device-type", "L4", "--log-text", "--id", "wA",
                          "--echo-delay-ms", "20", "--max-seqs", "4"])
        workers.append(wa)
        m = wait_batch(srv, b, timeout=40)
        out = results(srv, b)
        exactly_once(out, ids)
        if m["status"] != "completed":
            fail("batch meta wrong: %s" % m)
        who = {l["medley"]["worker"] for l in out}
        if who != {"wA"}:
            fail("only wA runs, so it answers every line: %s" % who)
        print("ok: wA answered all 24 lines (12 of them its steal class) in %.1f s" %
              (time.time() - t0))
    finally:
        for w in workers:
            w.stop()
        srv.stop()


if __name__ == "__main__":
    main()
