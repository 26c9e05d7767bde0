"""The shipped systemd units as systemd itself judges them (Debian 12's systemd 252, offline: no
systemd need run as init here):

- ``systemd-analyze verify`` finds nothing to say about any unit (with its host paths moved under a
  temporary tree where the programs exist: verify checks that every ``ExecStart=`` is executable);
- ``systemd-analyze security --offline=true`` scores every service's exposure at most 2.5
  (``Overall exposure level``; the hardened units score 1.2, the worker 1.4 for the two
  resource calls its work horse needs).

Each check is shown to fail on a broken copy. Whether each unit's command serves (under the
kernel's write+execute refusal, as ``MemoryDenyWriteExecute=yes`` gives it) is
tests/acceptance/test_deploy_units.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.system_tools import require_tool
from tests.support.units import ALL_UNITS, HOST_CODE, HOST_CONFIG, HOST_STATE, SERVICE_UNITS, UNITS_DIR, Host

# Starts systemd-analyze.
pytestmark = pytest.mark.slow

MAX_EXPOSURE = 2.5
SERVICES = (*SERVICE_UNITS, "koala-alert@.service")
# Templates verified as an instance: a worker, and the alert its OnFailure=koala-alert@%N.service starts.
INSTANCES = {"koala-worker@.service": "koala-worker@1.service", "koala-alert@.service": "koala-alert@koala-worker@1.service"}


def verify(tool: str, folder: Path, unit_name: str) -> list[str]:
    """What ``systemd-analyze verify`` says about a unit in ``folder`` (its own lines: a system
    unit pulled in as a dependency may have remarks of its own)."""
    done = subprocess.run(
        [tool, "verify", "--man=no", str(folder / unit_name)], capture_output=True, text=True, timeout=120, check=False
    )
    said = [line for line in (done.stdout + done.stderr).splitlines() if "koala" in line]
    return said if said or done.returncode == 0 else [f"exit {done.returncode}: {done.stderr.strip()}"]


def exposure(tool: str, path: Path) -> tuple[float, str]:
    """The overall exposure ``systemd-analyze security --offline=true`` gives a unit file, and its report."""
    done = subprocess.run(
        [tool, "security", "--offline=true", "--no-pager", str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    report = done.stdout + done.stderr
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", report)
    assert match, f"no exposure level for {path.name}: {report[-2000:]}"
    return float(match[1]), report


def host_units(tmp_path: Path) -> Path:
    """Every unit as shipped, its host paths moved under a tree laid out like the host."""
    host = Host(tmp_path / "host", env_overrides={})
    folder = tmp_path / "units"
    folder.mkdir()
    for name in ALL_UNITS:
        text = (UNITS_DIR / name).read_text()
        for prefix in (HOST_CODE, HOST_CONFIG, HOST_STATE):
            text = text.replace(prefix, host.path(prefix))
        (folder / name).write_text(text)
    return folder


def test_systemd_analyze_verify_accepts_every_unit(tmp_path: Path) -> None:
    tool = require_tool("systemd-analyze")
    folder = host_units(tmp_path)
    for name in ALL_UNITS:
        instance = INSTANCES.get(name, name)
        assert verify(tool, folder, instance) == [], f"systemd-analyze verify {instance}"


def test_systemd_analyze_verify_reports_misspelt_values_and_an_unknown_key(tmp_path: Path) -> None:
    """The check above can fail: verify exits 0 on both, so the test reads what it says."""
    tool = require_tool("systemd-analyze")
    folder = host_units(tmp_path)
    broken = tmp_path / "broken"
    broken.mkdir()
    text = (folder / "koala-beat.service").read_text()
    assert "Restart=on-failure" in text and "CPUQuota=" in text and "ProtectClock=yes" in text
    text = text.replace("Restart=on-failure", "Restart=onfailure").replace("CPUQuota=", "CPUQuotaa=")
    text = text.replace("ProtectClock=yes", "ProtectClock=maybe")
    (broken / "koala-beat.service").write_text(text)
    said = verify(tool, broken, "koala-beat.service")
    assert any("restart specifier" in line for line in said), said
    assert any("CPUQuotaa" in line for line in said), said
    assert any("Failed to parse boolean value, ignoring: maybe" in line for line in said), said


@pytest.mark.parametrize("name", SERVICES)
def test_every_service_is_exposed_at_most_2_5(name: str) -> None:
    tool = require_tool("systemd-analyze")
    score, report = exposure(tool, UNITS_DIR / name)
    print(f"{name}: exposure {score}")  # shown with -s
    assert score <= MAX_EXPOSURE, f"{name}: exposure {score} > {MAX_EXPOSURE}:\n{report}"


def test_a_service_without_its_sandbox_scores_above_the_bound(tmp_path: Path) -> None:
    """The bound can fail: the web with its sandbox lines removed (what the units had before)."""
    tool = require_tool("systemd-analyze")
    text = (UNITS_DIR / "koala-web.service").read_text()
    start, end = text.index("# -- Sandboxing"), text.index("\n[Install]")
    assert "SystemCallFilter=" in text[start:end]
    weakened = tmp_path / "koala-web.service"
    weakened.write_text(text[:start] + "NoNewPrivileges=yes\nProtectSystem=strict\n" + text[end:])
    score, report = exposure(tool, weakened)
    assert score > MAX_EXPOSURE, report
