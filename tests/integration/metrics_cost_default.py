"""metrics_cost_default.py — a worker's price defaults from the GPU catalog by --device-type
(issue 39 item 18: no Kubernetes manifest passes --usd-per-hour, so every cost gauge read 0).
Real workers (echo) against a real redis-server, their /metrics scraped:

1. --device-type L4 without --usd-per-hour: medley_device_usd_per_hour is the catalog's L4
   price (scheduler/catalog/gpus.json).
2. --usd-per-hour 1.25 (a pool's override) wins, and so does an explicit 0.
3. --devices cpu,cpu --device-type L4: each child reports half of two L4s' price.
4. Every worker pool of deploy/k8s names a --device-type the catalog prices (> 0)."""
import glob
import json
import os
import re

from harness import *
from metrics_prometheus import sample, scrape

SRC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def catalog_price(name):
    doc = json.load(open(os.path.join(SRC, "scheduler/catalog/gpus.json")))
    for g in doc["gpus"]:
        if name == g["name"] or name in g.get("aliases", []):
            return g["usd_per_hour"]
    return None


def price_of(srv, args, name, port=None):
    port = port or free_port()
    w = Worker(srv, args=["--metrics", "127.0.0.1:%d" % port] + args, name=name)
    try:
        return sample(scrape(port, timeout=20), "medley_device_usd_per_hour"), w
    except SystemExit:
        print(w.logs()[-2000:])
        raise


def main():
    l4 = catalog_price("L4")
    if not l4:
        fail("the catalog has no L4 price")
    srv = RedisServer()
    workers = []
    try:
        for args, want, what in (
                (["--device-type", "L4"], l4, "the catalog's L4 price by default"),
                (["--device-type", "L4", "--usd-per-hour", "1.25"], 1.25, "the override"),
                (["--device-type", "L4", "--usd-per-hour", "0"], 0.0, "an explicit 0")):
            v, w = price_of(srv, args, "cost%d" % len(workers))
            workers.append(w)
            if v is None or abs(v - want) > 1e-9:
                fail("%s: medley_device_usd_per_hour %s, want %s (%s)" % (args, v, want, what))
            print("ok: %s -> %s USD/h (%s)" % (" ".join(args), v, what))
        port = free_port()
        w = Worker(srv, args=["--metrics", "127.0.0.1:%d" % port, "--devices", "cpu,cpu",
                              "--device-type", "L4", "--id", "cost-sv"], name="costsv")
        workers.append(w)
        for i in (0, 1):
            v = sample(scrape(port + i, timeout=20), "medley_device_usd_per_hour")
            if v is None or abs(v - l4) > 1e-9:
                fail("--devices child %d: %s USD/h, want half of 2 x L4 = %s" % (i, v, l4))
        print("ok: --devices cpu,cpu --device-type L4: each child %s USD/h" % l4)
        pools = sorted(glob.glob(os.path.join(SRC, "deploy/k8s/pools/*/worker.yaml")))
        if not pools:
            fail("no worker pools under deploy/k8s/pools")
        for p in pools:
            m = re.search(r'"--device-type",\s*"([^"]+)"', open(p).read())
            if not m or not catalog_price(m.group(1)):
                fail("%s: its --device-type %s has no catalog price" % (p, m and m.group(1)))
        print("ok: the %d k8s pools name priced catalog types" % len(pools))
    finally:
        for w in workers:
            w.stop()
        srv.stop()


if __name__ == "__main__":
    main()
