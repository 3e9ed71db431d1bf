"""The ``aiqsim`` command line: run and validate scenarios, sweep parameters.

Bad input (a malformed scenario, an unknown override) prints one clear message and exits
non-zero, without a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from aiqsim import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiqsim",
        description="Schedule AI API calls safely; simulate scenarios on a virtual clock.",
    )
    parser.add_argument("--version", action="version", version=f"aiqsim {__version__}")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    return 0
