"""Helpers of the tests of the command line."""

from __future__ import annotations

import click


def leaf_verbs(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    """Every verb under `group` with its path of names (the root's verbs load as `--help` loads them)."""
    ctx = click.Context(group)
    verbs = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            verbs += leaf_verbs(command, (*path, name))
        elif command is not None:
            verbs.append(((*path, name), command))
    return verbs
