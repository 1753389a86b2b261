"""deploy_drain.py — a drain sticks (docs/operations.md, "Drain a node"; issue 39 item 19).
Against a real redis-server, `medley dashboard` and `medley worker` (echo):

1. The dashboard's drain stops the worker with exit code 10, the code
   deploy/systemd/medley-worker.service lists in RestartPreventExitStatus= and
   SuccessExitStatus= (so systemd does not restart it, and does not call it a failure).
2. The same worker started again (a pod's restart) holds: heartbeat state `drained`,
   `medley health` alive (exit 0) but `--ready` not (exit 1, saying drained), and a batch
   submitted meanwhile is not read.
3. POST /api/undrain: the worker becomes ready and the batch completes.
4. A --devices supervisor whose child was drained does not restart it, and exits 10."""
import os
import re
import subprocess
import time

from dashboard_util import Dashboard, wait_for
from harness import *

TOKEN = "tok-drain-0123456789abcdef"
SRC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

def unit_codes():
    text = open(os.path.join(SRC, "deploy/systemd/medley-worker.service")).read()
    out = {}
    for key in ("RestartPreventExitStatus", "SuccessExitStatus"):
        m = re.search(r"^%s=(.*)$" % key, text, re.M)
        out[key] = m.group(1).split() if m else []
    return out

def main():
    srv = RedisServer()
    procs = []
    try:
        r = srv.client()
        tf = os.path.join(srv.dir, "token")
        with open(tf, "w") as f:
            f.write(TOKEN + "\n")
        dash = Dashboard(srv, ["--admin-token-file", tf])
        procs.append(dash)
        args = ["--id", "drain-w", "--heartbeat-ms", "300", "--grace-ms", "2000"]
        w = Worker(srv, args=args, name="drain1")
        wait_for("the worker's heartbeat", lambda: r.exists("medley:worker:{drain-w}"))

        # 1. drain: exit 10, which the unit treats as final
        st, doc = dash.post("/api/drain?worker=drain-w", token=TOKEN)
        if st != 200:
            fail("drain: expected 200, got %d %s" % (st, doc))
        try:
            rc = w.wait(15)
        except subprocess.TimeoutExpired:
            fail("the drained worker did not stop within 15 s:\n" + w.logs()[-2000:])
        codes = unit_codes()
        for key, vals in codes.items():
            if str(rc) not in vals:
                fail("the drained worker exited %d, which medley-worker.service's %s= (%s) "
                     "does not list: systemd would restart it" % (rc, key, " ".join(vals)))
        if rc == 0:
            fail("a drained worker must not exit 0 (Restart=always restarts it)")
        print("drained worker exited %d; the unit lists it in %s" % (rc, codes))

        # 2. started again: held, alive, not ready, reads nothing
        w2 = Worker(srv, args=args, name="drain2")
        procs.append(w2)
        wait_for("the held worker's heartbeat",
                 lambda: r.hget("medley:worker:{drain-w}", "state") == "drained")
        h = medley("health", "--redis", srv.url, "--worker-id", "drain-w", check=False)
        if h.returncode != 0:
            fail("a held worker must be alive (exit 0), got %d: %s" % (h.returncode, h.stderr))
        h = medley("health", "--redis", srv.url, "--worker-id", "drain-w", "--ready", check=False)
        if h.returncode != 1 or "drained" not in h.stderr:
            fail("a held worker must not be ready (exit 1, drained), got %d: %s"
                 % (h.returncode, h.stderr))
        path = write_lines(srv.dir, "b.jsonl", [chat_line("c%d" % i, "hi") for i in range(3)])
        b = submit(srv, path)
        time.sleep(1.5)
        if meta(srv, b)["completed"] not in ("0", 0):
            fail("a held worker answered: %s" % meta(srv, b))

        # 3. undrain
        st, doc = dash.post("/api/undrain?worker=drain-w", token=TOKEN)
        if st != 200 or doc.get("status") != "undrained":
            fail("undrain: expected 200 undrained, got %d %s" % (st, doc))
        st, doc = dash.post("/api/undrain?worker=drain-w", token=TOKEN)
        if st != 404:
            fail("undrain of a worker not drained: expected 404, got %d %s" % (st, doc))
        wait_batch(srv, b, timeout=20)
        h = medley("health", "--redis", srv.url, "--worker-id", "drain-w", "--ready", check=False)
        if h.returncode != 0:
            fail("an undrained worker must be ready, got %d: %s" % (h.returncode, h.stderr))
        w2.stop()
        procs.remove(w2)

        # 4. a --devices supervisor: its drained child is not restarted; all drained: exit 10
        sv = Worker(srv, args=["--id", "drain-sv", "--devices", "cpu,cpu", "--heartbeat-ms",
                               "300", "--grace-ms", "2000"], name="drainsv")
        procs.append(sv)
        for i in (0, 1):
            wait_for("child %d's heartbeat" % i,
                     lambda: r.exists("medley:worker:{drain-sv.%d}" % i))
        for i in (0, 1):
            st, doc = dash.post("/api/drain?worker=drain-sv.%d" % i, token=TOKEN)
            if st != 200:
                fail("drain of child %d: %d %s" % (i, st, doc))
        try:
            rc = sv.wait(20)
        except subprocess.TimeoutExpired:
            fail("the supervisor of two drained children did not exit:\n" + sv.logs()[-3000:])
        procs.remove(sv)
        if rc != 10 or "restarting it in" in sv.logs():
            fail("supervisor: expected exit 10 and no restart, got %d:\n%s"
                 % (rc, sv.logs()[-3000:]))
        print("deploy_drain: ok")
    finally:
        for p in procs:
            try:
                p.stop()
            except SystemExit:
                pass
        srv.stop()

if __name__ == "__main__":
    main()
