"""api_online.py — online requests through `medley api` (docs/api.md "Online requests") with
the real openai SDK, against a real redis-server and `medley worker` processes on the echo
model: chat and completions, streamed and not (the stream's text equals the answer's;
role first, finish_reason last, the usage chunk with include_usage, [DONE]); a 400 naming
the field for a bad one (from the API's validation, and from the worker's: a prompt past the
context, still a 400 with stream=True); 401 without a key or with a wrong one; 404 for a
model no worker serves; the per-tenant rate limit (429); a client that hangs up mid-stream
(P cancel:{R} set, the worker stops the request); an API process SIGKILLed mid-stream (the
client gets an error, the worker goes on); a worker SIGKILLed mid-stream (another runs the
request again and the stream goes on, its text unchanged); and priority: an online request answered while a
batch of 160 lines is queued ahead of it, in far less than the batch's drain time."""
import os
import sys
import threading
import time

import json
import urllib.error
import urllib.request

import openai
from openai import OpenAI

from api_util import KEY_A, Api, write_keys
from harness import RedisServer, Worker, chat_line, fail, submit, wait_batch, meta, write_lines

FAST = ("--block-ms", "200")  # an idle worker notices SIGTERM within 0.2 s
DELAY_MS = 30  # echo: per answer; with 4 slots a 160-line batch drains in about 1.2 s


def stream_text(stream, chat=True):
    """The concatenated text of a stream, and its chunks."""
    chunks = list(stream)
    text = "".join((c.choices[0].delta.content or "") if chat else c.choices[0].text
                   for c in chunks if c.choices)
    return text, chunks


def check_chat(client, model, **kw):
    msgs = [{"role": "user", "content": "Tell me about the streams of Redis, briefly."}]
    full = client.chat.completions.create(model=model, messages=msgs, temperature=0, **kw)
    text, chunks = stream_text(client.chat.completions.create(
        model=model, messages=msgs, temperature=0, stream=True,
        stream_options={"include_usage": True}, **kw))
    want = full.choices[0].message.content
    if text != want:
        fail("chat: streamed %r, answered %r" % (text, want))
    if chunks[0].choices[0].delta.role != "assistant":
        fail("chat: the first chunk is not the role: %s" % chunks[0])
    last = [c for c in chunks if c.choices][-1]
    if last.choices[0].finish_reason != full.choices[0].finish_reason:
        fail("chat: finish_reason %s, answered %s" % (last.choices[0].finish_reason,
                                                        full.choices[0].finish_reason))
    if chunks[-1].choices or chunks[-1].usage.total_tokens != full.usage.total_tokens:
        fail("chat: no usage chunk at the end: %s" % chunks[-1])
    ids = {c.id for c in chunks}
    if len(ids) != 1 or not ids.pop().startswith("chatcmpl-"):
        fail("chat: chunk ids differ: %s" % chunks)
    return chunks


def check_completion(client, model, **kw):
    full = client.completions.create(model=model, prompt="The capital of France is",
                                     temperature=0, **kw)
    text, chunks = stream_text(client.completions.create(
        model=model, prompt="The capital of France is", temperature=0, stream=True, **kw),
        chat=False)
    if text != full.choices[0].text:
        fail("completions: streamed %r, answered %r" % (text, full.choices[0].text))
    if chunks[-1].choices[0].finish_reason != full.choices[0].finish_reason:
        fail("completions: the last chunk has no finish_reason: %s" % chunks[-1])
    return chunks


def expect(exc, fn, param=None, status=None):
    try:
        fn()
    except exc as e:
        if param is not None and (e.body or {}).get("param") != param:
            fail("expected param %r, got %s" % (param, e.body))
        if status is not None and e.status_code != status:
            fail("expected status %d, got %d" % (status, e.status_code))
        return e
    fail("expected %s" % exc.__name__)


def main():
    srv = RedisServer()
    keys = write_keys(srv.dir)
    worker = Worker(srv, args=FAST + ("--max-seqs", "4", "--echo-delay-ms", str(DELAY_MS)),
                    name="a")
    api = Api(srv, keys)
    api2 = None
    try:
        client = OpenAI(base_url=api.base, api_key=KEY_A, max_retries=0)
        chunks = check_chat(client, "echo")
        if sum(1 for c in chunks if c.choices and c.choices[0].delta.content) < 2:
            fail("a delayed echo streams its answer in pieces: %s" % chunks)
        check_chat(client, "echo", stop=["briefly"], max_tokens=60)
        check_completion(client, "echo", max_tokens=10)
        print("ok: streamed == answered (chat, completions)")

        # refusals, in OpenAI's envelope, naming the field
        expect(openai.BadRequestError, lambda: client.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "x"}], temperature=5),
            param="temperature", status=400)
        expect(openai.BadRequestError, lambda: client.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "x"}], extra_body={"foo": 1}),
            param="foo")
        expect(openai.BadRequestError, lambda: client.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "x"}],
            stream_options={"include_usage": True}), param="stream_options")
        expect(openai.BadRequestError, lambda: client.completions.create(
            model="echo", prompt="x", n=2), param="n")
        # the worker's refusal (the echo model's context is 8192 bytes), before any stream
        big = "x" * 9000
        expect(openai.BadRequestError, lambda: list(client.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": big}], stream=True)),
            param="messages", status=400)
        expect(openai.NotFoundError, lambda: client.chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "x"}]), param="model")
        bad = OpenAI(base_url=api.base, api_key="sk-wrong-0123456789abcdef", max_retries=0)
        expect(openai.AuthenticationError, lambda: bad.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "x"}]))
        req = urllib.request.Request(api.base + "/chat/completions", data=json.dumps(
            {"model": "echo", "messages": [{"role": "user", "content": "x"}]}).encode())
        try:
            urllib.request.urlopen(req, timeout=10)
            fail("no key: answered")
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
            if e.code != 401 or body["error"]["type"] != "authentication_error":
                fail("no key: %d %s" % (e.code, body))
        print("ok: 400 naming the field, 401, 404")

        # a client that hangs up: its cancel key is set, the worker stops the request; and an
        # API process killed mid-stream: the client gets an error, the worker goes on. A slow
        # echo (20 s per answer) serves these alone, then hands back what it holds.
        worker.stop()
        slow = Worker(srv, args=FAST + ("--echo-delay-ms", "20000", "--grace-ms", "500"),
                      name="slow")
        time.sleep(0.5)
        st = client.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "a" * 2000}], stream=True)
        first = next(iter(st))
        rid = first.id.split("-", 1)[1]
        st.close()
        rc = srv.client()
        t0 = time.time()
        while not rc.exists("medley:cancel:{%s}" % rid) and time.time() - t0 < 5:
            time.sleep(0.05)
        if not rc.exists("medley:cancel:{%s}" % rid):
            fail("a client that hung up left no cancel key")
        while "cancelled (its client" not in slow.logs() and time.time() - t0 < 5:
            time.sleep(0.05)
        if "cancelled (its client" not in slow.logs():
            fail("the worker did not stop a cancelled request:\n" + slow.logs()[-1500:])
        print("ok: a client hanging up stops its request")

        api2 = Api(srv, keys, args=("--tenant-rps", "3"), name="api2")
        c2 = OpenAI(base_url=api2.base, api_key=KEY_A, max_retries=0)
        codes = []
        for _ in range(8):
            try:
                c2.models.list()
                codes.append(200)
            except openai.RateLimitError:
                codes.append(429)
        if 429 not in codes:
            fail("--tenant-rps 3: 8 requests at once were all served: %s" % codes)
        time.sleep(1.1)
        st = c2.chat.completions.create(model="echo", messages=[{"role": "user",
                                        "content": "b" * 3000}], stream=True)
        it = iter(st)
        next(it)
        next(it)  # a piece of the text: the worker runs it
        api2.kill()
        try:
            for _ in it:
                pass
            fail("a stream whose API process died ended without an error")
        except Exception as e:  # the connection's end, as the SDK's transport reports it
            print("ok: the stream of the killed API process ended with %s" % type(e).__name__)
        api2 = None
        time.sleep(0.3)
        if slow.proc.poll() is not None:
            fail("the worker died with the API process")
        slow.stop()
        worker = Worker(srv, args=FAST + ("--max-seqs", "4", "--echo-delay-ms", str(DELAY_MS)),
                        name="b")
        check_completion(client, "echo", max_tokens=5)
        print("ok: 429 per tenant; an API process killed mid-stream is an error to its client")

        # priority: a batch of 160 lines drains in about 160 / 4 slots * 30 ms = 1.2 s; an
        # online request sent once it runs is answered in a fraction of that
        lines = [chat_line("r%d" % i, "line %d" % i) for i in range(160)]
        t0 = time.time()
        batch = submit(srv, write_lines(srv.dir, "batch.jsonl", lines), "--model", "echo")
        time.sleep(0.3)
        lat = []
        for _ in range(3):
            t1 = time.time()
            out = client.chat.completions.create(model="echo", messages=[{"role": "user",
                                                 "content": "me first"}])
            lat.append(time.time() - t1)
            if out.choices[0].message.content != "me first":
                fail("online answer: %s" % out)
        m = meta(srv, batch)
        done = int(m.get("completed", 0)) + int(m.get("failed", 0))
        if m.get("status") != "in_progress" or done >= 160:
            fail("the batch was over before the online requests: %s" % m)
        wait_batch(srv, batch, timeout=60)
        drain = time.time() - t0
        if max(lat) > drain / 5:
            fail("online latencies %s s against a batch drain of %.1f s: no priority" % (lat, drain))
        print("ok: online latencies %s s while a 160-line batch drained in %.1f s (%d lines "
              "answered when the online requests were)" % (
                  ["%.3f" % x for x in lat], drain, done))

        # the online reserve: with 2 slots and 1.5 s answers, batch lines take one slot once
        # the worker has served an online request, so the next one starts at once (its role
        # chunk comes when the worker starts it)
        worker.stop()
        worker = Worker(srv, args=FAST + ("--max-seqs", "2", "--echo-delay-ms", "1500",
                                          "--grace-ms", "200"), name="c")
        warm = client.completions.create(model="echo", prompt="warm", stream=True)
        next(iter(warm))  # started: the worker has seen online traffic
        warm.close()
        batch = submit(srv, write_lines(srv.dir, "slow.jsonl", lines[:8]), "--model", "echo")
        time.sleep(0.5)
        t1 = time.time()
        st = client.chat.completions.create(model="echo", stream=True,
                                            messages=[{"role": "user", "content": "now"}])
        next(iter(st))
        ttfc = time.time() - t1
        st.close()
        if ttfc > 0.75:
            fail("an online request waited %.2f s for a slot held by batch lines" % ttfc)
        print("ok: with every batch slot busy an online request started in %.3f s" % ttfc)

        # a worker SIGKILLed mid-stream: another takes the entry over and runs it again; its
        # text agrees with what was sent (the echo is deterministic), so the stream goes on
        worker.stop()
        slow = ("--echo-delay-ms", "1500", "--visibility-ms", "1000")
        worker = Worker(srv, args=FAST + slow, name="d")
        text = "the quick brown fox jumps over the lazy dog " * 2
        st = client.chat.completions.create(model="echo", stream=True,
                                            messages=[{"role": "user", "content": text}])
        it = iter(st)
        got = ""
        while len(got) < 20:
            c = next(it)
            got += (c.choices[0].delta.content or "") if c.choices else ""
        worker.proc.kill()
        worker.proc.wait()
        worker = Worker(srv, args=FAST + slow, name="e")
        t1 = time.time()
        got += stream_text(it)[0]
        if got != text:
            fail("after a worker died mid-stream the client got %r" % got)
        print("ok: a worker killed mid-stream: another ran it again and the stream went on "
              "(%.1f s)" % (time.time() - t1))
    finally:
        if api2:
            api2.stop()
        api.stop()
        worker.stop()
        srv.stop()
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
