"""Fixtures for the demo tests: the loopback provider playing make run's sandbox."""

from __future__ import annotations

# The loopback payment/model provider, shared with tests/effects (make run's sandbox is the same code).
from tests.effects.conftest import provider  # noqa: F401
