"""api_smollm2.py — e2e: OpenAI's Batch flow with the openai SDK against `medley api` and a
`medley worker --model smollm2-135m` running the real engine on the CPU: 3 short chat
requests at temperature 0, each answered with text and usage, in the output file.
Skipped (exit 77) when the model is not fetched (scripts/fetch-model.sh)."""
import json
import os
import sys

from openai import OpenAI

from api_util import KEY_A, Api, wait_status, write_keys
from harness import RedisServer, Worker, chat_line, fail, write_lines


def model_path():
    """Where `medley models fetch smollm2-135m` puts it (as queue_run_smollm2.py looks)."""
    d = os.environ.get("MEDLEY_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "medley", "models")
    return os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")


def main():
    if not os.path.exists(model_path()):
        print("SKIP: %s not fetched (scripts/fetch-model.sh)" % model_path())
        sys.exit(77)
    srv = RedisServer()
    srv.start()
    keys = write_keys(srv.dir)
    worker = Worker(srv, models=("smollm2-135m",))
    api = Api(srv, keys)
    try:
        client = OpenAI(base_url=api.base, api_key=KEY_A, max_retries=0)
        qs = ["What is the capital of France?", "Name a primary color.", "Say hello."]
        path = write_lines(srv.dir, "in.jsonl", [
            chat_line("q%d" % i, q, model="smollm2-135m", max_tokens=12, temperature=0)
            for i, q in enumerate(qs)])
        f = client.files.create(file=open(path, "rb"), purpose="batch")
        b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                  completion_window="1h")
        b = wait_status(client, b.id, ("completed", "failed"), timeout=300)
        if b.status != "completed" or b.request_counts.completed != 3:
            fail("batch ended %s: %s" % (b.status, b.request_counts))
        out = [json.loads(l) for l in client.files.content(b.output_file_id).text.splitlines()]
        for o in sorted(out, key=lambda o: o["custom_id"]):
            body = o["response"]["body"]
            text = body["choices"][0]["message"]["content"]
            if not text.strip() or body["usage"]["completion_tokens"] < 1:
                fail("empty answer: %s" % o)
            print("%s: %r" % (o["custom_id"], text))
    finally:
        api.stop()
        worker.stop()
        srv.stop()
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
