"""The prepared forms of the engine's hot statements (workers.sql.Prepared, sql.PREPARED): pure text."""

from __future__ import annotations

import re

import pytest

from workers import sql


def test_named_placeholders_become_numbered_parameters_in_first_seen_order() -> None:
    p = sql.Prepared("koala_t", "SELECT 1 FROM t WHERE a = %(a)s AND b = %(b)s AND c = %(a)s AND d LIKE 'x%%'")
    assert p.prepare == "PREPARE koala_t AS SELECT 1 FROM t WHERE a = $1 AND b = $2 AND c = $1 AND d LIKE 'x%'"
    assert p.execute == "EXECUTE koala_t(%(a)s, %(b)s)"
    assert p.deallocate == "DEALLOCATE koala_t"


def test_positional_placeholders_are_numbered_in_turn() -> None:
    p = sql.Prepared("koala_t", "INSERT INTO t VALUES (%s, %s, %s)")
    assert p.prepare == "PREPARE koala_t AS INSERT INTO t VALUES ($1, $2, $3)"
    assert p.execute == "EXECUTE koala_t(%s, %s, %s)"


def test_a_statement_mixing_both_kinds_is_refused() -> None:
    with pytest.raises(ValueError, match="named or positional"):
        sql.Prepared("koala_t", "SELECT %s, %(a)s")


def test_every_prepared_statement_has_a_fixed_outermost_column_list() -> None:
    # A prepared SELECT * / RETURNING * fails ("cached plan must not change result type") once a
    # migration adds a column: only CTEs may use *, the outermost statement names its columns.
    for statement, prepared in sql.PREPARED.items():
        outermost = statement.rsplit(")", 1)[-1] if statement.lstrip().startswith("WITH") else statement
        assert not re.search(r"(SELECT|RETURNING)\s+(\w+\.)?\*", outermost), prepared.name
        assert prepared.name.startswith("koala_") and prepared.name.isidentifier()


def test_the_hot_path_statements_are_prepared_and_names_are_unique() -> None:
    names = [p.name for p in sql.PREPARED.values()]
    assert len(set(names)) == len(names)
    for statement in (sql.CLAIM_NEXT, sql.CLAIM_NEXT_MANY, sql.COMPLETE, sql.COMPLETE_MANY, sql.insert_jobs(1)):
        assert statement in sql.PREPARED
