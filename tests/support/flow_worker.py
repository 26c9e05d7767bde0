"""An SDK worker process serving the remote steps of the test workflows (tests/flows_kinds.py):

    PYTHONPATH=sdk/python/src python tests/support/flow_worker.py --url URL --key KEY --name N \
        --serve hfan@1 --serve hmix@1:b,c,d

Standard library and the SDK only (it runs as a user's worker would). Every body appends
``<step> <run> <job> <attempt> <pid> <worker>`` to the effect file named in the run's input
(``log``; fsync: the outside world's record of how often it ran), sleeps ``input.pause[step]``
seconds (plus ``input.hold[step]`` on its first attempt; watching ``ctx.cancelled``), sets
``<step>`` and ``stage`` in the run's state and returns what its lease carried: the earlier
steps' outputs and the run's state.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from koala_worker import Client, Worker, Workflow


def effect(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def body(worker_name: str) -> Any:
    def run(ctx: Any, data: dict[str, Any]) -> dict[str, Any]:
        effect(data["log"], f"{ctx.step} {ctx.run_id} {ctx.job_id} {ctx.attempt} {os.getpid()} {worker_name}")
        pause = float((data.get("pause") or {}).get(ctx.step) or 0)
        if ctx.attempt == 1:
            pause += float((data.get("hold") or {}).get(ctx.step) or 0)
        if pause and ctx.cancelled.wait(pause):
            effect(data["log"], f"cancelled {ctx.step} {ctx.run_id} {ctx.job_id} {ctx.attempt} {os.getpid()} {worker_name}")
            ctx.checkpoint()
        ctx.set_state(stage=ctx.step, **{ctx.step: ctx.attempt})
        return {"step": ctx.step, "seen": ctx.steps, "state": ctx.state, "run": ctx.run, "key": ctx.idempotency_key}

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--serve", action="append", required=True, help="workflow@version[:step,step]")
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    worker = Worker(Client(args.url, args.key, timeout=10), concurrency=args.concurrency, name=args.name, shutdown_deadline=5)
    for item in args.serve:
        pair, _, steps = item.partition(":")
        name, _, version = pair.partition("@")
        flow = Workflow(name, version=int(version or 1))
        for step in steps.split(",") if steps else ["a", "b", "c", "d"]:
            flow.step(step, body(args.name))
        worker.register(flow)
    worker.serve()


if __name__ == "__main__":
    main()
