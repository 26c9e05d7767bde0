"""Local tooling on top of everything else: the demo launcher (``koala_run``), the demo seed
(``koala_demo``), the embedded PostgreSQL/Redis launcher (``python -m devtools.embedded``) and the
sandbox provider (``devtools/sandbox/``) that both ``make run`` and the tests talk to.

Nothing in the product imports this package (import-linter's layers contract, docs/architecture.md).
It must stay importable without Django set up: ``python -m devtools.embedded`` runs before any
settings exist.
"""
