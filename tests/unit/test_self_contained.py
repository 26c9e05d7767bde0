"""The project's code and docs stand on their own: none cites a design document the repository
does not hold (what such a document said — the invariants, the requirements — is in docs/)."""

from __future__ import annotations

from tests.support.doc_commands import REPO

OUTSIDE = ("DESIGN.md", "../shared/")
# What is not the project's own: tools' caches, the virtualenv, local data, git's objects.
NOT_OURS = {".git", ".venv", ".koala-data", "node_modules", ".mypy_cache", ".ruff_cache", ".pytest_cache", "__pycache__"}


def tracked_files() -> list[str]:
    """The project's files: the checkout without what tools and local runs put there."""
    found = []
    for path in REPO.rglob("*"):
        parts = path.relative_to(REPO).parts
        if path.is_file() and not NOT_OURS & set(parts) and path.suffix not in {".pyc", ".png", ".sqlite3"}:
            found.append("/".join(parts))
    return [name for name in found if name != "tests/unit/test_self_contained.py"]


def test_no_file_cites_a_document_outside_the_repository() -> None:
    files = tracked_files()
    assert len(files) > 200  # the listing worked
    cited = []
    for name in files:
        path = REPO / name
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary (screenshots) or removed in the work tree
        cited += [f"{name}: {needle}" for needle in OUTSIDE if needle in text]
    assert cited == []
