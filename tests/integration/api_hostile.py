"""api_hostile.py — hostile HTTP against `medley api`, each case bounded in time: bad
multipart, a 2 GB body, 1 MB of headers, ids like ../../etc/passwd, JSON bombs in metadata,
unknown fields, a flood of connections (refused past the per-address limit, the kept ones
answered 408 and closed) and a slowloris (each trickling connection closed, with a 408, within
the header timeout; another client answered all along; counted in /metrics), per-tenant
limits (429 + Retry-After), the bodies held at once bounded (--max-body-memory: 503 +
Retry-After past it), and the server's peak memory bounded. docs/api.md "Limits".
CI: small limits, a few seconds. MEDLEY_API_HOSTILE_FULL=1 (ctest -L long, api_hostile_full):
the issue's sizes against the default limits, 10,000 connections held and a 30 s slowloris of
2,000 (~1 min; ulimit -n of 10,500)."""
import json
import os
import resource
import select
import socket
import sys
import time
import urllib.request

from api_util import KEY_A, Api, write_keys
from harness import RedisServer, fail, free_port

AUTH = b"Authorization: Bearer " + KEY_A.encode() + b"\r\n"


def raw(api, data, src="127.0.0.1", timeout=10):
    """Send data on a fresh connection from src; the whole answer (until close)."""
    host, port = api.url.rsplit("/", 1)[1].split(":")
    s = socket.create_connection((host, int(port)), timeout=timeout, source_address=(src, 0))
    try:
        s.sendall(data)
    except OSError:
        pass
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except OSError:
        pass
    s.close()
    return out


def req(method, path, headers=b"", body=b""):
    return (b"%s %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" % (method, path) + AUTH +
            headers + (b"Content-Length: %d\r\n" % len(body) if body else b"") + b"\r\n" + body)


def expect(what, answer, status, code=None, within=None, t0=None):
    line = answer.split(b"\r\n", 1)[0]
    if not line.startswith(b"HTTP/1.1 %d" % status):
        fail("%s: expected %d, got %r" % (what, status, answer[:300]))
    if code and b'"code":"%s"' % code.encode() not in answer:
        fail("%s: expected code %s in %r" % (what, code, answer[-300:]))
    if within and time.time() - t0 > within:
        fail("%s took %.1f s" % (what, time.time() - t0))


def multipart(parts, boundary=b"b0undary42"):
    body = b""
    for head, data in parts:
        body += b"--" + boundary + b"\r\n" + head + b"\r\n\r\n" + data + b"\r\n"
    return body + b"--" + boundary + b"--\r\n", b"Content-Type: multipart/form-data; boundary=" + boundary + b"\r\n"


def bodies(api):
    t0 = time.time()
    body, ct = multipart([(b'Content-Disposition: garbage', b"zzz")])
    expect("nameless part", raw(api, req(b"POST", b"/v1/files", ct, body)), 400, "invalid_multipart")
    expect("not multipart", raw(api, req(b"POST", b"/v1/files", b"Content-Type: text/plain\r\n",
                                         b"hello")), 400)
    body, ct = multipart([(b'Content-Disposition: form-data; name="purpose"', b"batch")])
    expect("no file part", raw(api, req(b"POST", b"/v1/files", ct, body)), 400,
           "missing_required_parameter")
    body, ct = multipart([(b'Content-Disposition: form-data; name="purpose"', b"fine-tune"),
                          (b'Content-Disposition: form-data; name="file"; filename="a.jsonl"',
                           b'{"custom_id":"a"}\n')])
    expect("purpose", raw(api, req(b"POST", b"/v1/files", ct, body)), 400, "invalid_value")
    body, ct = multipart([(b'Content-Disposition: form-data; name="purpose"', b"batch"),
                          (b'Content-Disposition: form-data; name="file"; filename="a.jsonl"',
                           b'x\n' * 2000)])
    expect("too many lines", raw(api, req(b"POST", b"/v1/files", ct, body)), 400,
           "too_many_requests_in_file")
    # 2 GB announced: refused from the headers, before any byte of it is read
    t = time.time()
    big = (b"POST /v1/files HTTP/1.1\r\nHost: t\r\n" + AUTH + b"Content-Length: 2147483648\r\n"
           b"Content-Type: multipart/form-data; boundary=b0undary42\r\n\r\n" + b"a" * 65536)
    expect("2 GB body", raw(api, big), 413, "request_too_large", 2, t)
    t = time.time()
    expect("1 MB of headers", raw(api, req(b"GET", b"/v1/files", b"X-Big: " + b"a" * (1 << 20) +
                                           b"\r\n")), 431, None, 5, t)
    print("bodies: %.1f s" % (time.time() - t0))


def ids_and_json(api):
    for path in (b"/v1/files/../../etc/passwd", b"/v1/files/..%2F..%2Fetc%2Fpasswd",
                 b"/v1/batches/../../etc/passwd", b"/v1/files/%00", b"/v1/batches/a/b/c",
                 b"/v1/files/" + b"a" * 5000 + b"/content"):
        expect(path[:40], raw(api, req(b"GET", path)), 404)
    ct = b"Content-Type: application/json\r\n"
    bomb = b'{"input_file_id":"file-x","endpoint":"/v1/chat/completions","completion_window":"24h","metadata":' + b"[" * 200000 + b"]" * 200000 + b"}"
    expect("nested JSON bomb", raw(api, req(b"POST", b"/v1/batches", ct, bomb)), 400)
    many = json.dumps({"input_file_id": "file-x", "endpoint": "/v1/chat/completions",
                       "completion_window": "24h",
                       "metadata": {"k%d" % i: "v" for i in range(20000)}}).encode()
    expect("metadata with 20,000 keys", raw(api, req(b"POST", b"/v1/batches", ct, many)), 400)
    huge = b'{"metadata":{"a":"' + b"x" * (3 << 20) + b'"}}'
    expect("3 MB JSON body", raw(api, req(b"POST", b"/v1/batches", ct, huge)), 413)
    unknown = json.dumps({"input_file_id": "file-x", "endpoint": "/v1/chat/completions",
                          "completion_window": "24h", "output_expires_after": {}}).encode()
    a = raw(api, req(b"POST", b"/v1/batches", ct, unknown))
    expect("unknown field", a, 400)
    if b'"param":"output_expires_after"' not in a:
        fail("the unknown field is not named: %r" % a[-300:])
    expect("completion_window 48h", raw(api, req(b"POST", b"/v1/batches", ct, json.dumps(
        {"input_file_id": "file-x", "endpoint": "/v1/chat/completions",
         "completion_window": "48h"}).encode())), 400)
    expect("no key", raw(api, b"GET /v1/files HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"),
           401, "invalid_api_key")


def other_client_answers(api, what):
    """A request from another address (127.0.0.2) is answered, fast."""
    t = time.time()
    expect(what, raw(api, req(b"GET", b"/v1/files"), src="127.0.0.2", timeout=5), 200, None, 2, t)


def open_conns(api, n, sources):
    """n connections, round-robin over the source addresses 127.0.1.1.. (sources of them),
    held open; those the server refused at once are closed and not counted."""
    host, port = api.url.rsplit("/", 1)[1].split(":")
    socks = []
    for i in range(n):
        try:
            socks.append(socket.create_connection(
                (host, int(port)), timeout=5, source_address=("127.0.1.%d" % (i % sources + 1), 0)))
        except OSError as e:
            fail("connection %d of %d: %s" % (i, n, e))
    return socks


def wait_closed(socks, within, what):
    """Every socket is closed by the server within `within` s; what each one read (408s)."""
    poller = select.poll()
    by_fd = {s.fileno(): s for s in socks}
    for fd in by_fd:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    t0 = time.time()
    open_fds, got408 = set(by_fd), 0
    while open_fds and time.time() - t0 < within:
        for fd, _ in poller.poll(200):
            try:
                data = by_fd[fd].recv(4096)
            except OSError:
                data = b""
            if data.startswith(b"HTTP/1.1 408"):
                got408 += 1
            if not data or b"\r\n\r\n" in data:
                poller.unregister(fd)
                open_fds.discard(fd)
    if open_fds:
        fail("%s: %d of %d connections still open after %.0f s" %
             (what, len(open_fds), len(socks), within))
    for s in socks:
        s.close()
    return time.time() - t0, got408


def flood(api, n, sources, within):
    """n connections opened and held from `sources` addresses: the server keeps what its limits
    allow (extra ones closed at once), answers another client meanwhile, and closes the ones it
    kept (408) within `within` s, since they never send a request."""
    t0 = time.time()
    socks = open_conns(api, n, sources)
    opened = time.time() - t0
    other_client_answers(api, "another client during a flood of %d connections" % n)
    mb = rss_mb(api.proc.pid)
    took, got408 = wait_closed(socks, within, "flood of %d from %d address(es)" % (n, sources))
    print("flood: %d connections from %d address(es) opened in %.1f s; rss %.0f MB held; all "
          "closed by the server in %.1f s (%d with a 408)" % (n, sources, opened, mb, took, got408))


def slowloris(api, n, sources, seconds, header_timeout):
    """n connections trickling a header byte each 0.5 s for `seconds` s (reopened as the server
    closes them): each is closed, with a 408, within the header timeout (+2 s), and another
    client is answered all along."""
    host, port = api.url.rsplit("/", 1)[1].split(":")
    msg = b"GET /v1/files HTTP/1.1\r\nHost: t\r\nX-a: " + b"b" * 100000
    socks = open_conns(api, n, sources)
    born = {s: time.time() for s in socks}
    pos = {s: 0 for s in socks}
    t0 = time.time()
    cut, oldest, slow_answers, i = 0, 0.0, 0, 0
    while time.time() - t0 < seconds:
        for s in list(socks):
            try:
                s.send(msg[pos[s]:pos[s] + 1])
                pos[s] += 1
                continue
            except OSError:
                pass
            oldest = max(oldest, time.time() - born[s])  # closed by the server
            cut += 1
            s.close()
            socks.remove(s)
            try:
                ns = socket.create_connection((host, int(port)), timeout=5,
                                              source_address=("127.0.1.%d" % (i % sources + 1), 0))
                i += 1
                socks.append(ns)
                born[ns], pos[ns] = time.time(), 0
            except OSError:
                pass
        t = time.time()
        other_client_answers(api, "another client during a slowloris")
        slow_answers = max(slow_answers, time.time() - t)
        time.sleep(max(0.0, 0.5 - (time.time() - t)))
    mb = rss_mb(api.proc.pid)
    took, got408 = wait_closed(socks, header_timeout + 3, "slowloris")
    oldest = max(oldest, max((time.time() - b for s, b in born.items() if s in socks), default=0))
    if cut == 0 and seconds > header_timeout + 2:
        fail("slowloris: no connection was closed in %d s" % seconds)
    if oldest > header_timeout + 3:
        fail("slowloris: a connection lived %.1f s (header timeout %d s)" % (oldest, header_timeout))
    if got408 == 0:
        fail("slowloris: no connection was told 408")
    print("slowloris: %d connections for %d s: %d closed by the server meanwhile, the longest "
          "lived %.1f s; the rest closed in %.1f s (%d with a 408); another client answered "
          "within %.2f s at worst; rss %.0f MB" %
          (n, seconds, cut, oldest, took, got408, slow_answers, mb))


def idle_closed(api):
    """An idle connection is closed after --timeout."""
    host, port = api.url.rsplit("/", 1)[1].split(":")
    idle = socket.create_connection((host, int(port)), timeout=10)
    t = time.time()
    idle.recv(100)
    if time.time() - t > 5:
        fail("an idle connection stayed open %.1f s" % (time.time() - t))


def tenant_limits(server, keys):
    api = Api(server, keys, ["--tenant-rps", "5", "--tenant-max-files", "1"], name="api-limits")
    try:
        body, ct = multipart([(b'Content-Disposition: form-data; name="purpose"', b"batch"),
                              (b'Content-Disposition: form-data; name="file"; filename="a.jsonl"',
                               b'{"custom_id":"a"}\n')])
        time.sleep(1.05 - time.time() % 1)  # a fresh second for the rate counter
        expect("first file", raw(api, req(b"POST", b"/v1/files", ct, body)), 200)
        expect("second file over the tenant's limit", raw(api, req(b"POST", b"/v1/files", ct, body)),
               429, "quota_exceeded")
        answers = [raw(api, req(b"GET", b"/v1/files")) for _ in range(10)]
        limited = [a for a in answers if a.startswith(b"HTTP/1.1 429")]
        if not limited or b"Retry-After: 1" not in limited[0]:
            fail("10 requests in a second at --tenant-rps 5: %d answered 429" % len(limited))
    finally:
        api.stop()


def body_memory(server, keys):
    """--max-body-memory bounds the bodies held at once: an upload in progress holds its
    buffers; while it does, another upload and a large JSON body answer 503 server_busy with
    Retry-After; once it is gone, an upload is taken again."""
    api = Api(server, keys, ["--max-body-memory", "400000"], name="api-bodymem")
    try:
        host, port = api.url.rsplit("/", 1)[1].split(":")
        body, ct = multipart([(b'Content-Disposition: form-data; name="purpose"', b"batch"),
                              (b'Content-Disposition: form-data; name="file"; filename="a.jsonl"',
                               b'{"custom_id":"a"}\n' * 1000)])
        held = socket.create_connection((host, int(port)), timeout=10)
        held.sendall(req(b"POST", b"/v1/files", ct, body)[:-len(body) // 2])
        time.sleep(0.5)  # its headers are in: its buffers are held
        a = raw(api, req(b"POST", b"/v1/files", ct, body))
        expect("an upload past --max-body-memory", a, 503, "server_busy")
        if b"Retry-After: 1" not in a:
            fail("503 server_busy without Retry-After: %r" % a[:300])
        big = json.dumps({"metadata": {"a": "x" * 100000}}).encode()
        expect("a JSON body past --max-body-memory", raw(api, req(
            b"POST", b"/v1/batches", b"Content-Type: application/json\r\n", big)), 503,
            "server_busy")
        held.close()
        time.sleep(0.5)
        expect("an upload once the other is gone", raw(api, req(b"POST", b"/v1/files", ct, body)),
               200)
    finally:
        api.stop()


def rss_mb(pid, field="VmRSS"):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0


def peak_mb(pid):
    return rss_mb(pid, "VmHWM")


def main():
    full = os.environ.get("MEDLEY_API_HOSTILE_FULL") == "1"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 10500 if full else 2500
    if hard < need:
        fail("ulimit -n: the hard limit is %d; this test needs %d (raise it)" % (hard, need))
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the server inherits it
    server = RedisServer()
    server.start()
    keys = write_keys(server.dir)
    # full: the sizes against the default limits; else a few seconds against small ones
    mport = free_port()
    args = ["--max-file-bytes", "1048576", "--max-file-lines", "1000", "--metrics",
            "127.0.0.1:%d" % mport]
    if not full:
        args += ["--timeout", "2", "--header-timeout", "2", "--max-connections", "400",
                 "--max-connections-per-ip", "200"]
    api = Api(server, keys, args)
    t0 = time.time()
    try:
        bodies(api)
        ids_and_json(api)
        if full:
            flood(api, 10000, 1, 15)  # one address: 4,096 kept (per address), the rest refused
            flood(api, 10000, 20, 15)  # twenty: all 10,000 held
            slowloris(api, 2000, 10, 30, 10)
        else:
            flood(api, 2000, 1, 6)
            slowloris(api, 60, 2, 6, 2)
            idle_closed(api)
        mb = rss_mb(api.proc.pid)
        peak = peak_mb(api.proc.pid)
        if peak > 300:
            fail("medley api peaked at %.0f MB in the hostile cases" % peak)
        print("rss after: %.0f MB, peak %.0f MB" % (mb, peak))
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport, timeout=10).read()
        slow = [l for l in text.decode().splitlines()
                if l.startswith("medley_api_slow_connections_closed_total ")]
        if not slow or float(slow[0].split()[1]) < 60:
            fail("/metrics does not count the slowloris connections closed: %s" % slow)
        tenant_limits(server, keys)
        body_memory(server, keys)
    finally:
        api.stop()
        server.stop()
    print("ok (%.1f s)" % (time.time() - t0))


if __name__ == "__main__":
    sys.exit(main())
