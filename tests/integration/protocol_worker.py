"""protocol_worker.py — a worker on redis-py written only from docs/protocol.md §6 (its
completion script copied from the page), serving the `echo` model side by side with a real
`medley worker` on one batch: every custom_id is answered exactly once, both workers answer
some, and the batch finishes. Shows the worker half of the contract is implementable from
the page, so a fleet can mix implementations."""
import json
import random
import time

import redis

from harness import RedisServer, Worker, chat_line, exactly_once, fail, results, submit, \
    wait_batch, write_lines

FINISH = """
local function finish(meta, st, deadline, now, channel, batch)
  local final = 'completed'
  if st == 'cancelling' then final = 'cancelled'
  elseif tonumber(deadline) and tonumber(deadline) > 0 and tonumber(now) > tonumber(deadline) then final = 'expired' end
  redis.call('HSET', meta, 'status', final, 'finished_at', now)
  redis.call('PUBLISH', channel, cjson.encode({type='batch', batch=batch, status=final}))
  return final
end
"""
COMPLETE = FINISH + """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('XADD', KEYS[3], '*', 'custom_id', ARGV[1], 'ok', ARGV[2], 'line', ARGV[3], 'entry', ARGV[7] or '')
if ARGV[2] == '1' then redis.call('HINCRBY', KEYS[1], 'completed', 1)
else redis.call('HINCRBY', KEYS[1], 'failed', 1) end
local m = redis.call('HMGET', KEYS[1], 'status', 'total', 'completed', 'failed', 'started_at', 'deadline')
if not m[5] or m[5] == '' or m[5] == '0' then redis.call('HSET', KEYS[1], 'started_at', ARGV[4]) end
if (m[1] == 'in_progress' or m[1] == 'cancelling') and (tonumber(m[3]) or 0) + (tonumber(m[4]) or 0) >= (tonumber(m[2]) or 0) then
  finish(KEYS[1], m[1], m[6], ARGV[4], ARGV[5], ARGV[6])
end
return 1
"""


def hexid(n=24):
    return "%0*x" % (n, random.getrandbits(4 * n))


def answer(r, sha, p, q, entry_id, batch, member, ok, doc):
    keys = ["%s{%s}:meta" % (p, batch), "%s{%s}:done" % (p, batch), "%s{%s}:out" % (p, batch)]
    argv = [member, "1" if ok else "0", json.dumps(doc), int(time.time() * 1000), p + "events",
            batch, entry_id]
    try:
        r.evalsha(sha, 3, *keys, *argv)
    except redis.exceptions.NoScriptError:
        r.eval(COMPLETE, 3, *keys, *argv)
    r.xack(q, "workers", entry_id)
    r.xdel(q, entry_id)


def serve(r, p, model, name, until):
    q = "%sq:{%s}" % (p, model)
    try:
        r.xgroup_create(q, "workers", id="0", mkstream=True)
    except redis.exceptions.ResponseError as e:
        if "BUSYGROUP" not in str(e):
            raise
    sha = r.script_load(COMPLETE)
    n = 0
    while not until():
        got = r.xreadgroup("workers", name, {q: ">"}, count=16, block=100)
        for _, entries in got or []:
            for entry_id, f in entries:
                batch, line = f["batch"], f["line"]
                st = r.hmget("%s{%s}:meta" % (p, batch), "status", "deadline")
                med = {"worker": name, "device_types": ["cpu"], "queue_ms": 0.0,
                       "prefill_ms": 0.0, "decode_ms": 0.0, "cost_usd": 0.0, "attempt": 1}
                try:
                    req = json.loads(line)
                    text = req["body"]["messages"][-1]["content"]
                    cid = req["custom_id"]
                except (ValueError, KeyError, TypeError, IndexError):
                    answer(r, sha, p, q, entry_id, batch, "#" + entry_id, False,
                           {"id": "batch_req_" + hexid(), "custom_id": None,
                            "response": {"status_code": 400, "request_id": "req_" + hexid(),
                                         "body": {"error": {"message": "not a chat request",
                                                            "type": "invalid_request_error",
                                                            "param": None, "code": "invalid_json"}}},
                            "error": None, "medley": med})
                    continue
                if st[0] in ("cancelling", "cancelled"):
                    answer(r, sha, p, q, entry_id, batch, cid, False,
                           {"id": "batch_req_" + hexid(), "custom_id": cid, "response": None,
                            "error": {"code": "batch_cancelled", "message": "cancelled"},
                            "medley": med})
                    continue
                body = {"id": "chatcmpl-" + hexid(), "object": "chat.completion",
                        "created": int(time.time()), "model": model,
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                     "finish_reason": "stop", "logprobs": None}],
                        "usage": {"prompt_tokens": len(text), "completion_tokens": len(text),
                                  "total_tokens": 2 * len(text)}}
                answer(r, sha, p, q, entry_id, batch, cid, True,
                       {"id": "batch_req_" + hexid(), "custom_id": cid,
                        "response": {"status_code": 200, "request_id": "req_" + hexid(),
                                     "body": body}, "error": None, "medley": med})
                n += 1
    return n


def main():
    srv = RedisServer()
    w = None
    try:
        ids = ["mix-%d" % i for i in range(3000)]
        b = submit(srv, write_lines(srv.dir, "in.jsonl", [chat_line(c, "t " + c) for c in ids]))
        w = Worker(srv, args=["--echo-delay-ms", "2", "--max-seqs", "4"], name="c")
        r = redis.Redis(host="127.0.0.1", port=srv.port, decode_responses=True)
        meta = "medley:{%s}:meta" % b
        t_end = time.time() + 60
        n_py = serve(r, "medley:", "echo", "py-worker",
                     lambda: r.hget(meta, "status") == "completed" or time.time() > t_end)
        m = wait_batch(srv, b, timeout=30)
        lines = results(srv, b)
        exactly_once(lines, ids)
        by = {}
        for l in lines:
            by[l["medley"]["worker"]] = by.get(l["medley"]["worker"], 0) + 1
        if m["status"] != "completed" or by.get("py-worker", 0) != n_py or n_py == 0 or \
                len(by) != 2:
            fail("mixed fleet: %s, answers by worker %s" % (m, by))
        print("ok: python worker from docs/protocol.md + medley worker: %s" % by)
    finally:
        if w:
            w.stop()
        srv.stop()


main()
