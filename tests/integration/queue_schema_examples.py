"""queue_schema_examples.py — every schema of the queue is a valid Draft 2020-12 schema, and
every example under schemas/examples/ follows its schema (named by the file's prefix)."""
import glob
import json
import os

from harness import SOURCE_DIR, fail, schema_validator, validate_all

NAMES = ["input-line", "output-line", "error-line", "batch-meta", "worker-heartbeat"]


def main():
    n = 0
    for name in NAMES:
        v = schema_validator(name)
        examples = sorted(glob.glob(os.path.join(SOURCE_DIR, "schemas", "examples", name + ".*.json")))
        examples += glob.glob(os.path.join(SOURCE_DIR, "schemas", "examples", name + ".json"))
        if not examples:
            fail("no example for schemas/%s.schema.json" % name)
        for path in examples:
            with open(path) as f:
                validate_all(v, [json.load(f)], path)
            n += 1
    # The schemas must also refuse: a wrong document is caught.
    bad = {"custom_id": "x", "method": "GET", "url": "/v1/chat/completions", "body": {"messages": []}}
    if not list(schema_validator("input-line").iter_errors(bad)):
        fail("input-line schema accepted a GET with no messages")
    print("ok: %d examples follow their schemas" % n)


main()
