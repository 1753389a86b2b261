"""queue_lifecycle.py — the batch lifecycle beyond the happy path: cancel (remaining requests
answered batch_cancelled, status cancelled), deadline (batch_expired, status expired), the
DLQ after max_attempts, ACL/password AUTH (and a clear failure with a wrong password),
`medley batches`, `results --errors`, and `medley run` with its private redis-server."""
import glob
import json
import os
import signal
import subprocess
import time

from harness import *


def test_cancel(srv):
    ids = ["c%04d" % i for i in range(2000)]
    b = submit(srv, write_lines(srv.dir, "c.jsonl", [chat_line(c, c) for c in ids]))
    w = Worker(srv, args=["--echo-delay-ms", "50", "--max-seqs", "8"], name="cancel")
    try:
        time.sleep(1.0)
        p = medley("cancel", b, "--redis", srv.url)
        if "cancelling" not in p.stdout:
            fail("cancel said: %s" % p.stdout)
        m = wait_batch(srv, b, timeout=60)
        lines = results(srv, b)
        exactly_once(lines, ids)
        cancelled = [l for l in lines if l["error"] and l["error"]["code"] == "batch_cancelled"]
        if m["status"] != "cancelled" or not cancelled or len(cancelled) == len(ids):
            fail("cancel: status %s, %d cancelled of %d" % (m["status"], len(cancelled), len(ids)))
        if int(m["failed"]) != len(cancelled):
            fail("cancelled lines must count as failed: %s" % m)
        p = medley("cancel", b, "--redis", srv.url, check=False)
        if p.returncode != 1 or "already cancelled" not in p.stderr:
            fail("cancelling a finished batch should fail clearly: %s" % p.stderr)
        print("cancel ok: %d done, %d cancelled" % (len(ids) - len(cancelled), len(cancelled)))
    finally:
        w.stop()


def test_expired(srv):
    ids = ["e%d" % i for i in range(30)]
    b = submit(srv, write_lines(srv.dir, "e.jsonl", [chat_line(c, c) for c in ids]),
               "--completion-window", "1s")
    time.sleep(1.3)
    w = Worker(srv, name="expired")
    try:
        m = wait_batch(srv, b, timeout=30)
        lines = results(srv, b)
        exactly_once(lines, ids)
        if m["status"] != "expired" or any(l["error"]["code"] != "batch_expired" for l in lines):
            fail("expired: %s" % m)
        print("expired ok")
    finally:
        w.stop()


def test_dlq(srv):
    r = srv.client()
    b = submit(srv, write_lines(srv.dir, "d.jsonl", [chat_line("poison", "p")]))
    # A consumer takes the entry and dies without answering (delivery 1).
    got = r.xreadgroup("workers", "ghost", {"medley:q:{echo}": ">"}, count=1)
    if not got:
        fail("ghost read nothing")
    w = Worker(srv, args=["--max-attempts", "1", "--visibility-ms", "300"], name="dlq")
    try:
        m = wait_batch(srv, b, timeout=30)
        lines = results(srv, b)
        if len(lines) != 1 or lines[0]["error"]["code"] != "max_attempts_exceeded":
            fail("dlq answer: %s" % lines)
        dl = r.xrange("medley:dlq:{echo}")
        if len(dl) != 1 or dl[0][1]["batch"] != b or "max_attempts" not in dl[0][1]["reason"]:
            fail("dlq stream: %s" % dl)
        if json.loads(dl[0][1]["line"])["custom_id"] != "poison":
            fail("the DLQ must keep the input line")
        if int(m["failed"]) != 1:
            fail("dlq meta: %s" % m)
        print("dlq ok")
    finally:
        w.stop()


def test_batches_and_errors_file(srv):
    p = medley("batches", "--redis", srv.url, "--json")
    docs = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    if len(docs) < 3:
        fail("batches listed %d" % len(docs))
    validate_all(schema_validator("batch-meta"), docs, "batches --json")
    b = submit(srv, write_lines(srv.dir, "x.jsonl", [chat_line("ok1", "a"), "nonsense",
                                                      chat_line("bad", "b", max_tokens=0)]))
    w = Worker(srv, name="errs")
    try:
        wait_batch(srv, b, timeout=30)
    finally:
        w.stop()
    o, e = os.path.join(srv.dir, "o.jsonl"), os.path.join(srv.dir, "e.jsonl")
    medley("results", b, "--redis", srv.url, "-o", o, "--errors", e)
    if len(open(o).readlines()) != 1 or len(open(e).readlines()) != 2:
        fail("results --errors split wrong")
    dup = write_lines(srv.dir, "dup.jsonl", [chat_line("same", "a"), chat_line("same", "b")])
    p = medley("submit", dup, "--redis", srv.url, check=False)
    if p.returncode == 0 or "more than once" not in p.stderr:
        fail("duplicate custom_ids must be refused: %s" % p.stderr)
    # a --batch-id longer than an id can be (63) is refused as given, not shortened (issue
    # 25, item 4: it used to be cut to 63 characters, and `status` of the id given said "no
    # batch")
    long_id = "b" * 64
    one = write_lines(srv.dir, "one.jsonl", [chat_line("one", "a")])
    p = medley("submit", one, "--redis", srv.url, "--batch-id", long_id, check=False)
    if p.returncode == 0 or "1..63" not in p.stderr or long_id not in p.stderr:
        fail("a 64-character --batch-id must be refused naming it: %s" % p.stderr)
    if srv.client().exists("medley:{%s}:meta" % long_id[:63]):
        fail("a shortened batch id was created")
    print("batches/results --errors, --batch-id limit ok")


def test_auth():
    srv = RedisServer(password="s3cr%t")
    try:
        url = "redis://:s3cr%%25t@127.0.0.1:%d/0" % srv.port
        path = write_lines(srv.dir, "a.jsonl", [chat_line("a%d" % i, "x") for i in range(10)])
        b = medley("submit", path, "--redis", url).stdout.strip()
        cmd = [MEDLEY, "worker", "--redis", "redis://:wrong@127.0.0.1:%d/0" % srv.port,
               "--model", "echo"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if p.returncode != 1 or "AUTH" not in p.stderr:
            fail("a wrong password must fail clearly: rc %d %s" % (p.returncode, p.stderr))
        w = subprocess.Popen([MEDLEY, "worker", "--redis", url, "--model", "echo"],
                             stderr=subprocess.DEVNULL)
        try:
            srv.password = "s3cr%t"
            m = wait_batch(srv, b, timeout=30)
            if m["status"] != "completed":
                fail("auth batch: %s" % m)
        finally:
            w.terminate()
            w.wait()
        # An ACL user with a password, as redis://user:pass@host/db.
        srv.client().execute_command("ACL", "SETUSER", "medleyw", "on", ">pw-2", "~*", "&*",
                                     "+@all")
        url = "redis://medleyw:pw-2@127.0.0.1:%d/0" % srv.port
        path = write_lines(srv.dir, "acl.jsonl", [chat_line("acl%d" % i, "x") for i in range(5)])
        b = medley("submit", path, "--redis", url).stdout.strip()
        w = subprocess.Popen([MEDLEY, "worker", "--redis", url, "--model", "echo"],
                             stderr=subprocess.DEVNULL)
        try:
            if wait_batch(srv, b, timeout=30)["status"] != "completed":
                fail("ACL user batch did not complete")
        finally:
            w.terminate()
            w.wait()
        print("auth ok (password and ACL user)")
    finally:
        srv.stop()


def test_run(tmp):
    ids = ["run-%d" % i for i in range(300)]
    path = write_lines(tmp, "run.jsonl", [chat_line(c, "say %s" % c) for c in ids])
    out = os.path.join(tmp, "run.out.jsonl")
    env = dict(os.environ, TMPDIR=tmp)
    p = subprocess.run([MEDLEY, "run", path, "-o", out], capture_output=True, text=True,
                       timeout=60, env=env)
    if p.returncode != 0:
        fail("medley run: %s" % p.stderr)
    lines = [json.loads(l) for l in open(out)]
    exactly_once(lines, ids)
    if glob.glob(os.path.join(tmp, "medley-run-*")):
        fail("medley run left its temp dir behind")
    print("run ok: %s" % p.stderr.strip().splitlines()[-1])


def test_handback(srv):
    """SIGTERM with a short grace: running requests are handed back (marked idle) and another
    worker takes them over at once, although the visibility timeout is a minute."""
    ids = ["h%d" % i for i in range(8)]
    b = submit(srv, write_lines(srv.dir, "h.jsonl", [chat_line(c, c) for c in ids]))
    slow = Worker(srv, args=["--echo-delay-ms", "60000", "--grace-ms", "300"], name="slow")
    time.sleep(1.0)
    t = time.time()
    slow.stop()  # exits 0 after handing back its 8 running requests
    fast = Worker(srv, args=["--visibility-ms", "60000"], name="fast")
    try:
        m = wait_batch(srv, b, timeout=20)
        lines = results(srv, b)
        exactly_once(lines, ids)
        if m["status"] != "completed" or time.time() - t > 15:
            fail("hand-back: %s after %.1fs" % (m, time.time() - t))
        if "handing back 8" not in slow.logs():
            fail("the slow worker did not hand back its requests:\n" + slow.logs()[-1500:])
        print("hand-back ok: taken over in %.1fs" % (time.time() - t))
    finally:
        fast.stop()


def test_resume_same_id(srv):
    """A worker SIGKILLed and restarted with the same --id resumes its pending entries at
    once, without waiting out the (one minute) visibility timeout."""
    ids = ["s%d" % i for i in range(6)]
    b = submit(srv, write_lines(srv.dir, "s.jsonl", [chat_line(c, c) for c in ids]))
    w1 = Worker(srv, args=["--id", "stable-1", "--echo-delay-ms", "60000"], name="s1")
    time.sleep(1.0)
    w1.signal(signal.SIGKILL)
    w1.wait()
    t = time.time()
    w2 = Worker(srv, args=["--id", "stable-1", "--visibility-ms", "60000"], name="s2")
    try:
        m = wait_batch(srv, b, timeout=20)
        exactly_once(results(srv, b), ids)
        if m["status"] != "completed" or "resuming 6 entries" not in w2.logs():
            fail("resume: %s\n%s" % (m, w2.logs()[-1500:]))
        print("resume with the same id ok: %.1fs" % (time.time() - t))
    finally:
        w2.stop()


def test_unservable_model(srv):
    p = subprocess.run([MEDLEY, "worker", "--redis", srv.url, "--model", "no-such-model"],
                       capture_output=True, text=True, timeout=30)
    if p.returncode != 1 or "no-such-model" not in p.stderr:
        fail("a worker for an unknown model must fail at startup: rc %d %s" % (p.returncode,
                                                                               p.stderr))
    print("unservable model ok: %s" % p.stderr.strip().splitlines()[-1][:160])


def test_run_interrupted(tmp):
    """Ctrl-C during `medley run`: exit 130, the answers so far written, its redis-server and
    temp dir gone."""
    ids = ["int-%d" % i for i in range(400)]
    path = write_lines(tmp, "int.jsonl", [chat_line(c, c) for c in ids])
    out = os.path.join(tmp, "int.out.jsonl")
    env = dict(os.environ, TMPDIR=tmp)
    p = subprocess.Popen([MEDLEY, "run", path, "-o", out, "--echo-delay-ms", "100",
                          "--max-seqs", "20"], stderr=subprocess.PIPE, text=True, env=env)
    time.sleep(2.0)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    if p.returncode != 130:
        fail("interrupted run exited %d: %s" % (p.returncode, err))
    n = len(open(out).readlines())
    if not 0 < n < len(ids):
        fail("interrupted run wrote %d lines" % n)
    if glob.glob(os.path.join(tmp, "medley-run-*")):
        fail("interrupted run left its temp dir")
    marker = os.path.join(tmp, "medley-run-").encode()
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(cmdline, "rb") as f:
                if marker in f.read():
                    fail("interrupted run left a process running: %s" % cmdline)
        except OSError:
            pass
    print("interrupted run ok: %d answers written" % n)


def main():
    srv = RedisServer()
    try:
        test_handback(srv)
        test_resume_same_id(srv)
        test_unservable_model(srv)
        test_run_interrupted(srv.dir)
        test_cancel(srv)
        test_expired(srv)
        test_dlq(srv)
        test_batches_and_errors_file(srv)
        test_run(srv.dir)
    finally:
        srv.stop()
    test_auth()


main()
