"""``sdcp-fast`` command line.

Each subcommand is a module in this package exposing ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. Modules are discovered, so a
component adds its command without touching this file.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence


def _commands() -> dict[str, object]:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        found[info.name.replace("_", "-")] = info.name
    return dict(sorted(found.items()))


def build_parser() -> argparse.ArgumentParser:
    from sdcp_fast import __version__

    parser = argparse.ArgumentParser(
        prog="sdcp-fast",
        description="Speculative Decoding Coordination Protocol (SDCP) engine: demo, services, tools.",
    )
    parser.add_argument("--version", action="version", version=f"sdcp-fast {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, modname in _commands().items():
        mod = importlib.import_module(f"{__name__}.{modname}")
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
