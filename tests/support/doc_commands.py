"""The shell commands of README.md and docs/*.md (and of the example workers' READMEs), as a reader
would copy them.

A fenced block labelled ``sh`` or ``bash`` is run (tests/acceptance/test_demo_doc_commands.py), unless its
first line is the marker ``# doc-test: not run: <why>`` (the reason is required, and the list
of such blocks is kept short: tests/unit/test_doc_blocks.py prints it). Any other block that
holds a Koala command (``manage.py …``, ``./manage.py …``, ``make manage …``) is an error: a
command a reader may copy is either run or marked.

Two shapes of ``sh`` block:

- a script: every line is what a reader types (comments, ``\\`` continuations, ``$(…)`` and
  variables included); the block runs as one bash script that stops at the first failure;
- a transcript: lines starting with ``$ `` are commands, the lines under each its output. The
  output is not compared (ids and times differ), except what says a command fails: a
  ``CommandError: …`` or ``…: error: …`` line (the command must exit non-zero and print it;
  ``…`` matches anything) or ``usage:`` (non-zero), and ``$ echo $?`` with the status under it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARKER = "# doc-test: not run:"
RUN_LANGUAGES = ("sh", "bash")
PROSE_LANGUAGES = ("", "text", "console", "shell", "shell-session")  # blocks a reader might copy from too
COMMAND = re.compile(r"^\s*(?:\$\s+)?(?:[A-Z_]+=\S*\s+)*(?:\./manage\.py|manage\.py|python3?\s+manage\.py|make\s+manage)\b")
FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w-]*)\s*$")


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    lines: list[str]

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        """The marker's reason, when the block is marked not to run ("" for a marker without one)."""
        first = self.lines[0].strip() if self.lines else ""
        return first[len(MARKER) :].strip() if first.startswith(MARKER) else None

    @property
    def runs(self) -> bool:
        return self.language in RUN_LANGUAGES and self.skip_reason is None

    @property
    def has_commands(self) -> bool:
        return any(COMMAND.match(line) for line in self.lines)

    @property
    def is_transcript(self) -> bool:
        return any(line.startswith("$ ") for line in self.lines)


@dataclass
class Step:
    """One command of a transcript and what its output says about how it ends."""

    command: str
    output: list[str] = field(default_factory=list)

    @property
    def expected_status(self) -> int | None:
        """0, a stated status (from an ``echo $?`` after it), or None: non-zero."""
        if any(_says_error(line) or line.startswith("usage:") for line in self.output):
            return None
        return 0

    @property
    def expected_messages(self) -> list[re.Pattern[str]]:
        return [_pattern(line) for line in self.output if _says_error(line)]


def _says_error(line: str) -> bool:
    return line.startswith("CommandError:") or bool(re.match(r"^[\w. -]+: error: ", line))


def _pattern(line: str) -> re.Pattern[str]:
    parts = re.split(r"…|\.\.\.", line.strip())
    return re.compile(".*".join(re.escape(p) for p in parts))


def documents() -> list[Path]:
    """The documents whose shell blocks run against the demo (tests/acceptance/test_demo_doc_commands.py)."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def example_documents() -> list[Path]:
    """The example workers' READMEs: their shell blocks are a session beside ``make run`` (the first
    starts the worker, the others run in a second terminal), run against a live server by
    tests/acceptance/test_example_workers.py."""
    return [REPO / "sdk" / "python" / "README.md", *sorted((REPO / "examples").glob("*/README.md"))]


def example_session(path: Path) -> list[Block]:
    """An example README's runnable shell blocks, in order: the worker's, then the second terminal's."""
    return [b for b in blocks(path) if b.runs]


def blocks(path: Path) -> list[Block]:
    found: list[Block] = []
    text = path.read_text().splitlines()
    i = 0
    while i < len(text):
        opening = FENCE.match(text[i])
        if not opening:
            i += 1
            continue
        indent, fence, language = opening.groups()
        body: list[str] = []
        j = i + 1
        while j < len(text) and not re.match(rf"^\s*{fence}\s*$", text[j]):
            body.append(text[j][len(indent) :] if text[j].startswith(indent) else text[j].lstrip())
            j += 1
        found.append(Block(path=path, line=i + 1, language=language.lower(), lines=body))
        i = j + 1
    return found


def all_blocks() -> list[Block]:
    return [block for path in documents() for block in blocks(path)]


def steps(block: Block) -> list[Step]:
    """A transcript's commands (continuation lines joined) with the output under each."""
    result: list[Step] = []
    lines = iter(block.lines)
    for line in lines:
        if line.startswith("$ "):
            command = line[2:]
            while command.rstrip().endswith("\\"):
                command = command.rstrip()[:-1].rstrip() + " " + next(lines, "").strip()
            result.append(Step(command=command))
        elif result and line.strip():
            result[-1].output.append(line.strip())
    return result
