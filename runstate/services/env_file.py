"""The `.env` block of `runstate services up`: the endpoints written where Dagster's CLI and `runstate` read them."""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from pathlib import Path

from runstate.config import env_file
from runstate.services.state import ServiceError, atomic_write

ENV_BLOCK_START = "# >>> runstate services: written by `runstate services up`, removed by `down` >>>"
ENV_BLOCK_END = "# <<< runstate services <<<"
_UNQUOTED = re.compile(r"[A-Za-z0-9_./:@+%,=?&-]*")
_EXPANDED = re.compile(r"\$\{[^}]*\}")


def write_env_file(values: Mapping[str, str]) -> Path:
    """The endpoints as a block of the project's `.env`; the user's own lines there are kept as they are.

    A variable the user sets in their own lines is left out of the block, so their line wins for every
    reader of the file (a later line would win in dotenv's parser, Dagster's too). `runstate` reads the
    file below the process environment; Dagster's CLI started in the project folder reads it above.
    """
    path = env_file()
    mine = user_env_values(path)
    lines = [
        ENV_BLOCK_START,
        *(f"{key}={_env_value(key, value)}" for key, value in values.items() if key not in mine),
        ENV_BLOCK_END,
    ]
    atomic_write(path, "\n".join([*_lines_outside_block(path), *lines]) + "\n")
    return path


def user_env_values(path: Path | None = None) -> dict[str, str]:
    """What the user's own lines of `.env` set (everything outside our block), as dotenv reads them."""
    from dotenv import dotenv_values

    text = "\n".join(_lines_outside_block(path or env_file()))
    return {key: value for key, value in dotenv_values(stream=io.StringIO(text)).items() if value is not None}


def remove_env_block() -> None:
    """Take our block out of `.env`; the file goes only when nothing of the user's is left in it."""
    path = env_file()
    if not path.exists():
        return
    rest = _lines_outside_block(path)
    if any(line.strip() for line in rest):
        atomic_write(path, "\n".join(rest) + "\n")
    else:
        path.unlink()


def _lines_outside_block(path: Path) -> list[str]:
    if not path.exists():
        return []
    # Only "\n" ends a line, as in dotenv's parser (splitlines would also cut at \f, \x85, \u2028...).
    lines = path.read_text().split("\n")
    if lines[-1] == "":
        lines.pop()
    kept, inside = [], False
    for line in lines:
        if line == ENV_BLOCK_START:
            inside = True
        elif line == ENV_BLOCK_END:
            inside = False
        elif not inside:
            kept.append(line)
    return kept


def _env_value(key: str, value: str) -> str:
    """The value as dotenv reads it back unchanged: bare when plain, else single-quoted with its
    backslashes and quotes escaped (the two escapes dotenv undoes there)."""
    if _UNQUOTED.fullmatch(value):
        return value
    # dotenv expands ${NAME} in every value, quoted or not, and has no escape for it.
    if any(ch in value for ch in "\n\r\0") or _EXPANDED.search(value):
        raise ServiceError(
            f"{key}: the value {value!r} cannot be written to .env (a line break, NUL or ${{...}}); "
            "pass it in the environment"
        )
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
