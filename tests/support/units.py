"""The shipped systemd units (deploy/systemd/) as data, and each one's command as a test runs it.

A unit file is read as systemd reads it (sections, ``Key=value`` lines, repeated keys kept in
order, ``#``/``;`` comments, ``\\`` continuations); its ``ExecStart=`` line becomes an argument
list with the specifiers systemd expands (``%d %H %i %n %N %%``; any other is an error, so a new
one cannot slip by unexpanded). ``Host`` is a temporary tree laid out like a host installed as
docs/operations.md says: ``/opt/koala`` (a symlink to this checkout, its ``.venv`` included),
``/etc/koala/koala.env`` (the env example, with the test's database and Redis), the credentials
folder (``%d``), ``/var/lib/koala`` (the units' ``StateDirectory=``). Every host path in a
command, an ``Environment=`` value or the env file is moved under that tree, and the process gets
the environment systemd gives a service: its own variables and nothing inherited from the test.
"""

from __future__ import annotations

import secrets
import shlex
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UNITS_DIR = REPO / "deploy" / "systemd"
ENV_EXAMPLE = UNITS_DIR / "koala.env.example"
# The timer-started housekeeping: koala_tick TASK under koala-TASK.service, started by koala-TASK.timer.
TICK_TASKS = ("prune", "export-cleanup", "budget-report")
TICK_SERVICES = tuple(f"koala-{task}.service" for task in TICK_TASKS)
TIMER_UNITS = tuple(f"koala-{task}.timer" for task in TICK_TASKS)
SERVICE_UNITS = ("koala-migrate.service", "koala-web.service", "koala-worker@.service", "koala-beat.service", *TICK_SERVICES)
ALL_UNITS = (*SERVICE_UNITS, "koala-alert@.service", *TIMER_UNITS)
# The service user every unit runs as, and the credential files the workers load besides secret_key.
SERVICE_USER = "koala-agent"
PROVIDER_CREDENTIALS = ("payments_api_key", "models_api_key")
# The host folders the units name, and what each is (moved under Host.root by the tests).
HOST_CODE, HOST_CONFIG, HOST_STATE = "/opt/koala", "/etc/koala", "/var/lib/koala"
# What systemd's service manager puts in every service's environment before the unit's own.
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"


@dataclass
class Unit:
    path: Path
    sections: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.name

    def values(self, section: str, key: str) -> list[str]:
        return [value for k, value in self.sections.get(section, []) if k == key]

    def value(self, section: str, key: str) -> str | None:
        """The last assignment (what systemd uses for a single-valued key), or None."""
        found = self.values(section, key)
        return found[-1] if found else None

    def instance_name(self, instance: str = "1") -> str:
        """``koala-worker@1.service`` for a template, the name itself otherwise."""
        return self.name.replace("@.", f"@{instance}.") if "@." in self.name else self.name


def parse_unit(path: Path) -> Unit:
    unit = Unit(path=path)
    section: str | None = None
    pending = ""
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = pending + raw.strip() if pending else raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            unit.sections.setdefault(section, [])
            continue
        key, sep, value = line.partition("=")
        if not sep or section is None:
            raise ValueError(f"{path.name}:{number}: not a Key=value line inside a section: {raw!r}")
        unit.sections[section].append((key.strip(), value.strip()))
    return unit


def units() -> dict[str, Unit]:
    return {name: parse_unit(UNITS_DIR / name) for name in ALL_UNITS}


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=value`` lines as systemd's EnvironmentFile= reads them (the example uses no quotes)."""
    values: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ValueError(f"{path.name}:{number}: not a KEY=value line: {raw!r}")
        if value[:1] in ("'", '"'):
            raise ValueError(f"{path.name}:{number}: quoted values are not read here; write {key}=value")
        values[key.strip()] = value.strip()
    return values


def expand_specifiers(text: str, *, unit_name: str, credentials: str, hostname: str) -> str:
    """systemd's specifiers, as expanded for ``unit_name`` (an instance name for a template)."""
    prefix = unit_name.rpartition(".")[0]
    instance = prefix.partition("@")[2]
    table = {"d": credentials, "H": hostname, "i": instance, "n": unit_name, "N": prefix, "%": "%"}
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "%":
            spec = text[i + 1 : i + 2]
            if spec not in table:
                raise ValueError(f"{unit_name}: the specifier %{spec} is not one this test expands: {text!r}")
            out.append(table[spec])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def command_line(value: str) -> list[str]:
    """An ``ExecStart=`` value as argv: no prefix (``-@:+!``) and no ``$VAR`` (the units use none,
    so a command here is exactly what systemd runs)."""
    if value[:1] in "-@:+!":
        raise ValueError(f"ExecStart prefixes are not expected in Koala's units: {value!r}")
    if "$" in value:
        raise ValueError(f"ExecStart must not expand variables (systemd and this test would differ): {value!r}")
    return shlex.split(value)


class Host:
    """A temporary tree laid out like an installed host (see the module docstring)."""

    def __init__(self, root: Path, *, env_overrides: dict[str, str]) -> None:
        self.root = root
        self.hostname = socket.gethostname()
        (root / "opt").mkdir(parents=True)
        (root / HOST_CODE.lstrip("/")).symlink_to(REPO)
        self.state = root / HOST_STATE.lstrip("/")
        self.state.mkdir(parents=True, mode=0o750)  # StateDirectory=koala, StateDirectoryMode=0750
        self.config = root / HOST_CONFIG.lstrip("/")
        (self.config / "credentials").mkdir(parents=True, mode=0o700)
        (self.config / "credentials" / "secret_key").write_text(secrets.token_urlsafe(50) + "\n")
        # The provider keys the workers load, empty as docs/operations.md installs them until a
        # provider is configured (an empty key is an unset one).
        for name in PROVIDER_CREDENTIALS:
            (self.config / "credentials" / name).write_text("")
        # The web's bearer token for /metrics, random as the install writes it.
        self.metrics_token = secrets.token_urlsafe(32)
        (self.config / "credentials" / "metrics_token").write_text(self.metrics_token + "\n")
        self.env_file = self.config / "koala.env"
        example = read_env_file(ENV_EXAMPLE)
        unknown = set(env_overrides) - set(example)
        if unknown:
            raise ValueError(f"overrides for variables the env example does not set: {sorted(unknown)}")
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in {**example, **env_overrides}.items()))

    def path(self, host_path: str) -> str:
        """A host path (or a value starting with one) moved under the tree; anything else unchanged."""
        for prefix in (HOST_CODE, HOST_CONFIG, HOST_STATE):
            if host_path == prefix or host_path.startswith(prefix + "/"):
                return str(self.root / prefix.lstrip("/")) + host_path[len(prefix) :]
        return host_path

    def credentials_dir(self, unit: Unit, instance: str = "1") -> Path:
        """What LoadCredential= gives the service: a private folder holding a copy of each credential."""
        folder = self.root / "run" / "credentials" / unit.instance_name(instance)
        if not folder.exists():
            folder.mkdir(parents=True, mode=0o700)
            for entry in unit.values("Service", "LoadCredential"):
                name, _, source = entry.partition(":")
                (folder / name).write_bytes(Path(self.path(source)).read_bytes())
        return folder

    def _expand(self, unit: Unit, text: str, instance: str) -> str:
        return expand_specifiers(
            text,
            unit_name=unit.instance_name(instance),
            credentials=str(self.credentials_dir(unit, instance)),
            hostname=self.hostname,
        )

    def environment(self, unit: Unit, instance: str = "1") -> dict[str, str]:
        """The service's environment: systemd's own variables, EnvironmentFile=, then Environment=."""
        env = {
            "PATH": SYSTEMD_PATH,
            "LANG": "C.UTF-8",
            "HOME": str(self.state),  # koala-agent's home (useradd --home-dir /var/lib/koala)
            "CREDENTIALS_DIRECTORY": str(self.credentials_dir(unit, instance)),
        }
        if unit.value("Service", "StateDirectory"):
            env["STATE_DIRECTORY"] = self.path(f"/var/lib/{unit.value('Service', 'StateDirectory')}")
        for name in unit.values("Service", "EnvironmentFile"):
            if self.path(name) != str(self.env_file):
                raise ValueError(f"{unit.name}: EnvironmentFile={name} is not /etc/koala/koala.env")
            env.update({key: self.path(value) for key, value in read_env_file(self.env_file).items()})
        for assignment in unit.values("Service", "Environment"):
            for word in shlex.split(assignment):
                key, _, value = self._expand(unit, word, instance).partition("=")
                env[key] = self.path(value)
        return env

    def commands(self, unit: Unit, *, instance: str = "1", port: int | None = None, key: str = "ExecStart") -> list[list[str]]:
        """Every ExecStart= (or ``key``: ExecStartPre=) of the unit (a oneshot may have several)
        as argv under the tree; ``port`` replaces the value of ``--port``."""
        result = []
        for line in unit.values("Service", key):
            argv = [self.path(word) for word in command_line(self._expand(unit, line, instance))]
            if port is not None:
                if "--port" not in argv:
                    raise ValueError(f"{unit.name}: no --port to replace in {argv}")
                argv[argv.index("--port") + 1] = str(port)
            result.append(argv)
        return result

    def cwd(self, unit: Unit) -> str:
        directory = unit.value("Service", "WorkingDirectory")
        if directory is None:
            raise ValueError(f"{unit.name} has no WorkingDirectory=")
        return self.path(directory)


# -- MemoryDenyWriteExecute=yes, as the kernel enforces it ------------------------------------------
PR_SET_MDWE, PR_GET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 66, 1


def refuse_write_execute() -> None:
    """For ``preexec_fn``: the process (and everything it execs or forks) may never map memory
    writable and executable, nor make writable memory executable: what the units'
    ``MemoryDenyWriteExecute=yes`` enforces (systemd 252 with a seccomp filter, later ones with
    this prctl; Linux 6.3 or later). Raises OSError on an older kernel."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, "prctl(PR_SET_MDWE) refused: this kernel cannot deny write+execute memory")


def kernel_can_refuse_write_execute() -> bool:
    """Whether ``refuse_write_execute`` works here (checked in a throw-away child)."""
    import subprocess
    import sys

    probe = (
        "import ctypes, mmap\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"assert libc.prctl({PR_SET_MDWE}, {PR_MDWE_REFUSE_EXEC_GAIN}, 0, 0, 0) == 0\n"
        "try:\n"
        "    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "except PermissionError:\n"
        "    raise SystemExit(0)\n"
        "raise SystemExit(1)\n"
    )
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=30).returncode == 0


# -- SystemCallFilter=, as the kernel enforces it ---------------------------------------------------
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_ERRNO_EPERM = 0x00050000 | 1  # SCMP_ACT_ERRNO(EPERM): SystemCallErrorNumber=EPERM


def syscall_groups(tool: str) -> dict[str, list[str]]:
    """systemd's system call groups (``@name`` → members, nested groups by name), as this
    systemd-analyze lists them."""
    import subprocess

    listed = subprocess.run([tool, "syscall-filter", "--no-pager"], capture_output=True, text=True, timeout=60, check=True).stdout
    groups: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in listed.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.strip(), [])
        elif current is not None and line.strip() and not line.strip().startswith("#"):
            current.append(line.strip())
    return groups


def _expand(names: list[str], groups: dict[str, list[str]]) -> set[str]:
    found: set[str] = set()
    for name in names:
        found |= _expand(groups[name], groups) if name.startswith("@") else {name}
    return found


def allowed_syscalls(unit: Unit, groups: dict[str, list[str]]) -> set[str]:
    """What the unit's ``SystemCallFilter=`` lines allow, read as systemd reads them: the first,
    an allow list, sets the default (deny) and what is allowed, with ``@default`` always allowed;
    each later ``~…`` line removes calls, each later plain line adds them back."""
    lines = unit.values("Service", "SystemCallFilter")
    if not lines or lines[0].startswith("~"):
        raise ValueError(f"{unit.name}: expected an allow list first, not {lines}")
    allowed = _expand(lines[0].split(), groups) | _expand(["@default"], groups)
    for line in lines[1:]:
        if line.startswith("~"):
            allowed -= _expand(line[1:].split(), groups)
        else:
            allowed |= _expand(line.split(), groups)
    return allowed


def confinement(unit: Unit, *, groups: dict[str, list[str]] | None, write_execute: bool) -> Callable[[], None]:
    """A ``preexec_fn`` giving the process what the kernel enforces for the unit here, without
    systemd: its system call filter (libseccomp; refused calls fail with EPERM, as
    ``SystemCallErrorNumber=EPERM`` says) when ``groups`` is given, and ``MemoryDenyWriteExecute``
    when ``write_execute``. Inherited by everything the process forks and execs."""
    allowed = sorted(allowed_syscalls(unit, groups)) if groups is not None else None

    def apply() -> None:
        if write_execute:
            refuse_write_execute()
        if allowed is None:
            return
        import ctypes

        seccomp = ctypes.CDLL("libseccomp.so.2", use_errno=True)
        seccomp.seccomp_init.restype = ctypes.c_void_p
        seccomp.seccomp_init.argtypes = [ctypes.c_uint32]
        seccomp.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
        seccomp.seccomp_load.argtypes = [ctypes.c_void_p]
        seccomp.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        context = seccomp.seccomp_init(SCMP_ACT_ERRNO_EPERM)
        if not context:
            raise OSError("seccomp_init failed")
        for name in allowed:
            number = seccomp.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                continue  # not a call of this architecture (SystemCallArchitectures=native)
            if seccomp.seccomp_rule_add(context, SCMP_ACT_ALLOW, number, 0) != 0:
                raise OSError(f"seccomp_rule_add({name}) failed")
        if seccomp.seccomp_load(context) != 0:
            raise OSError("seccomp_load failed")

    return apply
