"""api_crash.py — every custom_id exactly once in the output file of a batch run through
`medley api` while an API process is SIGKILLed in the middle of an upload and another in the
middle of the batch, and a worker is SIGKILLed mid-batch; two API processes behind no
balancer, the client alternating between them (a killed one restarted on a new port). The
upload cut off by the kill leaves no file and its chunks expire (TTL). 2,000 lines by
default (CI); MEDLEY_API_CRASH_LINES=20000 for the issue's size (bench-sized, ~1 min)."""
import json
import os
import signal
import socket
import sys
import time

import openai
from openai import OpenAI

from api_util import KEY_A, Api, write_keys
from harness import RedisServer, Worker, chat_line, fail, write_lines

N = int(os.environ.get("MEDLEY_API_CRASH_LINES", "2000"))


def kill_mid_upload(srv, api, path):
    """Half a multipart upload, then SIGKILL: the client sees the connection drop."""
    host, port = api.url.rsplit("/", 1)[1].split(":")
    data = open(path, "rb").read()
    head = (b'--b0undary42\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b'--b0undary42\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"'
            b'\r\n\r\n')
    total = len(head) + len(data) + len(b"\r\n--b0undary42--\r\n")
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(b"POST /v1/files HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer %s\r\n"
              b"Content-Type: multipart/form-data; boundary=b0undary42\r\n"
              b"Content-Length: %d\r\n\r\n" % (KEY_A.encode(), total) + head +
              data[:len(data) // 2])
    r = srv.client()
    for _ in range(200):  # the server has stored a chunk
        if list(r.scan_iter("medley:file:*:data")):
            break
        time.sleep(0.02)
    api.kill()
    s.close()
    orphans = list(r.scan_iter("medley:file:*"))
    if not orphans or any(not k.endswith(":data") or r.ttl(k) <= 0 for k in orphans):
        fail("a cut-off upload left %s (every key a :data with a TTL expected)" %
             [(k, r.ttl(k)) for k in orphans])
    print("SIGKILL api mid-upload: %d orphan chunk list(s), expiring" % len(orphans))


def main():
    srv = RedisServer()
    srv.start()
    keys = write_keys(srv.dir)
    apis = [Api(srv, keys, name="api0"), Api(srv, keys, name="api1")]
    workers = []
    t0 = time.time()
    try:
        ids = ["req-%05d" % i for i in range(N)]
        path = write_lines(srv.dir, "in.jsonl", [chat_line(c, "text " + c) for c in ids])
        pad = write_lines(srv.dir, "pad.jsonl", [chat_line("pad-%d" % i, "x" * 200)
                                                 for i in range(3000)])  # ~900 KB: chunks
        kill_mid_upload(srv, apis[0], pad)
        apis[0] = Api(srv, keys, name="api0b")
        clients = lambda: [OpenAI(base_url=a.base, api_key=KEY_A, max_retries=0) for a in apis]
        cl = clients()
        f = cl[1].files.create(file=open(path, "rb"), purpose="batch")
        b = cl[0].batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                 completion_window="24h")
        print("uploaded and created %d lines in %.1f s" % (N, time.time() - t0))
        args = ["--echo-delay-ms", "40", "--max-seqs", "8", "--visibility-ms", "1500",
                "--heartbeat-ms", "500"]
        workers = [Worker(srv, args=args + ["--id", "w%d" % i], name="w%d" % i) for i in (0, 1)]
        killed_worker = killed_api = False
        i = 0
        while True:
            i += 1
            try:
                st = cl[i % 2].batches.retrieve(b.id)
            except openai.APIConnectionError:
                continue  # the API just killed: the other one answers the next poll
            done = st.request_counts.completed
            if st.status == "completed":
                break
            if not killed_worker and done > N // 4:
                workers[0].signal(signal.SIGKILL)
                killed_worker = True
                print("SIGKILL worker w0 at %d/%d" % (done, N))
            if killed_worker and not killed_api and done > N // 2:
                apis[1].kill()
                killed_api = True
                print("SIGKILL api1 at %d/%d" % (done, N))
                part = cl[0].files.content("file-out-" + b.id).text.splitlines()
                if len(part) < done:
                    fail("mid-batch output file has %d lines, %d completed" % (len(part), done))
                apis[1] = Api(srv, keys, name="api1b")
                cl = clients()
            if time.time() - t0 > 150:
                fail("batch not completed: %s" % st)
            time.sleep(0.05)
        if not (killed_worker and killed_api):
            fail("the batch finished before the kills; the test proves nothing")
        rc = st.request_counts
        if (rc.total, rc.completed, rc.failed) != (N, N, 0):
            fail("request_counts %s" % rc)
        out = cl[1].files.content(st.output_file_id).text.splitlines()
        got = sorted(json.loads(l)["custom_id"] for l in out)
        if got != ids:
            dup = len(got) - len(set(got))
            fail("%d output lines for %d custom_ids (%d doubled, %d missing)" %
                 (len(got), N, dup, len(set(ids) - set(got))))
        print("every one of %d custom_ids exactly once (%.1f s)" % (N, time.time() - t0))
    finally:
        for w in workers[1:]:
            w.stop()
        for a in apis:
            a.kill()
        srv.stop()
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
