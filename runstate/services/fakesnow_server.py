"""`python -m runstate.services.fakesnow_server -s --host HOST -p PORT`: fakesnow's server, faithful.

fakesnow's own command line (`fakesnow -s ...`), with its failed statements answered as Snowflake
answers them (fakesnow_errors.py).
"""

from __future__ import annotations

import sys

from runstate.services.fakesnow_errors import answer_statement_errors_as_snowflake


def main(argv: list[str]) -> int:
    from fakesnow.cli import main as fakesnow_main

    answer_statement_errors_as_snowflake()
    return fakesnow_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
