"""The Python blocks of the documents, as a reader would copy them (tests/integration/test_doc_python.py).

Every fenced ``python`` block of README.md, docs/*.md, sdk/python/README.md and examples/*/README.md
runs in a test, unless its first line is the marker ``# doc-test: not run: <why>`` (the reason is
required, and tests/unit/test_doc_blocks.py keeps such blocks few). A document's blocks run in
order, as a reader pastes them into one session with Django set up (``manage.py shell``): one
namespace per document, so a later block uses what an earlier one defined. Two shapes of block:

- a module of the reader's own, named by its first line (``# mysite/settings.py …``): it is
  written at that path under a temporary folder on ``sys.path`` and imported, as a fresh process
  would import it (``koala.settings`` is loaded anew for it, so what it changes there stays in it);
- any other block is code of the session, compiled with the document's name and line numbers, so
  a traceback points at the document.

The kinds and workflows a document's blocks declare (``@job_kind``, ``workflow(...)``) are
registered while its session lasts and dropped afterwards; the test that runs the session enqueues and drains their jobs.
"""

from __future__ import annotations

import importlib
import re
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.doc_commands import MARKER, REPO, Block, blocks, documents, example_documents

LANGUAGE = "python"
MODULE_FILE = re.compile(r"^#\s+([\w-]+(?:/[\w-]+)*\.py)\b")


def python_documents() -> list[Path]:
    return [*documents(), *example_documents()]


def python_blocks(path: Path) -> list[Block]:
    return [b for b in blocks(path) if b.language == LANGUAGE]


def runnable_python_blocks(path: Path) -> list[Block]:
    return [b for b in python_blocks(path) if b.skip_reason is None]


def module_file(block: Block) -> str | None:
    """The reader's module path a block is (its first line names it), or None for session code."""
    found = MODULE_FILE.match(block.lines[0]) if block.lines else None
    return found[1] if found else None


def source(block: Block) -> str:
    return "\n".join(block.lines) + "\n"


def relative(path: Path) -> str:
    return str(path.relative_to(REPO))


@dataclass
class Session:
    """One document's blocks run in one namespace; ``names`` is that namespace."""

    path: Path
    folder: Path  # where module blocks are written (on sys.path while the session lasts)
    names: dict[str, Any] = field(default_factory=dict)
    modules: dict[str, types.ModuleType] = field(default_factory=dict)  # module blocks, by dotted name

    def run(self, block: Block) -> None:
        assert block.skip_reason is None, f"{block.where} is marked {MARKER!r}"
        target = module_file(block)
        if target is None:
            # Padded so that line numbers in a traceback are the document's.
            code = compile("\n" * block.line + source(block), str(self.path), "exec")
            exec(code, self.names)  # the document's own example, run as a reader runs it
            return
        written = self.folder / target
        written.parent.mkdir(parents=True, exist_ok=True)
        for package in written.relative_to(self.folder).parents:
            if str(package) != ".":
                (self.folder / package / "__init__.py").touch()
        written.write_text(source(block))
        dotted = target.removesuffix(".py").replace("/", ".")
        with fresh("koala.settings"):
            self.modules[dotted] = importlib.import_module(dotted)

    def run_all(self) -> Session:
        for block in runnable_python_blocks(self.path):
            self.run(block)
        return self

    def __getitem__(self, name: str) -> Any:
        return self.names[name]


@contextmanager
def fresh(name: str) -> Iterator[None]:
    """``import name`` loads the module anew inside; the process's own module is back afterwards."""
    original = sys.modules.pop(name, None)
    parent, _, leaf = name.rpartition(".")
    try:
        yield
    finally:
        if original is not None:
            sys.modules[name] = original
            if parent:
                setattr(sys.modules[parent], leaf, original)


@contextmanager
def session(path: Path, folder: Path) -> Iterator[Session]:
    """A document's session: its namespace, its module folder on sys.path, and afterwards every
    kind it declared dropped and every module it wrote forgotten."""
    from workers import definitions, kinds

    before = {(k.name, k.version) for k in kinds.served()}
    workflows_before = {(d.name, d.version) for d in definitions.definitions()}
    name = "doc_" + re.sub(r"\W", "_", relative(path).removesuffix(".md"))
    module = types.ModuleType(name)
    sys.modules[name] = module  # the module functions defined in the blocks say they are in
    folder.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(folder))
    run = Session(path=path, folder=folder, names=module.__dict__)
    try:
        yield run
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(name, None)
        for dotted in list(sys.modules):
            if dotted.split(".")[0] in {d.split(".")[0] for d in run.modules}:
                sys.modules.pop(dotted, None)
        for definition in definitions.definitions():
            if (definition.name, definition.version) not in workflows_before:
                definitions.forget(definition.name, definition.version)  # its steps' kinds with it
        for kind in kinds.served():
            if (kind.name, kind.version) not in before:
                kinds.unregister(kind.name, kind.version)


def declared_kinds(run: Session) -> list[Any]:
    """The kind handles the session's blocks declared (``@job_kind`` / ``remote_kind`` results)."""
    from workers import KindHandle

    return [value for value in run.names.values() if isinstance(value, KindHandle)]
