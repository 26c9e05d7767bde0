"""The floor plan is enforced: import-linter's contracts (pyproject.toml) hold, cover every app, and bite.

CI runs the test suite (`.ci/run` -> `make test`), not `make lint`, so the contracts are checked
here: an upward import anywhere fails the build, not only a developer's `make lint`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from django.conf import settings

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
LAYERS: list[str] = next(contract["layers"] for contract in CONFIG["contracts"] if contract["type"] == "layers")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    # --no-cache: the verdict is about the files as they are now, never a cached graph.
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow  # lint-imports in a subprocess
def test_the_import_contracts_hold() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_every_app_of_the_project_is_analysed_and_has_a_layer() -> None:
    local_apps = {app.split(".")[0] for app in settings.INSTALLED_APPS if (REPO / app.split(".")[0]).is_dir()}
    layered = {name.strip() for layer in LAYERS for name in layer.split("|")}
    assert local_apps <= set(CONFIG["root_packages"]), "a new app must be listed in root_packages"
    assert local_apps == layered, "every app of the project has its place in the layers contract"


@pytest.fixture(scope="module")
def copy_of_the_code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("floor-plan")
    for package in CONFIG["root_packages"]:
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


@pytest.mark.slow  # lint-imports in a subprocess, on a copy of the code
@pytest.mark.parametrize(
    ("module", "added", "complaint"),
    [
        # The engine reaching up, at module level or lazily inside a function.
        ("workers/doorbell.py", "import console.roles", "workers is not allowed to import console"),
        ("workers/kinds.py", "def _late() -> None:\n    import reviews.services", "workers is not allowed to import reviews"),
        ("workers/services/jobs.py", "from effects import kinds", "workers is not allowed to import effects"),
        ("koala/audit.py", "import workers.models", "koala is not allowed to import workers"),
        # Siblings of the middle layer know only the engine, not each other.
        ("effects/kinds.py", "import exports.services", "effects is not allowed to import exports"),
        ("exports/services.py", "from reviews import models", "exports is not allowed to import reviews"),
        ("reviews/services.py", "import console.roles", "reviews is not allowed to import console"),
        # The in-tree kinds (and their providers) reach the engine through its public root only.
        ("effects/kinds.py", "from workers.ledger import ABSENT as OLD", "effects is not allowed to import workers.ledger"),
        ("workers/builtin_kinds.py", "from workers.errors import Retryable as Old", "is not allowed to import workers.errors"),
        # Nothing the product runs depends on the local tooling or the tests.
        ("console/roles.py", "import devtools.embedded", "console is not allowed to import devtools"),
        ("workers/hooks.py", "import tests.kinds", "workers is not allowed to import tests"),
    ],
)
def test_an_upward_import_breaks_the_contract(copy_of_the_code: Path, module: str, added: str, complaint: str) -> None:
    target = copy_of_the_code / module
    original = target.read_text()
    target.write_text(original + "\n\n" + added + "\n")
    try:
        result = lint_imports(copy_of_the_code)
    finally:
        target.write_text(original)
    assert result.returncode != 0, result.stdout
    assert complaint in result.stdout
