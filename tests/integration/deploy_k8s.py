"""deploy_k8s.py — deploy/k8s is valid Kubernetes and consistent with itself and with medley,
offline (docs/operations.md, "Runbook").

Every kustomization (base, each pool, each overlay) is rendered here: resources, namespace,
images and JSON 6902 patches with a kind/name target — the only features the manifests use;
any other kustomization key fails the test, so a new feature cannot be skipped silently.
Where `kustomize` or `kubectl` is on PATH (not in CI: no binaries are downloaded), its
rendering must equal ours. Then:

  * every rendered object validates with kubernetes-validate --strict against Kubernetes
    K8S_VERSION (unknown fields fail); a control: the same manifests fail at 1.27, which has
    no native sidecars (initContainers[].restartPolicy), so the pinned version matters;
  * every Secret, ConfigMap and PVC a pod uses exists in the same rendering, with the keys it
    names; every Service, PDB, NetworkPolicy and workload selector matches its pod labels;
  * workers: nodeSelector on nvidia.com/gpu.product (or GKE's accelerator label),
    --device-type a GPU catalog name (scheduler/catalog/gpus.json), nvidia.com/gpu equal to
    the number of devices in --device/--devices, terminationGracePeriodSeconds above
    --grace-ms + 10 s, probes calling `medley health` with options it accepts (run against
    the built binary: --help exits 0 and every flag is in it) and --children N for a
    --devices worker of N devices, --id from the node name;
  * every container non-root, no privilege escalation, capabilities dropped, read-only root;
  * the redis.conf of the ConfigMap is deploy/redis.conf, the ACL of the Secret template is
    deploy/redis/users.acl's medley user, and the stunnel config keeps the host file's
    verification settings.

kubernetes-validate comes from scripts/requirements-test.txt (PyPI)."""
import copy
import glob
import json
import os
import re
import shutil
import subprocess
import sys

import yaml

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(SRC, "deploy", "k8s")
K8S_VERSION = "1.30.0"
MEDLEY = os.environ.get("MEDLEY_BIN") or os.path.join(SRC, "build", "cli", "medley")
KUSTOMIZATION_KEYS = {"apiVersion", "kind", "namespace", "resources", "images", "patches"}


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


try:
    import kubernetes_validate
except ImportError:
    fail("kubernetes-validate is not installed (pip install -r scripts/requirements-test.txt)")


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def pointer(path):
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]


def json_patch(doc, ops, where):
    """RFC 6902 add/replace/remove (what the overlays use) on doc, in place."""
    for op in ops:
        parts = pointer(op["path"])
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        if isinstance(parent, list):
            last = len(parent) if last == "-" else int(last)
        if op["op"] == "add":
            if isinstance(parent, list):
                parent.insert(last, copy.deepcopy(op["value"]))
            else:
                parent[last] = copy.deepcopy(op["value"])
        elif op["op"] == "replace":
            if (isinstance(parent, dict) and last not in parent) or \
                    (isinstance(parent, list) and last >= len(parent)):
                fail("%s: replace %s: no such member" % (where, op["path"]))
            parent[last] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            del parent[last]
        else:
            fail("%s: JSON patch op %r is not one this test applies" % (where, op["op"]))


CLUSTER_SCOPED = {"Namespace"}


def render(d):
    """The objects kustomization directory d yields."""
    kpath = os.path.join(d, "kustomization.yaml")
    k = load_docs(kpath)[0]
    extra = set(k) - KUSTOMIZATION_KEYS
    if extra:
        fail("%s: keys %s are not rendered by this test (allowed: %s)" %
             (kpath, sorted(extra), sorted(KUSTOMIZATION_KEYS)))
    objs = []
    for r in k.get("resources", []):
        p = os.path.normpath(os.path.join(d, r))
        if os.path.isdir(p):
            objs += render(p)
        elif os.path.isfile(p):
            objs += load_docs(p)
        else:
            fail("%s: resource %s does not exist" % (kpath, r))
    for pt in k.get("patches", []):
        t = pt.get("target", {})
        ops = load_docs(os.path.join(d, pt["path"]))[0]
        hit = [o for o in objs if o["kind"] == t.get("kind") and
               o["metadata"]["name"] == t.get("name")]
        if len(hit) != 1:
            fail("%s: patch %s targets %s/%s, found %d objects" %
                 (kpath, pt["path"], t.get("kind"), t.get("name"), len(hit)))
        json_patch(hit[0], ops, "%s: %s" % (kpath, pt["path"]))
    for o in objs:
        if "namespace" in k and o["kind"] not in CLUSTER_SCOPED:
            o["metadata"]["namespace"] = k["namespace"]
    for img in k.get("images", []):
        for o in objs:
            for c in containers(o):
                name, _, tag = c["image"].rpartition(":")
                if name == img["name"]:
                    c["image"] = "%s:%s" % (img.get("newName", name), img.get("newTag", tag))
    return objs


def pod_spec(o):
    if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
        return o["spec"]["template"]["spec"]
    return None


def containers(o, init=True):
    s = pod_spec(o)
    if not s:
        return []
    return s.get("containers", []) + (s.get("initContainers", []) if init else [])


def key(o):
    return (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])


def compare_with_kustomize(d, objs):
    exe = shutil.which("kustomize")
    cmd = [exe, "build", d] if exe else None
    if not cmd and shutil.which("kubectl"):
        cmd = ["kubectl", "kustomize", d]
    if not cmd:
        return "no kustomize or kubectl on PATH: rendered here only"
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if p.returncode:
        fail("%s failed: %s" % (" ".join(cmd), p.stderr))
    theirs = {key(o): o for o in yaml.safe_load_all(p.stdout) if o}
    ours = {key(o): o for o in objs}
    if set(theirs) != set(ours):
        fail("%s: kustomize yields %s, this test %s" % (d, sorted(theirs), sorted(ours)))
    for k2 in ours:
        if json.dumps(ours[k2], sort_keys=True) != json.dumps(theirs[k2], sort_keys=True):
            fail("%s: %s differs from kustomize's rendering:\nours   %s\ntheirs %s" %
                 (d, k2, json.dumps(ours[k2], sort_keys=True)[:1500],
                  json.dumps(theirs[k2], sort_keys=True)[:1500]))
    return "equal to `%s`" % " ".join(cmd[:2])


def validate(objs, version, where):
    errors = []
    for o in objs:
        try:
            kubernetes_validate.validate(o, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append("%s/%s: %s" % (o["kind"], o["metadata"]["name"], e.message))
    return errors


def selects(sel, labels):
    return all(labels.get(k) == v for k, v in sel.items())


def check_refs(objs, where):
    by = {}
    for o in objs:
        by.setdefault(o["kind"], {})[o["metadata"]["name"]] = o

    def data_keys(kind, name):
        o = by.get(kind, {}).get(name)
        if o is None:
            fail("%s: %s %s is used but not defined" % (where, kind, name))
        return set(o.get("data", {})) | set(o.get("stringData", {}))

    pods = [o for o in objs if pod_spec(o)]
    for o in pods:
        s, name = pod_spec(o), o["metadata"]["name"]
        labels = o["spec"]["template"]["metadata"]["labels"]
        if not selects(o["spec"]["selector"]["matchLabels"], labels):
            fail("%s: %s's selector does not match its pod labels" % (where, name))
        vols = {v["name"]: v for v in s.get("volumes", [])}
        for v in vols.values():
            if "secret" in v:
                data_keys("Secret", v["secret"]["secretName"])
            if "configMap" in v:
                data_keys("ConfigMap", v["configMap"]["name"])
            if "persistentVolumeClaim" in v:
                if v["persistentVolumeClaim"]["claimName"] not in by.get("PersistentVolumeClaim", {}):
                    fail("%s: %s uses PVC %s, not defined" %
                         (where, name, v["persistentVolumeClaim"]["claimName"]))
        claims = {t["metadata"]["name"] for t in o["spec"].get("volumeClaimTemplates", [])}
        for c in containers(o):
            for m in c.get("volumeMounts", []):
                if m["name"] not in vols and m["name"] not in claims:
                    fail("%s: %s/%s mounts %s, no such volume" % (where, name, c["name"], m["name"]))
                sub = m.get("subPath")
                v = vols.get(m["name"], {})
                if sub and "configMap" in v and sub not in data_keys("ConfigMap", v["configMap"]["name"]):
                    fail("%s: %s mounts key %s of ConfigMap %s, which has no such key" %
                         (where, name, sub, v["configMap"]["name"]))
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref["key"] not in data_keys("Secret", ref["name"]):
                    fail("%s: %s reads key %s of Secret %s, which has no such key" %
                         (where, name, ref["key"], ref["name"]))
            sc = c.get("securityContext", {})
            if sc.get("allowPrivilegeEscalation") is not False or \
                    sc.get("readOnlyRootFilesystem") is not True or \
                    sc.get("capabilities", {}).get("drop") != ["ALL"]:
                fail("%s: %s/%s: allowPrivilegeEscalation false, readOnlyRootFilesystem and "
                     "capabilities drop ALL are required" % (where, name, c["name"]))
        psc = s.get("securityContext", {})
        if psc.get("runAsNonRoot") is not True or not psc.get("runAsUser") or \
                psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            fail("%s: %s must run as a non-root uid with the RuntimeDefault seccomp profile" %
                 (where, name))
    for kind in ("Service", "PodDisruptionBudget", "NetworkPolicy"):
        for o in by.get(kind, {}).values():
            sel = o["spec"].get("selector") if kind == "Service" else \
                o["spec"]["selector" if kind == "PodDisruptionBudget" else "podSelector"]
            sel = sel.get("matchLabels", sel) if kind != "Service" else sel
            hit = [p for p in pods if selects(sel, p["spec"]["template"]["metadata"]["labels"])]
            if not hit:
                fail("%s: %s %s selects no pod (%s)" % (where, kind, o["metadata"]["name"], sel))
    return pods


def health_flags():
    p = subprocess.run([MEDLEY, "health", "--help"], capture_output=True, text=True, timeout=10)
    if p.returncode:
        fail("medley health --help exited %d (MEDLEY_BIN=%s)" % (p.returncode, MEDLEY))
    return set(re.findall(r"--[a-z-]+", p.stdout))


def check_workers(pods, where, catalog, flags):
    n = 0
    for o in pods:
        if o["kind"] != "DaemonSet":
            continue
        n += 1
        s, name = pod_spec(o), o["metadata"]["name"]
        sel = s.get("nodeSelector", {})
        if not (sel.get("nvidia.com/gpu.product") or sel.get("cloud.google.com/gke-accelerator")):
            fail("%s: %s selects no GPU product" % (where, name))
        c = next(c for c in s["containers"] if c["name"] == "worker")
        args = c["args"]
        opt = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}
        if args[0] != "worker" or opt.get("--id") != "$(MEDLEY_WORKER_ID)":
            fail("%s: %s: args must be `worker --id $(MEDLEY_WORKER_ID) ...`: %s" % (where, name, args))
        env = {e["name"]: e for e in c["env"]}
        if env["MEDLEY_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] != "spec.nodeName":
            fail("%s: %s: MEDLEY_WORKER_ID must be the node name" % (where, name))
        if opt.get("--device-type") not in catalog:
            fail("%s: %s: --device-type %s is not in the GPU catalog %s" %
                 (where, name, opt.get("--device-type"), sorted(catalog)))
        devs = opt.get("--devices", opt.get("--device", "")).split(",")
        gpus = int(c["resources"]["limits"]["nvidia.com/gpu"])
        if gpus != len(devs) or not all(d.startswith("cuda:") for d in devs):
            fail("%s: %s: nvidia.com/gpu %d but devices %s" % (where, name, gpus, devs))
        grace_ms = int(opt.get("--grace-ms", 30000))
        if s["terminationGracePeriodSeconds"] * 1000 < grace_ms + 10000:
            fail("%s: %s: terminationGracePeriodSeconds %d leaves under 10 s after --grace-ms %d" %
                 (where, name, s["terminationGracePeriodSeconds"], grace_ms))
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            cmd = c[probe]["exec"]["command"]
            # a --devices supervisor has no heartbeat of its own: its N children are checked
            want = str(len(devs)) if "--devices" in opt else None
            got = cmd[cmd.index("--children") + 1] if "--children" in cmd else None
            if got != want:
                fail("%s: %s: %s %s: --children must be %s for devices %s" %
                     (where, name, probe, cmd, want, devs))
            if cmd[:2] != ["medley", "health"] or \
                    not {a for a in cmd[2:] if a.startswith("--")} <= flags:
                fail("%s: %s: %s %s is not a `medley health` with flags it has (%s)" %
                     (where, name, probe, cmd, sorted(flags)))
        if "--ready" not in c["readinessProbe"]["exec"]["command"] or \
                "--ready" in c["livenessProbe"]["exec"]["command"]:
            fail("%s: %s: readiness must use --ready, liveness must not" % (where, name))
        side = [i for i in s.get("initContainers", []) if i.get("restartPolicy") == "Always"]
        if not side or "stunnel" not in side[0]["command"][0]:
            fail("%s: %s: no stunnel native sidecar to carry Redis over TLS" % (where, name))
    return n


def check_files(objs):
    """The ConfigMap and Secret templates against the host files of deploy/."""
    by = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    with open(os.path.join(SRC, "deploy", "redis.conf")) as f:
        if by[("ConfigMap", "medley-redis-config")]["data"]["redis.conf"] != f.read():
            fail("the medley-redis-config ConfigMap's redis.conf differs from deploy/redis.conf")
    with open(os.path.join(SRC, "deploy", "redis", "users.acl")) as f:
        host = [l for l in f.read().splitlines() if l.startswith("user ")]
    pod = by[("Secret", "medley-redis-acl")]["stringData"]["users.acl"].splitlines()
    for l in host:
        if l not in pod:
            fail("the medley-redis-acl Secret lacks deploy/redis/users.acl's line %r" % l[:80])

    def stunnel(text):
        return dict(re.match(r"\s*([^=;\[]+?)\s*=\s*(.*?)\s*$", l).groups()
                    for l in text.splitlines() if re.match(r"\s*[^=;\[]+=", l))
    with open(os.path.join(SRC, "deploy", "stunnel", "medley-redis.conf")) as f:
        host = stunnel(f.read())
    pod = stunnel(by[("ConfigMap", "medley-stunnel-config")]["data"]["medley-redis.conf"])
    for k in ("client", "accept", "verifyChain", "sslVersionMin", "foreground", "CAfile",
              "checkHost", "cert", "key", "connect"):
        if k not in pod:
            fail("the medley-stunnel-config ConfigMap has no %s" % k)
    for k in ("client", "accept", "verifyChain", "sslVersionMin", "foreground"):
        if pod[k] != host[k]:
            fail("stunnel %s: %r in the ConfigMap, %r in deploy/stunnel/medley-redis.conf" %
                 (k, pod[k], host[k]))
    url = by[("Secret", "medley-redis-url")]["stringData"]["url"]
    if not url.endswith("@%s/0" % pod["accept"]):
        fail("the medley-redis-url Secret (%s) does not go through the sidecar's %s" %
             (url, pod["accept"]))


def main():
    with open(os.path.join(SRC, "scheduler", "catalog", "gpus.json")) as f:
        catalog = {g["name"] for g in json.load(f)["gpus"]}
    flags = health_flags()
    dirs = [os.path.join(K8S, "base")] + sorted(glob.glob(os.path.join(K8S, "pools", "*"))) + \
        sorted(glob.glob(os.path.join(K8S, "overlays", "*")))
    overlays = 0
    for d in dirs:
        rel = os.path.relpath(d, SRC)
        objs = render(d)
        how = compare_with_kustomize(d, objs)
        errors = validate(objs, K8S_VERSION, rel)
        if errors:
            fail("%s: kubernetes-validate --strict (%s):\n  %s" % (rel, K8S_VERSION,
                                                                  "\n  ".join(errors)))
        if "/overlays/" in d:
            overlays += 1
            pods = check_refs(objs, rel)
            n = check_workers(pods, rel, catalog, flags)
            check_files(objs)
            if n == 0 or "Deployment" not in {o["kind"] for o in objs}:
                fail("%s: no worker pools or no scheduler" % rel)
            old = validate(objs, "1.27.0", rel)
            if not any("restartPolicy" in e for e in old):
                fail("%s: validated at 1.27 too (no native sidecars there): is --strict "
                     "checking anything?" % rel)
            print("ok: %s: %d objects valid at %s, %d worker pools, references consistent; %s" %
                  (rel, len(objs), K8S_VERSION, n, how))
        else:
            print("ok: %s: %d objects valid at %s; %s" % (rel, len(objs), K8S_VERSION, how))
    if overlays < 2:
        fail("expected the aws and gcp overlays, found %d" % overlays)
    print("deploy_k8s: ok")


if __name__ == "__main__":
    main()
