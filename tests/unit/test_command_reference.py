"""docs/command-reference.md is every Koala command's own --help, as the commands print it today."""

from __future__ import annotations

import argparse

from devtools import command_reference


def test_the_page_is_the_commands_help() -> None:
    assert command_reference.PAGE.read_text(encoding="utf-8") == command_reference.render(), (
        "docs/command-reference.md is out of date: run python -m devtools.command_reference"
    )


def test_the_page_holds_every_command_and_subcommand() -> None:
    page = command_reference.PAGE.read_text(encoding="utf-8")
    commands = command_reference.koala_commands()
    assert {"koala_apikey", "koala_worker", "koala_beat", "koala_reviews", "koala_enqueue"} <= set(commands)
    for name in commands:
        assert f"\n## {name}\n" in page, name
    for sub in ("koala_apikey create", "koala_apikey revoke", "koala_reviews approve", "koala_reviews reject"):
        assert f"\n### {sub}\n" in page, sub


def test_each_option_says_what_it_is_for() -> None:
    """An option whose help repeats another's meaning is caught where it matters most: a decision's
    comment is optional to approve and required to reject (the service refuses a reject without)."""
    from django.core.management import load_command_class

    command = load_command_class("reviews", "koala_reviews")
    parser = command.create_parser("manage.py", "koala_reviews")
    [subparsers] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {name: {a.dest: a.help for a in sub._actions} for name, sub in subparsers.choices.items()}
    assert "required" in str(helps["reject"]["comment"]) and "optional" in str(helps["approve"]["comment"])
