"""Every Koala management command, fed malformed input: a clear one-line refusal, nothing changed.

The table below has cases for every command of Koala's apps and every argument each one
defines. Each case must exit non-zero with a last stderr line that names the argument
(argparse's usage line above it is fine), print no traceback, and leave every Koala table
(and auth's) exactly as it was: same row count and same content. A command or argument
added without a case here fails ``test_every_command_and_argument_has_cases``.

Cases run in this process (``run_from_argv``, as ``manage.py`` does) for speed; a handful
run through a real ``manage.py`` subprocess: argv bytes that are not UTF-8, a non-finite
environment setting, and the long-running commands, to prove they exit before starting.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import signal
import socket
import subprocess
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.core.management import ManagementUtility, get_commands, load_command_class
from django.db import connection

from api.keys import create_key, revoke_key
from exports.demo_data import generate_events
from exports.models import Account
from exports.services import request_export
from reviews.models import ReviewRequest
from schedules import services as schedule_services
from tests.conftest import REPO, worker_env
from tests.inprocess import run_until
from workers.services import budgets, pauses
from workers.services.jobs import enqueue

pytestmark = pytest.mark.django_db(transaction=True)

KOALA_APPS = ("koala", "workers", "effects", "reviews", "console", "exports", "api", "devtools", "schedules")
# Options every Django command has; Koala's table covers the ones Koala's commands define.
DJANGO_DESTS = {"help", "version", "verbosity", "settings", "pythonpath", "traceback", "no_color", "force_color", "skip_checks"}

NUL = "a\x00b"
SURROGATE = "\udcff"  # how Python hands over an argv byte that is not UTF-8 (b"\xff")
HUGE = "99999999999999999999"  # beyond bigint
DEEP_JSON = '{"a": ' + "[" * 20_000 + "]" * 20_000 + "}"  # deeper than Python's recursion limit
ACTOR_151 = "a" * 151  # the actor columns hold 150


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    names: str  # what the one-line message must name: the argument (or the thing it refers to)

    def argv(self, seeds: dict[str, str]) -> list[str]:
        """The arguments, with "{job}"-style placeholders replaced by the seeded rows' ids."""
        return [seeds.get(arg[1:-1], arg) if arg.startswith("{") and arg.endswith("}") else arg for arg in self.args]


def c(*args: str, names: str) -> Case:
    return Case(args, names)


def actor_cases(*prefix: str) -> list[Case]:
    return [
        c(*prefix, "--actor", ACTOR_151, names="--actor"),
        c(*prefix, "--actor", NUL, names="--actor"),
        c(*prefix, "--actor", SURROGATE, names="--actor"),
    ]


def job_id_cases(*prefix: str, extra: tuple[str, ...] = ()) -> list[Case]:
    return [
        c(*prefix, *extra, names="job_id"),  # missing
        c(*prefix, "abc", *extra, names="job_id"),
        c(*prefix, "999999", *extra, names="job"),
        c(*prefix, "0", *extra, names="job"),
        c(*prefix, "-1", *extra, names="job"),
        c(*prefix, HUGE, *extra, names="job"),
    ]


ENQUEUE = ("noop",)
PAUSE_DEFAULT = ("--queue", "default", "--reason", "maintenance")
EXPORT_CREATE = ("create", "--user", "alice", "--account", "acme")
EXPORT_DATES = ("--from", "2026-01-01", "--to", "2026-01-31")
BUDGET_NEW = ("create", "b2", "--scope", "global")
KEY_NEW = ("create", "--name", "ci", "--scope", "worker")

TABLE: dict[str, list[Case]] = {
    "koala_beat": [
        c("--interval", "nan", names="--interval"),  # without --once: today a busy loop
        *[c("--interval", value, "--once", names="--interval") for value in ("inf", "-inf", "0", "-1", "abc", "1e12", "1e400")],
        c("--interval", names="--interval"),
        c("--once=yes", names="--once"),
        c("--status=yes", names="--status"),
        c("--nope", names="--nope"),
    ],
    "koala_worker": [
        *[
            c("--queues", value, "--burst", names="--queues")
            for value in ("nope", "default,nope", "", ",", NUL, SURROGATE, "q" * 65)
        ],
        *[c("--pool", value, "--burst", names="--pool") for value in ("0", "-1", "65", "abc", HUGE)],
        *[
            c("--shutdown-deadline", value, "--burst", names="--shutdown-deadline")
            for value in ("nan", "inf", "-1", "abc", "1e12")
        ],
        *[c("--name", value, "--burst", names="--name") for value in ("w" * 201, NUL, SURROGATE, "", "tab\there", "a/b")],
        c("--pool", "2", "--name", "w1", "--burst", names="--name"),
        c("--worker-class", "nope", "--burst", names="--worker-class"),
        c("--burst=1", names="--burst"),
        c("--nope", names="--nope"),
    ],
    "koala_run": [
        *[c("--port", value, names="--port") for value in ("99999", "65536", "0", "-1", "abc", HUGE, "{busy_port}")],
        *[c("--host", value, names="--host") for value in ("", "bad host", NUL, SURROGATE, "h" * 300, "192.0.2.1", "999.1.1.1")],
        c("--no-demo=1", names="--no-demo"),
        c("--no-sandbox=1", names="--no-sandbox"),
        c("--nope", names="--nope"),
    ],
    "koala_demo": [
        *[c("--username", value, names="--username") for value in ("", "u" * 151, NUL, SURROGATE, "bad name!")],
        c("--username", names="--username"),
        c("--no-jobs=1", names="--no-jobs"),
        c("--nope", names="--nope"),
    ],
    "koala_enqueue": [
        c(names="kind"),
        c("nope", names="kind"),
        c("k" * 101, names="kind"),
        c(NUL, names="kind"),
        c(SURROGATE, names="kind"),
        *[c(*ENQUEUE, "--queue", value, names="--queue") for value in ("nope", "", NUL, "q" * 65)],
        *[
            c(*ENQUEUE, "--input", value, names="--input")
            for value in (
                '{"a": "\\u0000"}',
                '{"a\\u0000": 1}',
                '{"a": NaN}',
                '{"a": Infinity}',
                '{"a": -Infinity}',
                '{"a": "\\ud800"}',
                '{"a": 1e999}',
                "[1]",
                "{",
                DEEP_JSON,
                "{" * 200_000,
                NUL,
                '{"a": "' + "x" * 20_000 + '"}',
            )
        ],
        c(*ENQUEUE, "--input", names="--input"),
        *[c(*ENQUEUE, "--key", value, names="--key") for value in ("k" * 201, NUL, SURROGATE, "")],
        c(*ENQUEUE, "--kind-version", "abc", names="--kind-version"),
        *[c(*ENQUEUE, "--kind-version", value, names="version") for value in ("0", "-1", HUGE)],
        *[c(*ENQUEUE, "--priority", value, names="--priority") for value in ("40000", "-40000", "1.5", HUGE)],
        *[c(*ENQUEUE, "--delay", value, names="--delay") for value in ("nan", "inf", "-inf", "-1", "1e12", "abc")],
        *actor_cases(*ENQUEUE),
        c(*ENQUEUE, "--nope", names="--nope"),
    ],
    "koala_job": [
        *job_id_cases(),
        *actor_cases("{job}"),
        c("{job}", "--json=1", names="--json"),
        c("{job}", "--nope", names="--nope"),
    ],
    "koala_jobs": [
        *[c("--limit", value, names="--limit") for value in ("0", "-1", "10001", "abc", "nan", HUGE)],
        c("--state", "nope", names="--state"),
        *[c("--kind", value, names="--kind") for value in ("nope", "", NUL, "k" * 101)],
        *[c("--queue", value, names="--queue") for value in ("nope", "", NUL, SURROGATE)],
        c("--nope", names="--nope"),
    ],
    "koala_cancel": [
        *job_id_cases(),
        *actor_cases("{job}"),
        *[c("{job}", "--reason", value, names="--reason") for value in (NUL, SURROGATE, "r" * 501)],
        c("{job}", "--nope", names="--nope"),
    ],
    "koala_requeue": [
        *job_id_cases(),
        *actor_cases("{job}"),
        c("{job}", "--nope", names="--nope"),
    ],
    "koala_retry": [
        *job_id_cases(),
        *actor_cases("{failed}"),
        c("{failed}", "--nope", names="--nope"),
    ],
    "koala_pause": [
        *[c("--queue", value, "--reason", "maintenance", names="--queue") for value in ("nope", "", NUL, "q" * 101)],
        *[c("--kind", value, "--reason", "maintenance", names="--kind") for value in ("nope", "", SURROGATE, "k" * 101)],
        c("--queue", "default", names="reason"),
        *[c("--queue", "default", "--reason", value, names="--reason") for value in (NUL, SURROGATE, "   ", "r" * 1001)],
        *[
            c(*PAUSE_DEFAULT, "--expires-in", value, names="--expires-in")
            for value in ("nan", "inf", "-inf", "0", "-5", "1e12", "abc")
        ],
        c(*PAUSE_DEFAULT, "--mode", "nope", names="--mode"),
        *[c(*PAUSE_DEFAULT, "--tenant", value, names="tenant") for value in (" acme", "t" * 101, NUL, SURROGATE)],
        c("--tenant", "acme", names="--tenant"),  # a tenant without a scope to pause
        *actor_cases(*PAUSE_DEFAULT),
        c("--queue", "default", "--kind", "noop", "--reason", "maintenance", names="--kind"),
        c("--global=1", names="--global"),
        c("--nope", names="--nope"),
    ],
    "koala_resume": [
        c(names="pause_id"),
        *[c(value, names="pause") for value in ("abc", "999999", "0", HUGE)],
        *[c("--queue", value, names="--queue") for value in ("nope", "", NUL)],
        *[c("--kind", value, names="--kind") for value in ("nope", "", SURROGATE)],
        c("{pause}", "--queue", "bulk", names="--queue"),
        *[c("--queue", "bulk", "--tenant", value, names="--tenant") for value in ("t" * 101, NUL)],
        c("--queue", "bulk", "--tenant", "acme", names="tenant acme"),  # bulk is paused for every tenant, not acme
        c("{pause}", "--tenant", "acme", names="--tenant"),
        *[c("{pause}", "--note", value, names="--note") for value in (NUL, SURROGATE, "n" * 501)],
        *actor_cases("{pause}"),
        c("--global=1", names="--global"),
        c("{pause}", "--nope", names="--nope"),
    ],
    "koala_schedule": [
        c(names="action"),
        c("nope", names="action"),
        c("list", "extra", names="extra"),
        c("show", names="name"),
        c("show", "nope", names="schedule"),
        *[c("show", value, names="name") for value in (NUL, "n" * 101)],
        *[
            case
            for verb in ("create", "update")
            for case in (
                c(verb, names="name"),
                c(verb, NUL, "--kind", "noop", "--cron", "@daily", "--zone", "UTC", names="name"),
                c(verb, "s1", "--file", "/nonexistent/spec.json", names="--file"),
                c(verb, "s1", "--file", NUL, names="--file"),
                *[
                    c(verb, "s1", "--kind", value, "--cron", "@daily", "--zone", "UTC", names="kind")
                    for value in ("no.such.kind", NUL)
                ],
                *[
                    c(verb, "s1", "--kind", "noop", "--input", value, "--cron", "@daily", "--zone", "UTC", names="--input")
                    for value in ("[1]", "{", DEEP_JSON)
                ],
                c(verb, "s1", "--kind", "noop", "--queue", "nope", "--cron", "@daily", "--zone", "UTC", names="queue"),
                *[
                    c(verb, "s1", "--kind", "noop", "--cron", value, "--zone", "UTC", names="cron")
                    for value in ("61 * * * *", "* * *", "@fortnightly", NUL)
                ],
                *[
                    c(verb, "s1", "--kind", "noop", "--interval", value, "--zone", "UTC", names="--interval")
                    for value in ("0", "-1", "abc", HUGE)
                ],
                *[
                    c(verb, "s1", "--kind", "noop", "--cron", "@daily", "--zone", value, names="--zone")
                    for value in ("Mars/Olympus", NUL)
                ],
                *[
                    c(verb, "s1", "--kind", "noop", "--cron", "@daily", "--zone", "UTC", flag, value, names=flag)
                    for flag in ("--starts", "--ends")
                    for value in ("yesterday", "2026-01-01T00:00:00", NUL)
                ],
                c(
                    verb,
                    "s1",
                    "--kind",
                    "noop",
                    "--cron",
                    "@daily",
                    "--zone",
                    "UTC",
                    "--starts",
                    "2026-02-01T00:00:00Z",
                    "--ends",
                    "2026-01-01T00:00:00Z",
                    names="ends_at",
                ),
                *[
                    c(verb, "s1", "--kind", "noop", "--cron", "@daily", "--zone", "UTC", "--jitter", value, names="--jitter")
                    for value in ("-1", "nan", HUGE)
                ],
                *[
                    c(verb, "s1", "--kind", "noop", "--cron", "@daily", "--zone", "UTC", "--catch-up", value, names="catch_up")
                    for value in ("sometimes", NUL)
                ],
                c(
                    verb,
                    "s1",
                    "--kind",
                    "noop",
                    "--cron",
                    "@daily",
                    "--zone",
                    "UTC",
                    "--catch-up",
                    "all_within",
                    names="catch_up_window_seconds",
                ),
                *[
                    c(verb, "s1", "--kind", "noop", "--cron", "@daily", "--zone", "UTC", flag, "0", names=flag)
                    for flag in ("--window", "--max")
                ],
                c(verb, "s1", "--kind", "noop", "--cron", "@daily", "--zone", "UTC", "--overlap", "sometimes", names="overlap"),
                c(
                    verb,
                    "s1",
                    "--kind",
                    "noop",
                    "--cron",
                    "@daily",
                    "--zone",
                    "UTC",
                    "--pause-on-failures",
                    "-1",
                    names="--pause-on-failures",
                ),
                *actor_cases(verb, "s1", "--kind", "noop", "--cron", "@daily", "--zone", "UTC"),
            )
        ],
        c("update", "nope", "--cron", "@daily", names="schedule"),
        c("pause", "nope", "--reason", "r", names="schedule"),
        c("pause", "nope", names="--reason"),
        c("pause", NUL, "--reason", "r", names="name"),
        c("resume", NUL, names="name"),
        c("backfill", NUL, "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T00:00:00Z", names="name"),
        *[c("pause", "nope", "--reason", value, names="--reason") for value in (NUL, "r" * 501)],
        *actor_cases("pause", "nope", "--reason", "r"),
        c("resume", "nope", names="schedule"),
        c("resume", "nope", "--dry-run", names="schedule"),
        c("resume", "nope", "--dry-run=yes", names="--dry-run"),
        *actor_cases("resume", "nope"),
        c("run-now", "nope", names="schedule"),
        c("run-now", names="name"),
        *actor_cases("run-now", "nope"),
        c("backfill", "nope", "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T00:00:00Z", "--dry-run", names="schedule"),
        c("backfill", "nope", "--to", "2026-01-02T00:00:00Z", names="--from"),
        c("backfill", "nope", "--from", "2026-01-01T00:00:00Z", names="--to"),
        *[
            c("backfill", "nope", "--from", value, "--to", "2026-01-02T00:00:00Z", names="--from")
            for value in ("yesterday", "2026-01-01", NUL)
        ],
        *[c("backfill", "nope", "--from", "2026-01-01T00:00:00Z", "--to", value, names="--to") for value in ("tomorrow", NUL)],
        c("backfill", "nope", "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T00:00:00Z", "--dry-run=1", names="--dry-run"),
        *actor_cases("backfill", "nope", "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T00:00:00Z"),
    ],
    "koala_reviews": [
        c(names="action"),
        c("nope", names="action"),
        c("list", "--all=1", names="--all"),
        c("list", "--nope", names="--nope"),
        *[c("show", *value, names="review") for value in ((), ("abc",), ("999999",), (HUGE,))],
        c("approve", "999999", "--actor", "bob", names="review"),
        c("approve", "abc", names="review_id"),
        c("reject", HUGE, "--comment", "no", names="review"),
        c("show", "abc", names="review_id"),
        c("reject", "abc", "--comment", "no", names="review_id"),
        *actor_cases("approve", "{review}"),
        *actor_cases("reject", "{review}", "--comment", "no"),
        c("reject", "{review}", "--actor", "bob", names="comment"),
        # bob is a user but no reviewer; "carol" names no user; "inactive" an inactive one.
        *[
            c(decide, "{review}", "--actor", who, "--comment", "ok", names="--actor")
            for decide in ("approve", "reject")
            for who in ("bob", "carol", "inactive")
        ],
        c("approve", "{review}", names="--actor"),  # a decision names its reviewer: no default
        c("reject", "{review}", "--actor", "bob", "--comment", SURROGATE, names="--comment"),
        c("approve", "{review}", "--actor", "bob", "--comment", NUL, names="--comment"),
        c("approve", "{review}", "--actor", "bob", "--comment", "c" * 1001, names="--comment"),
    ],
    "koala_budget": [
        c(names="action"),
        c("nope", names="action"),
        c("list", "--nope", names="--nope"),
        c("create", names="name"),
        c("create", "b2", names="--scope"),
        c("create", "b2", "--scope", "nope", names="scope"),
        c("create", "b-queue", "--scope", "queue", "--target", "nope", names="--target"),
        c("create", "b-kind", "--scope", "kind", "--target", "nope", names="--target"),
        c("create", "b-queue2", "--scope", "queue", "--target", "", names="--target"),
        c("create", "b-queue3", "--scope", "queue", names="target"),
        c("create", "b-global", "--scope", "global", "--target", "default", names="target"),
        *[c("create", value, "--scope", "global", names="name") for value in ("n" * 101, NUL, SURROGATE, "", "b1")],
        *[c(*BUDGET_NEW, "--tenant", value, names="--tenant") for value in ("t" * 101, NUL, " acme")],
        *[c(*BUDGET_NEW, "--timezone", value, names="zone") for value in ("Nowhere/City", "z" * 65, NUL, "../../etc/passwd")],
        *[c(*BUDGET_NEW, "--currency", value, names="--currency") for value in ("EURO", NUL)],
        *[c(*BUDGET_NEW, "--spend", value, names="--spend") for value in (HUGE, "-1", "nan", "1.5")],
        c(*BUDGET_NEW, "--concurrency", "3000000000", names="--concurrency"),
        c(*BUDGET_NEW, "--requests", "abc", names="request"),
        c(*BUDGET_NEW, "--run-seconds", "1e3", names="--run-seconds"),
        c(*BUDGET_NEW, "--attempts", "-5", names="attempt"),
        c(*BUDGET_NEW, "--pause-on-exhaust=1", names="--pause-on-exhaust"),
        *actor_cases(*BUDGET_NEW),
        c("set", "nope", "--spend", "1", names="budget"),
        c("set", "n" * 101, "--spend", "1", names="name"),
        c("set", "b1", "--spend", HUGE, names="--spend"),
        c("set", "b1", "--concurrency", "-1", names="--concurrency"),
        *actor_cases("set", "b1", "--spend", "5"),
        c("set", "b1", "--requests", "-1", names="request"),
        c("set", "b1", "--run-seconds", HUGE, names="--run-seconds"),
        c("set", "b1", "--attempts", "1.5", names="attempt"),
        c("set", "b1", "--pause-on-exhaust=no", names="--pause-on-exhaust"),
        c("set", "b1", "--nope", names="--nope"),
        c("price", "m-small", "1", names="output_per_mtok"),
        *[c("price", value, "1", "2", names="model") for value in ("m" * 101, NUL, "")],
        c("price", "m-small", "x", "2", names="input_per_mtok"),
        c("price", "m-small", "-1", "2", names="input"),
        c("price", "m-small", "nan", "2", names="input"),
        c("price", "m-small", "1", HUGE, names="output_per_mtok"),
        *actor_cases("price", "m-small", "1", "2"),
    ],
    "koala_export": [
        c(names="action"),
        c("nope", names="action"),
        c(*EXPORT_CREATE, "--from", "2026-01-01", names="--to"),
        c("create", "--account", "acme", *EXPORT_DATES, names="--user"),
        c("create", "--user", "alice", *EXPORT_DATES, names="--account"),
        *[c("create", "--user", value, "--account", "acme", *EXPORT_DATES, names="user") for value in ("nope", NUL, SURROGATE)],
        *[c("create", "--user", "alice", "--account", value, *EXPORT_DATES, names="account") for value in ("nope", NUL)],
        *[c(*EXPORT_CREATE, "--from", value, "--to", "2026-01-31", names="--from") for value in ("2026-13-01", NUL)],
        c(*EXPORT_CREATE, "--from", "2026-02-01", "--to", "2026-01-01", names="date range"),
        *[c(*EXPORT_CREATE, *EXPORT_DATES, "--format", value, names="format") for value in ("xlsx", NUL)],
        *[c(*EXPORT_CREATE, *EXPORT_DATES, "--max-rows", value, names="--max-rows") for value in ("0", "-1", HUGE)],
        c(*EXPORT_CREATE, *EXPORT_DATES, "--max-bytes", "abc", names="--max-bytes"),
        *[c(*EXPORT_CREATE, *EXPORT_DATES, "--time-limit", value, names="--time-limit") for value in ("nan", "inf", "0")],
        c("show", "999999", "--user", "alice", names="export"),
        c("show", "abc", "--user", "alice", names="export_id"),
        c("show", HUGE, "--user", "alice", names="export"),
        c("show", "{export}", names="--user"),
        *[c("show", "{export}", "--user", value, names="user") for value in ("nope", NUL)],
        *[c("list", "--limit", value, names="--limit") for value in ("-1", "0", "abc", "nan", HUGE)],
        c("cancel", "999999", "--user", "alice", names="export"),
        c("cancel", "{export}", "--user", "nope", names="--user"),
        c("cancel", "abc", "--user", "alice", names="export_id"),
        *[
            c("cancel", "{export}", "--user", "alice", "--reason", value, names="--reason")
            for value in (NUL, SURROGATE, "r" * 501)
        ],
        c("clean", "--nope", names="--nope"),
        c("clean", "extra", names="extra"),
    ],
    "koala_apikey": [
        c(names="action"),
        c("nope", names="action"),
        c("create", "--scope", "worker", names="--name"),
        *[c("create", "--name", value, "--scope", "worker", names="--name") for value in ("", "n" * 101, NUL, SURROGATE)],
        c("create", "--name", "ci", names="--scope"),
        *[c("create", "--name", "ci", "--scope", value, names="--scope") for value in ("root", "", NUL, "Worker")],
        c("create", "--name", "ci", "--scope", names="--scope"),
        c(*KEY_NEW, "--person", "nope", names="person"),
        c(*KEY_NEW, "--person", "bob", "--person", "", names="--person"),
        *[c(*KEY_NEW, "--person", value, names="--person") for value in (NUL, SURROGATE, "u" * 151, "bad name!")],
        c(*KEY_NEW, "--person", "inactive", names="person"),
        *[
            c(*KEY_NEW, "--expires-in-days", value, names="--expires-in-days")
            for value in ("0", "-1", "1.5", "abc", "3661", HUGE)
        ],
        *actor_cases(*KEY_NEW),
        *[
            c(*KEY_NEW, "--kinds", value, names="--kinds")
            for value in ("", "nope", "noop@9", "noop@x", "@1", "noop,,boom", " , ", NUL, SURROGATE, "k" * 2001)
        ],
        *[c(*KEY_NEW, "--queues", value, names="--queues") for value in ("", "nope", "default,nope", "default,", NUL, SURROGATE)],
        c(*KEY_NEW, "--nope", names="--nope"),
        c("list", "--nope", names="--nope"),
        c("list", "extra", names="extra"),
        c("revoke", names="prefix"),
        *[c("revoke", value, names="prefix") for value in ("abc", "kk_", "KK_0123ABCD", "0123abcd0", NUL, SURROGATE, "")],
        c("revoke", "0123abcd", names="key"),
        c("revoke", "{revoked_key}", names="key"),
        *actor_cases("revoke", "{apikey}"),
        c("revoke", "{apikey}", "--nope", names="--nope"),
    ],
    "koala_demo_data": [
        *[c("--rows", "10", "--days", value, names="--days") for value in ("0", "36501", "abc", HUGE)],
        c("--rows", "10", "--truncate", "--days", "0", names="--days"),
        c("--rows", "10", "--member", "nope", names="user"),
        *[c("--rows", "10", "--member", value, names="--member") for value in (NUL, SURROGATE)],
        *[c("--rows", "10", "--accounts", value, names="--accounts") for value in ("0", "1001", HUGE)],
        *[c("--rows", value, names="--rows") for value in ("-1", "1e3", HUGE)],
        *[c("--rows", "10", "--start", value, names="--start") for value in ("2026-02-30", NUL)],
        c("--rows", "10", "--seed", "abc", names="--seed"),
        *actor_cases("--rows", "10", "--member", "alice"),
        c("--truncate=1", names="--truncate"),
        c("--nope", names="--nope"),
    ],
    "koala_prune": [
        *[c("--dry-run", "--days", value, names="--days") for value in ("-1", "36501", "abc", "1.5", HUGE, NUL)],
        *[c("--dry-run", "--batches", value, names="--batches") for value in ("0", "-1", "abc", HUGE)],
        c("--days", names="--days"),
        c("--dry-run=1", names="--dry-run"),
        c("--nope", names="--nope"),
    ],
    "koala_tick": [
        c(names="task"),  # missing: exit 2, like argparse's own refusals
        *[c(value, names="task") for value in ("nope", "PRUNE", "", NUL, SURROGATE, "prune;budget-report")],
        *[c("prune", "--lease-seconds", value, names="--lease-seconds") for value in ("0", "-1", "nan", "inf", "abc", "1e9")],
        c("--list=yes", names="--list"),
        c("prune", "--nope", names="--nope"),
    ],
    "koala_status": [
        c("--json=yes", names="--json"),
        c("--nope", names="--nope"),
        c("extra", names="extra"),
    ],
}


# -- the harness -----------------------------------------------------------------------------------


def koala_commands() -> dict[str, str]:
    return {name: app for name, app in get_commands().items() if app in KOALA_APPS}


def koala_tables() -> list[str]:
    models = [m for label in (*KOALA_APPS, "auth") for m in apps.get_app_config(label).get_models(include_auto_created=True)]
    return sorted({m._meta.db_table for m in models if m._meta.managed and not m._meta.proxy})


def table_state() -> dict[str, tuple[int, int]]:
    """Per table: its row count and a hash of all its rows (an UPDATE changes it too)."""
    parts = [
        f"SELECT %s, count(*), coalesce(sum(hashtext(t::text)::bigint), 0) FROM {connection.ops.quote_name(table)} t"
        for table in koala_tables()
    ]
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), koala_tables())
        return {table: (count, digest) for table, count, digest in cursor.fetchall()}


class Hung(BaseException):
    """The command did not return in time (it started working on bad input)."""


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    crash: str = ""  # an exception that escaped the command: a traceback for the person


def run_in_process(argv: list[str], *, timeout: float = 15.0) -> Outcome:
    """``manage.py ARGV`` in this process, as Django runs it (run_from_argv), output captured."""
    # Like the real streams: text over bytes (koala_run writes to stdout.buffer); stderr escapes.
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)
    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGALRM)
    previous = {s: signal.getsignal(s) for s in handled}

    def hung(signum: int, frame: Any) -> None:
        raise Hung()

    signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    code, crash = 0, ""
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            full = ["manage.py", *argv]
            ManagementUtility(full).fetch_command(argv[0]).run_from_argv(full)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Hung:
        code, crash = -1, f"still running after {timeout:.0f}s"
    except BaseException:
        code, crash = -1, traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s, handler in previous.items():
            signal.signal(s, handler)
    return Outcome(code, _text(out), _text(err), crash)


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode(errors="replace")


def _normal(text: str) -> str:
    return text.lower().replace("-", "_").lstrip("_")


def problems(outcome: Outcome, names: str) -> list[str]:
    """What is wrong with how a command answered bad input (empty: a clean refusal)."""
    found = []
    if outcome.crash:
        found.append("traceback: " + outcome.crash.strip().splitlines()[-1][:200])
    elif outcome.code == 0:
        found.append("exit 0")
    if "Traceback" in outcome.stdout + outcome.stderr:
        found.append("Traceback printed")
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    if not outcome.crash:
        if not lines:
            found.append("no message on stderr")
        else:
            message = lines[-1]
            # One line, or argparse's usage (which may wrap) followed by its one error line.
            if len(lines) > 1 and not lines[0].startswith("usage:"):
                found.append(f"{len(lines)} lines on stderr")
            if _normal(names) not in _normal(message):
                found.append(f"message does not name {names}: {message[:120]!r}")
            if len(message) > 400:
                found.append(f"message is {len(message)} characters")
    return found


def describe(argv: list[str]) -> str:
    shown = " ".join(repr(a) if (not a or len(a) > 40 or not a.isprintable() or " " in a) else a for a in argv)
    return shown if len(shown) < 160 else shown[:157] + "..."


# -- seeds: real rows for the cases to point at -----------------------------------------------------


@pytest.fixture
def seeds(
    tmp_path: Path, redis_clean: None, monkeypatch: pytest.MonkeyPatch, settings: Any, export_root: Path
) -> Iterator[dict[str, str]]:
    settings.SECRET_KEY = "test-command-input-" + "k1m2n3" * 8  # the commands' system checks pass
    monkeypatch.setenv("KOALA_DATA_DIR", str(tmp_path / "data"))
    alice = User.objects.create_user("alice", password="x")
    User.objects.create_user("bob", password="x")
    acme = Account.objects.create(slug="acme", name="Acme")
    acme.members.add(alice)
    generate_events(rows=20, accounts=[acme])
    export = request_export(user=alice, account_id=acme.pk, date_from=_date("2026-01-01"), date_to=_date("2026-01-31"))
    job = enqueue(kind="noop", input={"n": 1}, delay_seconds=3600).job_id  # stays queued while the seeds drain
    failed = run_until(enqueue(kind="terminal", input={}).job_id, "failed").pk
    parked = enqueue(kind="tests.charge", input={"world": str(tmp_path / "world.log"), "amount": 6000}, created_by="alice")
    run_until(parked.job_id, "parked")
    review = ReviewRequest.objects.get(job_id=parked.job_id, state="pending").pk
    budgets.create_budget(name="b1", scope="global", actor="setup")
    # koala_schedule update's cases change this one (and must not).
    schedule_services.create_schedule(name="s1", actor="setup", kind="noop", cron="@daily", zone="UTC")
    budgets.set_model_price(model="m-small", input_minor_per_mtok=300, output_minor_per_mtok=1500, actor="setup")
    pause = pauses.pause(scope="queue", target="bulk", reason="held for the resume cases", actor="setup").pk
    User.objects.create_user("inactive", password="x", is_active=False)
    apikey = create_key(name="seed", scopes=["worker"], actor="setup")[0].prefix
    revoked_key = create_key(name="seed, revoked", scopes=["worker"], actor="setup")[0]
    revoke_key(key_id=revoked_key.pk, actor="setup")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield {
            "job": str(job),
            "failed": str(failed),
            "review": str(review),
            "export": str(export.pk),
            "pause": str(pause),
            "apikey": apikey,
            "revoked_key": "kk_" + revoked_key.prefix,
            "busy_port": str(busy.getsockname()[1]),
        }


def _date(text: str) -> Any:
    from datetime import date

    return date.fromisoformat(text)


# -- the tests -------------------------------------------------------------------------------------


def _arguments(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """(subcommand path, argument) for every argument a Koala command defines."""
    for action in parser._actions:
        if action.dest in DJANGO_DESTS:
            continue
        if isinstance(action, argparse._SubParsersAction):
            yield path, action.dest
            for name, sub in action.choices.items():
                yield from _arguments(sub, (*path, name))
        else:
            yield path, action.option_strings[-1] if action.option_strings else action.dest


def test_every_command_and_argument_has_cases() -> None:
    commands = koala_commands()
    assert set(commands) == set(TABLE), (
        f"commands without a table entry: {sorted(set(commands) - set(TABLE))}; "
        f"table entries without a command: {sorted(set(TABLE) - set(commands))}"
    )
    missing = []
    for name, app in commands.items():
        parser = load_command_class(app, name).create_parser("manage.py", name)
        for path, argument in _arguments(parser):
            cases = [case for case in TABLE[name] if case.args[: len(path)] == path]
            named = any(_normal(case.names) == _normal(argument) for case in cases)
            if not named and not any(argument in case.args[len(path) :] for case in cases):
                missing.append(f"{name} {' '.join(path)} {argument}".replace("  ", " "))
    assert not missing, f"arguments without a malformed-input case: {missing}"


@pytest.mark.parametrize("command", sorted(TABLE))
def test_malformed_input_is_refused_cleanly_and_changes_nothing(command: str, seeds: dict[str, str]) -> None:
    failures = []
    for case in TABLE[command]:
        argv = [command, *case.argv(seeds)]
        before = table_state()
        outcome = run_in_process(argv)
        after = table_state()
        found = problems(outcome, case.names)
        changed = sorted(t for t in before if before[t] != after.get(t))
        if changed:
            found.append(f"changed {', '.join(changed)}")
        if found:
            failures.append(f"{describe(argv)}: {'; '.join(found)}")
    assert not failures, f"{len(failures)} of {len(TABLE[command])} cases misbehaved:\n" + "\n".join(failures)


# -- through a real manage.py ------------------------------------------------------------------


def run_manage(args: list[str | bytes], *, timeout: float = 30.0, **env: str) -> Outcome:
    environment = worker_env(**env)
    environment.pop("DEBUG", None)
    try:
        done = subprocess.run(
            [sys.executable, str(REPO / "manage.py"), *args], cwd=REPO, env=environment, capture_output=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace"), (exc.stderr or b"").decode(errors="replace")
        return Outcome(-1, *output, crash=f"still running after {timeout:.0f}s")
    return Outcome(done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))


@pytest.mark.slow  # a manage.py subprocess
@pytest.mark.parametrize(
    ("args", "names"),
    [
        ([b"koala_enqueue", b"noop", b"--actor", b"\xff"], "--actor"),
        ([b"koala_pause", b"--queue", b"default", b"--reason", b"caf\xe9"], "--reason"),
        ([b"koala_budget", b"create", b"\xff\xfe", b"--scope", b"global"], "name"),
        ([b"koala_worker", b"--queues", b"nope"], "--queues"),  # without --burst: today it serves forever
        ([b"koala_beat", b"--interval", b"nan"], "--interval"),  # today: a busy loop
        ([b"koala_run", b"--port", b"99999"], "--port"),  # today: migrates, seeds, starts everything
    ],
    ids=["enqueue-actor-bytes", "pause-reason-latin1", "budget-name-bytes", "worker-unknown-queue", "beat-nan", "run-port"],
)
def test_through_manage_py(args: list[str | bytes], names: str, seeds: dict[str, str]) -> None:
    before = table_state()
    outcome = run_manage(args)
    found = problems(outcome, names)
    assert not found, f"{found}\nstdout: {outcome.stdout[-2000:]}\nstderr: {outcome.stderr[-2000:]}"
    assert table_state() == before
    assert "Operations to perform" not in outcome.stdout  # koala_run did not migrate


@pytest.mark.slow  # a manage.py subprocess
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "1e999"])
def test_non_finite_environment_number_stops_startup(value: str) -> None:
    outcome = run_manage(["check"], KOALA_LEASE_SECONDS=value)
    assert outcome.code == 2, outcome
    assert "KOALA_LEASE_SECONDS" in outcome.stderr and "finite" in outcome.stderr
    assert "Traceback" not in outcome.stderr


@pytest.mark.alone  # each command must finish within run_in_process's 15 s, koala_demo included
def test_valid_invocations_still_work(seeds: dict[str, str]) -> None:
    """The same harness on good input: the refusals above are not a command that refuses everything."""
    ok = [
        ["koala_enqueue", "noop", "--input", json.dumps({"n": 2}), "--queue", "bulk", "--delay", "1.5", "--actor", "ops"],
        ["koala_jobs", "--queue", "default", "--kind", "noop", "--limit", "5"],
        ["koala_job", seeds["job"], "--actor", "ops"],
        ["koala_pause", "--kind", "noop", "--reason", "deploy", "--expires-in", "30", "--actor", "ops"],
        ["koala_resume", "--kind", "noop", "--note", "done", "--actor", "ops"],
        ["koala_pause", "--kind", "noop", "--tenant", "acme", "--reason", "acme only", "--actor", "ops"],
        ["koala_resume", "--kind", "noop", "--tenant", "acme", "--actor", "ops"],
        ["koala_budget", "create", "q", "--scope", "queue", "--target", "bulk", "--spend", "100", "--concurrency", "2"],
        ["koala_budget", "set", "q", "--spend", "none", "--actor", "ops"],
        ["koala_budget", "price", "m-large", "900", "4500"],
        ["koala_export", "list", "--limit", "3"],
        ["koala_export", "show", seeds["export"], "--user", "alice"],
        ["koala_demo_data", "--rows", "10", "--accounts", "2", "--days", "3", "--member", "bob", "--actor", "ops"],
        ["koala_requeue", seeds["job"], "--actor", "ops"],
        ["koala_cancel", seeds["job"], "--reason", "not needed", "--actor", "ops"],
        ["koala_retry", seeds["failed"], "--actor", "ops"],
        ["koala_reviews", "list", "--all"],
        ["koala_reviews", "show", seeds["review"]],
        ["koala_resume", seeds["pause"], "--note", "", "--actor", "ops"],
        ["koala_export", "cancel", seeds["export"], "--user", "alice", "--reason", "not needed"],
        ["koala_demo", "--username", "demo.admin", "--no-jobs"],
        [
            "koala_apikey",
            "create",
            "--name",
            "ci",
            "--scope",
            "worker",
            "--scope",
            "execute",
            "--person",
            "bob",
            "--expires-in-days",
            "30",
            "--kinds",
            "noop,http.probe@1",
            "--queues",
            "default",
            "--actor",
            "ops",
        ],
        ["koala_apikey", "list"],
        ["koala_apikey", "revoke", seeds["apikey"], "--actor", "ops"],
    ]
    for argv in ok:
        outcome = run_in_process(argv)
        assert outcome.code == 0 and not outcome.crash, f"{argv}: {outcome}"


@pytest.mark.slow  # a manage.py subprocess
@pytest.mark.parametrize(
    "args",
    [
        ["koala_beat", "--once", "--interval", "0.5"],
        ["koala_worker", "--queues", "default, bulk", "--name", "w-valid", "--burst", "--shutdown-deadline", "0"],
    ],
    ids=["beat", "worker"],
)
def test_long_running_commands_still_start_on_good_input(args: list[str | bytes], redis_clean: None) -> None:
    """Through manage.py: in this process they would reconfigure its runtime and database sessions."""
    outcome = run_manage(args)
    assert outcome.code == 0 and not outcome.crash, outcome
