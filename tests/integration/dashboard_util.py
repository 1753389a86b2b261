"""dashboard_util.py — `medley dashboard` for the dashboard's integration tests: start it on a
free port against a harness RedisServer, read its JSON documents, send actions."""
import json
import os
import select
import subprocess
import time
import urllib.error
import urllib.request

from harness import MEDLEY, fail, free_port


class Dashboard:
    def __init__(self, server, args=(), env=None, refresh_ms=300):
        self.log_path = os.path.join(server.dir, "dashboard-%d.log" % free_port())
        self.log = open(self.log_path, "w")
        e = dict(os.environ)
        e.pop("MEDLEY_DASHBOARD_TOKEN", None)
        e.update(env or {})
        cmd = [MEDLEY, "dashboard", "--listen", "127.0.0.1:0", "--redis", server.url,
               "--refresh-ms", str(refresh_ms)] + list(args)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, env=e,
                                     text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 15)
        line = self.proc.stdout.readline() if ready else ""
        prefix = "medley dashboard: serving "
        if not line.startswith(prefix):
            self.proc.kill()
            fail("medley dashboard did not start (%r):\n%s" % (line, self.logs()))
        self.url = line[len(prefix):].strip().rstrip("/")

    def request(self, method, path, headers=None):
        """(HTTP status, parsed JSON body or None)."""
        req = urllib.request.Request(self.url + path, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                status, body = r.status, r.read()
        except urllib.error.HTTPError as err:
            status, body = err.code, err.read()
        try:
            return status, json.loads(body)
        except ValueError:
            return status, None

    def get(self, path):
        status, doc = self.request("GET", path)
        if status != 200:
            fail("GET %s: HTTP %d %s" % (path, status, doc))
        return doc

    def post(self, path, token=None, header=None):
        headers = {}
        if token is not None:
            headers["Authorization"] = "Bearer " + token
        if header is not None:
            headers["Authorization"] = header
        return self.request("POST", path, headers)

    def logs(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                rc = self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                fail("medley dashboard did not stop within 10 s of SIGTERM")
            if rc != 0:
                fail("medley dashboard exited %d after SIGTERM:\n%s" % (rc, self.logs()))
        self.log.close()


def wait_for(what, fn, timeout=20, every=0.1):
    """fn() until it returns a true value; fail naming `what` after timeout seconds."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    fail("timed out after %ds waiting for %s (last: %r)" % (timeout, what, last))
