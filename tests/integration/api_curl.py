"""api_curl.py — the curl walk-through of docs/api.md and its online requests' curl block
("Streaming with curl"), each run as written (bash, curl, jq) against `medley api` + an echo
`medley worker`; their output must be the one the page shows."""
import os
import re
import subprocess
import sys

from api_util import KEY_A, Api, write_keys
from harness import SOURCE_DIR, RedisServer, Worker, fail


def walkthrough(heading):
    """The first sh block after heading in docs/api.md, and the text block it prints."""
    text = open(os.path.join(SOURCE_DIR, "docs", "api.md")).read()
    sec = text.split(heading, 1)[1]
    script = re.search(r"```sh\n(.*?)```", sec, re.S).group(1)
    expected = re.search(r"```text\n(.*?)```", sec, re.S).group(1)
    return script, expected


def main():
    blocks = [walkthrough("## A walk-through with curl"), walkthrough("### Streaming with curl")]
    srv = RedisServer()
    srv.start()
    keys = write_keys(srv.dir)
    worker = Worker(srv)
    api = Api(srv, keys)
    try:
        env = dict(os.environ, API=api.url, KEY=KEY_A)
        for script, expected in blocks:
            p = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=srv.dir, env=env,
                               capture_output=True, text=True, timeout=60)
            if p.returncode != 0:
                fail("the walk-through exited %d: %s\n%s" % (p.returncode, p.stderr, api.logs()))
            if p.stdout != expected:
                fail("the walk-through printed\n%s\ninstead of\n%s" % (p.stdout, expected))
    finally:
        api.stop()
        worker.stop()
        srv.stop()
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
