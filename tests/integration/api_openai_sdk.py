"""api_openai_sdk.py — the Batch API flow of OpenAI's own documentation, run unchanged with the
real `openai` SDK (scripts/requirements-test.txt) against `medley api` + `medley worker` on the
echo model: files.create, batches.create, batches.retrieve until completed, files.content of
the output and error files, those files listed (purpose batch_output), paged by purpose and
deleted (409 while their batch runs), batches.list pagination, files OpenAI's validation refuses (broken
JSON, another endpoint or model, a duplicate custom_id: failed with errors by line),
batches.cancel of a running batch (its
request_counts and answered lines kept), files.delete; then tenants: the second key gets 404
on the first tenant's file, batch and content and does not see them in lists; no key or a
wrong key gets 401. docs/api.md."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import openai
from openai import OpenAI

from api_util import KEY_A, KEY_B, Api, wait_status, write_keys
from harness import MEDLEY, RedisServer, Worker, chat_line, fail, free_port, write_lines


def batch_flow(client, tmp):
    # 60 lines, one of which the worker refuses (temperature out of range): an error file too
    lines = [chat_line("req-%d" % i, "hello %d" % i) for i in range(59)]
    lines.append(chat_line("req-bad", "x", temperature=7))
    path = write_lines(tmp, "batchinput.jsonl", lines)
    batch_input_file = client.files.create(file=open(path, "rb"), purpose="batch")
    if batch_input_file.purpose != "batch" or batch_input_file.bytes != os.path.getsize(path):
        fail("files.create: %s" % batch_input_file)
    batch = client.batches.create(input_file_id=batch_input_file.id,
                                  endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"description": "nightly eval job"})
    if batch.metadata != {"description": "nightly eval job"} or batch.object != "batch":
        fail("batches.create: %s" % batch)
    batch = wait_status(client, batch.id, ("completed", "failed"))
    rc = batch.request_counts
    if batch.status != "completed" or (rc.total, rc.completed, rc.failed) != (60, 59, 1):
        fail("batch ended %s with %s" % (batch.status, rc))
    if not batch.completed_at or not batch.in_progress_at or not batch.output_file_id:
        fail("timestamps / output file missing: %s" % batch)
    out = client.files.content(batch.output_file_id).text.splitlines()
    err = client.files.content(batch.error_file_id).text.splitlines()
    ids = sorted(json.loads(l)["custom_id"] for l in out)
    if ids != sorted("req-%d" % i for i in range(59)):
        fail("output file custom_ids: %s" % ids[:5])
    if [json.loads(l)["custom_id"] for l in err] != ["req-bad"]:
        fail("error file: %s" % err)
    if json.loads(out[0])["response"]["body"]["choices"][0]["message"]["content"][:6] != "hello ":
        fail("echo answer: %s" % out[0][:300])
    meta = client.files.retrieve(batch.output_file_id)
    if meta.purpose != "batch_output" or meta.bytes != sum(len(l) + 1 for l in out):
        fail("output file object: %s" % meta)
    return batch_input_file, batch


def output_files(client, batch, input_file):
    """The output and error files are files: listed (purpose batch_output, made when the batch
    ended), retrieved, paged by purpose, deleted (then 404 everywhere, their lines gone)."""
    out_id, err_id = batch.output_file_id, batch.error_file_id
    listed = {f.id: f for f in client.files.list()}
    for fid in (out_id, err_id):
        f = listed.get(fid)
        body = client.files.content(fid).content
        if not f or f.purpose != "batch_output" or f.bytes != len(body) or \
                f.created_at != batch.completed_at:
            fail("files.list: %s is %s (content %d bytes, batch ended %s)" %
                 (fid, f, len(body), batch.completed_at))
    if input_file.id not in listed:
        fail("files.list lost the input file: %s" % list(listed))
    outs = [f.id for f in client.files.list(purpose="batch_output", limit=1)]  # pages of 1
    ins = [f.id for f in client.files.list(purpose="batch", limit=1)]
    if sorted(outs) != sorted([out_id, err_id]) or ins != [input_file.id]:
        fail("files.list by purpose: batch_output %s, batch %s" % (outs, ins))
    if not client.files.delete(err_id).deleted:
        fail("files.delete of the error file")
    for call in (lambda: client.files.retrieve(err_id), lambda: client.files.content(err_id),
                 lambda: client.files.delete(err_id)):
        try:
            call()
            fail("a deleted error file is still there")
        except openai.NotFoundError:
            pass
    if err_id in [f.id for f in client.files.list()]:
        fail("a deleted error file is still listed")
    if client.files.retrieve(out_id).bytes != len(client.files.content(out_id).content):
        fail("the output file changed when the error file was deleted")


def refused_file(client, tmp):
    """A file OpenAI's validation refuses: the batch is failed, errors name each line."""
    lines = [chat_line("ok-1", "x"), "{not json", chat_line("ok-1b", "y").replace(
        "/v1/chat/completions", "/v1/completions"), "", chat_line("ok-2", "z", model="other")]
    f = client.files.create(file=open(write_lines(tmp, "bad.jsonl", lines), "rb"),
                            purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                              completion_window="24h")
    got = [(e.code, e.line) for e in b.errors.data] if b.errors else []
    if b.status != "failed" or not b.failed_at or got != [
            ("invalid_json_line", 2), ("mismatched_endpoint", 3), ("mismatched_model", 5)]:
        fail("a refused file: %s %s" % (b.status, got))
    dup = [chat_line("same", "a"), chat_line("same", "b")]
    f2 = client.files.create(file=open(write_lines(tmp, "dup.jsonl", dup), "rb"), purpose="batch")
    b2 = client.batches.create(input_file_id=f2.id, endpoint="/v1/chat/completions",
                               completion_window="24h")
    if b2.status != "failed" or "more than once" not in b2.errors.data[0].message:
        fail("duplicate custom_ids: %s" % b2)
    for fid in (f.id, f2.id):
        client.files.delete(fid)


def list_pagination(client, file_id, first_batch):
    made = [first_batch.id]
    for _ in range(4):
        made.append(client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                          completion_window="24h").id)
    page = client.batches.list(limit=2)
    if len(page.data) != 2 or not page.has_more:
        fail("batches.list(limit=2): %d items, has_more %s" % (len(page.data), page.has_more))
    seen = [b.id for b in client.batches.list(limit=2)]  # the SDK follows `after`
    if sorted(seen) != sorted(made) or len(set(seen)) != len(seen):
        fail("auto-paging saw %s, made %s" % (seen, made))
    if seen != list(reversed(made)):
        fail("batches.list is not newest first: %s" % seen)


def cancel_running(client, tmp, r):
    path = write_lines(tmp, "long.jsonl", [chat_line("long-%d" % i, "x") for i in range(2000)])
    f = client.files.create(file=open(path, "rb"), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                              completion_window="1h")
    while client.batches.retrieve(b.id).request_counts.completed < 20:
        pass
    try:  # OpenAI makes the output file when the batch ends; medley deletes it then too
        client.files.delete("file-out-" + b.id)
        fail("the output file of a running batch was deleted")
    except openai.ConflictError as e:
        if "has ended" not in str(e):
            fail("deleting a running batch's output file: %s" % e)
    c = client.batches.cancel(b.id)
    if c.status not in ("cancelling", "cancelled") or not c.cancelling_at:
        fail("batches.cancel: %s" % c)
    c = wait_status(client, b.id, ("cancelled",), timeout=60)
    done = c.request_counts.completed
    if not 20 <= done < 2000 or not c.output_file_id:
        fail("cancelled batch counts: %s" % c)
    out = client.files.content(c.output_file_id).text.splitlines()
    if len(out) != done:
        fail("cancelled batch: %d output lines, %d completed" % (len(out), done))
    for fid in (c.output_file_id, c.error_file_id):  # the cancelled lines are error lines
        client.files.delete(fid)
    if r.xlen("medley:{%s}:out" % b.id) != 0:
        fail("deleting both files left %d stream entries" % r.xlen("medley:{%s}:out" % b.id))
    return f


def tenants(api, client, file_id, batch):
    other = OpenAI(base_url=api.base, api_key=KEY_B, max_retries=0)
    for call in (lambda: other.files.retrieve(file_id), lambda: other.files.content(file_id),
                 lambda: other.batches.retrieve(batch.id),
                 lambda: other.batches.cancel(batch.id),
                 lambda: other.files.content(batch.output_file_id),
                 lambda: other.files.delete(file_id)):
        try:
            call()
            fail("tenant beta reached tenant acme's object")
        except openai.NotFoundError:
            pass
    if list(other.files.list()) or list(other.batches.list()):
        fail("tenant beta's lists show tenant acme's objects")
    for key in ("sk-wrong-0000000000000000", ""):
        bad = OpenAI(base_url=api.base, api_key=key or "x", max_retries=0,
                     default_headers={} if key else {"Authorization": ""})
        try:
            bad.files.list()
            fail("key %r was let in" % key)
        except openai.AuthenticationError:
            pass


def dashboard_tenant(server, batch_id):
    """`medley dashboard` shows the batch's tenant."""
    d = subprocess.Popen([MEDLEY, "dashboard", "--listen", "127.0.0.1:0", "--redis", server.url],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = d.stdout.readline().split("serving ", 1)[1].strip().rstrip("/")
        doc = json.loads(urllib.request.urlopen(url + "/api/batches", timeout=10).read())
        mine = [b for b in doc["batches"] if b["id"] == batch_id]
        if not mine or mine[0].get("tenant") != "acme":
            fail("the dashboard does not show tenant acme: %s" % mine)
    finally:
        d.terminate()
        d.wait()


def sighup(api, keys):
    """A key added to the file works after SIGHUP, without a restart."""
    new = OpenAI(base_url=api.base, api_key="sk-gamma-0123456789abcdef", max_retries=0)
    try:
        new.batches.list()
        fail("a key not in the file was let in")
    except openai.AuthenticationError:
        pass
    with open(keys, "a") as f:
        f.write("gamma sk-gamma-0123456789abcdef\n")
    api.proc.send_signal(signal.SIGHUP)
    for _ in range(50):
        time.sleep(0.1)
        try:
            if list(new.batches.list()) == []:
                return
        except openai.AuthenticationError:
            pass
    fail("the key added to the file is refused 5 s after SIGHUP")


def metrics(port, uploaded):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()
    want = ['medley_api_requests_total{route="files.create",code="200"} 4',
            'medley_api_requests_total{route="batches.retrieve",code="404"} 1',
            'medley_api_request_seconds_count{route="batches.create"} 8',
            'medley_api_tenant_requests_total{tenant="beta"}']
    for w in want:
        if w not in text:
            fail("/metrics has no %s:\n%s" % (w, text[:3000]))
    up = [l for l in text.splitlines() if l.startswith('medley_api_upload_bytes_total{tenant="acme"}')]
    if not up or float(up[0].split()[-1]) < uploaded:
        fail("upload bytes: %s" % up)


def main():
    print("openai", openai.__version__)
    server = RedisServer()
    server.start()
    keys = write_keys(server.dir)
    worker = Worker(server, args=["--echo-delay-ms", "20", "--max-seqs", "8"])
    mport = free_port()
    api = Api(server, keys, ["--metrics", "127.0.0.1:%d" % mport])
    try:
        client = OpenAI(base_url=api.base, api_key=KEY_A, max_retries=0)
        if [m.id for m in client.models.list()] not in ([], ["echo"]):
            fail("models.list")
        f, batch = batch_flow(client, server.dir)
        output_files(client, batch, f)
        if "echo" not in [m.id for m in client.models.list()]:
            fail("models.list does not show echo")
        list_pagination(client, f.id, batch)
        refused_file(client, server.dir)
        long_file = cancel_running(client, server.dir, server.client())
        tenants(api, client, f.id, batch)
        for fid in (f.id, long_file.id):
            d = client.files.delete(fid)
            if not d.deleted:
                fail("files.delete: %s" % d)
        try:
            client.files.retrieve(f.id)
            fail("a deleted file is still there")
        except openai.NotFoundError:
            pass
        r = server.client()
        left = [k for k in r.scan_iter("medley:file:*")]
        if left or int(r.hget("medley:tenant:{acme}:usage", "bytes")) != 0:
            fail("deleting files left %s, usage %s" % (left, r.hgetall("medley:tenant:{acme}:usage")))
        if r.hget("medley:{%s}:meta" % batch.id, "tenant") != "acme":
            fail("the batch meta does not name its tenant")
        dashboard_tenant(server, batch.id)
        sighup(api, keys)
        metrics(mport, f.bytes)
    finally:
        api.stop()
        worker.stop()
        server.stop()
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
