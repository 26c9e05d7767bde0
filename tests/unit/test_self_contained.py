"""The project's code and docs stand on their own: none cites a design document the repository
does not hold (what such a document said — the invariants, the requirements — is in docs/)."""

from __future__ import annotations

import subprocess

from tests.support.doc_commands import REPO

OUTSIDE = ("DESIGN.md", "../shared/")


def tracked_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return [name for name in listed if not name.startswith("tests/unit/test_self_contained.py")]


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
