"""queue_redis_restart.py — acceptance: redis-server (appendonly yes, fsync always) is killed
and restarted mid-batch; the workers reconnect with backoff and the batch completes with
every custom_id answered exactly once."""
import time

from harness import *

N = 5000


def main():
    srv = RedisServer(appendonly=True)
    workers = []
    try:
        ids = ["r%05d" % i for i in range(N)]
        path = write_lines(srv.dir, "in.jsonl", [chat_line(c, "text %s" % c) for c in ids])
        batch = submit(srv, path, "--model", "echo")
        args = ["--echo-delay-ms", "20", "--max-seqs", "16", "--visibility-ms", "2000"]
        workers = [Worker(srv, args=args, name="w%d" % i) for i in range(2)]
        time.sleep(1.5)
        done = int(meta(srv, batch).get("completed", 0))
        if done >= N:
            fail("batch finished before the restart")
        srv.kill()
        print("redis killed at %d/%d" % (done, N))
        time.sleep(1.5)
        srv.start()
        after = int(meta(srv, batch).get("completed", 0))
        print("redis restarted; %d answers survived" % after)
        if after < done:
            fail("answers lost by the restart: %d before, %d after" % (done, after))
        m = wait_batch(srv, batch, timeout=150)
        lines = results(srv, batch)
        exactly_once(lines, ids)
        if m["status"] != "completed" or int(m["completed"]) != N:
            fail("batch meta wrong: %s" % m)
        for w in workers:
            if w.proc.poll() is not None:
                fail("a worker died across the restart:\n" + w.logs()[-2000:])
        if not any("reconnect" in w.logs() for w in workers):
            fail("no worker logged a reconnect")
        print("ok: %d lines exactly once across a Redis restart" % len(lines))
    finally:
        for w in workers:
            w.stop()
        srv.stop()


main()
