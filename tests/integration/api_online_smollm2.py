"""api_online_smollm2.py — e2e: online chat and completions through `medley api` and a
`medley worker --model smollm2-135m` running the real engine on the CPU, with the openai SDK:
at temperature 0 the stream iterator's text equals the non-streamed answer (chat, with and
without a stop string, and completions), streamed in several pieces, with the usage chunk.
Skipped (exit 77) when the model is not fetched (scripts/fetch-model.sh)."""
import os
import sys
import time

from openai import OpenAI

from api_online import check_chat, check_completion
from api_smollm2 import model_path
from api_util import KEY_A, Api, write_keys
from harness import RedisServer, Worker, fail


def main():
    if not os.path.exists(model_path()):
        print("SKIP: %s not fetched (scripts/fetch-model.sh)" % model_path())
        sys.exit(77)
    srv = RedisServer()
    keys = write_keys(srv.dir)
    worker = Worker(srv, models=("smollm2-135m",))
    api = Api(srv, keys)
    try:
        # the worker loads the model before it opens the lane: until then the API answers 404
        # ("no worker serves it"), as it should; wait for the lane, not for a fixed time
        r, deadline = srv.client(), time.monotonic() + 120
        while not r.exists("medley:online:{smollm2-135m}"):
            if time.monotonic() > deadline:
                fail("the worker opened no online lane for smollm2-135m in 120 s")
            time.sleep(0.1)
        client = OpenAI(base_url=api.base, api_key=KEY_A, max_retries=0, timeout=120)
        chunks = check_chat(client, "smollm2-135m", max_tokens=24)
        pieces = [c.choices[0].delta.content for c in chunks
                  if c.choices and c.choices[0].delta.content]
        if len(pieces) < 4:
            fail("24 tokens came in %d pieces: %s" % (len(pieces), pieces))
        print("chat: %d pieces: %r" % (len(pieces), "".join(pieces)))
        check_chat(client, "smollm2-135m", max_tokens=24, stop=["."])
        chunks = check_completion(client, "smollm2-135m", max_tokens=16)
        print("completions: %r" % "".join(c.choices[0].text for c in chunks))
    finally:
        api.stop()
        worker.stop()
        srv.stop()
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
