"""A Koala worker in Python, on the koala-worker SDK (sdk/python/README.md shows and explains it).

It serves two kinds that Koala declares in workers/builtin_kinds.py with remote_kind (the
contract lives on the server, the body here): http.echo@1 answers {"echo": input}, and
http.invoice@1 writes an invoice once, through Koala's operations ledger, as a file in
$KOALA_DATA_DIR/invoices (.koala-data/invoices beside `make run`): the folder stands in for the
outside world here.

It also serves the steps of the workflow http_hello@1, declared there too with workflow and
remote_step: greet answers a greeting for the run's input "name" and sets "greeted" in the run's
state; shout, after it, reads greet's output and that state.
"""

import json
import os
import signal
from pathlib import Path

from koala_worker import ABSENT, Client, OperationResult, StepFailure, Worker, Workflow

INVOICES = Path(os.environ.get("KOALA_DATA_DIR") or ".koala-data") / "invoices"
hello = Workflow("http_hello", version=1)  # the bodies of the steps this worker serves


def echo(ctx, input):
    return {"echo": input}


def send_invoice(ctx, input):
    amount = input["amount_minor"]
    if not isinstance(amount, int) or amount <= 0:
        raise StepFailure(f"nothing to invoice: amount_minor {amount!r}", code="empty_invoice")  # failed, no retry
    ctx.checkpoint()  # a safe point: on a stop pause or a shutdown the body stops here, no attempt used

    def written(path):  # what the ledger keeps of the effect
        return OperationResult(external_id=path.name, data={"file": str(path)})

    def perform(key):  # the side effect, called at most once per key however often the job is retried
        path = INVOICES / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".part")
        partial.write_text(json.dumps({"invoice": input["invoice"], "amount_minor": amount, "currency": input["currency"]}))
        os.replace(partial, path)  # atomic: the invoice is there whole, or not at all
        return written(path)

    def reconcile(key):  # a crash or a timeout left the outcome open: was the invoice written?
        path = INVOICES / f"{key}.json"
        # A local folder reads its own writes, so "no such file" proves it never happened: ABSENT,
        # and Koala sends it again under the same key. An HTTP provider's 404 proves nothing until
        # its processing window has passed: answer Miss(window) there (docs/safety.md).
        return written(path) if path.exists() else ABSENT

    with ctx.span("invoice.write") as span:  # spans nest; each is stored with the job
        span.set_attribute("invoice", input["invoice"])
        sent = ctx.operation(
            "write",
            kind="invoice",
            params={"invoice": input["invoice"], "amount_minor": amount, "currency": input["currency"]},
            amount_minor=amount,
            currency=input["currency"],
            target=str(input["invoice"]),
            perform=perform,
            reconcile=reconcile,
        )
    ctx.set_state(invoice_file=sent["file"])  # merged into the job's run state on completion
    return {"sent": True, "file": sent["file"]}


@hello.step("greet")
def greet(ctx, input):  # input: the run's input
    ctx.set_state(greeted=input["name"])  # merged into the run's state when the step completes
    return {"greeting": f"Hello, {input['name']}!"}


@hello.step("shout")
def shout(ctx, input):
    greeting = ctx.steps["greet"]["greeting"]  # an earlier step's output, by name
    ctx.set_state(shouted=True)
    return {"shout": greeting.upper(), "greeted": ctx.state["greeted"]}


def main():
    client = Client(os.environ["KOALA_URL"], os.environ["KOALA_API_KEY"], timeout=30)
    worker = Worker(client, concurrency=4, name=os.environ.get("KOALA_WORKER_NAME"), shutdown_deadline=30)
    worker.register("http.echo", 1, echo).register("http.invoice", 1, send_invoice)  # register returns the worker
    worker.register(hello)  # the workflow's steps, at its version
    signal.signal(signal.SIGINT, lambda signum, frame: worker.stop("SIGINT"))  # Ctrl-C stops it as SIGTERM does
    worker.serve()  # until SIGTERM or Ctrl-C: running bodies finish (or are given back at the deadline)


if __name__ == "__main__":
    main()
