"""The command line: listing the commands imports none of them, and a command's parser is its
module's own."""

from __future__ import annotations

import subprocess
import sys

from sdcp_fast.cli import _commands, _help, build_parser

LIST_WITHOUT_IMPORTS = """
import sys
from sdcp_fast.cli import main
try:
    main(["--help"])
except SystemExit:
    pass
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith("sdcp_fast.cli."))
print(heavy)
"""


def test_the_command_list_imports_no_command_and_no_torch() -> None:
    out = subprocess.run([sys.executable, "-c", LIST_WITHOUT_IMPORTS], capture_output=True, text=True, check=True)
    assert "verifier" in out.stdout and out.stdout.strip().splitlines()[-1] == "[]"


def test_each_command_lists_the_help_of_its_module() -> None:
    import importlib

    for name, modname in _commands().items():
        assert _help(modname) == importlib.import_module(f"sdcp_fast.cli.{modname}").HELP, name


def test_a_command_gets_its_own_arguments_and_the_others_only_their_names() -> None:
    args = build_parser("certs").parse_args(["certs", "--days", "3", "D"])
    assert args.command == "certs" and args.days == 3 and callable(args._run)
