"""stage_guard.py — a `medley stage` serves its replica only (docs/sharding.md
"Authentication", "Wire format"), against real `medley stage` processes on loopback and a peer
written here from docs/sharding.md's wire format alone (struct, zlib.crc32, hmac):

1. A peer without the secret (a HELLO signed with another key, or replayed from another
   connection) is refused with "authentication failed" before any model is opened: it names
   an allowed model whose file does not exist, and the answer is not the file's error (the
   same HELLO signed with the secret gets that error, so the check can fail); the stage log
   has no "loading" line.
2. Signed HELLOs naming /etc/shadow, a path that does not exist, an unknown registry name and
   a synthetic model outside --model all get the same ERROR frame, byte for byte, and the
   stage opens nothing.
3. 50 idle connections and 50 slowloris ones (a HELLO header trickled a byte every 200 ms)
   on each of two stages: a real head (`medley generate` over synthetic:tiny split across
   the two) still finishes its first step in under 2 s (printed with the time of the same run
   without them).
4. A peer that sends a signed HELLO, takes READY and goes silent is dropped at
   --io-timeout-ms (1 s here), with an ERROR saying so; a real head is served right after.
5. A head facing a stopped stage (SIGSTOP) gives up at --stage-load-timeout-ms (1 s here),
   saying it had no CHALLENGE, instead of waiting.

Needs MEDLEY_BIN (ctest sets it). About 10 s."""
import hashlib
import hmac
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib

MEDLEY = os.environ.get("MEDLEY_BIN") or "medley"
MAGIC, VERSION = 0x5453444D, 2
HELLO, READY, RUN, RESULT, ERROR, CHALLENGE, PING = 1, 2, 3, 4, 5, 6, 7
TMP = tempfile.mkdtemp(prefix="medley-stage-guard-")


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


# ---- the wire format, from docs/sharding.md ----

def frame(ftype, payload, seq=0):
    h = struct.pack("<IHHQIII", MAGIC, VERSION, ftype, len(payload), zlib.crc32(payload), seq, 0)
    return h + struct.pack("<I", zlib.crc32(h)) + payload


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        k = s.recv(n - len(b))
        if not k:
            raise EOFError("closed after %d of %d bytes" % (len(b), n))
        b += k
    return b


def recv_frame(s):
    h = recv_exact(s, 32)
    magic, version, ftype, n, crc, seq, res, hcrc = struct.unpack("<IHHQIIII", h)
    if magic != MAGIC or version != VERSION or hcrc != zlib.crc32(h[:28]) or res:
        fail("bad frame header from the stage: %r" % h)
    p = recv_exact(s, n)
    if zlib.crc32(p) != crc:
        fail("bad payload CRC from the stage")
    return ftype, p


def s32(s):
    b = s.encode()
    return struct.pack("<I", len(b)) + b


def mac(key, label, *parts):
    return hmac.new(key, label + b"".join(parts), hashlib.sha256).digest()


def hello(key, stage_nonce, model, lo=0, hi=1, head_nonce=None):
    """A HELLO for a stage of synthetic:tiny's sizes (4 sequences of 4 blocks of 16 tokens)."""
    head_nonce = head_nonce or os.urandom(32)
    body = (s32(model) + struct.pack("<Qii", 0, lo, hi) + s32("cpu") +
            struct.pack("<9i", 1, 0, 256, 0, 16, 4, 4, 16, 64) + struct.pack("<Q", 0) +
            struct.pack("<ii", 0, 0) + head_nonce)
    return frame(HELLO, body + mac(key, b"MDST HELLO v2", stage_nonce, body)), head_nonce


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    t, p = recv_frame(s)
    if t != CHALLENGE or len(p) != 36 or struct.unpack("<I", p[:4])[0] != 1:
        fail("expected a CHALLENGE (HMAC-SHA256) first, got type %d %r" % (t, p))
    return s, p[4:]


def error_of(p):
    code, n = struct.unpack("<iI", p[:8])
    return code, p[8:8 + n].decode()


def ask(port, key, model, **kw):
    """A signed (with key) HELLO for model: ("READY", payload) or ("ERROR", (code, message))."""
    s, nonce = connect(port)
    f, head_nonce = hello(key, nonce, model, **kw)
    s.sendall(f)
    t, p = recv_frame(s)
    s.close()
    if t == READY:
        if p[-32:] != mac(key, b"MDST READY v2", head_nonce, nonce, p[:-32]):
            fail("READY not signed with the secret over both nonces")
        return "READY", p
    if t != ERROR:
        fail("answer of type %d to a HELLO" % t)
    return "ERROR", error_of(p)


# ---- processes ----

class Stage:
    def __init__(self, name, secret_file, models, extra=()):
        self.log_path = os.path.join(TMP, name + ".log")
        args = [MEDLEY, "stage", "--listen", "127.0.0.1:0", "--threads", "1", "--secret-file",
                secret_file] + [a for m in models for a in ("--model", m)] + list(extra)
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                     stderr=open(self.log_path, "w"))
        deadline = time.time() + 10
        while time.time() < deadline:
            text = self.log()
            if "listening on 127.0.0.1:" in text:
                self.port = int(text.split("listening on 127.0.0.1:")[1].split()[0])
                return
            if self.proc.poll() is not None:
                fail("medley stage exited: " + text)
            time.sleep(0.02)
        fail("medley stage did not start: " + self.log())

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        self.proc.terminate()
        if self.proc.wait(timeout=10) != 0:
            fail("medley stage did not exit 0 on SIGTERM:\n" + self.log())


def generate(stages, secret_file, extra=(), want_fail=False):
    spec = "tcp://127.0.0.1:%d/cpu:0-0,tcp://127.0.0.1:%d/cpu:1-1" % tuple(s.port for s in stages)
    t0 = time.time()
    p = subprocess.run([MEDLEY, "generate", "-m", "synthetic:tiny", "-p", "Once upon a time",
                        "-n", "1", "--ignore-eos", "-t", "1", "--json", "--stages", spec,
                        "--stage-secret-file", secret_file] + list(extra),
                       capture_output=True, text=True, timeout=60)
    dt = time.time() - t0
    if want_fail:
        return dt, p.returncode, p.stderr
    if p.returncode != 0:
        fail("medley generate through the stages: %s" % p.stderr[-2000:])
    return dt


def secret(name):
    path = os.path.join(TMP, name)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(os.urandom(24).hex() + "\n")
    with open(path, "rb") as f:
        return path, f.read().rstrip()


# ---- the cases ----

def no_secret_refused_before_open(st, key):
    missing = "/nonexistent/allowed.gguf"  # allowed by --model, absent on disk
    other = os.urandom(32)
    kind, (code, msg) = ask(st.port, other, missing)
    if kind != "ERROR" or "authentication failed" not in msg:
        fail("a HELLO signed with another key: %s %s" % (kind, msg))
    # a HELLO signed for another connection's challenge (a replay)
    s1, n1 = connect(st.port)
    f, _ = hello(key, n1, missing)
    s2, n2 = connect(st.port)
    s2.sendall(f)
    t, p = recv_frame(s2)
    s1.close()
    s2.close()
    if t != ERROR or "authentication failed" not in error_of(p)[1]:
        fail("a replayed HELLO: type %d %r" % (t, p))
    if "loading" in st.log():
        fail("the stage loaded something for a peer without the secret:\n" + st.log())
    # the contrast: signed, the same HELLO reaches the file and gets its error
    kind, (code, signed_msg) = ask(st.port, key, missing)
    if kind != "ERROR" or "authentication" in signed_msg or missing not in signed_msg:
        fail("signed, the HELLO should reach the missing file: %s %s" % (kind, signed_msg))
    print("1. no secret: '%s'; replayed: refused; signed, the same HELLO gets '%s'" % (
        msg, signed_msg[:80]))


def unknown_models_same_answer(st, key):
    before = st.log().count("loading")
    answers = {}
    for m in ("/etc/shadow", "/nonexistent/dir/model.gguf", "no-such-model", "synthetic:huge",
              "../../etc/passwd"):
        kind, a = ask(st.port, key, m)
        if kind != "ERROR":
            fail("HELLO for %s answered %s" % (m, kind))
        answers[m] = a
    if len(set(answers.values())) != 1:
        fail("different refusals: %s" % answers)
    if st.log().count("loading") != before:
        fail("the stage opened something for a model outside --model:\n" + st.log())
    kind, _ = ask(st.port, key, "synthetic:tiny")  # an allowed one is served
    if kind != "READY":
        fail("synthetic:tiny (allowed) was not served")
    print("2. /etc/shadow, a missing path, an unknown name, a synthetic outside --model: one "
          "answer %s" % (list(answers.values())[0],))


def idle_and_slowloris(stages, secret_file, header):
    base = generate(stages, secret_file)
    socks, stop = [], threading.Event()
    for st in stages:
        for _ in range(50):
            socks.append(socket.create_connection(("127.0.0.1", st.port)))  # idle
    slow = []
    for st in stages:
        for _ in range(50):
            slow.append(socket.create_connection(("127.0.0.1", st.port)))

    def trickle():
        i = 0
        while not stop.is_set() and i < len(header):
            for s in slow:
                try:
                    s.send(header[i:i + 1])
                except OSError:
                    pass
            i += 1
            stop.wait(0.2)

    th = threading.Thread(target=trickle)
    th.start()
    time.sleep(0.5)  # every connection accepted and trickling
    try:
        dt = generate(stages, secret_file)
    finally:
        stop.set()
        th.join()
        for s in socks + slow:
            s.close()
    print("3. 50 idle + 50 slowloris connections on each stage: a head's first step (whole "
          "`medley generate -n 1`) in %.2f s; %.2f s without them (ratio %.2f)" % (
              dt, base, dt / base))
    if dt >= 2.0:
        fail("the head took %.2f s with idle and slowloris peers (limit 2 s)" % dt)


def silent_head_dropped(st, key, stages, secret_file):
    s, nonce = connect(st.port)
    f, _ = hello(key, nonce, "synthetic:tiny")
    s.sendall(f)
    t, p = recv_frame(s)
    if t != READY:
        fail("HELLO for synthetic:tiny: %d %r" % (t, p))
    t0 = time.time()
    s.settimeout(10)
    t, p = recv_frame(s)
    dt = time.time() - t0
    try:
        eof = s.recv(1) == b""
    except OSError:
        eof = True
    s.close()
    if t != ERROR or "--io-timeout-ms" not in error_of(p)[1] or not eof:
        fail("a silent head: type %d %r, closed %s" % (t, p, eof))
    if not 0.9 <= dt <= 2.0:
        fail("a silent head was dropped after %.2f s, --io-timeout-ms is 1 s" % dt)
    generate(stages, secret_file)  # the stage is free for a real head
    print("4. a head silent after READY: dropped after %.2f s (--io-timeout-ms 1000): '%s'" % (
        dt, error_of(p)[1]))


def stopped_stage(stages, secret_file):
    stages[1].proc.send_signal(19)  # SIGSTOP
    try:
        dt, rc, err = generate(stages, secret_file, ["--stage-load-timeout-ms", "1000"],
                               want_fail=True)
    finally:
        stages[1].proc.send_signal(18)  # SIGCONT
    if rc != 1 or "no CHALLENGE within 1000 ms" not in err or not 0.9 <= dt <= 5:
        fail("a head facing a stopped stage: exit %d after %.2f s: %s" % (rc, dt, err[-500:]))
    print("5. a stopped stage: the head gave up after %.2f s (--stage-load-timeout-ms 1000)" % dt)


def main():
    secret_file, key = secret("stage.secret")
    models = ["synthetic:tiny", "/nonexistent/allowed.gguf"]
    a = Stage("a", secret_file, models, ["--io-timeout-ms", "1000"])
    b = Stage("b", secret_file, models)
    try:
        no_secret_refused_before_open(a, key)
        unknown_models_same_answer(a, key)
        hdr = frame(HELLO, b"x" * 100)[:32]  # a plausible header, trickled
        idle_and_slowloris([a, b], secret_file, hdr)
        silent_head_dropped(a, key, [a, b], secret_file)
        stopped_stage([a, b], secret_file)
    finally:
        a.stop()
        b.stop()
    print("ok")


main()
