"""The schedules app's one error: a request it refuses, with a message that says why (no row changed)."""


class ScheduleError(ValueError):
    pass
