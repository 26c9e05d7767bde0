"""The Python worker SDK (sdk/python, its own package ``koala-worker``) for the tests.

It is not installed into the project's virtualenv: its ``src`` folder goes on ``sys.path`` here
(tests/conftest.py imports this module), so a fresh clone runs the SDK's tests with no extra
step, and the tests see the SDK's files as they are in the work tree.
"""

from __future__ import annotations

import sys
from pathlib import Path

SDK_SRC = Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"
NODE_WORKER = Path(__file__).resolve().parents[2] / "examples" / "node-worker" / "worker.mjs"

if str(SDK_SRC) not in sys.path:
    sys.path.insert(0, str(SDK_SRC))
