"""A module's Terraform blocks as python-hcl2 reads them, keyed the way tests name them.

Design: python-hcl2 (8.x) keeps the quotes of block labels and string literals (``'"tcp"'``),
wraps expressions in ``${...}``, and records comments under ``__comments__`` keys; these
helpers unquote labels and string literals (``"tcp"``; an interpolated string such as
``"${local.name}-nat"`` loses its quotes too), drop the comment keys, and walk every value with its path,
so a test can say "no value anywhere references X" without matching comments.

Rule for tests: compare expressions as python-hcl2 prints them (``"${local.network_id}"``);
what an expression evaluates to is for terraform itself (see test_gcp_module.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import hcl2

from tests.terraform.conftest import TF_ROOT


def unquote(value: object) -> str:
    text = str(value)
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] == '"' else text


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {unquote(k): _clean(v) for k, v in value.items()
                if k not in ("__comments__", "__inline_comments__", "__is_block__")}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return unquote(value) if isinstance(value, str) else value


def parse(module: str) -> dict[str, list[tuple[Path, dict]]]:
    """Top-level blocks of every ``*.tf`` in ``terraform/<module>``: kind -> [(file, block)]."""
    out: dict[str, list[tuple[Path, dict]]] = {}
    for path in sorted((TF_ROOT / module).glob("*.tf")):
        with path.open(encoding="utf-8") as fh:
            for kind, blocks in hcl2.load(fh).items():
                out.setdefault(kind, []).extend((path, _clean(b)) for b in blocks)
    return out


def resources(module: str) -> dict[tuple[str, str], dict]:
    """``(type, name) -> body`` of every resource of the module."""
    found: dict[tuple[str, str], dict] = {}
    for _path, block in parse(module).get("resource", []):
        for rtype, named in block.items():
            for name, body in named.items():
                found[(rtype, name)] = body
    return found


def of_type(module: str, rtype: str) -> dict[str, dict]:
    return {name: body for (t, name), body in resources(module).items() if t == rtype}


def named_blocks(module: str, kind: str) -> dict[str, dict]:
    """``name -> body`` of the module's ``variable`` or ``output`` blocks."""
    return {name: body for _p, block in parse(module).get(kind, []) for name, body in block.items()}


def locals_(module: str) -> dict[str, Any]:
    """Every ``locals`` entry of the module, name -> expression."""
    return {k: v for _p, block in parse(module).get("locals", []) for k, v in block.items()}


def walk(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """Every leaf of a parsed value with its path of keys and indexes."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from walk(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from walk(v, path + (i,))
    else:
        yield path, value


def one_block(body: dict, key: str) -> dict:
    """The single nested block ``key`` of a body (python-hcl2 gives blocks as lists)."""
    blocks = body.get(key)
    assert isinstance(blocks, list) and len(blocks) == 1, f"expected one {key} block, got {blocks!r}"
    return blocks[0]
