"""What a schedule does now: which slots to enqueue, which to buffer, which to record skipped and why.

A pure function of stored state and ``now`` (the materialiser passes both; tests pass any clock),
returning a value the materialiser then writes (``schedules.services.materialise``). Nothing here
reads the clock, the database or "the timer fired".

The due slots are every slot strictly after the last one materialised and at or before ``now``.
The newest of them is **on time** when it is at most ``ON_TIME_SECONDS`` old; every other due slot
was **missed** (a later slot was already due, or it is older than that).

Catch-up (which due slots want a run; the others are skipped with reason ``catch_up``):

=============  ============================================================================
policy         runs
=============  ============================================================================
skip           the on-time slot only; missed slots are skipped (the next slot runs as usual)
latest         the newest due slot, on time or not, once; older missed slots are skipped
all_within     every due slot at most ``window`` old, the newest ``max_count`` of them
=============  ============================================================================

Overlap (applied to those slots, oldest first; "active" = a run of this schedule not terminal):

==========  ========================  =====================================================
policy      active run                outcome
==========  ========================  =====================================================
allow       any                       every wanted slot is enqueued
skip        yes                       every wanted slot skipped, reason ``overlap``
skip        no                        the oldest wanted slot enqueued, the rest ``overlap``
buffer_one  no, nothing buffered      oldest enqueued, next buffered, rest ``overlap``
buffer_one  yes, nothing buffered     oldest buffered, rest ``overlap``
buffer_one  yes, one buffered         every wanted slot skipped, reason ``overlap``
buffer_one  no, one buffered          the buffered slot is enqueued now, then as "active"
==========  ========================  =====================================================

``last_slot`` only moves forward, to the newest due slot; ``next_slot`` is the first slot strictly
after it (None: the schedule has ended), so a schedule is never due twice for one slot and its
next fire is always strictly later than its last (no busy loop).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from itertools import pairwise

ON_TIME_SECONDS = 60.0
# At most this many due slots are looked at (and recorded) per schedule and decision; older
# missed slots beyond them are skipped in one step (the oldest recorded row says so).
MAX_SLOTS = 1000


class CatchUp(StrEnum):
    SKIP = "skip"
    LATEST = "latest"
    ALL_WITHIN = "all_within"


class Overlap(StrEnum):
    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    ALLOW = "allow"


class Reason(StrEnum):
    CATCH_UP = "catch_up"
    OVERLAP = "overlap"


@dataclass(frozen=True)
class Policy:
    catch_up: CatchUp = CatchUp.SKIP
    overlap: Overlap = Overlap.SKIP
    window_seconds: int | None = None  # all_within only
    max_count: int | None = None  # all_within only


@dataclass(frozen=True)
class Decision:
    enqueue: tuple[datetime, ...] = ()
    buffer: datetime | None = None
    promote_buffered: bool = False  # the slot buffered earlier is enqueued now
    skipped: tuple[tuple[datetime, Reason], ...] = ()
    last_slot: datetime | None = None
    truncated: bool = False  # more missed slots than MAX_SLOTS: the oldest were not looked at

    @property
    def changes(self) -> bool:
        return bool(self.enqueue or self.buffer or self.promote_buffered or self.skipped)


def decide(
    *,
    due: Sequence[datetime],
    now: datetime,
    policy: Policy,
    active: bool,
    buffered: bool,
    last_slot: datetime | None,
    truncated: bool = False,
) -> Decision:
    """Decide a schedule's moves at ``now`` given its due slots (ascending, all ``<= now``)."""
    assert all(a < b for a, b in pairwise(due)), "due slots ascend"
    assert all(slot <= now for slot in due), "due slots are at or before now"
    wanted, skipped = _catch_up(due, now, policy)
    enqueue: list[datetime] = []
    buffer: datetime | None = None
    promote = False
    if policy.overlap is Overlap.ALLOW:
        enqueue = list(wanted)
    elif policy.overlap is Overlap.SKIP:
        if not active and wanted:
            enqueue = [wanted[0]]
        skipped += [(slot, Reason.OVERLAP) for slot in wanted[len(enqueue) :]]
    else:  # buffer_one
        if buffered and not active:
            promote, active, buffered = True, True, False
        rest = list(wanted)
        if not active and rest:
            enqueue.append(rest.pop(0))
            active = True
        if active and not buffered and rest:
            buffer = rest.pop(0)
        skipped += [(slot, Reason.OVERLAP) for slot in rest]
    skipped.sort()
    new_last = max([*due, *([last_slot] if last_slot else [])], default=None)
    return Decision(
        enqueue=tuple(enqueue),
        buffer=buffer,
        promote_buffered=promote,
        skipped=tuple(skipped),
        last_slot=new_last,
        truncated=truncated,
    )


def _catch_up(due: Sequence[datetime], now: datetime, policy: Policy) -> tuple[list[datetime], list[tuple[datetime, Reason]]]:
    if not due:
        return [], []
    newest = due[-1]
    if policy.catch_up is CatchUp.SKIP:
        on_time = now - newest <= timedelta(seconds=ON_TIME_SECONDS)
        wanted = [newest] if on_time else []
    elif policy.catch_up is CatchUp.LATEST:
        wanted = [newest]
    else:
        assert policy.window_seconds and policy.max_count, "all_within has a window and a maximum count"
        window = timedelta(seconds=policy.window_seconds)
        wanted = [slot for slot in due if now - slot <= window][-policy.max_count :]
    chosen = set(wanted)
    return wanted, [(slot, Reason.CATCH_UP) for slot in due if slot not in chosen]
