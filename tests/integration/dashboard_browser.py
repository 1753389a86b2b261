"""dashboard_browser.py — the `medley dashboard` page in headless Chromium (Debian's chromium
and chromium-driver, driven by selenium) against a real redis-server, a real `medley worker`
following a hand-written plan, and batches submitted with `medley submit`
(docs/operations.md "Dashboard"):

1. Numbers: a finished batch (12 lines, 2 invalid) shows completed, 12/12, 100.0%, 2 failed
   as invalid_value ×2, and the cost the output lines record (the sum of medley.cost_usd of
   `medley results`); a batch nobody serves shows 0/5 and no ETA; a batch submitted after the
   page loaded shows its progress rising without a reload, with an ETA, until 300/300.
2. Fleet and plan: the worker with its device and replica, a heartbeat left 60 s old marked
   stale; the plan's replicas as SVG, predicted tokens/s from the plan, measured > 0 from
   the worker's heartbeats while it works.
3. Actions: the admin token typed into the page and the cancel button clicked (twice, to
   confirm) cancel the idle batch.
4. Escaping: a batch id, a model, a plan replica, a worker and a DLQ custom_id holding
   markup show as text: no element, attribute or script from them is in the DOM, no alert.
5. No console errors (SEVERE browser log entries). Screenshots, full page, at 1366x900 and
   390x844 go to $MEDLEY_ARTIFACTS (default build/artifacts/); their paths are printed."""
import json
import os
import shutil
import time

from dashboard_util import Dashboard, wait_for
from harness import *

CHROMIUM = os.environ.get("MEDLEY_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = os.environ.get("MEDLEY_CHROMEDRIVER") or shutil.which("chromedriver") or \
    "/usr/bin/chromedriver"
TOKEN = "browser-token-0123456789"
HOSTILE_BATCH = "<img src=x onerror=alert(1)>"
HOSTILE_CID = "</td><script>window.__pwned=1</script><b>x</b>"
HOSTILE_REPLICA = "<svg onload=alert(2)>"
HOSTILE_HOST = "<iframe src=javascript:alert(3)>"


def plan_doc():
    def replica(rid, model, stages, pred, usd_h):
        return {"id": rid, "model": model, "candidate": "hand", "stages": stages, "classes": [],
                "routing": {}, "predicted_tokens_per_s": pred, "usd_per_hour": usd_h,
                "usd_per_mtok": usd_h / (pred * 3600) * 1e6}
    return {
        "schema_version": 1, "kind": "medley.plan", "version": 7,
        "created_at": "2026-12-06T12:00:00Z", "objective": "max_tokens_per_usd",
        "reason": "written by dashboard_browser.py",
        "replicas": [
            replica("r-echo", "echo", [{"gpu_type": "cpu", "gpus": ["{dash-w1}/0"], "tp": 1,
                                        "layers": [0, 1]}], 500.0, 36.0),
            replica("r-big", "llama-3-70b", [
                {"gpu_type": "H100", "gpus": ["{gpu-a}/0", "{gpu-a}/1"], "tp": 2,
                 "layers": [0, 40]},
                {"gpu_type": "L40S", "gpus": ["{gpu-b}/0"], "tp": 1, "layers": [40, 80]}],
                1800.0, 9.5),
            replica(HOSTILE_REPLICA, "<b>evil</b>", [{"gpu_type": "<i>T</i>",
                                                      "gpus": ["<u>g</u>"], "tp": 1,
                                                      "layers": [0, 2]}], 10.0, 1.0)],
        "models": [], "idle_gpus": ["{gpu-c}/0"],
        "totals": {"tokens_per_s": 2310.0, "usd_per_hour": 46.5, "usd_per_mtok": 5.6,
                   "tokens_per_usd": 178000.0},
        "notes": ["a note with <b>markup</b>"]}


def fmt_usd(v):
    return "$" + format(v, ".0f" if v >= 100 else ".2f" if v >= 1 else ".4f")


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    for p in (CHROMIUM, CHROMEDRIVER):
        if not os.path.exists(p):
            fail("%s not found (scripts/setup.sh installs chromium and chromium-driver)" % p)
    o = webdriver.ChromeOptions()
    o.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--hide-scrollbars", "--window-size=1366,900", "--no-first-run",
              "--disable-extensions", "--disable-background-networking"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=o)


def cells(d, selector, attr, key):
    """{cell class: textContent} of the row selector[attr=key] (None when absent)."""
    return d.execute_script("""
        for (const tr of document.querySelectorAll(arguments[0])) {
          if (tr.getAttribute(arguments[1]) !== arguments[2]) continue;
          const out = {cls: tr.className};
          for (const td of tr.children) {
            const c = [...td.classList].find((x) => x.startsWith('c-'));
            // the "no worker serves it" badge is checked by dashboard_ops.py, not here
            const copy = td.cloneNode(true);
            copy.querySelectorAll('.badge.unserved').forEach((b) => b.remove());
            if (c) out[c] = copy.textContent;
          }
          const codes = tr.querySelector('.c-codes');
          if (codes) out.codes = codes.textContent;
          const cost = tr.querySelector('.c-cost');
          if (cost) out.usd = cost.getAttribute('data-usd');
          return out;
        }
        return null;""", selector, attr, key)


def batch_row(d, bid):
    return cells(d, "#batches tbody tr", "data-batch", bid)


def screenshot(d, width, height, path):
    """The whole page at this viewport width (Page.captureScreenshot beyond the viewport)."""
    import base64
    d.set_window_size(width, height)
    d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600})
    time.sleep(0.3)
    full = d.execute_script("return Math.max(document.documentElement.scrollHeight, "
                            "document.body.scrollHeight)")
    shot = d.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": width, "height": full, "scale": 1}})
    with open(path, "wb") as f:
        f.write(base64.b64decode(shot["data"]))
    if os.path.getsize(path) < 5000:
        fail("screenshot %s is suspiciously small" % path)
    return path


def main():
    art = os.environ.get("MEDLEY_ARTIFACTS") or os.path.join(SOURCE_DIR, "build", "artifacts")
    os.makedirs(art, exist_ok=True)
    srv = RedisServer()
    w = dash = d = None
    try:
        r = srv.client()
        doc = plan_doc()
        validate_all(schema_validator("plan"), [doc], "the test's plan")
        r.set("medley:plan", json.dumps(doc))
        r.set("medley:plan:version", 7)
        w = Worker(srv, models=(), args=[
            "--follow-plan", "--id", "dash-w1", "--plan-check-ms", "100", "--heartbeat-ms",
            "1000", "--max-seqs", "2", "--echo-delay-ms", "50", "--usd-per-hour", "36"])
        # hand-written state the protocol allows but medley would not make
        now = int(time.time() * 1000)
        r.hset("medley:{%s}:meta" % HOSTILE_BATCH, mapping={
            "status": "in_progress", "model": "<b>m</b>", "total": 4, "completed": 1,
            "failed": 0, "created_at": now - 5000, "started_at": 0, "finished_at": 0,
            "deadline": 0, "priority": 0})
        r.zadd("medley:batches", {HOSTILE_BATCH: now - 5000})
        r.xadd("medley:dlq:{echo}", {
            "id": "1700000000000-0", "batch": HOSTILE_BATCH, "reason":
            "delivered 4 times without an answer (max_attempts 3) <i>x</i>",
            "worker": "dash-w0", "stream": "medley:q:{echo}",
            "line": json.dumps({"custom_id": HOSTILE_CID, "method": "POST"})})
        stale = {"worker": "stale-w2", "host": HOSTILE_HOST, "pid": 1, "state": "running",
                 "models": [{"model": "echo", "runner": "echo", "capacity": 4, "live": 0}],
                 "devices": [{"type": "L4", "memory_bytes": 24 * 2 ** 30}],
                 "started_at": now - 120000, "last_seen": now - 60000, "completed": 0,
                 "failed": 0, "in_flight": 0, "tokens_per_s": 0, "usd_per_hour": 0.8}
        r.hset("medley:worker:{stale-w2}", mapping={
            "json": json.dumps(stale), "devices": json.dumps(stale["devices"]),
            "state": "running", "last_seen": now - 60000, "plan_version": -1, "replicas": ""})
        r.pexpire("medley:worker:{stale-w2}", 120000)

        lines = [chat_line("a%02d" % i, "done batch line %d" % i) for i in range(10)]
        lines += [chat_line("bad%d" % i, "x", temperature=3) for i in range(2)]
        done_a = submit(srv, write_lines(srv.dir, "a.jsonl", lines), "--batch-id", "done-a")
        idle_c = submit(srv, write_lines(srv.dir, "c.jsonl", [
            chat_line("c%d" % i, "x", model="idle") for i in range(5)]), "--batch-id", "idle-c")
        r.hset("medley:{%s}:meta" % idle_c, "tenant", "acme")  # as `medley api` writes it
        d = browser()
        wait_batch(srv, done_a, timeout=30)
        cost_a = sum(l["medley"]["cost_usd"] for l in results(srv, done_a))
        if cost_a <= 0:
            fail("the worker (--usd-per-hour 36) must record a cost: %s" % cost_a)

        tf = os.path.join(srv.dir, "token")
        with open(tf, "w") as f:
            f.write(TOKEN)
        dash = Dashboard(srv, ["--admin-token-file", tf, "--heartbeat-ms", "1000"],
                         refresh_ms=300)
        d.get(dash.url + "/")
        wait_for("the page's first numbers", lambda: batch_row(d, done_a), timeout=15)

        # 1. numbers of a finished batch and an idle one
        a = batch_row(d, done_a)
        want = {"c-status": "completed", "c-done": "12/12", "c-progress": "100.0%",
                "c-model": "echo", "c-eta": "done", "codes": "invalid_value ×2"}
        for k, v in want.items():
            if a.get(k) != v:
                fail("batch done-a: %s shows %r, expected %r (row %s)" % (k, a.get(k), v, a))
        if not a["c-failed"].startswith("2"):
            fail("batch done-a: failed must show 2: %s" % a)
        if abs(float(a["usd"]) - cost_a) > 1e-12 or not a["c-cost"].startswith(fmt_usd(cost_a)):
            fail("batch done-a: cost %s / %r, expected %r (the sum of the output lines' "
                 "cost_usd)" % (a["usd"], a["c-cost"], fmt_usd(cost_a)))
        c = batch_row(d, idle_c)
        if c["c-done"] != "0/5" or c["c-eta"] != "--" or c["c-status"] != "in_progress":
            fail("batch idle-c: expected in_progress 0/5 with no ETA: %s" % c)
        # the tenants: idle-c is acme's, the others default's
        t = cells(d, "#tenants tbody tr", "data-tenant", "acme")
        want = {"c-tbatches": "1", "c-trunning": "1", "c-tdone": "0/5", "c-tfailed": "0"}
        if not t or any(t.get(k) != v for k, v in want.items()) or \
                not d.execute_script("return !document.getElementById('tenants-section').hidden"):
            fail("tenant acme on the page: %s, expected %s" % (t, want))
        t = cells(d, "#tenants tbody tr", "data-tenant", "default")
        if not t or t.get("c-tfailed") != "2" or int(t.get("c-tbatches", 0)) < 2:
            fail("tenant default on the page: %s" % t)

        # live progress of a batch submitted now
        live_b = submit(srv, write_lines(srv.dir, "b.jsonl", [
            chat_line("b%03d" % i, "live batch line %03d " % i + "x" * 40)
            for i in range(300)]), "--batch-id", "live-b")

        def progress():
            row = batch_row(d, live_b)
            return row and int(row["c-done"].split("/")[0])
        first = wait_for("live-b's progress on the page", lambda: progress() and progress() > 0)
        # the rate (hence the ETA) needs two samples of the batch's progress: the first
        # poll that sees lines done may still show "--"
        def eta_or_done():
            row = batch_row(d, live_b)
            if not row:
                return None
            n = int(row["c-done"].split("/")[0])
            return row if n >= 300 or row["c-eta"] not in ("--", "done") else None
        row = wait_for("an ETA for the running batch live-b", eta_or_done, timeout=15)
        if int(row["c-done"].split("/")[0]) < 300 and row["c-eta"] in ("--", "done"):
            fail("a running batch must show an ETA: %s" % row)
        wait_for("live-b's progress to rise without a reload",
                 lambda: (progress() or 0) > first, timeout=15)

        # 2. fleet and plan (measured while the worker runs live-b)
        def measured():
            t = d.execute_script(
                "const g = document.querySelector('#plan g[data-replica=\"r-echo\"]');"
                "return g && g.querySelector('.c-meas').textContent;")
            return t and float(t.split(" ")[0]) > 0 and t
        wait_for("measured tokens/s of r-echo in the plan", measured, timeout=15)
        pred = d.execute_script("return document.querySelector("
                                "'#plan g[data-replica=\"r-echo\"] .c-pred').textContent")
        if not pred.startswith("500.0 · $20.00/M"):
            fail("r-echo predicted: %r, expected 500.0 tok/s at $20.00/M" % pred)
        nrep = d.execute_script("return document.querySelectorAll('#plan g[data-replica]').length")
        nstage = d.execute_script("return document.querySelectorAll('#plan .stage').length")
        if nrep != 3 or nstage != 4:
            fail("the plan picture: %s replicas and %s stages, expected 3 and 4" % (nrep, nstage))
        w1 = cells(d, "#fleet tbody tr", "data-worker", "dash-w1")
        if not w1 or "stale" in w1["cls"] or "echo" not in w1["c-serves"] or \
                "replicas r-echo" not in w1["c-serves"] or "cpu" not in w1["c-devices"]:
            fail("worker dash-w1 must be live, serving echo as r-echo on cpu: %s" % w1)
        w2 = cells(d, "#fleet tbody tr", "data-worker", "stale-w2")
        if not w2 or "stale" not in w2["cls"] or "stale" not in w2["c-worker"] or \
                w2["c-host"] != HOSTILE_HOST + ":1" or "L4" not in w2["c-devices"]:
            fail("worker stale-w2 (heartbeat 60 s old) must be marked stale: %s" % w2)

        # 3. cancel through the page
        d.find_element("id", "token").send_keys(TOKEN)
        for _ in range(2):  # arm, then confirm
            d.execute_script("document.querySelector('[data-action=\"cancel:idle-c\"]').click()")
            time.sleep(0.05)
        # nobody serves model "idle": the dashboard answers its lines, so it ends cancelled
        wait_for("idle-c cancelled through the page",
                 lambda: (batch_row(d, idle_c) or {}).get("c-status") == "cancelled")
        if meta(srv, idle_c)["status"] != "cancelled":
            fail("the page's cancel must reach Redis: %s" % meta(srv, idle_c))
        msg = d.find_element("id", "action-msg").text
        if msg != "cancel idle-c: cancelled":
            fail("the page must say what the cancel did: %r" % msg)

        wait_batch(srv, live_b, timeout=30)
        wait_for("live-b at 300/300 on the page",
                 lambda: (batch_row(d, live_b) or {}).get("c-done") == "300/300")

        # 4. escaping
        h = batch_row(d, HOSTILE_BATCH)
        if not h or h["c-id"] != HOSTILE_BATCH or h["c-model"] != "<b>m</b>" or \
                h["c-done"] != "1/4":
            fail("the hostile batch must show as text: %s" % h)
        dl = d.execute_script("const tr = document.querySelector('#dlq tbody tr');"
                             "return tr && [tr.querySelector('.c-custom-id').textContent,"
                             "tr.querySelector('.c-batch').textContent,"
                             "tr.querySelector('.c-reason').textContent];")
        if dl != [HOSTILE_CID, HOSTILE_BATCH,
                  "delivered 4 times without an answer (max_attempts 3) <i>x</i>"]:
            fail("the DLQ entry must show its custom_id, batch and reason as text: %s" % dl)
        texts = d.execute_script(
            "return [...document.querySelectorAll('#plan g[data-replica] > text:first-of-type')]"
            ".map((t) => t.textContent)")
        if HOSTILE_REPLICA not in texts:
            fail("the hostile replica id must show as SVG text: %s" % texts)
        injected = d.execute_script("""return {
            tags: document.querySelectorAll('img, iframe, object, embed, b, i, u').length,
            scripts: document.scripts.length,
            svgs: document.querySelectorAll('svg').length,
            handlers: document.querySelectorAll('[onerror], [onload], [src]:not(script)').length,
            pwned: window.__pwned === undefined ? null : window.__pwned}""")
        if injected != {"tags": 0, "scripts": 1, "svgs": 1, "handlers": 0, "pwned": None}:
            fail("markup from the data reached the DOM: %s" % injected)

        # 5. screenshots and the console
        shots = [screenshot(d, 1366, 900, os.path.join(art, "dashboard-desktop-1366x900.png")),
                 screenshot(d, 390, 844, os.path.join(art, "dashboard-phone-390x844.png"))]
        # documents of odd shapes (valid JSON, not what the schemas say) are drawn, not fatal
        r.set("medley:plan", json.dumps({"replicas": [1, None, {"id": "odd", "stages": [
            {"layers": "x", "gpus": 3}, None]}], "notes": "n", "idle_gpus": {}}))
        r.hset("medley:worker:{stale-w2}", "json", json.dumps(
            {"devices": [None, 5, "L4"], "models": "echo", "host": {"a": 1}}))
        wait_for("the odd plan drawn", lambda: d.execute_script(
            "return document.querySelector('#plan g[data-replica=\"odd\"]') !== null && "
            "document.getElementById('conn').textContent === 'live'"))
        severe = [e for e in d.get_log("browser") if e.get("level") == "SEVERE"]
        if severe:
            fail("console errors: %s" % severe)
        if dash.proc.poll() is not None:
            fail("the dashboard died:\n" + dash.logs())
        for p in shots:
            print("screenshot: %s" % p)
        print("dashboard_browser: ok (numbers, live progress, fleet, plan, cancel, escaping)")
    finally:
        if d:
            d.quit()
        if dash:
            dash.stop()
        if w:
            w.stop()
        srv.stop()


if __name__ == "__main__":
    main()
