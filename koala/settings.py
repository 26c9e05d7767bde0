"""Koala settings: everything comes from the environment (see docs/configuration.md).

Parsing is strict (koala.env): a malformed value stops start-up naming the variable.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import environ
from django.conf import global_settings

from koala import env
from koala.env import ConfigError

BASE_DIR = Path(__file__).resolve().parent.parent

try:
    DEBUG = env.boolean("DEBUG", False)
    # Outside debug the system check koala.E001 refuses this placeholder.
    SECRET_KEY = env.string("SECRET_KEY", "") or "insecure-dev-only-secret-key"
    ALLOWED_HOSTS = env.string_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
    CSRF_TRUSTED_ORIGINS = env.string_list("CSRF_TRUSTED_ORIGINS", [])

    _database_url = env.string("DATABASE_URL", "")
    _redis_url = env.string("REDIS_URL", "")
    if not _database_url:
        raise ConfigError(
            "DATABASE_URL is not set. Use `make run`/`make test` (which start an embedded "
            'PostgreSQL when it is unset), `make manage ARGS="COMMAND ..."` or `scripts/manage COMMAND ...` '
            "for a command beside `make run`, or set DATABASE_URL=postgres://user@host:5432/db."
        )
    # Redis: one server by URL, or the master of a Redis Sentinel group (koala/redis_client.py).
    KOALA_REDIS_SENTINELS = env.host_ports("KOALA_REDIS_SENTINELS")
    KOALA_REDIS_SENTINEL_MASTER = env.string("KOALA_REDIS_SENTINEL_MASTER", "").strip()
    KOALA_REDIS_SENTINEL_PASSWORD = env.string("KOALA_REDIS_SENTINEL_PASSWORD", "")  # secret: the sentinels' own AUTH
    KOALA_REDIS_PASSWORD = env.string("KOALA_REDIS_PASSWORD", "")  # secret: the master's AUTH (sentinel mode)
    KOALA_REDIS_DB = env.integer("KOALA_REDIS_DB", 0, minimum=0)
    # How long one Redis command may wait for its reply: what a frozen master costs a caller
    # (an RQ worker's own connection waits at least its pop's timeout + 2 s, workers/rq_workers.py).
    KOALA_REDIS_SOCKET_TIMEOUT_SECONDS = env.number("KOALA_REDIS_SOCKET_TIMEOUT_SECONDS", 3.0, minimum=0.1)
    if KOALA_REDIS_SENTINELS:
        # Refused rather than ranked: with both set, which Redis a process uses would depend on
        # a rule the operator has to remember, and two hosts configured half-way would split.
        if _redis_url:
            raise ConfigError("REDIS_URL and KOALA_REDIS_SENTINELS are both set; set only one (docs/configuration.md, Redis).")
        if not KOALA_REDIS_SENTINEL_MASTER:
            raise ConfigError(
                "KOALA_REDIS_SENTINELS is set but KOALA_REDIS_SENTINEL_MASTER (the monitored master's name) is not."
            )
        if KOALA_REDIS_DB > 15:
            raise ConfigError(f"KOALA_REDIS_DB={KOALA_REDIS_DB} must be at most 15 (Redis has databases 0-15 by default).")
    else:
        for _name in ("KOALA_REDIS_SENTINEL_MASTER", "KOALA_REDIS_SENTINEL_PASSWORD", "KOALA_REDIS_PASSWORD", "KOALA_REDIS_DB"):
            if env.string(_name, ""):
                raise ConfigError(f"{_name} is set but KOALA_REDIS_SENTINELS is not; with REDIS_URL, put it in the URL.")
        if not _redis_url:
            raise ConfigError(
                "REDIS_URL is not set (e.g. redis://127.0.0.1:6379/0), nor KOALA_REDIS_SENTINELS + KOALA_REDIS_SENTINEL_MASTER."
            )
    try:
        _db = environ.Env.db_url_config(_database_url)
    except Exception as exc:  # django-environ raises several types for bad URLs
        raise ConfigError(f"DATABASE_URL is not a valid database URL: {exc}") from None
    if _db.get("ENGINE") != "django.db.backends.postgresql":
        raise ConfigError("DATABASE_URL must be a postgres:// URL: PostgreSQL is Koala's source of truth.")
    if _redis_url and not _redis_url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError("REDIS_URL must start with redis://, rediss:// or unix://.")
    _db["CONN_MAX_AGE"] = env.integer("DATABASE_CONN_MAX_AGE", 60, minimum=0)
    _db["CONN_HEALTH_CHECKS"] = True
    _db.setdefault("OPTIONS", {})
    # What sits between Koala and PostgreSQL (docs/scaling.md, "PgBouncer"): direct (nothing),
    # session (a pooler that gives each client connection one server session for its whole life)
    # or transaction (PgBouncer's pool_mode=transaction: each transaction may run on another
    # server session, so nothing may outlive a transaction). workers/dbsession.py checks at start
    # that the setting matches what it finds.
    KOALA_DATABASE_POOLING = env.choice("KOALA_DATABASE_POOLING", "direct", ["direct", "session", "transaction"])
    if KOALA_DATABASE_POOLING == "transaction":
        # PgBouncer 1.18 refuses libpq startup options ("unsupported startup parameter: options"),
        # prepared statements outlive the transaction that made them, and a server-side cursor of
        # an autocommit query (Django's .iterator()) is a WITH HOLD cursor: session state.
        # Django still sets the time zone (SET TIME ZONE, a parameter PgBouncer tracks per client).
        if "options" in _db["OPTIONS"]:
            raise ConfigError(
                "DATABASE_URL sets startup options, which PgBouncer in transaction mode refuses "
                "(KOALA_DATABASE_POOLING=transaction): remove ?options=… and set per-role settings instead "
                "(ALTER ROLE … SET …, docs/scaling.md)."
            )
        _db["OPTIONS"]["prepare_threshold"] = None
        _db["DISABLE_SERVER_SIDE_CURSORS"] = True
    elif KOALA_DATABASE_POOLING == "direct":
        # Every connection runs in UTC so that now() comparisons in SQL and Python agree (Django
        # sets it again with SET TIME ZONE; as a startup option it costs no round trip). Not sent
        # to a pooler: PgBouncer refuses startup options in every pool mode.
        _db["OPTIONS"].setdefault("options", "-c timezone=UTC")
    _db["TEST"] = {"NAME": env.string("DATABASE_TEST_NAME", "") or None}
    DATABASES = {"default": _db}
    REDIS_URL = _redis_url

    SENTRY_DSN = env.string("SENTRY_DSN", "")
    LOG_LEVEL = env.string("LOG_LEVEL", "INFO").upper()
    if LOG_LEVEL not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
        raise ConfigError(f"LOG_LEVEL={LOG_LEVEL!r} is not one of DEBUG, INFO, WARNING, ERROR, CRITICAL.")
    # plain: one human line per record; json: one JSON object per line (koala/log_format.py).
    KOALA_LOG_FORMAT = env.string("KOALA_LOG_FORMAT", "plain").lower()
    if KOALA_LOG_FORMAT not in {"plain", "json"}:
        raise ConfigError(f"KOALA_LOG_FORMAT={KOALA_LOG_FORMAT!r} is not one of plain, json.")

    # Koala's engine limits. Defaults: a heartbeat about every 10 s against a 30 s lease (three beats per lease).
    KOALA_LEASE_SECONDS = env.number("KOALA_LEASE_SECONDS", 30.0, minimum=1.0)
    KOALA_HEARTBEAT_SECONDS = env.number("KOALA_HEARTBEAT_SECONDS", 10.0, minimum=0.1)
    KOALA_ORPHAN_GRACE_SECONDS = env.number("KOALA_ORPHAN_GRACE_SECONDS", 10.0, minimum=0.0)
    KOALA_SHUTDOWN_DEADLINE_SECONDS = env.number("KOALA_SHUTDOWN_DEADLINE_SECONDS", 30.0, minimum=0.0)
    # Bounds on every wait of a worker's or beat's database session (workers/dbsession.py), all
    # shorter than the lease: a partitioned attempt's transaction is ended by the server (idle in
    # transaction), a reclaimer never queues behind it for long (lock), and no statement outlives
    # the lease it runs under (statement). Defaults: a third, a sixth and a third of the lease.
    KOALA_DB_STATEMENT_TIMEOUT_SECONDS = env.number("KOALA_DB_STATEMENT_TIMEOUT_SECONDS", KOALA_LEASE_SECONDS / 3, minimum=0.05)
    KOALA_DB_LOCK_TIMEOUT_SECONDS = env.number("KOALA_DB_LOCK_TIMEOUT_SECONDS", KOALA_LEASE_SECONDS / 6, minimum=0.05)
    KOALA_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS = env.number(
        "KOALA_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS", KOALA_LEASE_SECONDS / 3, minimum=0.05
    )
    KOALA_BEAT_INTERVAL_SECONDS = env.number("KOALA_BEAT_INTERVAL_SECONDS", 2.0, minimum=0.05)
    KOALA_DRAIN_BATCH = env.integer("KOALA_DRAIN_BATCH", 200, minimum=1)
    KOALA_DRAIN_SECONDS = env.number("KOALA_DRAIN_SECONDS", 5.0, minimum=0.1)
    # Batch claims (docs/engine.md): at most this many jobs per claim statement (1 turns batching off),
    # and how long a batch's completions may wait in memory for the batch's one write.
    KOALA_CLAIM_BATCH = env.integer("KOALA_CLAIM_BATCH", 16, minimum=1)
    KOALA_BATCH_COMPLETE_SECONDS = env.number("KOALA_BATCH_COMPLETE_SECONDS", 1.0, minimum=0.01)
    # The engine's hot statements are prepared once per database session (workers/prepared.py).
    # Off behind a pooler that gives each transaction another server session (PgBouncer's
    # transaction mode), where a statement prepared on one is missing on the next.
    # Default: on, except through a transaction pooler, where an explicit true is refused.
    KOALA_PREPARED_STATEMENTS = env.boolean("KOALA_PREPARED_STATEMENTS", KOALA_DATABASE_POOLING != "transaction")
    if KOALA_PREPARED_STATEMENTS and KOALA_DATABASE_POOLING == "transaction":
        raise ConfigError(
            "KOALA_PREPARED_STATEMENTS=true cannot work with KOALA_DATABASE_POOLING=transaction: a statement "
            "prepared in one transaction is missing from the server session the next one runs on. Unset it "
            "(it defaults to false in that mode) or set KOALA_PREPARED_STATEMENTS=false."
        )
    KOALA_DOORBELL_DEPTH = env.integer("KOALA_DOORBELL_DEPTH", 4, minimum=1)
    # Retention (docs/operations.md, "Retention"): finished jobs, their attempts and what hangs on
    # them are deleted this many days after they finished, by the beat, in batches of
    # KOALA_RETENTION_BATCH_SIZE rows (at most KOALA_RETENTION_BATCHES per pass, one pass every
    # KOALA_RETENTION_INTERVAL_SECONDS). 0 keeps everything forever (no pruning at all).
    KOALA_RETENTION_DAYS = env.integer("KOALA_RETENTION_DAYS", 30, minimum=0)
    KOALA_RETENTION_BATCH_SIZE = env.integer("KOALA_RETENTION_BATCH_SIZE", 1000, minimum=1)
    if KOALA_RETENTION_BATCH_SIZE > 10_000:
        # One batch is one transaction holding its rows' locks: bounded, so it stays short.
        raise ConfigError(f"KOALA_RETENTION_BATCH_SIZE={KOALA_RETENTION_BATCH_SIZE} must be at most 10000.")
    KOALA_RETENTION_BATCHES = env.integer("KOALA_RETENTION_BATCHES", 5, minimum=1)
    KOALA_RETENTION_INTERVAL_SECONDS = env.number("KOALA_RETENTION_INTERVAL_SECONDS", 60.0, minimum=1.0)
    # The worker API (docs/worker-api.md): the long-poll's idle look interval (never more than
    # twice a second), how long an acquire waits, the largest body, the API's database threads.
    KOALA_API_POLL_SECONDS = env.number("KOALA_API_POLL_SECONDS", 1.0, minimum=0.5)
    KOALA_API_ACQUIRE_WAIT_SECONDS = env.number("KOALA_API_ACQUIRE_WAIT_SECONDS", 60.0, minimum=1.0)
    KOALA_API_MAX_BODY_BYTES = env.integer("KOALA_API_MAX_BODY_BYTES", 1024 * 1024, minimum=1024)
    KOALA_API_DB_THREADS = env.integer("KOALA_API_DB_THREADS", 16, minimum=1)
    # What one API server process holds at once beyond its database threads: waiting acquires
    # (long-polls, each an open request), and calls queued for a thread. The excess is answered
    # at once with 503 busy and Retry-After (docs/worker-api.md, "Bounds of one server process").
    KOALA_API_MAX_WAITING = env.integer("KOALA_API_MAX_WAITING", 1000, minimum=1)
    KOALA_API_MAX_QUEUED_CALLS = env.integer("KOALA_API_MAX_QUEUED_CALLS", 1000, minimum=0)
    # Consecutive crashed/fatal attempts of one kind that pause it (0 turns the breaker off).
    KOALA_BREAKER_THRESHOLD = env.integer("KOALA_BREAKER_THRESHOLD", 5, minimum=0)
    # Per-attempt ceilings for kinds that declare none (workers/bounds.py; enforced by the fork
    # worker's work horse): MiB of memory above what the horse holds at the attempt's start, and
    # CPU seconds. 0 turns a ceiling off.
    KOALA_ATTEMPT_MEMORY_LIMIT_MB = env.integer("KOALA_ATTEMPT_MEMORY_LIMIT_MB", 0, minimum=0)
    KOALA_ATTEMPT_CPU_LIMIT_SECONDS = env.integer("KOALA_ATTEMPT_CPU_LIMIT_SECONDS", 0, minimum=0)
    # How long a reviewer has to decide, and how long an approval stays usable.
    KOALA_REVIEW_TTL_SECONDS = env.number("KOALA_REVIEW_TTL_SECONDS", 86400.0, minimum=1.0)
    KOALA_APPROVAL_TTL_SECONDS = env.number("KOALA_APPROVAL_TTL_SECONDS", 3600.0, minimum=1.0)
    KOALA_JOB_KIND_MODULES = env.string_list(
        "KOALA_JOB_KIND_MODULES", ["workers.builtin_kinds", "effects.kinds", "exports.jobs", "flows.kinds"]
    )
    if "workers.tasks_backend" not in KOALA_JOB_KIND_MODULES:
        # django.tasks' @task functions run as the "django.task" kind on every worker.
        KOALA_JOB_KIND_MODULES.append("workers.tasks_backend")
    # The worker API's keys (api/keys.py): how long a process trusts a key it has checked before it
    # checks all it holds again (one query); a revoke reaches the other processes sooner, on Redis.
    KOALA_API_KEY_CACHE_SECONDS = env.number("KOALA_API_KEY_CACHE_SECONDS", 30.0, minimum=0.0)
    KOALA_REDACT_EXTRA_PATTERNS = env.string_list("KOALA_REDACT_EXTRA_PATTERNS", [])
    # The console's worker health (R3): alive but nothing started or finished for this long is
    # "stuck"; this many short-lived starts of one host/queue set within the window is a crash loop.
    KOALA_STUCK_AFTER_SECONDS = env.number("KOALA_STUCK_AFTER_SECONDS", 300.0, minimum=1.0)
    KOALA_CRASH_LOOP_STARTS = env.integer("KOALA_CRASH_LOOP_STARTS", 3, minimum=2)
    KOALA_CRASH_LOOP_WINDOW_SECONDS = env.number("KOALA_CRASH_LOOP_WINDOW_SECONDS", 600.0, minimum=10.0)
    # koala_status's thresholds (docs/operations.md, "Health checks"): past the first a check
    # warns (exit 1), past the second it is critical (exit 2).
    KOALA_STATUS_DUE_AGE_WARNING_SECONDS = env.number("KOALA_STATUS_DUE_AGE_WARNING_SECONDS", 300.0, minimum=1.0)
    KOALA_STATUS_DUE_AGE_CRITICAL_SECONDS = env.number("KOALA_STATUS_DUE_AGE_CRITICAL_SECONDS", 1800.0, minimum=1.0)
    KOALA_STATUS_NO_COMPLETION_WARNING_SECONDS = env.number("KOALA_STATUS_NO_COMPLETION_WARNING_SECONDS", 900.0, minimum=1.0)
    KOALA_STATUS_NO_COMPLETION_CRITICAL_SECONDS = env.number("KOALA_STATUS_NO_COMPLETION_CRITICAL_SECONDS", 3600.0, minimum=1.0)
    KOALA_STATUS_REVIEW_AGE_WARNING_SECONDS = env.number("KOALA_STATUS_REVIEW_AGE_WARNING_SECONDS", 3600.0, minimum=1.0)
    KOALA_STATUS_REVIEW_AGE_CRITICAL_SECONDS = env.number("KOALA_STATUS_REVIEW_AGE_CRITICAL_SECONDS", 43200.0, minimum=1.0)
    KOALA_STATUS_BUDGET_WARNING_FRACTION = env.number("KOALA_STATUS_BUDGET_WARNING_FRACTION", 0.8, minimum=0.01)
    # GET /metrics (docs/metrics.md): scraped with "Authorization: Bearer <token>". Give it as
    # KOALA_METRICS_TOKEN_FILE in production (both set, or an unreadable file, stops start-up).
    # Empty: only loopback clients may scrape.
    KOALA_METRICS_TOKEN = env.string("KOALA_METRICS_TOKEN", "").strip()
    # Where Koala writes files at run time (exports, collected static files): one folder, which a
    # deployment makes writable (deploy/systemd: StateDirectory=koala, /var/lib/koala); locally
    # .koala-data/ in the checkout, beside the embedded services' data.
    KOALA_DATA_DIR = Path(env.string("KOALA_DATA_DIR", "") or BASE_DIR / ".koala-data")
    STATIC_ROOT = Path(env.string("STATIC_ROOT", "") or KOALA_DATA_DIR / "staticfiles")
    # CSV exports (docs/exports.md). The caps bound what any request may ask for; a request
    # beyond them is refused, and an export that crosses its own limits stops with a terminal reason.
    KOALA_EXPORT_ROOT = Path(env.string("KOALA_EXPORT_ROOT", "") or KOALA_DATA_DIR / "exports")
    KOALA_EXPORT_MAX_ROWS = env.integer("KOALA_EXPORT_MAX_ROWS", 10_000_000, minimum=1)
    KOALA_EXPORT_MAX_BYTES = env.integer("KOALA_EXPORT_MAX_BYTES", 4 * 1024**3, minimum=1)
    KOALA_EXPORT_MAX_SECONDS = env.number("KOALA_EXPORT_MAX_SECONDS", 3600.0, minimum=1.0)
    KOALA_EXPORT_MAX_DAYS = env.integer("KOALA_EXPORT_MAX_DAYS", 366, minimum=1)
    KOALA_EXPORT_BATCH_ROWS = env.integer("KOALA_EXPORT_BATCH_ROWS", 20_000, minimum=1)
    for _pattern in KOALA_REDACT_EXTRA_PATTERNS:
        try:
            re.compile(_pattern)
        except re.error as _bad:
            raise ConfigError(f"KOALA_REDACT_EXTRA_PATTERNS has an invalid regex {_pattern!r}: {_bad}") from None

    # Outbound providers (effects/providers/). Unset URL: jobs needing that provider fail
    # visibly (not_configured). API keys are secrets: in production give them as *_FILE.
    def _provider_url(name: str) -> str:
        url = env.string(name, "").strip().rstrip("/")
        if url and not url.startswith(("http://", "https://")):
            raise ConfigError(f"{name} must be an http:// or https:// URL.")
        return url

    KOALA_PAYMENTS_URL = _provider_url("KOALA_PAYMENTS_URL")
    KOALA_PAYMENTS_API_KEY = env.string("KOALA_PAYMENTS_API_KEY", "")
    KOALA_PAYMENTS_TIMEOUT_SECONDS = env.number("KOALA_PAYMENTS_TIMEOUT_SECONDS", 10.0, minimum=0.1)
    KOALA_MODELS_URL = _provider_url("KOALA_MODELS_URL")
    KOALA_MODELS_API_KEY = env.string("KOALA_MODELS_API_KEY", "")
    KOALA_MODELS_TIMEOUT_SECONDS = env.number("KOALA_MODELS_TIMEOUT_SECONDS", 60.0, minimum=0.1)
    KOALA_PROVIDER_CONNECT_TIMEOUT_SECONDS = env.number("KOALA_PROVIDER_CONNECT_TIMEOUT_SECONDS", 5.0, minimum=0.1)
    # Each provider's processing window (docs/effects.md, "The provider contract"): the longest a
    # request it received can take to show in a lookup by key. A lookup miss proves absence only
    # once the last send is older than this; set it from the provider's documentation, generously.
    KOALA_PAYMENTS_PROCESSING_WINDOW_SECONDS = env.number("KOALA_PAYMENTS_PROCESSING_WINDOW_SECONDS", 60.0, minimum=0.0)
    KOALA_MODELS_PROCESSING_WINDOW_SECONDS = env.number("KOALA_MODELS_PROCESSING_WINDOW_SECONDS", 60.0, minimum=0.0)
    # Traces (traces/, docs/operations.md "Traces"): exported over OTLP/HTTP only when an endpoint
    # is set. The endpoint is the receiver's base URL (/v1/traces is added unless it ends so);
    # the headers (an API key) are a secret: give them as KOALA_OTLP_HEADERS_FILE in production.
    KOALA_OTLP_ENDPOINT = _provider_url("KOALA_OTLP_ENDPOINT")
    KOALA_OTLP_HEADERS = env.headers("KOALA_OTLP_HEADERS")
    KOALA_OTLP_SERVICE_NAME = env.string("KOALA_OTLP_SERVICE_NAME", "koala").strip()
    if not 0 < len(KOALA_OTLP_SERVICE_NAME) <= 100 or any(c.isspace() and c != " " for c in KOALA_OTLP_SERVICE_NAME):
        raise ConfigError("KOALA_OTLP_SERVICE_NAME must be a name of 1 to 100 characters on one line.")
    # One export call's bound (the exporter's own retries included): a tick spends at most about twice this.
    KOALA_OTLP_TIMEOUT_SECONDS = env.number("KOALA_OTLP_TIMEOUT_SECONDS", 5.0, minimum=0.1)
    KOALA_OTLP_BATCH_SPANS = env.integer("KOALA_OTLP_BATCH_SPANS", 512, minimum=1)
    # The currency of every cost: operations' cost_minor, the model price table and budgets' spend
    # are minor units (cents) of it. Koala converts nothing; pages and commands name it.
    KOALA_COST_CURRENCY = env.string("KOALA_COST_CURRENCY", "EUR").strip().upper()
    if not re.fullmatch(r"[A-Z]{3}", KOALA_COST_CURRENCY):
        raise ConfigError(f"KOALA_COST_CURRENCY must be a 3-letter currency code, not {KOALA_COST_CURRENCY!r}.")
    # How long past that window the ledger keeps re-checking an open outcome (releasing the job
    # without using an attempt) before it parks the job needs_attention for a person.
    KOALA_RECONCILE_MAX_WAIT_SECONDS = env.number("KOALA_RECONCILE_MAX_WAIT_SECONDS", 900.0, minimum=0.0)
    # Email through Django's default mailer: SMTP when EMAIL_HOST is set, else logged as one line
    # per message, the message itself at DEBUG (effects/mailers.py; development only: nothing is delivered).
    _email_host = env.string("EMAIL_HOST", "")
    _email_options = {
        "host": _email_host,
        "port": env.integer("EMAIL_PORT", 25, minimum=1),
        "username": env.string("EMAIL_HOST_USER", ""),
        "password": env.string("EMAIL_HOST_PASSWORD", ""),
        "use_tls": env.boolean("EMAIL_USE_TLS", False),
        "use_ssl": env.boolean("EMAIL_USE_SSL", False),
        "timeout": env.number("EMAIL_TIMEOUT", 30.0, minimum=0.1),
    }
    if _email_options["use_tls"] and _email_options["use_ssl"]:
        raise ConfigError("EMAIL_USE_TLS and EMAIL_USE_SSL are both set; set only one.")
    MAILERS = {
        "default": {"BACKEND": "django.core.mail.backends.smtp.EmailBackend", "OPTIONS": _email_options}
        if _email_host
        else {"BACKEND": "effects.mailers.LoggingEmailBackend"}
    }
    DEFAULT_FROM_EMAIL = env.string("DEFAULT_FROM_EMAIL", "koala@localhost")
    # The right-hand side of the Message-IDs Koala derives from operation keys.
    KOALA_EMAIL_MESSAGE_ID_DOMAIN = (
        env.string("KOALA_EMAIL_MESSAGE_ID_DOMAIN", "") or DEFAULT_FROM_EMAIL.rpartition("@")[2] or "koala.invalid"
    )

    # HTTPS behind a TLS-terminating proxy (docs/configuration.md, "Behind a TLS proxy"). Off by
    # default, so `make run` and the tests' plain-HTTP servers work; deploy/systemd/koala.env.example
    # turns them on, and `manage.py check --deploy` warns about each one left off.
    SECURE_SSL_REDIRECT = env.boolean("KOALA_SECURE_SSL_REDIRECT", False)
    SECURE_HSTS_SECONDS = env.integer("KOALA_HSTS_SECONDS", 0, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env.boolean("KOALA_HSTS_INCLUDE_SUBDOMAINS", False)
    SECURE_HSTS_PRELOAD = env.boolean("KOALA_HSTS_PRELOAD", False)
    if (SECURE_HSTS_INCLUDE_SUBDOMAINS or SECURE_HSTS_PRELOAD) and not SECURE_HSTS_SECONDS:
        raise ConfigError(
            "KOALA_HSTS_INCLUDE_SUBDOMAINS and KOALA_HSTS_PRELOAD need KOALA_HSTS_SECONDS (no HSTS header is sent without it)."
        )
    if SECURE_HSTS_PRELOAD and (SECURE_HSTS_SECONDS < 31_536_000 or not SECURE_HSTS_INCLUDE_SUBDOMAINS):
        # The browsers' preload list takes a site only with both; a preload directive without them is a mistake.
        raise ConfigError(
            "KOALA_HSTS_PRELOAD needs KOALA_HSTS_INCLUDE_SUBDOMAINS=true and KOALA_HSTS_SECONDS of at least 31536000."
        )
    # Django reads X-Forwarded-Proto itself only when told to. Under the shipped uvicorn command the
    # ASGI server already applies it, and only from --forwarded-allow-ips; this is for a server
    # that does not (koala.wsgi), reachable by nothing but the proxy, which must set the header.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env.boolean("KOALA_TRUST_X_FORWARDED_PROTO", False) else None
    SECURE_COOKIES = env.boolean("SECURE_COOKIES", True)
except ConfigError as _exc:
    # A clear one-line message beats a traceback through the settings module.
    sys.stderr.write(f"Koala configuration error: {_exc}\n")
    raise SystemExit(2) from None

if KOALA_HEARTBEAT_SECONDS >= KOALA_LEASE_SECONDS:
    sys.stderr.write(
        "Koala configuration error: KOALA_HEARTBEAT_SECONDS must be shorter than KOALA_LEASE_SECONDS, "
        "or every lease expires between heartbeats.\n"
    )
    raise SystemExit(2)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # Before staticfiles, so runserver serves static files through WhiteNoise too (one code path).
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "workers.rq_app.DjangoRQConfig",  # django-rq, with a readable name in the admin
    # The floor plan (docs/architecture.md): the engine, the apps that plug into it, the staff
    # pages, the local tooling. Order matters only for workers.hooks: beat tasks run in it.
    "koala",
    "workers",
    "effects",
    "reviews",
    "console",
    "exports",
    "traces",
    "flows",
    "schedules",
    "api",
    "metrics",
    "devtools",
]

MIDDLEWARE = [
    # First: one redaction context per request, for its logs, Sentry events and pages (koala/redaction.py).
    "koala.redaction.RedactionMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files come from the app itself (no CDN, no extra web server); right after security headers.
    "koala.middleware.StaticFilesMiddleware",  # WhiteNoise, async-capable (koala/middleware.py)
    # Before anything reads the session or a parameter: a NUL would reach PostgreSQL (DataError, 500).
    "koala.middleware.RejectNulBytesMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "koala.urls"
WSGI_APPLICATION = "koala.wsgi.application"
ASGI_APPLICATION = "koala.asgi.application"
# The module serving the worker calls under ASGI (koala/asgi.py): configuration, like INSTALLED_APPS.
KOALA_API_ASGI_MODULE = "api.asgi"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# WhiteNoise serves straight from the finders (static/ and the apps), so the admin looks right
# without a collectstatic step; after `collectstatic` it serves STATIC_ROOT as well.
WHITENOISE_USE_FINDERS = True
# Files served at the site's root: /favicon.ico, which browsers and other clients ask for on their
# own (a 404 warning per page view otherwise). Pages link it too (templates/admin/base_site.html).
WHITENOISE_ROOT = BASE_DIR / "public"
# WhiteNoise warns about a missing STATIC_ROOT on every start; before the first collectstatic
# an empty one is correct (the finders serve everything), so make it.
try:
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)
except OSError:
    pass  # a read-only deployment has run collectstatic into it at build time
WHITENOISE_AUTOREFRESH = DEBUG

LOGIN_URL = "admin:login"

SESSION_COOKIE_SECURE = not DEBUG and SECURE_COOKIES
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SESSION_COOKIE_HTTPONLY = True
# Forms carry the CSRF token; no script needs to read the cookie.
CSRF_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

# django-rq's pages are mounted once, by Koala (workers/rq_pages.py), not as an admin model too.
RQ_SHOW_ADMIN_LINK = False
# django-rq's pages build their own clients from this (django_rq.connection_utils): the same
# server, or the same Sentinel master, as koala/redis_client.py connects to.
_rq_connection: dict[str, object] = (
    {
        "SENTINELS": KOALA_REDIS_SENTINELS,
        "MASTER_NAME": KOALA_REDIS_SENTINEL_MASTER,
        "DB": KOALA_REDIS_DB,
        "PASSWORD": KOALA_REDIS_PASSWORD or None,
        "SOCKET_TIMEOUT": KOALA_REDIS_SOCKET_TIMEOUT_SECONDS,
        "CONNECTION_KWARGS": {"socket_connect_timeout": 5},
        "SENTINEL_KWARGS": {"socket_timeout": 1, "socket_connect_timeout": 1, "password": KOALA_REDIS_SENTINEL_PASSWORD or None},
    }
    if KOALA_REDIS_SENTINELS
    else {"URL": REDIS_URL}
)
RQ_QUEUES = {
    name: {**_rq_connection, "DEFAULT_TIMEOUT": -1}
    for name in env.string_list("KOALA_QUEUES", ["default", "critical", "bulk", "exports"])
}

# Export objects go to the "exports" storage: the local folder KOALA_EXPORT_ROOT by default;
# point its BACKEND at storages.backends.s3.S3Storage (django-storages) for S3 (docs/exports.md).
STORAGES = {
    **global_settings.STORAGES,
    "exports": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(KOALA_EXPORT_ROOT), "file_permissions_mode": 0o600, "directory_permissions_mode": 0o700},
    },
}

TASKS = {"default": {"BACKEND": "workers.tasks_backend.KoalaTaskBackend", "QUEUES": list(RQ_QUEUES)}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"redact": {"()": "koala.redaction.RedactingFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "koala.log_format.JsonFormatter"},
    },
    "handlers": {
        # Drops its output once the reader is gone (a closed pipe) rather than failing every record.
        "console": {
            "class": "koala.log_handlers.PipeSafeStreamHandler",
            "formatter": KOALA_LOG_FORMAT,
            "filters": ["redact"],
        },
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        # RQ's per-message lines (koala_worker hands RQ this level); everything at LOG_LEVEL=DEBUG.
        "rq.worker": {"level": "DEBUG" if LOG_LEVEL == "DEBUG" else "WARNING"},
        # Django's own handlers format records without the redacting filter: its debug console
        # would print a request error's traceback (exception text and all) and the dev server's
        # access line carries the raw query string. Both go through Koala's handler instead
        # (no mail_admins either: ADMINS is not configurable, and it would mail tracebacks).
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        "django.server": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
if KOALA_LOG_FORMAT == "json":
    # The whole process logs JSON lines: uvicorn's own loggers (configured by uvicorn before it
    # imports the app, with handlers of their own) are handed Koala's handler once Django sets up,
    # so the web's startup, error and (if enabled) access lines are JSON too, and masked.
    LOGGING["loggers"].update(  # type: ignore[attr-defined]
        {name: {"handlers": ["console"], "level": "INFO", "propagate": False} for name in ("uvicorn", "uvicorn.access")}
    )

if SENTRY_DSN:
    import sentry_sdk

    from koala.redaction import restore_logged_exception, scrub_sentry_breadcrumb, scrub_sentry_event

    # Every event and breadcrumb is masked with the redaction context of the attempt or request
    # that produces it (docs/redaction.md). Frame locals are never collected: they hold inputs,
    # lease tokens and values a body fetched itself, which no redaction context knows.
    sentry_sdk.init(
        dsn=SENTRY_DSN,
        send_default_pii=False,
        before_send=scrub_sentry_event,  # type: ignore[arg-type]
        before_send_transaction=scrub_sentry_event,  # type: ignore[arg-type]
        before_breadcrumb=scrub_sentry_breadcrumb,  # type: ignore[arg-type]
        include_local_variables=False,
    )
    # A logged exception's event carries the exception (the log filter folds it into the text).
    sentry_sdk.get_global_scope().add_event_processor(restore_logged_exception)  # type: ignore[arg-type]
