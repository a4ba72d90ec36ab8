"""A run's state in and out: a durable snapshot read on this host, the trained model out of
it, and the user's own checkpoint as the state a run starts from.

Design. Reading: :func:`read_snapshot` takes a snapshot file (``step-...``) or a snapshot
directory (its newest complete snapshot: the one with a manifest), checks the bytes against
the manifest's SHA-256 when there is one, and decodes them with :mod:`trainer.state.codec`
(never pickle). :func:`model_of` picks the model's ``state_dict`` (or one of the job's extra
states, e.g. an EMA) out of the tree; ``python -m trainer export`` writes it with
``torch.save``, a file plain ``torch.load(weights_only=True)`` reads.

Starting from the user's checkpoint (``python -m trainer worker --resume CKPT``):
:func:`read_checkpoint` reads a spotring snapshot file as above, or a ``torch.save``'d dict
loaded with ``weights_only=True`` (tensors and plain data only: nothing is unpickled into
objects), and :func:`checkpoint_parts` maps the names the widely used training scripts give
its parts (``model``/``state_dict``/``model_state_dict``, ``optimizer``,
``scheduler``/``lr_scheduler``, ``step``/``iter_num``/``global_step``, ``epoch``) onto the
training state's, stripping ``module.`` (DDP) and ``_orig_mod.`` (``torch.compile``)
prefixes.

Rule for callers: what these return is a plain tree; load it through
:class:`trainer.state.training.TrainingState` (``load`` or ``load_checkpoint``), which checks
it fits the job.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

from trainer.errors import BadState, SnapshotError
from trainer.state import codec
from trainer.state.snapshot import Manifest

ALIASES = {
    "model": ("model", "state_dict", "model_state_dict"),
    "optimizer": ("optimizer", "optimizer_state_dict", "optim"),
    "scheduler": ("scheduler", "lr_scheduler", "scheduler_state_dict"),
    "step": ("step", "iter_num", "global_step", "iteration"),
    "epoch": ("epoch",),
    "cursor": ("cursor",),
    "samples_done": ("samples_done",),
}
PREFIXES = ("module.", "_orig_mod.")


def newest_snapshot(directory: Path) -> tuple[Path, Manifest]:
    """The newest complete snapshot of ``directory`` and its manifest. Raises
    :class:`trainer.errors.SnapshotError` when it holds none."""
    found = []
    for m in sorted(directory.glob("step-*.json")):
        try:
            man = Manifest.parse(m.read_bytes())
        except (ValueError, KeyError, OSError):
            continue
        if (directory / man.name).is_file():
            found.append(man)
    if not found:
        raise SnapshotError(f"{directory}: no complete snapshot (a step-* file with its .json "
                            "manifest); give a snapshot directory or file")
    man = max(found, key=lambda x: (x.step, x.time))
    return directory / man.name, man


def read_snapshot(path: Path) -> dict[str, Any]:
    """The training state in snapshot ``path`` (a file, or a directory: its newest), checked
    against its manifest when it has one. Raises :class:`trainer.errors.SnapshotError`."""
    path = Path(path)
    manifest: Manifest | None = None
    if path.is_dir():
        path, manifest = newest_snapshot(path)
    elif not path.is_file():
        raise SnapshotError(f"{path}: no such snapshot file or directory")
    else:
        side = path.with_name(path.name + ".json")
        if side.is_file():
            try:
                manifest = Manifest.parse(side.read_bytes())
            except (ValueError, KeyError) as e:
                raise SnapshotError(f"{side}: not a snapshot manifest ({e})") from e
    data = path.read_bytes()
    if manifest is not None and hashlib.sha256(data).hexdigest() != manifest.sha256:
        raise SnapshotError(f"{path}: its bytes differ from its manifest's digest (a torn or "
                            "altered copy); use another snapshot")
    try:
        tree = codec.decode(data)
    except BadState as e:
        raise SnapshotError(f"{path}: not a spotring snapshot ({e})") from e
    if not isinstance(tree, dict) or not isinstance(tree.get("model"), dict):
        raise SnapshotError(f"{path}: a snapshot without a model")
    return tree


def model_of(tree: dict[str, Any], extra: str | None = None) -> dict[str, torch.Tensor]:
    """The model's ``state_dict`` in ``tree`` (CPU tensors), or the job's extra state named
    ``extra`` (an EMA's ``state_dict``). Raises :class:`trainer.errors.SnapshotError`."""
    if extra is None:
        part = tree.get("model")
    else:
        extras = tree.get("extra") or {}
        if extra not in extras:
            raise SnapshotError(f"--extra {extra}: the snapshot's extra state holds "
                                f"{sorted(extras) or 'nothing'}")
        part = extras[extra]
    if not isinstance(part, dict):
        raise SnapshotError("the snapshot's part is not a state_dict")
    return {str(k): v.detach().to("cpu") if isinstance(v, torch.Tensor) else v
            for k, v in part.items()}


def read_checkpoint(path: Path) -> tuple[str, dict[str, Any]]:
    """``("snapshot", tree)`` for a spotring snapshot file or directory, else
    ``("checkpoint", dict)`` for a ``torch.save``'d dict (``weights_only=True``). Raises
    :class:`trainer.errors.SnapshotError` naming the file and the fix."""
    path = Path(path)
    if path.is_dir():
        return "snapshot", read_snapshot(path)
    if not path.is_file():
        raise SnapshotError(f"--resume {path}: no such file")
    try:
        return "snapshot", read_snapshot(path)
    except SnapshotError:
        pass
    try:
        got = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file: one line
        raise SnapshotError(f"--resume {path}: neither a spotring snapshot nor a checkpoint "
                            f"torch.load(weights_only=True) reads ({str(e).splitlines()[0]})"
                            ) from e
    if not isinstance(got, dict):
        raise SnapshotError(f"--resume {path}: a {type(got).__name__}, expected a dict "
                            "(e.g. {'model': model.state_dict(), 'optimizer': ...})")
    return "checkpoint", got


def strip_prefixes(sd: dict[str, Any]) -> dict[str, Any]:
    """``sd`` without the ``module.`` / ``_orig_mod.`` prefixes DDP and compile add."""
    out = {}
    for k, v in sd.items():
        key = str(k)
        changed = True
        while changed:
            changed = False
            for p in PREFIXES:
                if key.startswith(p):
                    key, changed = key[len(p):], True
        out[key] = v
    return out


def checkpoint_parts(ckpt: dict[str, Any], extra_names: list[str]) -> dict[str, Any]:
    """The training state's parts found in a user's checkpoint under their usual names
    (see the module docstring): ``model`` (a bare ``state_dict`` counts as the model),
    ``optimizer``, ``scheduler``, ``extra`` (by the job's names), ``step``, ``epoch``,
    ``cursor``, ``samples_done``; absent ones are left out. Raises :class:`BadState`."""
    out: dict[str, Any] = {}
    for part, names in ALIASES.items():
        for n in names:
            if n in ckpt:
                out[part] = ckpt[n]
                break
    if "model" not in out and ckpt and all(isinstance(v, torch.Tensor) for v in ckpt.values()):
        out["model"] = ckpt  # torch.save(model.state_dict(), path)
    if not isinstance(out.get("model"), dict):
        raise BadState(f"no model state_dict among the checkpoint's keys {sorted(ckpt)[:8]}; "
                       "save {'model': model.state_dict(), ...}")
    out["model"] = strip_prefixes(out["model"])
    extra = ckpt.get("extra") if isinstance(ckpt.get("extra"), dict) else {}
    out["extra"] = {n: extra.get(n, ckpt.get(n)) for n in extra_names
                    if extra.get(n, ckpt.get(n)) is not None}
    return out
