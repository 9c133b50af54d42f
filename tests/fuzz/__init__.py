"""Hostile input for every endpoint."""

import sys
from pathlib import Path

# The message strategies live beside the protocol tests, in a directory that is no package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "protocol"))
