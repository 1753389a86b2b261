"""api_hostile.py — hostile HTTP against `medley api`, each case bounded in time: bad
multipart, a 2 GB body, 1 MB of headers, ids like ../../etc/passwd, JSON bombs in metadata,
unknown fields, a flood of connections and a slowloris (the server still answers another
client meanwhile, and closes idle connections), per-tenant limits (429 + Retry-After), and
the server's memory bounded at the end. docs/api.md "Limits"."""
import json
import socket
import sys
import threading
import time
import urllib.request

from api_util import KEY_A, Api, write_keys
from harness import RedisServer, fail

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


def flood(api, n=2000):
    socks = []
    host, port = api.url.rsplit("/", 1)[1].split(":")
    for _ in range(n):
        try:
            s = socket.create_connection((host, int(port)), timeout=2)
            socks.append(s)
        except OSError:
            break
    other_client_answers(api, "another client during a flood of %d connections" % len(socks))
    for s in socks:
        s.close()
    print("flood: %d connections opened" % len(socks))


def slowloris(api, n=60, seconds=6):
    host, port = api.url.rsplit("/", 1)[1].split(":")
    stop = threading.Event()
    socks = [socket.create_connection((host, int(port)), timeout=5) for _ in range(n)]

    def drip():
        msg = b"GET /v1/files HTTP/1.1\r\nHost: t\r\n" + b"X-a: " + b"b" * 10000
        i = 0
        while not stop.is_set() and i < len(msg):
            for s in socks:
                try:
                    s.send(msg[i:i + 1])
                except OSError:
                    pass
            i += 1
            stop.wait(0.5)

    th = threading.Thread(target=drip)
    th.start()
    t0 = time.time()
    while time.time() - t0 < seconds:
        other_client_answers(api, "another client during a slowloris")
        time.sleep(0.5)
    stop.set()
    th.join()
    for s in socks:
        s.close()
    # an idle connection is closed by the server after --timeout (2 s here)
    idle = socket.create_connection((host, int(port)), timeout=10)
    t = time.time()
    if idle.recv(10) != b"" or time.time() - t > 5:
        fail("an idle connection stayed open %.1f s" % (time.time() - t))
    print("slowloris: %d connections for %d s" % (n, seconds))


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


def rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0


def main():
    server = RedisServer()
    server.start()
    keys = write_keys(server.dir)
    api = Api(server, keys, ["--max-file-bytes", "1048576", "--max-file-lines", "1000",
                             "--timeout", "2", "--max-connections", "400",
                             "--max-connections-per-ip", "200"])
    t0 = time.time()
    try:
        bodies(api)
        ids_and_json(api)
        flood(api)
        slowloris(api)
        mb = rss_mb(api.proc.pid)
        if mb > 200:
            fail("medley api holds %.0f MB after the hostile cases" % mb)
        print("rss after: %.0f MB" % mb)
        tenant_limits(server, keys)
    finally:
        api.stop()
        server.stop()
    print("ok (%.1f s)" % (time.time() - t0))


if __name__ == "__main__":
    sys.exit(main())
