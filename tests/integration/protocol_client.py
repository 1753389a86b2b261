"""protocol_client.py — a batch client on redis-py written only from docs/protocol.md (§3 and
§5): it creates the consumer group and the batch hash, pipelines the XADDs, seals the batch
with the seal script copied from the page, follows progress on the events channel, and reads
the results from {B}:out. The server side is a real `medley worker`."""
import json
import os
import time

import redis

from harness import RedisServer, Worker, fail

SEAL = """
local function finish(meta, st, deadline, now, channel, batch)
  local final = 'completed'
  if st == 'cancelling' then final = 'cancelled'
  elseif tonumber(deadline) and tonumber(deadline) > 0 and tonumber(now) > tonumber(deadline) then final = 'expired' end
  redis.call('HSET', meta, 'status', final, 'finished_at', now)
  redis.call('PUBLISH', channel, cjson.encode({type='batch', batch=batch, status=final}))
  return final
end
local m = redis.call('HMGET', KEYS[1], 'status', 'completed', 'failed', 'deadline')
if not m[1] then return redis.error_reply('NOBATCH no such batch') end
if m[1] ~= 'validating' and m[1] ~= 'cancelling' then
  return redis.error_reply('BADSTATE batch is ' .. m[1]) end
local st = m[1]
if st == 'validating' then st = 'in_progress' end
redis.call('HSET', KEYS[1], 'total', ARGV[1], 'status', st)
if (tonumber(m[2]) or 0) + (tonumber(m[3]) or 0) >= tonumber(ARGV[1]) then
  return finish(KEYS[1], st, m[4], ARGV[2], ARGV[3], ARGV[4])
end
redis.call('PUBLISH', ARGV[3], cjson.encode({type='batch', batch=ARGV[4], status=st}))
return st
"""

TERMINAL = {"completed", "failed", "cancelled", "expired"}


class BatchClient:
    def __init__(self, r, prefix="medley:"):
        self.r, self.p = r, prefix

    def submit(self, model, lines, batch, window_s=86400):
        p, r = self.p, self.r
        q = "%sq:{%s}" % (p, model)
        try:
            r.xgroup_create(q, "workers", id="0", mkstream=True)
        except redis.exceptions.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
        ids = []
        for l in lines:  # malformed lines are sent as they are; workers answer them
            try:
                ids.append(json.loads(l)["custom_id"])
            except (ValueError, KeyError, TypeError):
                pass
        if len(set(ids)) != len(ids):
            raise ValueError("duplicate custom_id")
        meta = "%s{%s}:meta" % (p, batch)
        if r.exists(meta):
            raise ValueError("batch exists")
        now = int(time.time() * 1000)
        r.hset(meta, mapping={"status": "validating", "model": model,
                              "endpoint": "/v1/chat/completions", "total": 0, "completed": 0,
                              "failed": 0, "created_at": now, "started_at": 0, "finished_at": 0,
                              "deadline": now + window_s * 1000, "priority": 0,
                              "input_file": "protocol_client.py"})
        r.zadd(p + "batches", {batch: now})
        pipe = r.pipeline(transaction=False)
        for i, l in enumerate(lines):
            pipe.xadd(q, {"batch": batch, "line": l})
            if i % 1000 == 999:
                pipe.execute()
        pipe.execute()
        return r.eval(SEAL, 1, meta, len(lines), int(time.time() * 1000), p + "events", batch)

    def status(self, batch):
        return self.r.hgetall("%s{%s}:meta" % (self.p, batch))

    def results(self, batch):
        key, start, out = "%s{%s}:out" % (self.p, batch), "-", []
        while True:
            chunk = self.r.xrange(key, start, "+", count=2000)
            out += [(f["ok"] == "1", json.loads(f["line"])) for _, f in chunk]
            if len(chunk) < 2000:
                return out
            start = "(" + chunk[-1][0]


def main():
    srv = RedisServer()
    w = None
    try:
        r = redis.Redis(host="127.0.0.1", port=srv.port, decode_responses=True)
        events = r.pubsub()
        events.subscribe("medley:events")
        c = BatchClient(r)
        n = 3000
        lines = [json.dumps({"custom_id": "py-%d" % i, "method": "POST",
                             "url": "/v1/chat/completions",
                             "body": {"model": "echo", "max_tokens": 20,
                                      "messages": [{"role": "user", "content": "n=%d" % i}]}})
                 for i in range(n)]
        lines.append('{"custom_id": "broken"')
        st = c.submit("echo", lines, "pyclient_1")
        if st != "in_progress":
            fail("seal returned %r" % st)
        w = Worker(srv, name="w")
        deadline = time.time() + 60
        while c.status("pyclient_1")["status"] not in TERMINAL:
            if time.time() > deadline:
                fail("batch did not finish: %s" % c.status("pyclient_1"))
            time.sleep(0.1)
        m = c.status("pyclient_1")
        res = c.results("pyclient_1")
        if m["status"] != "completed" or int(m["total"]) != n + 1 or int(m["completed"]) != n \
                or int(m["failed"]) != 1:
            fail("meta: %s" % m)
        good = {l["custom_id"]: l for ok, l in res if ok}
        bad = [l for ok, l in res if not ok]
        if len(good) != n or len(bad) != 1 or len(res) != n + 1:
            fail("results: %d good, %d bad" % (len(good), len(bad)))
        for i in range(n):
            txt = good["py-%d" % i]["response"]["body"]["choices"][0]["message"]["content"]
            if txt != "n=%d" % i:
                fail("py-%d answered %r" % (i, txt))
        seen = []
        t_end = time.time() + 2
        while time.time() < t_end:
            msg = events.get_message(timeout=0.2)
            if msg and msg["type"] == "message":
                seen.append(json.loads(msg["data"])["status"])
                if seen[-1] == "completed":
                    break
        if seen[:1] != ["in_progress"] or seen[-1:] != ["completed"]:
            fail("events seen: %s" % seen)
        # a second seal is refused, as the page says
        try:
            c.r.eval(SEAL, 1, "medley:{pyclient_1}:meta", 1, 0, "medley:events", "pyclient_1")
            fail("a second seal was accepted")
        except redis.exceptions.ResponseError as e:
            if "BADSTATE" not in str(e):
                fail("second seal: %s" % e)
        print("ok: redis-py client from docs/protocol.md: %d answers, events %s" % (len(res), seen))
    finally:
        if w:
            w.stop()
        srv.stop()


main()
