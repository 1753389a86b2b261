"""queue_crash.py — acceptance: 10,000 requests over 3 workers, one SIGKILLed mid-run and
one SIGTERMed: every custom_id has exactly one output line, none lost, none doubled; the
SIGTERMed worker exits 0; every entry the killed worker held when it died was taken over
(answered by another worker on a later delivery, or found already answered and acked)."""
import json
import signal
import time

from harness import *

N = 10000


def main():
    srv = RedisServer()
    workers = []
    try:
        ids = ["req-%05d" % i for i in range(N)]
        path = write_lines(srv.dir, "in.jsonl", [chat_line(c, "text %s" % c) for c in ids])
        t0 = time.time()
        batch = submit(srv, path, "--model", "echo")
        print("submitted %d in %.2fs" % (N, time.time() - t0))
        # 16 slots x 25 ms per answer: ~640 req/s per worker, so the batch lasts seconds and
        # the signals land mid-run; a short visibility timeout makes the takeover quick.
        args = ["--echo-delay-ms", "25", "--max-seqs", "16", "--visibility-ms", "1500",
                "--heartbeat-ms", "500"]
        # w0 starts alone and the others only once it holds entries in flight (on a loaded
        # machine a worker can take seconds to start: started together, the other two could
        # finish the batch before w0 took anything), so the takeover below is certain to have
        # something to take.
        workers = [Worker(srv, args=args + ["--id", "w0"], name="w0")]
        c = srv.client()

        def holds(name, timeout):
            t_wait = time.time() + timeout
            while time.time() < t_wait:
                held = c.xpending_range("medley:q:{echo}", "workers", min="-", max="+", count=1,
                                        consumername=name)
                if held and int(meta(srv, batch).get("completed", 0)) > 0:
                    return True
                time.sleep(0.05)
            return False

        if not holds("w0", 60):
            fail("worker w0 never held an entry")
        workers += [Worker(srv, args=args + ["--id", "w%d" % i], name="w%d" % i) for i in (1, 2)]
        if not holds("w1", 60):
            fail("worker w1 never held an entry")
        done = int(meta(srv, batch).get("completed", 0))
        if done >= N:
            fail("batch finished before the kill; the test would prove nothing")
        # Kill w0 while it holds entries: freeze it (SIGSTOP), read what it holds, and kill it
        # only when that is not empty (a worker between two reads holds nothing, and a kill
        # there would leave nothing to take over); those entries are what the others must
        # take over.
        held = []
        for _ in range(500):
            workers[0].signal(signal.SIGSTOP)
            held = c.xpending_range("medley:q:{echo}", "workers", min="-", max="+", count=1000,
                                    consumername="w0")
            if held:
                break
            workers[0].signal(signal.SIGCONT)
            time.sleep(0.01)
        if not held:
            fail("w0 never held an entry when frozen")
        held_cids = set()
        for h in held:
            for _, fields in c.xrange("medley:q:{echo}", min=h["message_id"], max=h["message_id"]):
                held_cids.add(json.loads(fields["line"])["custom_id"])
        workers[0].signal(signal.SIGKILL)
        workers[0].signal(signal.SIGCONT)
        print("SIGKILL w0 at %d/%d holding %d entries" % (done, N, len(held)))
        time.sleep(1.0)
        workers[1].signal(signal.SIGTERM)
        print("SIGTERM w1 at %s/%d" % (meta(srv, batch).get("completed"), N))
        rc = workers[1].wait(60)
        if rc != 0:
            fail("SIGTERMed worker exited %d:\n%s" % (rc, workers[1].logs()[-2000:]))
        m = wait_batch(srv, batch, timeout=150)
        print("batch %s: %s in %.1fs" % (batch, m, time.time() - t0))
        lines = results(srv, batch)
        exactly_once(lines, ids)
        if m["status"] != "completed" or int(m["completed"]) != N or int(m["failed"]) != 0:
            fail("batch meta wrong: %s" % m)
        if any(l["error"] is not None or l["response"]["status_code"] != 200 for l in lines):
            fail("some lines failed")
        retried = [l for l in lines if l["medley"]["attempt"] >= 2]
        # every entry w0 held when it died: answered by w0 before (its XACK lost with it; the
        # redelivery found it done) or taken over and answered by another worker
        by_cid = {l["custom_id"]: l for l in lines}
        taken = 0
        for cid in held_cids:
            l = by_cid[cid]
            if l["medley"]["attempt"] >= 2 and l["medley"]["worker"] != "w0":
                taken += 1
            elif l["medley"]["worker"] != "w0":
                fail("%s, held by the killed w0, was answered by %s on its first delivery" % (
                    cid, l["medley"]["worker"]))
        # (and none is still pending, checked below: only another worker can have acked them)
        print("w0 held %d entries at its death: %d taken over by other workers, %d answered "
              "by w0 before it died" % (len(held_cids), taken, len(held_cids) - taken))
        pend = srv.client().xpending("medley:q:{echo}", "workers")
        if pend["pending"] != 0:
            fail("%d entries still pending" % pend["pending"])
        left = srv.client().xlen("medley:q:{echo}")
        if left != 0:
            fail("%d answered entries were not deleted from the queue stream" % left)
        print("ok: %d lines, exactly once; %d taken over from the killed worker" % (
            len(lines), len(retried)))
    finally:
        for w in workers:
            w.stop()
        srv.stop()


main()
