"""The documents' command blocks are either run by tests/acceptance/test_demo_doc_commands.py or marked,
with a reason, as not run; the block reader reads them as a person would; the README's
screenshots are the browser tests'."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.doc_commands import MARKER, REPO, all_blocks, blocks, steps

# The blocks not run against the demo, each with its reason in the document. Keep it short.
# docs/worker-api.md's curl session needs the API server (tests/acceptance/test_api_doc_examples.py);
# docs/operations.md's install, host-command and upgrade blocks need a host as root (each unit's
# command runs in tests/acceptance/test_deploy_units.py).
NOT_RUN_AT_MOST = 7


def test_every_block_with_a_koala_command_is_run_or_marked_with_a_reason() -> None:
    found = all_blocks()
    unmarked = [b.where for b in found if b.has_commands and not b.runs and b.skip_reason is None]
    assert not unmarked, f"label these ```sh (they then run against the demo) or mark them '{MARKER} <why>': {unmarked}"
    marked = {b.where: b.skip_reason for b in found if b.skip_reason is not None}
    assert all(marked.values()), f"a marker needs its reason: {marked}"
    assert len(marked) <= NOT_RUN_AT_MOST, marked
    commands = sum(1 for b in found if b.runs for line in b.lines if line.strip() and not line.startswith("#"))
    assert commands >= 30, "the documents' examples were found"


def test_a_transcript_is_read_as_commands_and_what_they_answer(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "Text.\n\n"
        "  ```sh\n"
        "  $ manage.py koala_budget create b --scope kind \\\n"
        "        --target noop\n"
        "  budget b: created\n"
        "  $ manage.py koala_reviews approve 1 --actor alice\n"
        "  CommandError: four-eyes rule: … someone else must approve it.\n"
        "  $ manage.py koala_jobs --limit -1\n"
        "  usage: manage.py koala_jobs [-h] ...\n"
        "  manage.py koala_jobs: error: argument --limit: must be a whole number from 1 to 10000, not '-1'\n"
        "  $ echo $?\n"
        "  2\n"
        "  ```\n\n"
        "```\nmanage.py koala_jobs\n```\n"
        f"```sh\n{MARKER} starts a server\nmanage.py runserver\n```\n"
    )
    transcript, prose, marked = blocks(doc)
    assert (transcript.line, transcript.language, transcript.runs, transcript.is_transcript) == (3, "sh", True, True)
    create, approve, listing, echo = steps(transcript)
    assert create.command == "manage.py koala_budget create b --scope kind --target noop"
    assert (create.expected_status, create.expected_messages) == (0, [])
    assert approve.expected_status is None
    [message] = approve.expected_messages
    assert message.search("CommandError: four-eyes rule: you requested this action, so someone else must approve it.")
    assert listing.expected_status is None and len(listing.expected_messages) == 1
    assert (echo.command, echo.output) == ("echo $?", ["2"])
    assert prose.has_commands and not prose.runs and prose.skip_reason is None
    assert marked.skip_reason == "starts a server" and not marked.runs


def test_the_readmes_screenshots_exist_and_are_taken_by_the_browser_tests() -> None:
    readme = (REPO / "README.md").read_text()
    shown = re.findall(r"!\[[^\]]*\]\(docs/screenshots/([\w-]+)\.png\)", readme)
    assert shown, "the README shows screenshots"
    assert sorted(shown) == sorted(p.stem for p in (REPO / "docs" / "screenshots").glob("*.png"))
    taken = set(re.findall(r'\.shot\("([\w-]+)"\)', (REPO / "tests" / "browser" / "test_console_browser.py").read_text()))
    assert set(shown) <= taken, set(shown) - taken
