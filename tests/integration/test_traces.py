"""Traces: each job attempt a span, a body's spans under it, exported over OTLP/HTTP once each.

The receiver is a real OTLP/HTTP endpoint on loopback (http.server in a thread), decoding each
request as the protobuf ExportTraceServiceRequest a collector would (opentelemetry-proto, which
the exporter itself depends on). Bodies run through the real RQ runtime in the test process
(tests/inprocess.py); an HTTP worker is played by the protocol's services, as the API's views call
them (tests/integration/test_transitions.py's InProcessHttpWorker).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import connection
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse

from api import protocol
from tests.inprocess import run_until
from tests.integration.test_transitions import InProcessHttpWorker
from traces import services
from traces.models import Span, SpanKind
from traces.selectors import spans_of_job, spans_of_trace
from workers.errors import Rejection
from workers.models import Attempt, Job, JobState, Outcome
from workers.services import maintenance
from workers.services.jobs import enqueue
from workers.spans import attempt_span_id

pytestmark = pytest.mark.django_db(transaction=True)


class Receiver:
    """An OTLP/HTTP traces receiver on loopback: what it took, by span, and how it answers."""

    def __init__(self, port: int = 0) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.status = 200
        self.headers_seen: list[dict[str, str]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.headers_seen.append({k.lower(): v for k, v in self.headers.items()})
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                if receiver.status != 200:
                    self.send_response(receiver.status)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.requests.append(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spans(self) -> list[tuple[str, Any]]:
        """(service name, span) for every span received, in order."""
        found = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                service = next(a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name")
                for scope_spans in resource_spans.scope_spans:
                    found.extend((service, span) for span in scope_spans.spans)
        return found

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    found = Receiver()
    settings.KOALA_OTLP_ENDPOINT = found.url
    settings.KOALA_OTLP_HEADERS = {"x-api-key": "otlp-secret"}
    settings.KOALA_OTLP_SERVICE_NAME = "koala-test"
    settings.KOALA_OTLP_TIMEOUT_SECONDS = 1.0
    yield found
    found.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def attributes(span: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for item in span.attributes:
        kind = item.value.WhichOneof("value")
        values[item.key] = getattr(item.value, kind)
    return values


def by_name(received: list[tuple[str, Any]]) -> dict[str, list[Any]]:
    named: dict[str, list[Any]] = {}
    for _service, span in received:
        named.setdefault(span.name, []).append(span)
    return named


def test_a_retried_job_exports_one_span_per_attempt_with_its_body_spans_nested(receiver: Receiver, redis_clean: None) -> None:
    job_id = enqueue(kind="tests.traced", input={"fail_first": True, "secret": "hunter2-very-secret"}).job_id
    job = run_until(job_id)
    assert job.state == JobState.SUCCEEDED
    attempts = list(Attempt.objects.filter(job_id=job_id).order_by("number"))
    assert [a.outcome for a in attempts] == [Outcome.RETRY, Outcome.SUCCEEDED]

    report = services.export_spans()
    assert report.exported == Span.objects.filter(job_id=job_id).count() == 2 * 4  # attempt, agent, draft, model call
    received = receiver.spans()
    assert {service for service, _ in received} == {"koala-test"}
    assert receiver.headers_seen[0]["x-api-key"] == "otlp-secret"
    named = by_name(received)

    # One span per attempt, its id the one the lease carries, its times the attempt row's.
    attempt_spans = sorted(named["tests.traced"], key=lambda s: s.start_time_unix_nano)
    assert len(attempt_spans) == 2
    for attempt, span in zip(attempts, attempt_spans, strict=True):
        assert span.span_id.hex() == attempt_span_id(trace_id=job.trace_id, job_id=job_id, lease_token=attempt.lease_token)
        assert span.trace_id.hex() == job.trace_id and span.parent_span_id == b""
        assert span.start_time_unix_nano == int(attempt.started_at.timestamp() * 1e6) * 1000
        assert span.end_time_unix_nano == int(attempt.finished_at.timestamp() * 1e6) * 1000
        assert span.end_time_unix_nano > span.start_time_unix_nano
        assert attributes(span)["koala.attempt.number"] == attempt.number
    assert attributes(attempt_spans[0])["error.type"] == attempts[0].error_class and attempt_spans[0].status.code == 2
    assert attributes(attempt_spans[1])["koala.attempt.outcome"] == "succeeded" and attempt_spans[1].status.code == 0

    # Under each attempt: agent → draft → the model call, the call's usage the ledger's.
    for attempt_span in attempt_spans:
        [agent] = [s for s in named["agent"] if s.parent_span_id == attempt_span.span_id]
        [draft] = [s for s in named["draft"] if s.parent_span_id == agent.span_id]
        [call] = [s for s in named["model_call complete"] if s.parent_span_id == draft.span_id]
        assert attempt_span.start_time_unix_nano <= agent.start_time_unix_nano <= call.start_time_unix_nano
        assert call.end_time_unix_nano <= agent.end_time_unix_nano
        called = attributes(call)
        assert called["gen_ai.request.model"] == "tiny-model"
        if attempt_span is attempt_spans[0]:
            assert called["gen_ai.usage.input_tokens"] == 11 and called["gen_ai.usage.output_tokens"] == 5
            assert called["koala.cost_minor"] == 7
        else:  # the retry found the call done in the ledger: no second call, no second cost
            assert "gen_ai.usage.input_tokens" not in called and "koala.cost_minor" not in called
        assert attributes(draft)["gen_ai.usage.input_tokens"] == 3
        assert attributes(agent)["words"] == 5 and attributes(agent)["step"] == "plan"
        # The declared sensitive value never leaves Koala.
        assert "hunter2-very-secret" not in str(attributes(agent))
    assert "hunter2-very-secret" not in str([r.SerializeToString() for r in receiver.requests])

    # Exported once: the next tick sends nothing, and every row is marked.
    assert services.export_spans().exported == 0
    assert len(receiver.spans()) == 8
    assert not Span.objects.filter(job_id=job_id, exported_at__isnull=True).exists()
    span_ids = [span.span_id for _, span in receiver.spans()]
    assert len(set(span_ids)) == len(span_ids)

    # The selectors nest the same way: two attempt roots, each agent → draft → call.
    roots = spans_of_job(job_id=job_id)
    assert [root.kind for root in roots] == [SpanKind.ATTEMPT, SpanKind.ATTEMPT]
    assert [(depth, node.name) for depth, node in roots[1].walk()] == [
        (0, "tests.traced"),
        (1, "agent"),
        (2, "draft"),
        (3, "model_call complete"),
    ]
    assert [len(root.walk()) for root in spans_of_trace(trace_id=job.trace_id)] == [4, 4]


def test_a_reclaimed_attempt_keeps_one_span_and_its_stale_report_adds_none(receiver: Receiver, redis_clean: None) -> None:
    job_id = enqueue(kind="http.probe", input={"n": 1}).job_id
    worker = InProcessHttpWorker([("http.probe", 2)])
    first = worker.acquire()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE workers_job SET lease_expires_at = now() - interval '1 minute' WHERE id = %s", [job_id])
    maintenance.reap(grace_seconds=0)  # orphaned, requeued: the reclaim
    assert Job.objects.get(pk=job_id).state == JobState.QUEUED
    second = worker.acquire()
    assert second.lease.job_id == job_id and second.lease.attempt_id != first.lease.attempt_id

    now = datetime.now(UTC)
    step = protocol.span_id_of(second.lease)
    spans = protocol.check_spans(
        [
            {"span_id": "a" * 16, "name": "agent", "start": now.isoformat(), "end": (now + timedelta(seconds=1)).isoformat()},
            {
                "span_id": "b" * 16,
                "parent_id": "a" * 16,
                "name": "model.call",
                "usage": {"model": "m", "input_tokens": 2, "output_tokens": 3},
            },
        ],
        step_span=step,
    )
    assert protocol.complete(held=second, output=1, state_delta={}, usage=None, spans=spans, duration_seconds=0.1) == "succeeded"
    # The reply was lost and the report repeated: already recorded, no second copy of its spans.
    with pytest.raises(protocol.ApiError) as repeated:
        protocol.complete(held=worker.refresh(second), output=1, state_delta={}, usage=None, spans=spans, duration_seconds=0.1)
    assert repeated.value.code == Rejection.ALREADY_RECORDED.value
    # The first holder wakes up and reports with spans of its own: fenced out, nothing stored.
    stale = protocol.check_spans([{"span_id": "c" * 16, "name": "late"}], step_span=protocol.span_id_of(first.lease))
    with pytest.raises(protocol.ApiError) as fenced:
        protocol.complete(held=worker.refresh(first), output=2, state_delta={}, usage=None, spans=stale, duration_seconds=0.1)
    assert fenced.value.code == Rejection.LEASE_SUPERSEDED.value

    stored = list(Span.objects.filter(job_id=job_id).order_by("id"))
    assert sorted((s.kind, s.name) for s in stored) == [
        ("attempt", "http.probe"),
        ("attempt", "http.probe"),
        ("body", "agent"),
        ("body", "model.call"),
    ]
    orphaned = next(s for s in stored if s.attempt_id == first.lease.attempt_id)
    assert orphaned.span_id == protocol.span_id_of(first.lease) and orphaned.error == "orphaned"
    assert orphaned.ended_at == Attempt.objects.get(pk=first.lease.attempt_id).finished_at

    assert services.export_spans().exported == 4
    named = by_name(receiver.spans())
    assert len(named["http.probe"]) == 2 and "late" not in named
    [agent], [call] = named["agent"], named["model.call"]
    assert agent.parent_span_id.hex() == step and call.parent_span_id == agent.span_id
    assert attributes(call)["gen_ai.usage.output_tokens"] == 3
    assert agent.end_time_unix_nano - agent.start_time_unix_nano == 1_000_000_000


def test_an_http_workers_failure_report_carries_its_spans(receiver: Receiver, redis_clean: None) -> None:
    job_id = enqueue(kind="http.probe", input={"n": 2}).job_id
    worker = InProcessHttpWorker([("http.probe", 2)])
    held = worker.acquire()
    spans = protocol.check_spans(
        [{"span_id": "d" * 16, "name": "fetch", "error": "TimeoutError"}], step_span=protocol.span_id_of(held.lease)
    )
    outcome = protocol.fail(
        held=held,
        classification="retryable",
        error_class="TimeoutError",
        message="upstream timed out",
        retry_after=None,
        body_started=True,
        safe_point=False,
        spans=spans,
    )
    assert outcome == Outcome.RETRY
    [root] = spans_of_job(job_id=job_id)
    assert root.error == "TimeoutError" and [(c.name, c.error) for c in root.children] == [("fetch", "TimeoutError")]


def test_a_receiver_down_then_failing_then_up_gets_every_span_exactly_once(settings: Any, redis_clean: None) -> None:
    port = free_port()
    settings.KOALA_OTLP_ENDPOINT = f"http://127.0.0.1:{port}/"
    settings.KOALA_OTLP_TIMEOUT_SECONDS = 1.0
    job_id = enqueue(kind="tests.traced", input={}).job_id
    assert run_until(job_id).state == JobState.SUCCEEDED
    total = Span.objects.filter(job_id=job_id).count()
    assert total == 4

    # Down: nothing listens. The tick is bounded and loses nothing.
    started = datetime.now(UTC)
    assert services.export_tick() == {"exported": 0, "failed": total}
    assert (datetime.now(UTC) - started).total_seconds() < 5
    assert Span.objects.filter(job_id=job_id, exported_at__isnull=True).count() == total

    # Up but failing (503, retried inside the call until its timeout): still nothing lost.
    receiver = Receiver(port)
    try:
        receiver.status = 503
        assert services.export_tick() == {"exported": 0, "failed": total}
        assert receiver.spans() == [] and Span.objects.filter(exported_at__isnull=True).count() == total

        receiver.status = 200
        assert services.export_tick() == {"exported": total, "failed": 0}
        assert services.export_tick() == {"exported": 0, "failed": 0}
        ids = [span.span_id.hex() for _, span in receiver.spans()]
        assert sorted(ids) == sorted(Span.objects.filter(job_id=job_id).values_list("span_id", flat=True))
    finally:
        receiver.close()


def test_nothing_is_exported_when_no_endpoint_is_set(settings: Any, redis_clean: None) -> None:
    receiver = Receiver()
    try:
        settings.KOALA_OTLP_ENDPOINT = ""
        job_id = enqueue(kind="tests.traced", input={}).job_id
        assert run_until(job_id).state == JobState.SUCCEEDED
        assert services.export_tick() == {"configured": 0}
        assert receiver.requests == [] and receiver.headers_seen == []
        # Stored all the same (the journal shows them), waiting for an endpoint.
        assert Span.objects.filter(job_id=job_id, exported_at__isnull=True).count() == 4
    finally:
        receiver.close()


def test_the_attempt_span_id_in_sql_is_the_engines(redis_clean: None) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    job = run_until(job_id)
    attempt = Attempt.objects.get(job_id=job_id)
    [span] = Span.objects.filter(job_id=job_id)
    assert span.span_id == attempt_span_id(trace_id=job.trace_id, job_id=job_id, lease_token=attempt.lease_token)
    assert (span.started_at, span.ended_at, span.kind, span.parent_id) == (attempt.started_at, attempt.finished_at, "attempt", "")
