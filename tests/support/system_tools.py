"""The Debian tools some tests run for real (promtool, prometheus, docker-compose, systemd-analyze).

requirements/debian-test.txt lists them; scripts/install-test-tools installs the missing ones as
root, and .ci/run runs it first. A test asks for its tool with `require_tool`: outside CI a missing
tool skips the test naming the script; under CI (CI=true) it fails, since CI must run that check.
"""

from __future__ import annotations

import os
import shutil

import pytest

HOW_TO_INSTALL = "run `scripts/install-test-tools` as root (Debian packages from requirements/debian-test.txt)"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require_tool(command: str) -> str:
    """The path of `command`, or skip (fail under CI) naming how to install it."""
    found = shutil.which(command)
    if found:
        return found
    message = f"{command} not found: {HOW_TO_INSTALL}"
    if in_ci():
        pytest.fail(message)
    pytest.skip(message)
