"""The documents' command blocks are either run by tests/acceptance/test_demo_doc_commands.py or marked,
with a reason, as not run; the block reader reads them as a person would; the README's
screenshots are the browser tests'."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.doc_commands import MARKER, REPO, all_blocks, blocks, example_documents, example_session, steps
from tests.support.doc_python import module_file, python_blocks, python_documents, relative, source

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


# Python blocks run nowhere, each with its reason in the document. None today: prefer a whole,
# runnable example (a fragment shown in full elsewhere is a reason; "too hard" is not).
PYTHON_NOT_RUN_AT_MOST = 0
PYTHON_RUNNER = REPO / "tests" / "integration" / "test_doc_python.py"
EXAMPLE_RUNNER = REPO / "tests" / "acceptance" / "test_example_workers.py"


def test_every_python_block_is_whole_python_run_by_a_test_or_marked_with_a_reason() -> None:
    found = [block for path in python_documents() for block in python_blocks(path)]
    assert len(found) >= 8, "the documents' Python examples were found"
    marked = {b.where: b.skip_reason for b in found if b.skip_reason is not None}
    assert all(marked.values()), f"a marker needs its reason: {marked}"
    assert len(marked) <= PYTHON_NOT_RUN_AT_MOST, marked
    broken = []
    for block in found:
        if block.skip_reason is None:
            try:
                compile(source(block), block.where, "exec")
            except SyntaxError as exc:
                broken.append(f"{block.where}: {exc.msg} (line {exc.lineno})")
    assert not broken, f"make these whole, runnable Python (or mark them '{MARKER} <why>'): {broken}"
    # Each document's blocks are run, and what they do checked, by the integration test.
    runner = PYTHON_RUNNER.read_text()
    unrun = sorted({relative(b.path) for b in found if b.skip_reason is None and f'"{relative(b.path)}"' not in runner})
    assert not unrun, f"{PYTHON_RUNNER.relative_to(REPO)} runs no test of {unrun}"


def test_a_python_block_is_session_code_or_a_module_its_first_line_names(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```python\n# mysite/settings.py  (DJANGO_SETTINGS_MODULE=mysite.settings)\nX = 1\n```\n"
        "```python\n# a comment, then code\nx = 1\n```\n"
        f"```python\n{MARKER} shown in full in a.py\n@decorator(\n```\n"
    )
    module, code, marked = blocks(doc)
    assert (module_file(module), module_file(code), module_file(marked)) == ("mysite/settings.py", None, None)
    assert marked.skip_reason == "shown in full in a.py" and source(code) == "# a comment, then code\nx = 1\n"


def test_every_example_readme_is_a_session_the_example_test_runs() -> None:
    runner = EXAMPLE_RUNNER.read_text()
    for readme in example_documents():
        worker, *beside = example_session(readme)
        assert beside, f"{relative(readme)}: a block that starts the worker, then what a second terminal types"
        assert any("worker" in line for line in worker.lines), worker.lines
        assert f'"{relative(readme)}"' in runner, f"{EXAMPLE_RUNNER.relative_to(REPO)} does not run {relative(readme)}"


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


# -- the README's first screen --------------------------------------------------------------------

README = REPO / "README.md"


def test_the_readme_opens_with_the_two_commands_that_work_on_a_fresh_clone() -> None:
    first = blocks(README)[0]
    assert first.line == 3, "the commands come first, right under the title"
    commands = [line.split("#")[0].strip() for line in first.lines]
    assert commands == ["make run", "make test"], first.lines
    targets = set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), flags=re.M))
    assert {"run", "test", "unit"} <= targets
    opening = README.read_text().split("\n## ", 1)[0]
    assert "Koala runs background jobs" in opening and "`make unit`" in opening


def test_the_readme_indexes_every_document_with_one_line_each() -> None:
    text = README.read_text()
    index = text[text.index("\n## Documentation\n") :]
    index = index[: index.index("\n## ", 1)]
    lines = [line for line in index.splitlines() if line.startswith("- [docs/")]
    listed = [re.match(r"- \[docs/([\w-]+\.md)\]\(docs/\1\): \S", line) for line in lines]
    assert all(listed), [line for line, m in zip(lines, listed, strict=True) if not m]
    names = [m[1] for m in listed if m]
    assert sorted(names) == sorted(p.name for p in (REPO / "docs").glob("*.md")), "every docs/*.md, once, in the README's index"
