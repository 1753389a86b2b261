"""dashboard_ops.py — issue 39 item 20, in headless Chromium (Debian's chromium and
chromium-driver through selenium) against a real redis-server, `medley dashboard` and the
real `medley submit`:

1. The plan picture at phone width (390x844): every box and text of the SVG lies inside the
   viewport, and its container scrolls nothing away (at 1366 it keeps the wide layout).
2. A batch for a model nobody serves shows "no worker serves it"; cancelled through the
   page it ends `cancelled` (not `cancelling` forever), every custom_id answered once with
   batch_cancelled.
3. --read-token-file: /api documents answer 401 without the token; the page asks for it and
   shows the batches once it is typed; /api/config stays open.
4. The DLQ hides prompt bodies by default (no line_head; the page says "hidden"), and shows
   them with --dlq-lines.
5. A worker held after a drain (state drained) gets an "undrain" button; clicked, it serves."""
import json
import os
import time

from dashboard_browser import browser, batch_row
from dashboard_util import Dashboard, wait_for
from harness import *

TOKEN = "ops-admin-token-0123456789"
READ = "ops-read-token-0123456789"
SECRET = "SECRET-PROMPT-TEXT"


def plan():
    def rep(rid, stages):
        return {"id": rid, "model": "llama-3-70b-instruct", "candidate": "hand",
                "stages": stages, "classes": [], "routing": {}, "predicted_tokens_per_s": 1800.0,
                "usd_per_hour": 9.5, "usd_per_mtok": 1.47}
    st = lambda t, g, lo, hi: {"gpu_type": t, "gpus": g, "tp": len(g), "layers": [lo, hi]}
    return {"schema_version": 1, "kind": "medley.plan", "version": 3,
            "created_at": "2026-12-07T12:00:00Z", "objective": "max_tokens_per_usd",
            "reason": "dashboard_ops.py",
            "replicas": [rep("r-wide", [st("A100-80GB-SXM", ["{gpu-a}/0", "{gpu-a}/1"], 0, 20),
                                        st("H100-SXM", ["{gpu-b}/0"], 20, 40),
                                        st("L40S", ["{gpu-c}/0"], 40, 60),
                                        st("L4", ["{gpu-d}/0"], 60, 80)]),
                         rep("r-one", [st("H100-SXM", ["{gpu-e}/0"], 0, 80)])],
            "models": [], "idle_gpus": [],
            "totals": {"tokens_per_s": 3600.0, "usd_per_hour": 19.0, "usd_per_mtok": 1.47,
                       "tokens_per_usd": 680000.0},
            "notes": []}


def plan_overflow(d):
    """Elements of the plan picture reaching past the viewport, and hidden scroll width."""
    return d.execute_script("""
        const vw = document.documentElement.clientWidth, out = [];
        for (const e of document.querySelectorAll('#plan svg rect, #plan svg text')) {
          const r = e.getBoundingClientRect();
          if (r.right > vw + 0.5 || r.left < -0.5) out.push(e.textContent || e.tagName);
        }
        const box = document.getElementById('plan');
        return {outside: out, hidden: box.scrollWidth - box.clientWidth,
                drawn: document.querySelectorAll('#plan svg g[data-replica]').length};""")


def set_width(d, w, h):
    d.set_window_size(w, h)
    d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": w, "height": h, "deviceScaleFactor": 1, "mobile": w < 600})


def main():
    srv = RedisServer()
    dashes, d = [], None
    try:
        r = srv.client()
        r.set("medley:plan", json.dumps(plan()))
        r.set("medley:plan:version", 3)
        lines = [chat_line("n%d" % i, "x", model="nobody") for i in range(6)]
        b = submit(srv, write_lines(srv.dir, "n.jsonl", lines), "--batch-id", "nobody-b")
        tf = os.path.join(srv.dir, "token")
        with open(tf, "w") as f:
            f.write(TOKEN + "\n")
        dash = Dashboard(srv, ["--admin-token-file", tf, "--refresh-ms", "300"])
        dashes.append(dash)
        d = browser()

        # 1. the plan at phone width
        set_width(d, 390, 844)
        d.get(dash.url + "/")
        wait_for("the plan drawn", lambda: plan_overflow(d)["drawn"] == 2)
        time.sleep(0.5)
        o = plan_overflow(d)
        if o["outside"] or o["hidden"] > 1:
            fail("the plan picture at 390 px: %d elements outside the screen (%s), %d px "
                 "scrolled out of sight" % (len(o["outside"]), o["outside"][:5], o["hidden"]))
        set_width(d, 1366, 900)
        wait_for("the wide plan", lambda: d.execute_script(
            "const s = document.querySelector('#plan svg');"
            "return s && !s.classList.contains('narrow');"))
        print("ok: plan at 390 px: nothing outside the screen; the wide layout at 1366 px")

        # 2. a batch nobody serves: warned, and a cancel ends it
        wait_for("the unserved warning", lambda: d.execute_script(
            "const tr = document.querySelector('#batches tr[data-batch=nobody-b]');"
            "return tr && tr.querySelector('.badge.unserved') !== null &&"
            " tr.querySelector('.badge.unserved').textContent === 'no worker serves it';"))
        d.find_element("id", "token").send_keys(TOKEN)
        for _ in range(2):
            d.execute_script("document.querySelector('[data-action=\"cancel:nobody-b\"]').click()")
            time.sleep(0.05)
        wait_for("nobody-b cancelled", lambda: meta(srv, b)["status"] == "cancelled", timeout=10)
        wait_for("the page shows cancelled",
                 lambda: (batch_row(d, b) or {}).get("c-status") == "cancelled")
        out = results(srv, b)
        exactly_once(out, ["n%d" % i for i in range(6)])
        codes = {l["error"]["code"] for l in out}
        if codes != {"batch_cancelled"} or r.xlen("medley:q:{nobody}") != 0:
            fail("the cancelled lines: codes %s, %d left queued" % (codes,
                                                                r.xlen("medley:q:{nobody}")))
        validate_all(schema_validator("error-line"), out, "the dashboard's cancel lines")
        print("ok: unserved batch warned; cancelled through the page, 6 lines answered once")

        # 4. DLQ prompt bodies hidden by default
        r.xadd("medley:dlq:{echo}", {"id": "1-0", "batch": "x", "reason": "r", "worker": "w",
                                     "stream": "medley:q:{echo}",
                                     "line": json.dumps({"custom_id": "c1", "body": {
                                         "messages": [{"role": "user", "content": SECRET}]}})})
        ent = dash.get("/api/dlq")["queues"][0]["entries"][0]
        if "line_head" in ent or not ent.get("line_bytes"):
            fail("/api/dlq must not show the line by default: %s" % ent)
        wait_for("the DLQ row", lambda: d.execute_script(
            "return document.querySelector('#dlq .c-hidden') !== null"))
        if SECRET in d.execute_script("return document.body.textContent"):
            fail("the page shows a DLQ prompt body by default")
        shown = Dashboard(srv, ["--dlq-lines"])
        dashes.append(shown)
        if SECRET not in shown.get("/api/dlq")["queues"][0]["entries"][0].get("line_head", ""):
            fail("--dlq-lines must show the start of the line")
        print("ok: DLQ prompt hidden by default, shown with --dlq-lines")

        # 5. undrain through the page: a worker started while its drain key exists holds
        r.set("medley:drain:{held-w}", "1")
        w = Worker(srv, args=["--id", "held-w", "--heartbeat-ms", "300"], name="held")
        try:
            wait_for("the undrain button", lambda: d.execute_script(
                "return document.querySelector('[data-action=\"undrain:held-w\"]') !== null"),
                timeout=15)
            for _ in range(2):
                d.execute_script(
                    "document.querySelector('[data-action=\"undrain:held-w\"]').click()")
                time.sleep(0.05)
            wait_for("held-w serving", lambda: r.hget("medley:worker:{held-w}", "state")
                     == "running", timeout=10)
            if r.exists("medley:drain:{held-w}"):
                fail("undrain through the page must delete the drain key")
        finally:
            w.stop()
        print("ok: a held worker undrained through the page serves again")

        # 3. the read token
        rf = os.path.join(srv.dir, "read")
        with open(rf, "w") as f:
            f.write(READ + "\n")
        ro = Dashboard(srv, ["--read-token-file", rf])
        dashes.append(ro)
        for p in ("/api/batches", "/api/fleet", "/api/plan", "/api/dlq"):
            st, doc = ro.request("GET", p)
            if st != 401:
                fail("GET %s without the read token: expected 401, got %d" % (p, st))
            st, doc = ro.request("GET", p, {"Authorization": "Bearer " + READ})
            if st != 200:
                fail("GET %s with the read token: expected 200, got %d %s" % (p, st, doc))
        cfg = ro.get("/api/config")
        if cfg.get("read_token") is not True:
            fail("/api/config must say read_token: true: %s" % cfg)
        d.get(ro.url + "/")
        wait_for("the page saying it cannot read", lambda: d.execute_script(
            "return document.getElementById('conn').textContent === 'error'"))
        if d.execute_script("return document.querySelectorAll('#batches tbody tr').length"):
            fail("the page showed batches without the read token")
        d.find_element("id", "token").send_keys(READ)
        wait_for("batches with the read token", lambda: d.execute_script(
            "return document.querySelector('#batches tr[data-batch=nobody-b]') !== null"))
        print("ok: read token: 401 without it, the page reads with it typed")
        print("dashboard_ops: ok")
    finally:
        if d:
            d.quit()
        for x in dashes:
            x.stop()
        srv.stop()


if __name__ == "__main__":
    main()
