"""api_util.py — helpers for the `medley api` tests: a key file, a `medley api` process on a
free port (its URL read from its first stdout line), a Redis and echo worker from harness.py."""
import hashlib
import os
import select
import subprocess
import time

from harness import MEDLEY, fail

KEY_A = "sk-acme-0123456789abcdef0123"
KEY_B = "sk-beta-0123456789abcdef0123"


def write_keys(dirpath):
    """acme with a plain key, beta with its sha256 (the file need not hold secrets)."""
    path = os.path.join(dirpath, "api-keys")
    with open(path, "w") as f:
        f.write("# tenant key\nacme %s\nbeta sha256:%s\n"
                % (KEY_A, hashlib.sha256(KEY_B.encode()).hexdigest()))
    return path


class Api:
    def __init__(self, server, keys, args=(), name="api"):
        self.log_path = os.path.join(server.dir, "%s.log" % name)
        self.log = open(self.log_path, "w")
        cmd = [MEDLEY, "api", "--listen", "127.0.0.1:0", "--redis", server.url,
               "--api-keys", keys] + list(args)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 20)
        line = self.proc.stdout.readline() if ready else ""
        if "serving http://" not in line:
            self.proc.kill()
            fail("medley api did not start: %r\n%s" % (line, self.logs()))
        self.url = line.split("serving ", 1)[1].strip()
        self.base = self.url + "/v1"

    def logs(self):
        with open(self.log_path) as f:
            return f.read()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                rc = self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                fail("medley api did not stop within 20 s of SIGTERM")
            if rc != 0:
                fail("medley api exited %d after SIGTERM:\n%s" % (rc, self.logs()[-2000:]))
        self.log.close()


def wait_status(client, batch_id, states, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        b = client.batches.retrieve(batch_id)
        if b.status in states:
            return b
        time.sleep(0.1)
    fail("batch %s not in %s after %d s: %s" % (batch_id, states, timeout, b))
