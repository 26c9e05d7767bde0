"""What the export services raise to people and commands (the body raises workers.errors types)."""

from __future__ import annotations


class ExportError(ValueError):
    """Bad export input or an action that does not apply; the message says what to change."""


class ExportPermissionDenied(ExportError):
    """The user may not see this account's data: no request, no download, no cancel."""


class ExportNotFound(ExportError):
    """No such export (or account)."""


class ExportNotReady(ExportError):
    """The export has not succeeded (yet): there is nothing to download."""


class ExportObjectMissing(ExportError):
    """The export succeeded, but its published object is no longer in storage."""
