"""The package's import graph: no module imports itself back through others (an import at
function level counts too: it is a dependency that only runs later), and each package imports
only the packages below it, as README.md's layout table says. And no two modules share a
name, so that a name says which module it is (the CLI's modules are named for their subcommand).

Read from the source with ``ast``, so every module counts, including those whose optional
dependencies are not installed here."""

from __future__ import annotations

import ast
import pathlib
import re

import sdcp_fast

PACKAGE = pathlib.Path(sdcp_fast.__file__).parent

README = PACKAGE.parent / "README.md"


def _layering() -> tuple[dict[str, set[str]], set[str]]:
    """What each package of sdcp_fast may import of sdcp_fast besides itself, from the third
    column of README.md's layout table; and the packages at the top (``any``: not checked)."""
    allowed: dict[str, set[str]] = {}
    top: set[str] = set()
    for line in README.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if len(cells) != 3 or not cells[0].startswith("`sdcp_fast/"):
            continue
        packages = re.findall(r"`sdcp_fast/(\w+)(?:/|\.py)`", cells[0])
        if cells[2] == "any":
            top.update(packages)
            continue
        names = set(re.findall(r"`(\w+)`", cells[2]))
        assert names or cells[2] == "nothing", line
        for package in packages:
            allowed[package] = names
    return allowed, top


ALLOWED, TOP = _layering()


def _name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(name: str, *, typing: bool) -> set[str]:
    """The modules of sdcp_fast that ``name`` imports anywhere in its body (those under ``if
    TYPE_CHECKING`` only with ``typing``), as module names: ``from pkg import mod`` is ``pkg.mod``."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    pending: list[ast.AST] = [ast.parse(path.read_text(), str(path))]
    while pending:
        node = pending.pop()
        if not typing and _type_checking_only(node):
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
        pending.extend(ast.iter_child_nodes(node))
    ours: set[str] = set()
    for module in found:
        if module != "sdcp_fast" and not module.startswith("sdcp_fast."):
            continue
        while module not in MODULES and "." in module:  # a name inside a module, or triton_kernels
            if module.count(".") == 1:
                break
            module = module.rpartition(".")[0]
        if module != name:
            ours.add(module)
    return ours


def _package(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next((w for w in edges if w in graph), None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_reader_sees_the_imports_it_should() -> None:
    assert "sdcp_fast.protocol.messages" in _imports("sdcp_fast.protocol", typing=False)
    assert "sdcp_fast.model.kv_cache" in _imports("sdcp_fast.model.target_scorer", typing=False)
    assert "sdcp_fast.benchlib.run" in _imports("sdcp_fast.cli.bench", typing=False)  # at function level
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert ALLOWED["protocol"] == set() and "roles" in ALLOWED["deploy"] and TOP == {"cli"}


def test_no_import_circle_among_the_modules() -> None:
    graph = {name: _imports(name, typing=False) for name in MODULES}
    assert _cycles(graph) == []


def test_no_import_circle_through_imports_for_types_only() -> None:
    """An import under ``if TYPE_CHECKING`` is still a dependency (on the other module's
    types): the checks and the kit that runs them are a layer each, not a circle."""
    graph = {name: _imports(name, typing=True) for name in MODULES}
    assert _cycles(graph) == []


def test_each_package_imports_only_the_packages_below_it() -> None:
    wrong = []
    for name in MODULES:
        package = _package(name)
        if package not in ALLOWED:  # cli, __main__ and the package root sit on top
            continue
        for module in _imports(name, typing=True):
            other = _package(module)
            if other != package and other not in ALLOWED[package]:
                wrong.append(f"{name} imports {module}")
    assert wrong == []


def test_the_table_names_only_what_each_package_imports() -> None:
    """The table says what the code imports, not what it once did: an allowance no module
    uses is dropped from its row."""
    used: dict[str, set[str]] = {package: set() for package in ALLOWED}
    for name in MODULES:
        package = _package(name)
        if package in used:
            used[package].update(_package(module) for module in _imports(name, typing=True))
    unused = {package: sorted(names - used[package]) for package, names in ALLOWED.items() if names - used[package]}
    assert unused == {}


def test_the_layering_itself_has_no_circle() -> None:
    assert _cycles(ALLOWED) == []


def test_every_package_has_a_place_in_the_layering() -> None:
    packages = {_package(name) for name in MODULES} - {"", "__main__"}
    assert packages <= set(ALLOWED) | TOP, packages - set(ALLOWED) - TOP
    assert set(ALLOWED) | TOP <= packages, f"README.md names packages that are gone: {(set(ALLOWED) | TOP) - packages}"


def test_no_two_modules_share_a_name() -> None:
    seen: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        if path.name != "__init__.py" and _package(name) != "cli":
            seen.setdefault(path.name, []).append(name)
    assert {base: names for base, names in seen.items() if len(names) > 1} == {}
