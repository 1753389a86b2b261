"""plan_scheduler.py — end to end with the real `medley scheduler`: two `medley worker
--follow-plan` processes report L4 devices (the echo model stands in for a real one; its
shape comes from a model card in the workload file, with two request-size classes). A
batch submitted before any plan waits in q:{echo}; `medley scheduler --once` plans from the
heartbeats and that backlog and publishes plan v1; the workers its replicas name load echo
and answer the batch. A second batch is then routed to the plan's class streams and
answered too: every custom_id exactly once, only by workers the plan names."""
import json
import os
import time

from harness import *

WORKLOAD = {
    "version": 1, "kind": "medley.workload",
    "models": [{
        "model": {"name": "echo", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 4,
                  "ffn": 128, "vocab": 256, "tied_embeddings": True, "quant": "F16",
                  "max_context": 8192},
        "classes": [
            {"name": "short", "input_mean": 50, "output_mean": 50, "max_tokens": 300,
             "share": 0.5},
            {"name": "long", "input_mean": 500, "output_mean": 500, "max_tokens": 4096,
             "share": 0.5}]}]}


def main():
    srv = RedisServer()
    workers = []
    try:
        r = srv.client()
        wl = os.path.join(srv.dir, "workload.json")
        with open(wl, "w") as f:
            json.dump(WORKLOAD, f)
        args = ["--follow-plan", "--plan-check-ms", "100", "--heartbeat-ms", "300",
                "--device-type", "L4", "--echo-delay-ms", "5", "--log-text"]
        for name in ("wA", "wB"):
            workers.append(Worker(srv, models=(), name=name, args=args + ["--id", name]))
        deadline = time.time() + 10
        while len(r.keys("medley:worker:*")) < 2 and time.time() < deadline:
            time.sleep(0.05)
        if len(r.keys("medley:worker:*")) < 2:
            fail("workers did not heartbeat")

        ids1 = ["one-%03d" % i for i in range(40)]
        b1 = submit(srv, write_lines(srv.dir, "b1.jsonl", [chat_line(c, c) for c in ids1]))
        time.sleep(1.0)
        if int(meta(srv, b1).get("completed", 0)) != 0:
            fail("workers named in no plan must not serve anything")

        p = medley("scheduler", "--once", "--workload", wl, "--redis", srv.url, timeout=60)
        doc = json.loads(r.get("medley:plan") or "null")
        if not doc:
            fail("the scheduler published no plan:\n" + p.stdout + p.stderr)
        validate_all(schema_validator("plan"), [doc], "the scheduler's plan")
        named = {g for rep in doc["replicas"] if rep["model"] == "echo"
                 for st in rep["stages"] for g in st["gpus"]}
        planned = {w for w in ("wA", "wB") if "{%s}/0" % w in named}
        if not planned:
            fail("the plan names neither worker's device: %s" % sorted(named))
        print("plan v%d: echo on %s" % (doc["version"], sorted(named)))

        m1 = wait_batch(srv, b1, timeout=60)
        out1 = results(srv, b1)
        exactly_once(out1, ids1)
        lines2 = [chat_line("two-%03d" % i, "x" * (4000 if i % 3 == 0 else 8), max_tokens=16)
                  for i in range(30)]
        ids2 = ["two-%03d" % i for i in range(30)]
        b2 = submit(srv, write_lines(srv.dir, "b2.jsonl", lines2))
        m2 = meta(srv, b2)
        if m2.get("plan_version") != str(doc["version"]) or \
                json.loads(m2["routing"]) != {"short": 20, "long": 10}:
            fail("batch 2 must be routed by plan v%d: %s" % (doc["version"], m2))
        m2 = wait_batch(srv, b2, timeout=60)
        out2 = results(srv, b2)
        exactly_once(out2, ids2)
        for m in (m1, m2):
            if m["status"] != "completed" or int(m["failed"]) != 0:
                fail("batch meta wrong: %s" % m)
        by = {l["medley"]["worker"] for l in out1 + out2}
        if not by <= planned:
            fail("answered by %s, but the plan names only %s" % (sorted(by), sorted(planned)))
        for w in ("wA", "wB"):
            deadline = time.time() + 5
            hb = {}
            while time.time() < deadline:
                hb = r.hgetall("medley:worker:{%s}" % w)
                if hb.get("plan_version") == str(doc["version"]):
                    break
                time.sleep(0.05)
            if hb.get("plan_version") != str(doc["version"]):
                fail("%s does not report plan v%d: %s" % (w, doc["version"], hb))
            if w in planned and not hb.get("replicas") or w not in planned and hb.get("replicas"):
                fail("%s reports replicas '%s' under plan v%d" % (w, hb.get("replicas"),
                                                                  doc["version"]))
        print("ok: %d + %d lines exactly once, answered by %s" % (len(out1), len(out2),
                                                                 sorted(by)))
    finally:
        for w in workers:
            w.stop()
        srv.stop()


if __name__ == "__main__":
    main()
