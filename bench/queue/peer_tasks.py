"""peer_tasks.py — the no-op that RQ and Celery run in bench_queue.py: the same work as
medley's echo model with no delay (hand back the last user message)."""
import os

from celery import Celery


def echo(body):
    return body["messages"][-1]["content"]


app = Celery("peer_tasks", broker=os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/0"),
             backend=os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/0"))
app.conf.task_default_queue = "bench"
app.conf.worker_prefetch_multiplier = 256
app.conf.result_expires = 3600


@app.task(name="echo")
def celery_echo(body):
    return echo(body)
