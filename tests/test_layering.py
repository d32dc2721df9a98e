"""The packages import one way (docs/ARCHITECTURE.md, "Layers"), read from the sources with `ast`:

    cuda_agent_core  ->  kernel_cache  ->  agent_backend (+ skills, its templates)

Every import counts, including those inside functions and under TYPE_CHECKING: a lazy import is
still a dependency, and a cycle of lazy imports is still a cycle.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("cuda_agent_core", "kernel_cache", "agent_backend", "skills")
# What each package may import of the others: only what lies below it.
ALLOWED = {
    "cuda_agent_core": set(),
    "kernel_cache": {"cuda_agent_core"},
    "agent_backend": {"cuda_agent_core", "kernel_cache", "skills"},
    "skills": {"cuda_agent_core", "kernel_cache", "agent_backend"},
}
# A circle that is known and not yet untied: skills' templates build on agent_backend.specs,
# task and env.fast_kernel, and agent_backend's policies load skills. Untying it means moving
# those below both. Remove it from here when that is done.
KNOWN_PACKAGE_CIRCLES = [{"agent_backend", "skills"}]


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of our packages under `root`."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(module of ours imported, line) for each import in `path`. `from a import b` imports `a`,
    and `a.b` too where that is a module; relative imports are resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` where only a.b is ours
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, node.lineno))
    return found


def import_graph(root: Path = REPO) -> dict[str, dict[str, int]]:
    """module -> {module it imports: first line that does}."""
    modules = module_names(root)
    graph = {}
    for name, path in modules.items():
        edges = graph[name] = {}
        for target, line in imports_of(name, path, modules):
            edges.setdefault(target, line)
    return graph


def package_of(module: str) -> str:
    return module.split(".")[0]


def forbidden_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    return [f"{module} (line {line}) imports {target}"
            for module, edges in graph.items() for target, line in edges.items()
            if package_of(target) != package_of(module) and package_of(target) not in ALLOWED[package_of(module)]]


def circles(graph: dict[str, set[str] | dict[str, int]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while not component or node not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.append(component)

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


def package_graph(graph: dict[str, dict[str, int]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {package: set() for package in PACKAGES}
    for module, edges in graph.items():
        packages[package_of(module)] |= {package_of(t) for t in edges} - {package_of(module)}
    return packages


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_the_scanner_sees_relative_lazy_and_from_imports(graph):
    # Guards the checks below against passing because nothing was found.
    assert "kernel_cache.keys" in graph["kernel_cache.layers"]  # from .keys import ...
    assert "kernel_cache" in graph["agent_backend.dispatch"]  # inside a method
    assert "cuda_agent_core.identity" in graph["kernel_cache.keys"]  # from cuda_agent_core import identity
    assert "cuda_agent_core.toolchain" in graph["agent_backend.env.nvrtc"]


def test_kernel_cache_imports_nothing_of_agent_backend(graph):
    wrong = [f"{module} (line {line}) imports {target}" for module, edges in graph.items()
             if package_of(module) == "kernel_cache" for target, line in edges.items()
             if package_of(target) in ("agent_backend", "skills")]
    assert not wrong, "the kernel cache must not depend on the environment:\n" + "\n".join(wrong)


def test_each_package_imports_only_what_lies_below_it(graph):
    wrong = forbidden_imports(graph)
    assert not wrong, "\n".join(wrong)


def test_the_package_graph_has_no_circle_but_the_known_one(graph):
    assert sorted(map(sorted, circles(package_graph(graph)))) == sorted(map(sorted, KNOWN_PACKAGE_CIRCLES))


def test_no_module_cycle_runs_through_the_cache_or_its_foundation(graph):
    foundation = {m for m in graph if package_of(m) in ("cuda_agent_core", "kernel_cache")}
    # The modules involved: the two packages and every module that imports them.
    involved = foundation | {m for m, edges in graph.items() if foundation & edges.keys()}
    through = [sorted(c) for c in circles(graph) if c & involved]
    assert not through, f"import cycles through {sorted(involved & set().union(*map(set, through)))}: {through}"


def test_an_import_from_the_cache_into_the_environment_is_caught(tmp_path):
    """The checks fail on the circle this layering replaced (kernel_cache.keys asking
    agent_backend.env.nvrtc for the compiler, under TYPE_CHECKING and inside a function)."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "agent_backend" / "env").mkdir()
    (tmp_path / "agent_backend" / "env" / "__init__.py").write_text("")
    (tmp_path / "agent_backend" / "env" / "nvrtc.py").write_text("from kernel_cache.keys import canonical_json\n")
    (tmp_path / "kernel_cache" / "keys.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from agent_backend.specs import TensorSpec\n"
        "def compiler_version():\n    from agent_backend.env.nvrtc import get_compiler\n")
    (tmp_path / "agent_backend" / "specs.py").write_text("")
    planted = import_graph(tmp_path)
    assert forbidden_imports(planted) == ["kernel_cache.keys (line 3) imports agent_backend.specs",
                                          "kernel_cache.keys (line 5) imports agent_backend.env.nvrtc"]
    assert {"kernel_cache.keys", "agent_backend.env.nvrtc"} in circles(planted)
