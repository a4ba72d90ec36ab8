"""The provisioner's rooms hold (docs/architecture.md): no import cycle anywhere in
``provisioner/`` and ``pricing/``, and each room imports only what its rule allows.

The graph is read with ``ast`` from the source, every import counted where it is written
(a module's top or inside a function: a lazy import is still a dependency), except those
under ``if TYPE_CHECKING:``. A package's ``__init__`` is not a dependency of its modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("provisioner", "pricing")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (REPO / pkg).rglob("*.py"):
            parts = list(p.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``name`` imports (nearest known module of each)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                continue
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package[:len(package) - (child.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in child.names] + [base]
            for t in targets:
                while t and t not in known:
                    t = t.rpartition(".")[0]
                if t and t != name and not name.startswith(t + "."):  # not its own package
                    found.add(t)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            strong(v)
    return out


def test_cycles_are_found():
    """The checker itself: a cycle of three is reported, a chain is not."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycle_in_provisioner_and_pricing():
    g = graph()
    assert "provisioner.daemon.run.session" in g  # the walk sees the tree
    assert cycles(g) == []


def room(module: str) -> str:
    """The daemon room of a ``provisioner.daemon`` module: ``loop``, ``view``, ``run``,
    ``wiring`` or ``leaf`` (state, ports, outcome)."""
    parts = module.split(".")
    if len(parts) < 3:
        return "package"
    if parts[2] in ("loop", "view", "run", "wiring"):
        return parts[2]
    return "leaf"


#: What each room of the daemon may import of the daemon (docs/architecture.md).
DAEMON_RULES = {
    "leaf": set(),
    "view": {"leaf", "view"},
    "loop": {"leaf", "view", "loop"},
    "wiring": {"leaf", "loop"},
    "run": {"leaf", "view", "loop", "wiring", "run"},
}


def test_the_daemons_rooms_import_only_what_their_rule_allows():
    bad = []
    for m, targets in graph().items():
        for t in targets:
            inside = t.startswith("provisioner.daemon.")
            if m.startswith("provisioner.daemon.") and inside:
                if room(t) not in DAEMON_RULES[room(m)]:
                    bad.append(f"{m} ({room(m)}) -> {t} ({room(t)})")
            elif inside and not m.startswith(("provisioner.commands.", "provisioner.cli")):
                bad.append(f"{m} -> {t}: only the commands use the daemon")
    assert bad == []


def test_pure_and_edge_rooms_stay_apart():
    """pricing/ knows nothing of the provisioner; plan/ (the decision, no I/O) imports no
    driver, daemon, simulator or command; drivers import no planner, daemon or simulator."""
    forbidden = {
        "pricing": ("provisioner",),
        "provisioner.plan": ("provisioner.drivers", "provisioner.daemon", "provisioner.sim",
                             "provisioner.commands"),
        "provisioner.drivers": ("provisioner.plan", "provisioner.daemon", "provisioner.sim",
                                "provisioner.commands"),
    }
    bad = [f"{m} -> {t}" for m, targets in graph().items() for t in targets
           for pkg, banned in forbidden.items()
           if (m == pkg or m.startswith(pkg + ".")) and t.startswith(banned)]
    assert bad == []
