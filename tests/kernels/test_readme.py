"""The README's "Use the kernels from your engine" example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_kernel_example_runs() -> None:
    text = README.read_text()
    section = text.split("## Use the kernels from your engine", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "the section lost its python example"
    exec(compile(block.group(1), "README.md", "exec"), {})  # noqa: S102 - our own documentation
