"""workers/bounds.py's pure parts: a kind's ceilings, the shared page, and naming a horse's death."""

from __future__ import annotations

import signal

import pytest
from django.test import override_settings

from workers import kinds
from workers.bounds import CPU_GRACE_SECONDS, Limit, Limits, Slate, Written, cause_of_death, limits_for


def body(ctx: object, data: dict[str, object]) -> None:
    return None


def kind(**policy: object) -> kinds.JobKind:
    return kinds.JobKind(name="t.bounds", version=1, body=body, **policy)  # type: ignore[arg-type]


@override_settings(KOALA_ATTEMPT_MEMORY_LIMIT_MB=128, KOALA_ATTEMPT_CPU_LIMIT_SECONDS=30)
def test_a_kinds_own_ceiling_beats_the_setting_and_none_takes_it() -> None:
    assert limits_for(kind()) == Limits(memory_mb=128, cpu_seconds=30)
    assert limits_for(kind(memory_limit_mb=512)) == Limits(memory_mb=512, cpu_seconds=30)
    assert limits_for(kind(memory_limit_mb=0, cpu_limit_seconds=0)) == Limits()  # 0: none, whatever the setting
    assert not Limits() and Limits(cpu_seconds=1)


@pytest.mark.parametrize("value", [-1, 1.5, "64", True])
@pytest.mark.parametrize("name", ["memory_limit_mb", "cpu_limit_seconds"])
def test_a_ceiling_that_is_not_a_whole_number_is_refused_at_declaration(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"t\.bounds@1: {name} must be a whole number ≥ 0"):
        kinds.register(kind(**{name: value}))


def test_the_shared_page_holds_what_the_horse_wrote_until_cleared() -> None:
    """(Across a fork: the acceptance tests' killed horses, named by their parent.)"""
    slate = Slate()
    assert slate.read() is None
    slate.write(attempt_id=41, lease_token=7, limits=Limits(memory_mb=64, cpu_seconds=3), cpu_hard=9)
    assert slate.read() == Written(attempt_id=41, lease_token=7, limits=Limits(memory_mb=64, cpu_seconds=3), cpu_hard=9)
    slate.clear()
    assert slate.read() is None


def killed(sig: int) -> int:
    return sig  # a wait status for "killed by sig" (no core dump)


def exited(code: int) -> int:
    return code << 8


CPU = Written(attempt_id=1, lease_token=1, limits=Limits(cpu_seconds=2), cpu_hard=5)
MEMORY = Written(attempt_id=1, lease_token=1, limits=Limits(memory_mb=64), cpu_hard=0)
BOTH = Written(attempt_id=1, lease_token=1, limits=Limits(memory_mb=64, cpu_seconds=2), cpu_hard=5)


@pytest.mark.parametrize(
    ("written", "status", "cpu_used", "cause"),
    [
        (CPU, killed(signal.SIGKILL), 4.7, Limit.CPU),  # the hard limit (rusage trails the kernel's count)
        (CPU, killed(signal.SIGKILL), 5 - CPU_GRACE_SECONDS, Limit.CPU),  # at least past the soft limit
        (CPU, killed(signal.SIGKILL), 1.0, None),  # killed by someone else before the allowance was used
        (CPU, killed(signal.SIGXCPU), 3.1, Limit.CPU),  # SIGXCPU's default action (no handler)
        (CPU, killed(signal.SIGSEGV), 4.9, None),
        (CPU, exited(1), 4.9, None),
        (MEMORY, killed(signal.SIGABRT), 0.2, Limit.MEMORY),  # a native allocation that could not fail softly
        (MEMORY, exited(1), 0.2, Limit.MEMORY),
        (MEMORY, exited(0), 0.2, None),
        (BOTH, killed(signal.SIGKILL), 4.8, Limit.CPU),
        (BOTH, killed(signal.SIGKILL), 0.5, Limit.MEMORY),
        (CPU, None, None, None),
    ],
)
def test_a_horses_death_is_named_by_its_status_and_cpu_time(
    written: Written, status: int | None, cpu_used: float | None, cause: Limit | None
) -> None:
    assert cause_of_death(written, status, cpu_used) == cause
