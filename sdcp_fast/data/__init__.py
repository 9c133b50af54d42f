"""Shipped data: the built-in prompt set and small models (see docs/models.md)."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def prompts(kind: str = "eval") -> list[dict[str, str]]:
    """Built-in prompts: ``eval`` (measurements, demo) or ``train`` (distillation seeds).
    Each is ``{"kind": "chat" | "copy", "text": ...}``."""
    data = json.loads((HERE / "prompts.json").read_text())
    return list(data[kind])
