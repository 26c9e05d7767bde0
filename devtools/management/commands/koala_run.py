"""Run the whole local demo: migrate, seed, then web server + one worker + the beat.

    manage.py koala_run [--host 127.0.0.1] [--port 8000] [--no-demo]

`make run` calls this through devtools.embedded, so it works with nothing but Python. The
web server, worker and beat (koala_beat: dispatcher, reaper and the safety layer's periodic
work; not a cron scheduler) run as child processes (same environment, each in its
own process group) with their output prefixed. Ctrl-C or SIGTERM sends SIGTERM to every
child once, waits for them (the worker finishes or hands back its jobs), kills what is
left after the grace period and exits 0; a second signal kills them at once. If a child
exits on its own, the others are stopped and the command fails.

Once the web server answers and the start-up output has settled, a short banner comes last:
the URL, the demo logins (read from ``$KOALA_DATA_DIR/logins.json``, devtools/logins.py), where
they are kept, and how to stop.

Without DEBUG in the environment the command re-executes itself with DEBUG=true: this is
a local demo, the admin must log in over plain http and runserver must serve its static
files.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from devtools import logins
from devtools.demo import sandbox_state_file
from devtools.servers import uvicorn_command
from koala import cli

MIN_GRACE_SECONDS = 35.0
FORCE_AFTER_SECONDS = 1.0  # a repeated signal sooner than this is the same Ctrl-C seen twice
# The banner waits for the web server to answer and for this long without output (the start-up
# burst of the demo jobs), but never longer than BANNER_AT_THE_LATEST after the start.
BANNER_QUIET_SECONDS = 1.0
BANNER_AT_THE_LATEST = 20.0


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    pending: bytes = b""
    reported: bool = False
    output: IO[bytes] | None = field(default=None, repr=False)


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to SIGTERM the child if koala_run dies (even by SIGKILL)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)

    return preexec


def _check_bindable(host: str, port: int) -> None:
    """Refuse an address the web server could not listen on, before anything has started.

    Otherwise the migration, the demo data and the worker and beat would all be done first,
    and only runserver would fail. Bound the way runserver binds (SO_REUSEADDR), then closed.
    """
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise CommandError(f"--host {host}: cannot be resolved ({exc}).") from None
    family, kind, proto, _, address = found[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise CommandError(f"--port {port} on --host {host}: cannot listen there ({exc.strerror}).") from None


def banner(*, url: str, found: list[logins.Login], source: Path | None, data_dir: Path | None) -> str:
    """What koala_run prints last: where to go, who to log in as (and where that is kept), how to stop."""
    lines = [f"Koala is running: {url}"]
    if found:
        lines.append(f"Logins (kept in {source}):")
        name_width = max(len(x.username) for x in found)
        password_width = max(len(x.password) for x in found)
        for login in found:
            roles = ", ".join(login.roles)
            lines.append(f"  {login.username:<{name_width}}  {login.password:<{password_width}}  {roles}".rstrip())
    else:
        lines.append('No demo logins (--no-demo): make manage ARGS="createsuperuser" creates one.')
    key, key_source = logins.read_api_key(source.parent if source is not None else None)
    if key:
        lines.append(
            f"Worker API: {url.removesuffix('/admin/')}/api/v1/ with key {key} (kept in {key_source}; docs/worker-api.md)"
        )
    lines.append('Commands beside it: make manage ARGS="koala_jobs" (or scripts/manage koala_jobs)')
    stop = "Ctrl-C stops everything"
    lines.append(f"{stop}; the data stays in {data_dir} (make clean deletes it)." if data_dir else f"{stop}.")
    rule = "=" * max(len(line) for line in lines)
    return "\n".join([rule, *lines, rule]) + "\n"


def _answers(host: str, port: int) -> bool:
    connect_to = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host.strip("[]"))  # noqa: S104
    try:
        with socket.create_connection((connect_to, port), timeout=0.2):
            return True
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Command(BaseCommand):
    help = "Run the local demo: migrate, koala_demo, then the web server (uvicorn) + koala_worker + koala_beat until Ctrl-C."
    # Checks run in handle(), once DEBUG is settled (koala.E001 refuses the dev SECRET_KEY without it).
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", type=cli.host, default="127.0.0.1", help="address for the web server (default 127.0.0.1)")
        parser.add_argument("--port", type=cli.port, default=8000, help="port for the web server, 1-65535 (default 8000)")
        parser.add_argument("--no-demo", action="store_true", help="skip koala_demo (admin user and demo jobs)")
        parser.add_argument(
            "--no-sandbox",
            action="store_true",
            help="do not start the sandbox payment/model provider (started when KOALA_PAYMENTS_URL and "
            "KOALA_MODELS_URL are both unset, so the demo's orders, charges and model calls have somewhere to go)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        _check_bindable(options["host"], options["port"])
        debug_configured = "DEBUG" in os.environ or "DEBUG_FILE" in os.environ
        wants_sandbox = (
            not options["no_sandbox"]
            and "KOALA_SANDBOX_PORT" not in os.environ
            and not (settings.KOALA_PAYMENTS_URL or settings.KOALA_MODELS_URL)
            and importlib.util.find_spec("devtools.sandbox.provider") is not None  # a checkout, not a slim deploy
        )
        if (wants_sandbox or not debug_configured) and sys.argv[1:2] == ["koala_run"]:
            if not debug_configured:
                os.environ["DEBUG"] = "true"
                self.stderr.write("koala_run: DEBUG is not set; using DEBUG=true for this local demo")
            if wants_sandbox:
                # Settings are read at start-up, so the provider's address goes into the environment
                # and this command starts again with it (as do the worker and beat it supervises).
                port = str(_free_port())
                os.environ["KOALA_SANDBOX_PORT"] = port
                os.environ["KOALA_PAYMENTS_URL"] = os.environ["KOALA_MODELS_URL"] = f"http://127.0.0.1:{port}"
                self.stderr.write(f"koala_run: sandbox payment/model provider on http://127.0.0.1:{port} (--no-sandbox to skip)")
            sys.stdout.flush()
            sys.stderr.flush()
            manage_py = str(settings.BASE_DIR / "manage.py")
            os.execv(sys.executable, [sys.executable, manage_py, *sys.argv[1:]])  # noqa: S606 - argv, no shell

        if not options.get("skip_checks"):
            self.check(display_num_errors=False)
        verbosity = options["verbosity"]
        try:
            call_command("migrate", interactive=False, verbosity=verbosity)
            if not options["no_demo"]:
                call_command("koala_demo", verbosity=verbosity)
        except KeyboardInterrupt:
            raise CommandError("interrupted before the services started") from None

        env = dict(os.environ)
        env.setdefault("DEBUG", "true")
        env["PYTHONUNBUFFERED"] = "1"
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
        host = f"[{options['host']}]" if ":" in options["host"] else options["host"]  # IPv6, as runserver reads it
        address = f"{host}:{options['port']}"
        children = [
            # The ASGI server production runs (koala/asgi.py): the admin and console, and the worker
            # API whose acquire long-polls (docs/worker-api.md). Static files come from WhiteNoise.
            Child("web", uvicorn_command(host=options["host"], port=options["port"])),
            Child("worker", [*manage, "koala_worker"]),
            Child("beat", [*manage, "koala_beat"]),
        ]
        sandbox_port = os.environ.get("KOALA_SANDBOX_PORT")
        if sandbox_port and not options["no_sandbox"]:
            # The sandbox provider the tests also use (idempotency keys, lookups by key), standing in for
            # a real payment and model API so the demo's charges and model calls complete.
            state = sandbox_state_file()  # koala_demo's uncertain charge was made against this record
            state.parent.mkdir(parents=True, exist_ok=True)
            children.insert(
                0,
                Child(
                    "sandbox",
                    [sys.executable, "-m", "devtools.sandbox.provider", "--port", sandbox_port, "--state", str(state)],
                ),
            )
        grace = max(MIN_GRACE_SECONDS, float(getattr(settings, "KOALA_SHUTDOWN_DEADLINE_SECONDS", 30.0)) + 5.0)
        supervisor = Supervisor(self, children, env, grace)
        # The launcher (devtools.embedded) exports KOALA_DATA_DIR when the data lives there.
        data_dir = Path(os.environ["KOALA_DATA_DIR"]) if os.environ.get("KOALA_DATA_DIR") else None

        def last_words() -> str:
            found, source = logins.read()
            return banner(url=f"http://{address}/admin/", found=found, source=source, data_dir=data_dir)

        supervisor.banner = last_words
        supervisor.web = (options["host"], options["port"])
        failure = supervisor.run(address)
        if failure:
            raise CommandError(failure)


class Supervisor:
    def __init__(self, command: Command, children: list[Child], env: dict[str, str], grace: float) -> None:
        self.command = command
        self.children = children
        self.env = env
        self.grace = grace
        self.width = max(len(c.name) for c in children)
        self.signals: list[tuple[int, float]] = []
        self.banner: Callable[[], str] | None = None  # printed once, when the start-up has settled
        self.web: tuple[str, int] | None = None
        self.last_output = time.monotonic()
        sys.stdout.flush()  # what migrate/koala_demo printed goes first
        self.out = sys.stdout.buffer

    def say(self, message: str) -> None:
        self.write(f"{'koala_run':>{self.width}} | {message}\n".encode())

    def write(self, data: bytes) -> None:
        """Our output, or nothing once its reader is gone.

        `make run | tee log`, then Ctrl-C: tee dies first and every write here fails (EPIPE).
        That must not end the supervisor, whose exit path SIGKILLs the children: the workers
        would never stop gracefully nor record their stop. Keep supervising; drop the output.
        """
        try:
            self.out.write(data)
            self.out.flush()
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # also spares the interpreter's final flush
            os.close(devnull)
            self.out = open(os.devnull, "wb")  # held until exit

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append((signum, time.monotonic()))

    def start(self) -> None:
        preexec = _die_with_parent()
        for child in self.children:
            child.proc = subprocess.Popen(
                child.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                process_group=0,
                preexec_fn=preexec,
            )
            assert child.proc.stdout is not None
            child.output = child.proc.stdout
            os.set_blocking(child.output.fileno(), False)

    def pump(self, selector: selectors.BaseSelector, timeout: float) -> None:
        for key, _ in selector.select(timeout):
            child: Child = key.data
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                selector.unregister(key.fd)
                self.emit(child, final=True)
                continue
            child.pending += chunk
            self.emit(child)

    def emit(self, child: Child, final: bool = False) -> None:
        *lines, child.pending = child.pending.split(b"\n")
        if final and child.pending:
            lines.append(child.pending)
            child.pending = b""
        prefix = f"{child.name:>{self.width}} | ".encode()
        if lines:
            self.last_output = time.monotonic()
            self.write(b"".join(prefix + line.rstrip(b"\r") + b"\n" for line in lines))

    def banner_due(self, now: float, started: float) -> bool:
        """The web server answers and the output has been quiet a moment (or it is getting late)."""
        if now - started >= BANNER_AT_THE_LATEST:
            return True
        if now - self.last_output < BANNER_QUIET_SECONDS:
            return False
        return self.web is None or _answers(*self.web)

    def send(self, sig: int) -> None:
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                try:
                    os.killpg(child.proc.pid, sig)
                except ProcessLookupError:
                    pass

    def run(self, address: str) -> str | None:
        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {s: signal.signal(s, self.on_signal) for s in handled}
        selector = selectors.DefaultSelector()
        failure: str | None = None
        stop_at: float | None = None
        killed = False
        try:
            self.start()
            for child in self.children:
                assert child.output is not None
                selector.register(child.output, selectors.EVENT_READ, child)
            self.say(
                f"web, worker and beat (dispatcher, reaper) started; admin at http://{address}/admin/ - Ctrl-C stops everything"
            )
            started = time.monotonic()
            while True:
                self.pump(selector, 0.2)
                now = time.monotonic()
                if self.banner is not None and stop_at is None and self.banner_due(now, started):
                    self.write(self.banner().encode())
                    self.banner = None
                for child in self.children:
                    assert child.proc is not None
                    if child.proc.poll() is not None and not child.reported:
                        child.reported = True
                        if stop_at is None:
                            failure = f"{child.name} exited unexpectedly with code {child.proc.returncode}"
                            self.say(failure + "; stopping the others")
                            stop_at = now
                            self.send(signal.SIGTERM)
                if self.signals and stop_at is None:
                    signum, _ = self.signals[0]
                    self.say(
                        f"{signal.Signals(signum).name}: stopping web, worker and beat "
                        f"(up to {self.grace:.0f}s; Ctrl-C again to kill them now)"
                    )
                    stop_at = now
                    self.send(signal.SIGTERM)
                if all(c.proc is not None and c.proc.poll() is not None for c in self.children):
                    break
                if stop_at is not None and not killed:
                    forced = any(t - stop_at > FORCE_AFTER_SECONDS for _, t in self.signals)
                    if forced or now - stop_at > self.grace:
                        left = [c.name for c in self.children if c.proc is not None and c.proc.poll() is None]
                        self.say(("killing " if forced else f"still running after {self.grace:.0f}s, killing ") + ", ".join(left))
                        self.send(signal.SIGKILL)
                        killed = True
            # Drain what the children printed on their way out.
            deadline = time.monotonic() + 2
            while selector.get_map() and time.monotonic() < deadline:
                self.pump(selector, 0.1)
        finally:
            self.send(signal.SIGKILL)  # only if we are leaving by an exception
            for child in self.children:
                if child.proc is not None:
                    child.proc.wait()
            selector.close()
            for s, handler in previous.items():
                signal.signal(s, handler)
        codes = ", ".join(f"{c.name}={c.proc.returncode}" for c in self.children if c.proc is not None)
        self.say(f"stopped ({codes})")
        return failure
