#!/usr/bin/env python3
"""queue_tls_acl.py — medley over TLS with the least-privilege ACL user (docs/operations.md,
"TLS and least privilege"), against real servers on loopback:

  redis-server with a TLS port only (no plaintext port), client certificates required, the
  ACL file deploy/redis/users.acl (a test password) plus an admin user for this test;
  an stunnel client sidecar (the deploy/stunnel/medley-redis.conf settings) that verifies the
  server's chain and host name; workers and every client command through it:
  submit, status (one, all, --json), batches, results (--wait), cancel, run --redis,
  scheduler --once, a worker killed mid-batch and its entries taken over by another
  (XPENDING/XAUTOCLAIM/XCLAIM). Then: the ACL log holds no refusal; the medley user gets
  NOPERM for keys outside medley:* and for commands outside the list; --prefix other: stops
  the worker and the clients with a sentence naming ~other:* and &other:*, and works for a
  user made for it; plaintext to the TLS port, a sidecar trusting another CA and one expecting
  another host name all fail. ~15 s."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import chat_line, exactly_once, fail, free_port, medley, write_lines  # noqa: E402

STUNNEL = shutil.which("stunnel4") or shutil.which("stunnel")
OPENSSL = shutil.which("openssl")
PASSWORD = "test-pw-0123456789"
ADMIN_PW = "admin-pw-9876543210"


def sh(*args, cwd):
    p = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True)
    if p.returncode:
        fail("%s exited %d: %s" % (" ".join(args), p.returncode, p.stderr))


def make_ca(d, name):
    sh(OPENSSL, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
       "-nodes", "-keyout", name + ".key", "-out", name + ".crt", "-days", "2",
       "-subj", "/CN=medley test " + name, cwd=d)


def make_cert(d, name, ca, san):
    """name.crt/name.key signed by ca, with subjectAltName san ("" for a client cert)."""
    sh(OPENSSL, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
       "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name, cwd=d)
    ext = os.path.join(d, name + ".ext")
    with open(ext, "w") as f:
        f.write("basicConstraints=CA:FALSE\n")
        if san:
            f.write("subjectAltName=%s\nextendedKeyUsage=serverAuth\n" % san)
        else:
            f.write("extendedKeyUsage=clientAuth\n")
    sh(OPENSSL, "x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey", ca + ".key",
       "-CAcreateserial", "-out", name + ".crt", "-days", "2", "-extfile", ext, cwd=d)


def wait_port(port, what, proc, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            fail("%s exited %d before listening on %d" % (what, proc.returncode, port))
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    fail("%s did not listen on %d" % (what, port))


class Endpoint:
    """What harness.Worker/submit/results need: a URL and a directory for logs."""

    def __init__(self, url, d):
        self.url, self.dir = url, d


class Stunnel:
    """An stunnel client sidecar in the foreground: 127.0.0.1:<port> -> TLS to the server."""

    def __init__(self, d, name, tls_port, ca, check_host="localhost"):
        self.port = free_port()
        self.conf = os.path.join(d, name + ".conf")
        self.log = os.path.join(d, name + ".log")
        # The settings of deploy/stunnel/medley-redis.conf, with test paths and ports.
        with open(self.conf, "w") as f:
            f.write("foreground = yes\npid =\ndebug = info\n\n[medley-redis]\nclient = yes\n"
                    "accept = 127.0.0.1:%d\nconnect = 127.0.0.1:%d\nverifyChain = yes\n"
                    "CAfile = %s\ncheckHost = %s\ncert = %s\nkey = %s\nsslVersionMin = TLSv1.2\n"
                    % (self.port, tls_port, os.path.join(d, ca + ".crt"), check_host,
                       os.path.join(d, "client.crt"), os.path.join(d, "client.key")))
        self.proc = subprocess.Popen([STUNNEL, self.conf], stdout=open(self.log, "w"),
                                     stderr=subprocess.STDOUT)
        wait_port(self.port, "stunnel " + name, self.proc)

    def url(self, user="medley", pw=PASSWORD, db=0):
        return "redis://%s:%s@127.0.0.1:%d/%d" % (user, pw, self.port, db)

    def logs(self):
        with open(self.log) as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def refused(fn, what, cls=redis.exceptions.NoPermissionError, words=()):
    """fn() must raise cls (NoPermissionError: Redis said NOPERM) with words in its text."""
    try:
        fn()
    except cls as e:
        if not all(w in str(e) for w in words):
            fail("%s: refused, but without %s: %s" % (what, words, e))
        return
    except redis.exceptions.RedisError as e:
        fail("%s: expected %s, got %s: %s" % (what, cls.__name__, type(e).__name__, e))
    fail("%s was allowed" % what)


def batch_lines(n, model="echo", tag="r"):
    return [chat_line("%s-%d" % (tag, i), "hello %d" % i, model=model) for i in range(n)]


def main():
    if not harness.REDIS_SERVER:
        fail("redis-server not found (apt-get install redis-server)")
    if not STUNNEL or not OPENSSL:
        fail("stunnel4 and openssl are needed (apt-get install stunnel4 openssl)")
    d = tempfile.mkdtemp(prefix="medley-tls-")
    procs = []
    try:
        run(d, procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(d, ignore_errors=True)
    print("ok")


def run(d, procs):
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    make_cert(d, "server", "ca", "DNS:localhost,IP:127.0.0.1")
    make_cert(d, "client", "ca", "")
    # The deploy ACL file as it is checked in, with a test password, and an admin for checks.
    with open(os.path.join(harness.SOURCE_DIR, "deploy", "redis", "users.acl")) as f:
        users = f.read()
    if ">CHANGE-ME " not in users:
        fail("deploy/redis/users.acl should carry the placeholder password >CHANGE-ME")
    with open(os.path.join(d, "users.acl"), "w") as f:
        f.write(users.replace(">CHANGE-ME ", ">%s " % PASSWORD))
        f.write("user admin on >%s ~* &* +@all\n" % ADMIN_PW)
    tls_port = free_port()
    server = subprocess.Popen(
        [harness.REDIS_SERVER, "--port", "0", "--tls-port", str(tls_port), "--bind", "127.0.0.1",
         "--tls-cert-file", os.path.join(d, "server.crt"),
         "--tls-key-file", os.path.join(d, "server.key"),
         "--tls-ca-cert-file", os.path.join(d, "ca.crt"), "--tls-auth-clients", "yes",
         "--aclfile", os.path.join(d, "users.acl"), "--dir", d, "--save", "",
         "--appendonly", "no", "--logfile", os.path.join(d, "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(server)
    wait_port(tls_port, "redis-server", server)

    def tls_client(user, pw):
        return redis.Redis(host="127.0.0.1", port=tls_port, username=user, password=pw,
                           ssl=True, ssl_ca_certs=os.path.join(d, "ca.crt"),
                           ssl_certfile=os.path.join(d, "client.crt"),
                           ssl_keyfile=os.path.join(d, "client.key"), decode_responses=True,
                           socket_timeout=10)

    admin = tls_client("admin", ADMIN_PW)
    admin.ping()
    admin.config_set("acllog-max-len", "1000")
    tun = Stunnel(d, "stunnel", tls_port, "ca")
    procs.append(tun.proc)
    ep = Endpoint(tun.url(), d)

    # -- a worker and every client command through the sidecar, as the medley user ---------
    w = harness.Worker(ep, args=["--echo-delay-ms", "0", "--heartbeat-ms", "500"], name="w1")
    procs.append(w.proc)
    ids = ["r-%d" % i for i in range(50)]
    batch = harness.submit(ep, write_lines(d, "in.jsonl", batch_lines(50)))
    out = os.path.join(d, "out.jsonl")
    medley("results", batch, "--wait", "-o", out, "--redis", ep.url, timeout=60)
    with open(out) as f:
        lines = [json.loads(l) for l in f if l.strip()]
    exactly_once(lines, ids)
    if admin.hget("medley:{%s}:meta" % batch, "status") != "completed":
        fail("batch %s did not complete: %s" % (batch, admin.hgetall("medley:{%s}:meta" % batch)))
    for args in (["status", batch], ["status", batch, "--json"], ["status"], ["batches"],
                 ["batches", "--json", "--limit", "5"]):
        p = medley(*args, "--redis", ep.url)
        if batch not in p.stdout:
            fail("medley %s does not show %s: %s" % (" ".join(args), batch, p.stdout))
    # SELECT: a client on database 1 (empty there)
    p = medley("batches", "--redis", tun.url(db=1))
    if batch in p.stdout:
        fail("database 1 should not hold the batch of database 0")
    # cancel: a batch of a model no worker serves
    b2 = harness.submit(ep, write_lines(d, "in2.jsonl", batch_lines(3, model="nobody")))
    p = medley("cancel", b2, "--redis", ep.url)
    if admin.hget("medley:{%s}:meta" % b2, "status") != "cancelling":
        fail("cancel of %s: %s %s" % (b2, p.stdout, admin.hgetall("medley:{%s}:meta" % b2)))
    # medley run --redis: its own worker thread and client through the sidecar
    run_out = os.path.join(d, "run.jsonl")
    medley("run", write_lines(d, "in3.jsonl", batch_lines(5, tag="run")), "-o", run_out,
           "--redis", ep.url, "--quiet", timeout=60)
    with open(run_out) as f:
        exactly_once([json.loads(l) for l in f if l.strip()], ["run-%d" % i for i in range(5)])
    # the scheduler: SCAN, heartbeats, backlogs, lease, plan
    p = medley("scheduler", "--once", "--redis", ep.url, check=False, timeout=60)
    if p.returncode != 0 or "NOPERM" in p.stderr:
        fail("medley scheduler --once exited %d: %s" % (p.returncode, p.stderr[-2000:]))

    # a worker killed mid-batch; another takes its entries over (XPENDING, XAUTOCLAIM, XCLAIM)
    w.stop()
    slow = harness.Worker(ep, args=["--echo-delay-ms", "1200", "--max-seqs", "4",
                                    "--visibility-ms", "1500"], name="slow")
    procs.append(slow.proc)
    b3 = harness.submit(ep, write_lines(d, "in4.jsonl", batch_lines(20, tag="k")))
    deadline = time.time() + 20
    while int(admin.hget("medley:{%s}:meta" % b3, "completed") or 0) < 2:
        if time.time() > deadline:
            fail("the slow worker answered nothing:\n" + slow.logs()[-2000:])
        time.sleep(0.05)
    slow.signal(signal.SIGKILL)
    slow.wait()
    w2 = harness.Worker(ep, args=["--visibility-ms", "1500", "--heartbeat-ms", "500"], name="w2")
    procs.append(w2.proc)
    deadline = time.time() + 40
    while admin.hget("medley:{%s}:meta" % b3, "status") != "completed":
        if time.time() > deadline:
            fail("the batch of the killed worker did not complete:\n" + w2.logs()[-2000:])
        time.sleep(0.1)
    exactly_once(harness.results(ep, b3), ["k-%d" % i for i in range(20)])
    w2.stop()
    for wk in (w, w2):
        if "NOPERM" in wk.logs() or "no permissions" in wk.logs():
            fail("a worker was refused a command:\n" + wk.logs()[-3000:])

    # -- nothing medley did was refused; what it did ----------------------------------------
    denied = [e for e in admin.acl_log() if e.get("username") == "medley"]
    if denied:
        fail("the ACL refused medley: %s" % denied[:5])
    stats = admin.info("commandstats")
    used = sorted(k[len("cmdstat_"):] for k in stats if k.startswith("cmdstat_"))
    print("commands called (all users):", " ".join(used))
    for c in ("xreadgroup", "xautoclaim", "xclaim", "xpending", "evalsha", "eval", "script|load",
              "xgroup|create", "xack", "xdel", "xadd", "publish", "hset", "hincrby", "sadd",
              "xrange", "zrevrange", "hgetall", "zadd", "exists", "pexpire", "select", "scan",
              "xinfo|groups", "set"):
        if c not in used:
            fail("the test should have made medley call %s" % c)

    # -- the medley user is confined to medley:* and its commands ---------------------------
    m = redis.Redis(host="127.0.0.1", port=tun.port, username="medley", password=PASSWORD,
                    decode_responses=True, socket_timeout=10)
    m.set("medley:tls-acl-probe", "1")
    refused(lambda: m.set("other:x", "1"), "SET other:x")
    refused(lambda: m.get("secret"), "GET secret")
    refused(lambda: m.publish("other:events", "x"), "PUBLISH other:events")
    for name, fn in (("FLUSHALL", m.flushall), ("CONFIG GET", lambda: m.config_get("*")),
                     ("KEYS", lambda: m.keys("*")), ("ACL LIST", m.acl_list),
                     ("SHUTDOWN", lambda: m.execute_command("SHUTDOWN")),
                     ("CLIENT LIST", m.client_list),
                     ("SWAPDB", lambda: m.execute_command("SWAPDB", "0", "1")),
                     ("SUBSCRIBE", lambda: m.execute_command("SUBSCRIBE", "medley:events")),
                     ("SCRIPT FLUSH", lambda: m.execute_command("SCRIPT", "FLUSH")),
                     ("XGROUP DESTROY", lambda: m.execute_command("XGROUP", "DESTROY",
                                                                  "medley:q:{echo}", "g")),
                     ("EVAL of FLUSHALL", lambda: m.eval("return redis.call('FLUSHALL')", 0)),
                     ("EVAL of another key", lambda: m.eval(
                         "return redis.call('GET', KEYS[1])", 1, "other:x")),
                     ("EVAL of an undeclared key", lambda: m.eval(
                         "return redis.call('GET', 'other:x')", 0))):
        if name in ("EVAL of FLUSHALL", "EVAL of an undeclared key"):
            # refused inside the script: an error reply of the script
            refused(fn, name, redis.exceptions.ResponseError, ("The user executing the script",))
        else:
            refused(fn, name)
    m.close()

    # -- --prefix other: needs its own key and channel patterns -----------------------------
    p = subprocess.run([harness.MEDLEY, "worker", "--model", "echo", "--redis", ep.url,
                        "--prefix", "other:"], capture_output=True, text=True, timeout=20)
    for want in ("NOPERM", "~other:*", "&other:*", "user 'medley'", "docs/operations.md"):
        if p.returncode == 0 or want not in p.stderr:
            fail("worker --prefix other: should exit non-zero saying %r: rc %d, %s" % (
                want, p.returncode, p.stderr[-1500:]))
    for args in (["submit", os.path.join(d, "in.jsonl")], ["status"], ["cancel", batch],
                 ["results", batch, "-o", "-"], ["scheduler", "--once"]):
        p = medley(*args, "--redis", ep.url, "--prefix", "other:", check=False, timeout=30)
        if p.returncode == 0 or "~other:*" not in p.stderr:
            fail("medley %s --prefix other: should fail naming ~other:*: rc %d, %s" % (
                args[0], p.returncode, p.stderr[-1000:]))
    # a user made for the prefix, from the deploy line: the same commands, ~other:* &other:*
    line = next(l for l in users.splitlines() if l.startswith("user medley "))
    rules = [w for w in line.split()[2:] if w[0] not in ">~&"]
    rules = [w.replace("resetchannels", "resetchannels ~other:* &other:*") for w in rules]
    admin.execute_command("ACL", "SETUSER", "medley-other", ">other-pw", *" ".join(rules).split())
    other = Endpoint(tun.url("medley-other", "other-pw"), d)
    wo = harness.Worker(other, args=["--prefix", "other:"], name="other")
    procs.append(wo.proc)
    b4 = medley("submit", os.path.join(d, "in2.jsonl"), "--model", "echo", "--redis", other.url,
                "--prefix", "other:").stdout.strip()
    deadline = time.time() + 20
    while admin.hget("other:{%s}:meta" % b4, "status") != "completed":
        if time.time() > deadline:
            fail("a batch under other: did not complete for medley-other:\n" + wo.logs()[-2000:])
        time.sleep(0.1)
    wo.stop()
    if admin.exists("medley:{%s}:meta" % b4):
        fail("--prefix other: wrote under medley:")

    # -- no plaintext, and the sidecar really verifies the server ---------------------------
    plain = redis.Redis(host="127.0.0.1", port=tls_port, username="medley", password=PASSWORD,
                        socket_timeout=3, socket_connect_timeout=3)
    refused(plain.ping, "plaintext to the TLS port", redis.exceptions.ConnectionError)
    p = medley("batches", "--redis", "redis://medley:%s@127.0.0.1:%d/0" % (PASSWORD, tls_port),
               check=False, timeout=30)
    if p.returncode == 0:
        fail("medley spoke plaintext to the TLS port: " + p.stdout)
    for name, ca, host, log_says in (("wrong-ca", "other-ca", "localhost", "verify"),
                                     ("wrong-host", "ca", "redis.example.org", "")):
        bad = Stunnel(d, name, tls_port, ca, check_host=host)
        procs.append(bad.proc)
        p = medley("batches", "--redis", bad.url(), check=False, timeout=30)
        if p.returncode == 0:
            fail("stunnel with %s let medley through: %s" % (name, p.stdout))
        bad.stop()
        if "CERTIFICATE_VERIFY_FAILED" not in bad.logs().upper().replace(" ", "_"):
            fail("stunnel %s should log a failed verification:\n%s" % (name, bad.logs()[-1500:]))
    tun.stop()


if __name__ == "__main__":
    main()
