"""harness.py — shared helpers for the queue's integration tests: a real redis-server on a
free port in a temp dir (optionally with appendonly), `medley worker` processes, submission,
waiting, reading results. No mocks: every test talks to a real Redis and the real binary.

Environment: MEDLEY_BIN (the medley binary; ctest sets it), MEDLEY_REDIS_SERVER (default
redis-server on PATH)."""
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

MEDLEY = os.environ.get("MEDLEY_BIN") or shutil.which("medley") or "medley"
REDIS_SERVER = os.environ.get("MEDLEY_REDIS_SERVER") or shutil.which("redis-server")
SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class RedisServer:
    """redis-server on 127.0.0.1:<free port>, data in a temp dir; restartable."""

    def __init__(self, appendonly=False, password=None, args=()):
        if not REDIS_SERVER:
            fail("redis-server not found (apt-get install redis-server)")
        self.dir = tempfile.mkdtemp(prefix="medley-it-")
        self.port = free_port()
        self.appendonly = appendonly
        self.password = password
        self.args = list(args)  # more redis-server options, e.g. ["--replicaof", host, port]
        self.proc = None
        self.start()

    @property
    def url(self):
        auth = ":%s@" % self.password if self.password else ""
        return "redis://%s127.0.0.1:%d/0" % (auth, self.port)

    def start(self):
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                "--save", "", "--logfile", os.path.join(self.dir, "redis.log")]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        args += self.args
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                if self.client().ping():
                    return
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        fail("redis-server did not start on port %d" % self.port)

    def client(self):
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password,
                           decode_responses=True, socket_timeout=30)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Worker:
    def __init__(self, server, models=("echo",), args=(), name=None, env=None):
        self.log_path = os.path.join(server.dir, "worker-%s.log" % (name or free_port()))
        self.log = open(self.log_path, "w")
        cmd = [MEDLEY, "worker", "--redis", server.url]
        for m in models:
            cmd += ["--model", m]
        cmd += list(args)
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=e)

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout=60):
        return self.proc.wait(timeout)

    def stop(self):
        """SIGTERM; a worker we stop must exit 0 (graceful stop, no leak reports)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                rc = self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                fail("worker did not stop within 30 s of SIGTERM:\n" + self.logs()[-2000:])
            if rc != 0:
                fail("worker exited %d after SIGTERM:\n%s" % (rc, self.logs()[-3000:]))
        self.log.close()

    def logs(self):
        with open(self.log_path) as f:
            return f.read()


def medley(*args, check=True, timeout=120, input=None):
    p = subprocess.run([MEDLEY] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout, input=input)
    if check and p.returncode != 0:
        fail("medley %s exited %d: %s" % (" ".join(map(str, args)), p.returncode, p.stderr))
    return p


def chat_line(cid, content, model="echo", **body):
    b = {"model": model, "messages": [{"role": "user", "content": content}]}
    b.update(body)
    return json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                       "body": b})


def write_lines(dirpath, name, lines):
    path = os.path.join(dirpath, name)
    with open(path, "w") as f:
        for l in lines:
            f.write(l + "\n")
    return path


def submit(server, path, *extra):
    p = medley("submit", path, "--redis", server.url, *extra)
    return p.stdout.strip()


def meta(server, batch):
    return server.client().hgetall("medley:{%s}:meta" % batch)


def wait_batch(server, batch, timeout=120, states=("completed", "failed", "cancelled", "expired")):
    deadline = time.time() + timeout
    m = {}
    while time.time() < deadline:
        try:
            m = meta(server, batch)
        except redis.exceptions.ConnectionError:
            m = {}
        if m.get("status") in states:
            return m
        time.sleep(0.1)
    fail("batch %s did not finish in %ds: %s" % (batch, timeout, m))


def results(server, batch):
    """All output lines of a batch (parsed), via `medley results`."""
    out = os.path.join(server.dir, batch + ".out.jsonl")
    medley("results", batch, "--redis", server.url, "-o", out)
    with open(out) as f:
        return [json.loads(l) for l in f if l.strip()]


def exactly_once(lines, expected_ids):
    seen = {}
    for l in lines:
        seen[l["custom_id"]] = seen.get(l["custom_id"], 0) + 1
    doubled = [k for k, v in seen.items() if v > 1]
    missing = [k for k in expected_ids if k not in seen]
    extra = [k for k in seen if k not in set(expected_ids)]
    if doubled or missing or extra:
        fail("exactly-once violated: %d doubled (%s), %d missing (%s), %d unexpected (%s)" % (
            len(doubled), doubled[:5], len(missing), missing[:5], len(extra), extra[:5]))


def schema_validator(name):
    """A jsonschema validator for schemas/<name>.schema.json (Draft 2020-12)."""
    import jsonschema
    path = os.path.join(SOURCE_DIR, "schemas", name + ".schema.json")
    with open(path) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def validate_all(validator, docs, what):
    for d in docs:
        errs = sorted(validator.iter_errors(d), key=lambda e: e.path)
        if errs:
            fail("%s does not follow its schema: %s\n%s" % (what, errs[0].message,
                                                           json.dumps(d)[:2000]))
