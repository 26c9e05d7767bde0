"""Koala through a real PgBouncer 1.18 in transaction pooling mode (docs/scaling.md, "PgBouncer").

The worker, beat and API server subprocesses reach the test database only through PgBouncer
(``through_pgbouncer``: tests.conftest.subprocess_database points them at it, as a login role
whose settings are Koala's session bounds); the test process itself reads and asserts on the
rows directly. The core fault cases are the fault suite's own scenarios, run again unchanged:
kill -9 mid-body, a stale attempt rejected after its lease was lost, one charge per operation
key across a crash, a concurrency budget held, HTTP workers draining and performing an
operation once. Then the start-up refusals: a pooler the setting does not name, a role without
the bounds, startup options, and prepared statements.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from tests.acceptance import test_api_sdk_worker, test_effects_crashes, test_exports_faults, test_faults
from tests.conftest import REPO, subprocess_database, worker_env
from tests.support.api_server import ApiServer
from tests.support.effects import FakeProvider
from tests.support.pgbouncer import PgBouncer, running, worker_role

pytestmark = [pytest.mark.slow, pytest.mark.services, pytest.mark.django_db(transaction=True)]


def bounds_for(lease_seconds: float) -> dict[str, str]:
    """Koala's session bounds for a lease (workers/dbsession.py: a third, a sixth, a third)."""
    ms = lambda seconds: f"{max(int(seconds * 1000), 1)}ms"  # noqa: E731
    return {
        "statement_timeout": ms(lease_seconds / 3),
        "lock_timeout": ms(lease_seconds / 6),
        "idle_in_transaction_session_timeout": ms(lease_seconds / 3),
    }


def role_name() -> str:
    return f"koala_pgb_{connection.settings_dict['NAME']}"[:63]


@pytest.fixture
def bouncer(transactional_db: None) -> Iterator[PgBouncer]:
    params = dict(connection.settings_dict)
    lease = float(worker_env()["KOALA_LEASE_SECONDS"])
    with worker_role(params, role_name(), bounds_for(lease)) as role, running(params, users=[params["USER"], role]) as found:
        yield found


@pytest.fixture
def through_pgbouncer(bouncer: PgBouncer) -> Iterator[PgBouncer]:
    with subprocess_database(bouncer.url(user=role_name()), KOALA_DATABASE_POOLING="transaction"):
        yield bouncer
    # Only PgBouncer logs in as that role: its server sessions prove the traffic went through it.
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s", [role_name()])
        (sessions,) = cursor.fetchone()
    assert sessions > 0, "no server session of PgBouncer's: the subprocesses did not go through it"


# -- the fault suite's core cases, through PgBouncer ------------------------------------------------
@pytest.mark.parametrize(("kind", "worker_class"), [("probe", "simple"), ("probe_once", "fork")])
def test_kill_9_mid_body(through_pgbouncer, processes, tmp_path, stray_pids, kind: str, worker_class: str) -> None:
    test_faults.test_kill_9_mid_body(processes, tmp_path, stray_pids, kind, worker_class)


@pytest.mark.parametrize("worker_class", ["simple", "fork"])
def test_stale_attempt_after_lease_loss_is_rejected(
    through_pgbouncer, processes, tmp_path, stray_pids, worker_class: str
) -> None:
    test_faults.test_stopped_worker_past_its_lease_cannot_change_the_outcome(processes, tmp_path, stray_pids, worker_class)


def test_one_charge_per_operation_key_across_a_kill_9(through_pgbouncer, processes, provider: FakeProvider) -> None:
    test_effects_crashes.test_kill_9_after_the_charge_reached_the_provider_reconciles_to_one_charge(processes, provider)


def test_a_concurrency_budget_holds(through_pgbouncer, processes, provider: FakeProvider) -> None:
    test_effects_crashes.test_a_concurrency_limit_of_2_holds_at_the_provider_with_10_jobs_and_4_workers(processes, provider)


@pytest.fixture
def api_through_pgbouncer(through_pgbouncer: PgBouncer, tmp_path: Path, redis_clean: None) -> Iterator[ApiServer]:
    server = ApiServer(tmp_path)  # its environment is built now, inside subprocess_database()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_http_workers_drain_through_the_api_server(api_through_pgbouncer: ApiServer, worker_key: str) -> None:
    test_api_sdk_worker.test_eight_slots_drain_many_jobs_each_exactly_once(api_through_pgbouncer, worker_key)


def test_an_http_workers_operation_runs_once(api_through_pgbouncer: ApiServer, worker_key: str) -> None:
    test_api_sdk_worker.test_an_operation_is_performed_once_across_retries_and_its_result_comes_back(
        api_through_pgbouncer, worker_key
    )


# -- start-up refusals ------------------------------------------------------------------------------
def start_worker(url: str, **settings_: str) -> subprocess.CompletedProcess[str]:
    """A worker that must refuse to start (it exits; a running one would be killed by the timeout)."""
    env = worker_env(DATABASE_URL=url, **settings_)
    return subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "koala_worker", "--queues", "default"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_worker_set_to_direct_refuses_to_start_through_a_pooler(bouncer: PgBouncer) -> None:
    result = start_worker(bouncer.url(user=role_name()), KOALA_DATABASE_POOLING="direct")
    assert result.returncode != 0
    assert "KOALA_DATABASE_POOLING=direct, but DATABASE_URL goes through a connection pooler" in result.stdout + result.stderr
    assert "Set KOALA_DATABASE_POOLING=transaction" in result.stdout + result.stderr


def test_a_worker_set_to_session_refuses_to_start_through_a_transaction_pooler(bouncer: PgBouncer) -> None:
    result = start_worker(bouncer.url(user=role_name()), KOALA_DATABASE_POOLING="session")
    assert result.returncode != 0
    assert "KOALA_DATABASE_POOLING=session, but DATABASE_URL goes through a transaction pooler" in result.stdout + result.stderr


def test_a_role_without_the_bounds_is_refused_with_the_commands_that_fix_it(bouncer: PgBouncer) -> None:
    user, database = connection.settings_dict["USER"], connection.settings_dict["NAME"]
    result = start_worker(bouncer.url(), KOALA_DATABASE_POOLING="transaction")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"the sessions of role {user!r} lack the bounds" in output
    for name, value in bounds_for(float(worker_env()["KOALA_LEASE_SECONDS"])).items():
        assert f"""ALTER ROLE "{user}" IN DATABASE "{database}" SET {name} = '{value}';""" in output


def test_startup_options_are_what_pgbouncer_refuses(bouncer: PgBouncer) -> None:
    """Why transaction mode sends none: PgBouncer 1.18 itself refuses the connection."""
    import psycopg

    with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter: options"):
        psycopg.connect(bouncer.url(user=role_name()), options="-c timezone=UTC").close()
    # And with the setting, Koala sends none: the management check connects through it fine.
    env = worker_env(DATABASE_URL=bouncer.url(user=role_name()), KOALA_DATABASE_POOLING="transaction")
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "manage.py"),
            "shell",
            "-c",
            "from django.db import connection; connection.ensure_connection(); print('ok')",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr


def test_pooling_detection_sees_postgresql_itself_as_direct() -> None:
    from workers import dbsession

    assert dbsession.detect_pooling(connection) == "direct"


def test_an_export_streams_its_copy_through_pgbouncer(
    through_pgbouncer, people, export_root, processes, export_env, faults
) -> None:
    """The COPY's read-only mode, time limit and output format are set inside its own transaction."""
    test_exports_faults.test_kill_9_mid_stream_publishes_nothing_partial_and_the_retry_cleans_up(
        people, export_root, processes, export_env, faults
    )
