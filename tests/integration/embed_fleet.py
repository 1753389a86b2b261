#!/usr/bin/env python3
"""embed_fleet.py — embedding models in the fleet (docs/embeddings.md: "Mixing with
generation", "Scheduling and cost", "Metrics"). A random BERT (embed_reference.py) written
as a sentence-transformers directory and registered; real redis-server, real workers:

1. Mixing: one worker serves the BERT and the echo model (a generation model, 20 ms an
   answer). An embedding backlog of 300 lines of 120 tokens is submitted first, 20 chat lines
   after it: the chat batch is done before the embedding batch (generation is not starved
   behind the backlog), both exactly once; the embedding lines were answered over 10 polls or
   more, 90% of them within 0.5 s and all within 2.5 s (the runner's polls aim at 0.2 s; at
   16,384 tokens a poll it took the whole backlog in two or three).
2. Cost: with --usd-per-hour 3.6, every embedding answer carries medley.cost_usd > 0, and
   the answers' shares sum to medley_request_cost_usd_total, at most the device's cost.
3. /metrics: medley_embedding_requests_total, _inputs_total and _tokens_total by model equal
   the lines, inputs and usage of the answers; no finish_reason or TTFT series for the
   embedding model; promtool accepts the text when it is installed. The dashboard's
   /api/batches gives the embeddings batch's inputs, tokens and $ per M embedded tokens, and
   the page (headless chromium, as dashboard_browser.py drives it) shows them in its row.
4. Profile and plan: `medley profile` on the BERT writes a profile (buckets of output [0, 1),
   prefill tokens/s per batch) valid against schemas/profile; `medley plan` with it and an
   inline card ("embedding": "encoder"), and again with the card read from the model's
   directory (model_file), places the model on the fleet's CPU host, its class "measured" at
   the profile's inputs/s.
Needs numpy, redis-server, jsonschema, chromium with selenium; seconds."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import embed_reference as ref  # noqa: E402
from harness import (MEDLEY, RedisServer, Worker, chat_line, exactly_once, fail, free_port,  # noqa: E402
                     results, schema_validator, submit, wait_batch, write_lines)
from dashboard_browser import batch_row, browser  # noqa: E402
from dashboard_util import Dashboard, wait_for  # noqa: E402
from metrics_prometheus import sample, scrape  # noqa: E402

C, H, L, F, V = 128, 4, 4, 512, 2000
N_EMB, N_CHAT, TOKENS = 300, 20, 120


def emb_line(i, rng):
    ids = [int(x) for x in rng.integers(0, V, TOKENS)]
    inp = ids if i % 3 else [ids, ids[:40]]  # every third line holds two inputs
    return json.dumps({"custom_id": "e%d" % i, "method": "POST", "url": "/v1/embeddings",
                       "body": {"model": "fleet-bert", "input": inp}})


def histogram(text, name, model):
    """{le: count} of a histogram's buckets for model."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "_bucket{") and 'model="%s"' % model in line:
            le = line.split('le="')[1].split('"')[0]
            out[le] = float(line.split()[-1])
    return out


def mixed(tmp, env):
    rng = np.random.default_rng(7)
    server = RedisServer()
    port = free_port()
    w = Worker(server, models=("fleet-bert", "echo"), env=env,
               args=["--metrics", "127.0.0.1:%d" % port, "--usd-per-hour", "3.6",
                     "--echo-delay-ms", "20", "--threads", "1"])
    try:
        scrape(port)  # up: the model is loaded
        e = write_lines(tmp, "e.jsonl", [emb_line(i, rng) for i in range(N_EMB)])
        g = write_lines(tmp, "g.jsonl", [chat_line("g%d" % i, "hi %d" % i) for i in range(N_CHAT)])
        be = submit(server, e, "--model", "fleet-bert")
        bg = submit(server, g, "--model", "echo")
        me = wait_batch(server, be, 240)
        mg = wait_batch(server, bg, 240)
        re, rg = results(server, be), results(server, bg)
        exactly_once(re, ["e%d" % i for i in range(N_EMB)])
        exactly_once(rg, ["g%d" % i for i in range(N_CHAT)])
        if not all(r["response"]["status_code"] == 200 for r in re + rg):
            fail("an answer is not a 200: %s" % [r for r in re + rg
                                                 if r["response"]["status_code"] != 200][:1])
        if not int(mg["finished_at"]) < int(me["finished_at"]):
            fail("the chat batch (submitted after a %d-line embedding backlog) finished at %s, "
                 "not before the embeddings (%s)" % (N_EMB, mg["finished_at"], me["finished_at"]))
        print("ok: mixing: chat batch done %d ms before the embedding backlog it followed" % (
            int(me["finished_at"]) - int(mg["finished_at"])))
        # 2: cost shares
        costs = [r["medley"]["cost_usd"] for r in re]
        if not all(c > 0 for c in costs):
            fail("an embedding answer without a cost share: %s" % re[costs.index(min(costs))])
        text = scrape(port)
        total = sum(costs) + sum(r["medley"]["cost_usd"] for r in rg)
        counted = (sample(text, "medley_request_cost_usd_total", 'model="fleet-bert"') +
                   sample(text, "medley_request_cost_usd_total", 'model="echo"'))
        device = sample(text, "medley_device_cost_usd_total")
        if abs(counted - total) > 1e-9 * max(1, total) or total > device * (1 + 1e-6):
            fail("cost shares %.3g, counted %.3g, device %.3g" % (total, counted, device))
        print("ok: cost: %d embedding answers carry shares (sum $%.6f of the device's $%.6f)" % (
            len(re), sum(costs), device))
        # 3: metrics by model
        inputs = sum(len(r["response"]["body"]["data"]) for r in re)
        tokens = sum(r["response"]["body"]["usage"]["total_tokens"] for r in re)
        want = {"medley_embedding_requests_total": N_EMB, "medley_embedding_inputs_total": inputs,
                "medley_embedding_tokens_total": tokens}
        for name, v in want.items():
            got = sample(text, name, 'model="fleet-bert"')
            if got != v:
                fail("%s{model=\"fleet-bert\"} is %s, the answers say %d" % (name, got, v))
        if sample(text, "medley_embedding_requests_total", 'model="echo"') not in (None, 0):
            fail("echo lines counted as embeddings")
        if 'finish_reason="unknown"' in text or histogram(
                text, "medley_time_to_first_token_seconds", "fleet-bert").get("+Inf"):
            fail("embedding answers counted in a generation series (finish_reason, TTFT)")
        polls = histogram(text, "medley_step_duration_seconds", "fleet-bert")
        # a poll aims at 0.2 s at the rate measured so far (at most 16,384 tokens); on a loaded
        # box one may run over. How many polls that makes depends on the machine's speed, so
        # the count is only bounded below by the token cap; the durations are the check.
        least = max(2, -(-tokens // 16384))
        if not polls or polls["+Inf"] < least or polls.get("0.5") < 0.9 * polls["+Inf"] or \
                polls.get("2.5") != polls["+Inf"]:
            fail("embedding polls: %s (want %d or more, 90%% <= 0.5 s, all <= 2.5 s)" %
                 (polls, least))
        if shutil.which("promtool"):
            p = subprocess.run(["promtool", "check", "metrics"], input=text,
                               capture_output=True, text=True, timeout=30)
            if p.returncode != 0:
                fail("promtool: %s%s" % (p.stdout, p.stderr))
        print("ok: metrics: %d lines, %d inputs, %d tokens by model; %d polls, %d <= 0.5 s" % (
            N_EMB, inputs, tokens, polls["+Inf"], polls["0.5"]))
        # the dashboard's batches document: inputs, tokens embedded, $ per M embedded tokens
        dash = Dashboard(server)
        d = None
        try:
            st, doc = dash.request("GET", "/api/batches")
            d = browser()  # and the page: the batch row says what was embedded
            d.get(dash.url + "/")
            row = wait_for("the embeddings batch's row", lambda: batch_row(d, be))
            want = "embedded %d inputs, %d tok" % (inputs, tokens)
            if want not in row.get("c-mtok", ""):
                fail("the dashboard's row of the embeddings batch: %s (want %r)" % (row, want))
        finally:
            if d:
                d.quit()
            dash.stop()
        b = {x["id"]: x for x in (doc or {}).get("batches", [])}.get(be, {})
        if st != 200 or b.get("embedding_inputs") != inputs or b.get("embedding_tokens") != tokens \
                or abs(b.get("usd_per_mtok", 0) - sum(costs) / tokens * 1e6) > 1e-6 * b.get(
                    "usd_per_mtok", 1):
            fail("dashboard /api/batches for the embeddings batch: %s %s" % (st, b))
        print("ok: dashboard: %d inputs, %d tokens, $%.4f per M embedded tokens; the page: %r" % (
            inputs, tokens, b["usd_per_mtok"], row["c-mtok"]))
    finally:
        w.stop()
        server.stop()


def profile_and_plan(tmp, env, bert_dir):
    prof = os.path.join(tmp, "profile.json")
    p = subprocess.run([MEDLEY, "profile", "-m", "fleet-bert", "--threads", "1", "--batches",
                        "1,8", "--contexts", "16,64", "-o", prof], capture_output=True, text=True,
                       env=env, timeout=120)
    if p.returncode != 0:
        fail("medley profile on an embedding model exited %d: %s" % (p.returncode, p.stderr))
    doc = json.load(open(prof))
    schema_validator("profile").validate(doc)
    if not (all(b["output_lo"] == 0 and b["output_hi"] == 1 and b["max_requests_per_s"] > 0
                for b in doc["buckets"]) and len(doc["buckets"]) == 2 and
            all(b["prefill_tokens_per_s"] > 0 for b in doc["batches"])):
        fail("the embedding profile: %s" % doc)
    doc["model"] = "e-bert"
    json.dump(doc, open(prof, "w"))
    card = {"name": "e-bert", "layers": L, "hidden": C, "heads": H, "kv_heads": H, "ffn": F,
            "vocab": V, "quant": "F32", "max_context": 64, "embedding": "encoder"}
    rps = doc["buckets"][0]["max_requests_per_s"]
    fleet = {"name": "host", "pools": [{"name": "cpu", "type": "cpu", "count": 1,
                                        "gpus_per_host": 1}]}
    # the card inline, and read from the model's directory (model_file: a BertModel is an
    # embedding model)
    for model in ({"model": card}, {"model": "e-bert", "model_file": bert_dir}):
        wl = {"horizon_s": 3600, "models": [dict(model, requests=round(rps * 1800),
                                                 input_mean=16)]}
        paths = {}
        for name, d in (("workload", wl), ("fleet", fleet)):
            paths[name] = os.path.join(tmp, name + ".json")
            json.dump(d, open(paths[name], "w"))
        p = subprocess.run([MEDLEY, "plan", "--fleet", paths["fleet"], "--workload",
                            paths["workload"], "--profile", prof, "--json"], capture_output=True,
                           text=True, timeout=120)
        if p.returncode != 0:
            fail("medley plan (%s) exited %d: %s" % (list(model)[-1], p.returncode, p.stderr))
        plan = json.loads(p.stdout)
        reps = [r for r in plan["replicas"] if r["model"] == "e-bert"]
        pc = reps[0]["per_class"]["all"] if reps else {}
        if not reps or pc.get("source") != "measured" or \
                abs(pc["requests_per_s"] - rps) > 1e-6 * rps:
            fail("the plan does not place the embedding model at its measured rate: %s" % plan)
        print("ok: profile (%.0f inputs/s of 16 tokens) and plan from %s: %s on %s, %s" % (
            rps, list(model)[-1], reps[0]["id"], reps[0]["candidate"], pc["source"]))


def main():
    tmp = tempfile.mkdtemp(prefix="medley-embed-fleet-")
    try:
        cfg, t = ref.random_bert(np.random.default_rng(3), C=C, H=H, L=L, F=F, V=V, P=128)
        d = os.path.join(tmp, "bert")
        ref.write_st(d, cfg, t, "mean", True)
        env = dict(os.environ, MEDLEY_MODELS=os.path.join(tmp, "models"))
        p = subprocess.run([MEDLEY, "models", "add", "fleet-bert", d], capture_output=True,
                           text=True, env=env)
        if p.returncode != 0:
            fail("models add: " + p.stderr)
        mixed(tmp, env)
        profile_and_plan(tmp, env, d)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
