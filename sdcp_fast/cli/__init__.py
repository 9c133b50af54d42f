"""``sdcp-fast`` command line.

Each subcommand is a module in this package exposing ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. Modules are discovered, so a
component adds its command without touching this file.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import pathlib
import pkgutil
import sys
from collections.abc import Sequence


def _commands() -> dict[str, str]:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        found[info.name.replace("_", "-")] = info.name
    return dict(sorted(found.items()))


def _help(modname: str) -> str:
    """A command's HELP read from its source: listing the commands imports none of them (most
    import torch, seconds on a busy machine)."""
    source = pathlib.Path(__path__[0], f"{modname}.py").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "HELP" for t in node.targets):
            return str(ast.literal_eval(node.value))
    return ""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported and given its arguments (all of them
    when ``command`` is None)."""
    from sdcp_fast import __version__

    parser = argparse.ArgumentParser(
        prog="sdcp-fast",
        description="Speculative Decoding Coordination Protocol (SDCP) engine: demo, services, tools.",
    )
    parser.add_argument("--version", action="version", version=f"sdcp-fast {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, modname in _commands().items():
        if command is not None and name != command:
            sub.add_parser(name, help=_help(modname))
            continue
        mod = importlib.import_module(f"{__name__}.{modname}")
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), "")
    parser = build_parser(command if command in _commands() else "")
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
