"""The trainer's layout holds: no import cycle, each room imports only the rooms it may, no
two classes share a name, one error module (docs/architecture.md shows the rules).

The imports are read with ``ast`` from the source (nothing is imported): every ``import`` and
``from ... import`` that runs, at the top of a module or inside a function (a lazy import
is still a dependency), as an edge to the module it names (``from trainer.x import y``: to
``trainer.x.y`` when that is a module, else to ``trainer.x``); the packages Python imports
on the way are not edges. An import under ``if TYPE_CHECKING:`` only serves the type
checker and is left out.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

TRAINER = Path(__file__).resolve().parents[2] / "trainer"

#: What each room may import (besides itself). The top-level modules: ``errors`` imports
#: nothing, ``job`` is the user's API, ``__main__`` the command line.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "data": {"errors"},
    "protocol": {"errors"},
    "job": {"errors", "data"},
    "state": {"errors", "data", "protocol"},
    "collective": {"errors", "protocol", "state"},
    "control": {"errors", "protocol", "state"},
    "pipeline": {"errors", "collective", "data", "state"},
    "hybrid": {"errors", "collective", "data", "state"},
    "worker": {"errors", "job", "data", "protocol", "state", "collective", "pipeline",
               "hybrid"},
    "__main__": {"errors", "job", "protocol", "control", "state", "worker"},
    "__init__": set(),
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(TRAINER.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(TRAINER.rglob("*.py"))}


def _type_checking_only(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The trainer modules ``name`` (at ``path``) imports when it runs."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def longest(dotted: str) -> None:
        parts = dotted.split(".")
        for k in range(len(parts), 0, -1):  # the module itself, else its package
            if ".".join(parts[:k]) in known:
                found.add(".".join(parts[:k]))
                return

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for a in node.names:
                longest(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join([*pkg, *(node.module.split(".") if node.module else [])])
            else:
                base = node.module or ""
            for a in node.names:  # ``from trainer.x import y``: y is a module, or a name of x
                longest(f"{base}.{a.name}")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(name)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {name: _imports(path, name, known) for name, path in mods.items()}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as a list of modules (first == last), or None."""
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(graph, white)
    stack: list[str] = []

    def dfs(u: str) -> list[str] | None:
        color[u] = grey
        stack.append(u)
        for v in sorted(graph[u]):
            if color.get(v, black) == grey:
                return [*stack[stack.index(v):], v]
            if color.get(v) == white and (found := dfs(v)):
                return found
        stack.pop()
        color[u] = black
        return None

    for u in sorted(graph):
        if color[u] == white and (found := dfs(u)):
            return found
    return None


def test_the_reader_sees_the_imports_it_must() -> None:
    """The graph is not empty by mistake: known edges are found, a TYPE_CHECKING one is not."""
    g = _graph()
    assert "trainer.worker.member" in g["trainer.worker.loop"]
    assert "trainer.collective.groups" in g["trainer.worker.member"]
    assert "trainer.worker.modes.ring" in g["trainer.worker.modes.hybrid"]
    assert "trainer.worker.loop" not in g["trainer.worker.member"]  # TYPE_CHECKING only
    assert "trainer.data.batching" in g["trainer.job"]  # a lazy import still counts
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_the_trainer() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle or [])


def test_each_room_imports_only_the_rooms_it_may() -> None:
    bad = []
    for module, deps in sorted(_graph().items()):
        room = _room(module)
        assert room in ALLOWED, f"{module}: room {room!r} is not in ALLOWED (add it, and to " \
                                "docs/architecture.md)"
        for dep in sorted(deps):
            if _room(dep) != room and _room(dep) not in ALLOWED[room]:
                bad.append(f"{module} imports {dep}")
    assert not bad, "\n".join(bad)


def test_no_two_classes_in_the_trainer_share_a_name() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(name)
    dup = {k: v for k, v in where.items() if len(v) > 1}
    assert not dup, dup


def test_exceptions_are_defined_in_the_error_module_only() -> None:
    from trainer import errors

    outside = []
    for name, path in _modules().items():
        if name == "trainer.errors":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and (b.id.endswith(("Error", "Exception"))
                                                 or b.id in vars(errors))
                    for b in node.bases):
                outside.append(f"{name}.{node.name}")
    assert not outside, outside
    for obj in vars(errors).values():
        if isinstance(obj, type) and issubclass(obj, Exception) and obj.__module__ == errors.__name__:
            assert issubclass(obj, errors.TrainerError)


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def test_every_import_of_the_trainer_names_a_module_or_a_name_of_this_tree() -> None:
    """A stale ``from trainer.old_module import x`` must fail here, not resolve silently (a
    development install can find a module of another checkout under the old name)."""
    mods = _modules()
    roots = [TRAINER.parent / "trainer", TRAINER.parent / "tests",
             TRAINER.parent / "benchmarks", TRAINER.parent / "examples"]
    bad = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    targets = [(a.name, None) for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    targets = [(node.module, a.name) for a in node.names]
                else:
                    continue
                for module, name in targets:
                    if module.split(".")[0] != "trainer":
                        continue
                    if module not in mods:
                        bad.append(f"{path}:{node.lineno}: no module {module}")
                    elif name is not None and f"{module}.{name}" not in mods and (
                            name not in _top_level_names(mods[module])):
                        bad.append(f"{path}:{node.lineno}: {module} has no {name}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("room", sorted(r for r in ALLOWED if r not in ("__init__",
                                                                        "__main__")))
def test_every_room_is_documented(room: str) -> None:
    doc = (TRAINER.parent / "docs" / "architecture.md").read_text()
    assert f"`{room}" in doc, f"docs/architecture.md does not describe the room {room!r}"
