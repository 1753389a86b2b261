"""sched_profiles.py — measured profiles are always honoured (issue 26 item 1).

`medley plan --profile` on a fleet of 4 x A100-80GB (one host) and 8 x A10G (1-GPU hosts, as AWS g5.xlarge) at
Melange's prices, Llama-2-7B at 16 requests/s in two size classes:

1. a profile names its card as the catalog's alias ("A100"), as `medley profile` writes it on
   a real card ("A100-SXM4-80GB", "NVIDIA-A10G") or as the catalog does: each is matched to
   the catalog type, its candidate's classes say "measured" (before, only the exact catalog
   name matched and these profiles were silently replaced by the roofline);
2. a TP-2 candidate on a measured type is not priced by the bare roofline: it is scaled by
   measured / modelled on that type, and says so ("calibrated", with the factor);
3. a profile per TP degree: a TP-2 profile answers the TP-2 candidate;
4. a profile whose device is no catalog type is an error naming it; one whose model is not
   in the workload is a note in the plan;
5. the profiled plan differs from the roofline plan the way the profiles say it should: with
   A10G measured cheap per request and A100 measured dear, the plan uses A10Gs."""
import json
import os
import subprocess
import tempfile

from harness import MEDLEY, fail

FLEET = {"name": "melange-owned",
         "prices": {"A10G": 1.01, "A100-80GB-SXM": 3.67},
         "pools": [{"name": "a100", "type": "A100-80GB-SXM", "count": 4, "gpus_per_host": 4},
                   {"name": "a10g", "type": "A10G", "count": 8, "gpus_per_host": 1}]}
WORKLOAD = {"horizon_s": 3600,
            "models": [{"model": "llama-2-7b", "rate_rps": 16,
                        "classes": [{"name": "short", "input_mean": 200, "output_mean": 100,
                                     "max_tokens": 1024, "share": 0.7},
                                    {"name": "long", "input_mean": 1500, "output_mean": 250,
                                     "max_tokens": 2048, "share": 0.3}]}]}


def profile(device, rps_short, rps_long, tp=1, model="llama-2-7b"):
    return {"version": 1, "kind": "medley.profile", "device_type": device, "tp": tp,
            "model": model, "method": "published",
            "buckets": [{"input_lo": 1, "input_hi": 1024, "output_lo": 1, "output_hi": 200,
                         "input_mean": 200, "output_mean": 100, "max_requests_per_s": rps_short},
                        {"input_lo": 1024, "input_hi": 4096, "output_lo": 200, "output_hi": 512,
                         "input_mean": 1500, "output_mean": 250,
                         "max_requests_per_s": rps_long}]}


def plan(tmp, profiles, expect_rc=0):
    paths = {}
    for name, doc in (("fleet", FLEET), ("workload", WORKLOAD)):
        paths[name] = os.path.join(tmp, name + ".json")
        with open(paths[name], "w") as f:
            json.dump(doc, f)
    args = [MEDLEY, "plan", "--fleet", paths["fleet"], "--workload", paths["workload"], "--json"]
    for i, p in enumerate(profiles):
        path = os.path.join(tmp, "profile%d.json" % i)
        with open(path, "w") as f:
            json.dump(p, f)
        args += ["--profile", path]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if r.returncode != expect_rc:
        fail("medley plan exited %d (expected %d): %s %s" % (r.returncode, expect_rc,
                                                             r.stdout[-2000:], r.stderr))
    return json.loads(r.stdout) if r.returncode == 0 else r.stderr


def replicas_on(doc, gpu_type, tp=None):
    return [r for r in doc["replicas"]
            if all(s["gpu_type"] == gpu_type for s in r["stages"]) and
            (tp is None or (len(r["stages"]) == 1 and r["stages"][0]["tp"] == tp))]


def main():
    with tempfile.TemporaryDirectory() as tmp:
        roof = plan(tmp, [])
        for r in roof["replicas"]:
            if r["throughput_source"] != "modelled":
                fail("no profiles, yet replica %s says %r" % (r["id"], r["throughput_source"]))
        print("roofline plan: $%.2f/h, %s" % (roof["totals"]["usd_per_hour"],
                                             [r["candidate"] for r in roof["replicas"]]))
        # A10G measured fast for its price, A100 measured slow: 5 A10G ($5.05/h) serve
        # 16 req/s where the roofline would use the A100s.
        a10g, a100 = profile("NVIDIA-A10G", 4.5, 2.4), profile("A100", 10.0, 5.0)
        for name in ("A100", "A100-SXM4-80GB", "a100-80gb-sxm"):
            a100["device_type"] = name
            doc = plan(tmp, [a10g, a100])
            used = {r["stages"][0]["gpu_type"] for r in doc["replicas"]}
            print("profiles as %r + 'NVIDIA-A10G': $%.2f/h on %s; notes %s" % (
                name, doc["totals"]["usd_per_hour"], sorted(used), doc["notes"]))
            if used != {"A10G"}:
                fail("with A10G measured cheaper per request the plan uses %s" % sorted(used))
            for r in doc["replicas"]:
                single = len(r["stages"]) == 1 and r["stages"][0]["tp"] == 1
                want = "measured" if single else "modelled x"
                if not r["throughput_source"].startswith(want):
                    fail("replica %s (%s) says %r, expected %r" % (
                        r["id"], r["candidate"], r["throughput_source"], want))
                for cls, pc in r["per_class"].items():
                    ok = (pc["source"] == "measured" and pc["bound"] == "profile") if single \
                        else (pc["source"] == "calibrated" and abs(pc["calibration"] - 1) > 0.01)
                    if not ok:
                        fail("replica %s class %s: %s" % (r["id"], cls, pc))
            # single A10Gs alone, at their measured rates, serve it for 5 x $1.01; the plan
            # may only do better (2-stage A10G pipelines, calibrated by the same profile)
            if doc["totals"]["usd_per_hour"] > 5 * 1.01 + 1e-6:
                fail("expected at most 5 x A10G = $5.05/h, got $%.2f/h" %
                     doc["totals"]["usd_per_hour"])
        # 2: TP-2 candidates on measured types are calibrated, not bare roofline.
        a100["device_type"] = "A100"
        solo = {"horizon_s": 3600, "models": [dict(WORKLOAD["models"][0], rate_rps=40)]}
        fleet_a100 = {"name": "a100", "prices": {"A100-80GB-SXM": 3.67},
                      "pools": [{"name": "a100", "type": "A100-80GB-SXM", "count": 4,
                                 "gpus_per_host": 4}]}
        saved = FLEET.copy()
        FLEET.clear()
        FLEET.update(fleet_a100)
        WORKLOAD_SAVED = WORKLOAD["models"]
        WORKLOAD["models"] = solo["models"]
        try:
            # one profile at TP 1 only; force TP 2 by a long class that a single card holds
            doc = plan(tmp, [a100])
            cal = [n for n in doc["notes"] if "measured throughput is" in n]
            if not cal:
                fail("no calibration note: %s" % doc["notes"])
            print("calibration:", cal[0])
            # 3: a TP-2 profile answers the TP-2 candidate exactly
            tp2 = profile("A100-SXM4-80GB", 30.0, 12.0, tp=2)
            doc2 = plan(tmp, [a100, tp2])
            srcs = {}
            for r in doc["replicas"] + doc2["replicas"]:
                srcs.setdefault(r["stages"][0]["tp"], set()).add(r["throughput_source"])
            print("sources by TP:", srcs)
            # the roofline candidates of the TP-1-only run are all calibrated
            for r in doc["replicas"]:
                tp = r["stages"][0]["tp"]
                if tp > 1 and not r["throughput_source"].startswith("modelled x"):
                    fail("TP-%d replica without a TP-%d profile says %r" % (
                        tp, tp, r["throughput_source"]))
                for pc in r["per_class"].values():
                    if tp > 1 and (pc["source"] != "calibrated" or pc["calibration"] == 1):
                        fail("TP-%d class not calibrated: %s" % (tp, pc))
            for r in doc2["replicas"]:
                if r["throughput_source"] != "measured":
                    fail("with TP-1 and TP-2 profiles, replica %s (%s) says %r" % (
                        r["id"], r["candidate"], r["throughput_source"]))
            if not any(r["stages"][0]["tp"] == 2 for r in doc["replicas"]):
                fail("the TP-1-only run placed no TP-2 replica: nothing calibrated was checked")
            if not any(r["stages"][0]["tp"] == 2 for r in doc2["replicas"]):
                fail("a TP-2 profile measured 3x the TP-1 one, yet no TP-2 replica: %s" %
                     [r["candidate"] for r in doc2["replicas"]])
        finally:
            FLEET.clear()
            FLEET.update(saved)
            WORKLOAD["models"] = WORKLOAD_SAVED
        # 4: unknown device is an error; a profile of another model is a note
        err = plan(tmp, [profile("Z9000-128GB", 1, 1)], expect_rc=1)
        if "Z9000-128GB" not in err or "no GPU type of the catalog" not in err:
            fail("unknown device: %r" % err)
        doc = plan(tmp, [a10g, profile("A100", 1, 1, model="llama-3-70b")])
        if not any("llama-3-70b" in n and "not used" in n for n in doc["notes"]):
            fail("a profile of a model not in the workload left no note: %s" % doc["notes"])
        print("unknown device:", err.strip())
    print("sched_profiles: ok")


if __name__ == "__main__":
    main()
