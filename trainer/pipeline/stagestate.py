"""A stage's share of the training state: its layers' weights, buffers and optimiser state,
packed for the wave's reduction and moved between members as tensors and plain data.

Design. A pipelined job's model is an ``nn.Sequential``; its children are the *layers* the
layout cuts into stages (:mod:`trainer.pipeline.partition`). Every member builds the whole
model (the job is the same everywhere) but only the layers of its stage are *held*: current,
trained, carried in its optimiser and resident on its device (the others are released:
:mod:`trainer.pipeline.placement`, carried out by :meth:`ModelIndex.place`).
:class:`ModelIndex` maps a layer range to its state dict entries, its parameters and their
optimiser indices; :func:`bundle` and :func:`load` move a range with the small shared state
(step, data cursor, metrics) as a tree for :mod:`trainer.state.codec` (no pickle; the receiver
checks names, shapes and dtypes against its own model and the step against the generation's
agreement).

:class:`StagePack` is what one stage reduces per wave, one flat float32 tensor: the
parameters' gradients (already weighted by each micro-batch's share of the wave), one
*used* flag per parameter (a parameter no VW produced a gradient for is not stepped,
``set_to_none`` semantics), and the change each buffer underwent in the wave. The reduced
buffer change is the *sum* over VWs: BatchNorm's running statistics then move as one
process's would over the same micro-batches (to first order in the momentum), and
``num_batches_tracked`` counts every micro-batch exactly. Replicas apply the same reduced
tensor in the same wave order, so they hold the same bits.

The *live* buffers (the ones the stage's forward passes move) are the committed ones plus this
member's own changes of the waves it computed and has not applied (D > 0); the committed ones
(:attr:`StagePack.committed`) move only when a wave is applied. Whatever leaves the member as
the state of a step (a snapshot, an export: the head's gather) is the committed state:
:meth:`StagePack.committed_in_place`.

Rule for callers: pack a wave only after its last backward; apply reduced packs in wave
order; after a discarded wave, put the buffers back to :attr:`StagePack.committed`; send a
stage's state as a step's only inside :meth:`StagePack.committed_in_place`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from trainer.errors import BadState, LayoutError
from trainer.pipeline.placement import DEVICE, HOST, RELEASED, decide
from trainer.state import codec as st


@dataclass(frozen=True)
class _Layer:
    params: tuple[tuple[str, torch.nn.Parameter], ...]
    buffers: tuple[tuple[str, torch.Tensor], ...]
    opt_index: tuple[int, ...]  # the optimiser's index of each trainable parameter


class ModelIndex:
    """The layers of a sequential model and their parameters, buffers and optimiser slots."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if not isinstance(model, torch.nn.Sequential) or len(model) == 0:
            raise LayoutError("a pipelined job's model must be a non-empty torch.nn.Sequential "
                              "(its children are the layers cut into stages)")
        order = {id(p): i for i, p in enumerate(
            p for g in optimizer.param_groups for p in g["params"])}
        seen: dict[int, str] = {}
        layers = []
        children = list(model._modules.items())  # named_children() skips a repeated module
        if len({id(c) for _, c in children}) < len(children):
            raise LayoutError("a module appears twice in the model: layers that share "
                              "weights cannot be cut into stages")
        for name, child in children:
            params = tuple((f"{name}.{n}", p) for n, p in child.named_parameters())
            for full, p in params:
                if id(p) in seen:
                    raise LayoutError(f"parameter {full} is also {seen[id(p)]}: layers that "
                                      "share weights cannot be cut into stages")
                seen[id(p)] = full
            buffers = tuple((f"{name}.{n}", b) for n, b in child.named_buffers())
            layers.append(_Layer(params, buffers, tuple(
                order[id(p)] for _, p in params if p.requires_grad and id(p) in order)))
        self.layers = tuple(layers)
        self.modules = tuple(c for _, c in children)

    def __len__(self) -> int:
        return len(self.layers)

    def params(self, lo: int, hi: int) -> list[torch.nn.Parameter]:
        return [p for layer in self.layers[lo:hi] for _, p in layer.params if p.requires_grad]

    def buffers(self, lo: int, hi: int) -> list[torch.Tensor]:
        return [b for layer in self.layers[lo:hi] for _, b in layer.buffers]

    def param_bytes(self) -> list[float]:
        return [float(sum(p.numel() * p.element_size() for _, p in layer.params))
                for layer in self.layers]

    def state(self, lo: int, hi: int) -> dict[str, torch.Tensor]:
        """The state-dict entries of layers ``[lo, hi)`` (parameters and buffers)."""
        return {n: t.detach() for layer in self.layers[lo:hi]
                for n, t in (*layer.params, *layer.buffers)}

    def opt_state(self, optimizer: torch.optim.Optimizer, lo: int, hi: int
                  ) -> dict[str, dict[str, Any]]:
        """The optimiser state of layers ``[lo, hi)``'s parameters, by optimiser index."""
        out = {}
        for layer in self.layers[lo:hi]:
            for (_, p), i in zip([x for x in layer.params if x[1].requires_grad],
                                 layer.opt_index, strict=True):
                s = optimizer.state.get(p)
                if s:
                    out[str(i)] = dict(s)
        return out

    def keep_only(self, optimizer: torch.optim.Optimizer, lo: int, hi: int) -> None:
        """Forget the optimiser state of every parameter outside layers ``[lo, hi)``."""
        keep = {id(p) for p in self.params(lo, hi)}
        for p in [p for p in optimizer.state if id(p) not in keep]:
            del optimizer.state[p]

    def place(self, where: Sequence[str | None], device: torch.device,
              optimizer: torch.optim.Optimizer | None = None) -> None:
        """Put each layer's parameters and buffers where :mod:`trainer.pipeline.placement`
        decided (``where[i]`` for layer ``i``; None leaves it), and the optimiser state of a
        parameter that moves with it (its ``step`` stays where it is, as :func:`load` leaves
        it). The tensors keep their identity (the optimiser, the stage's runner and pack
        hold them): their contents are swapped. A released layer's tensors become ``meta``
        (no storage, no gradient); one materialised from released holds garbage until
        loaded. Release a layer's optimiser state first (:meth:`keep_only`)."""
        targets = {DEVICE: device, HOST: torch.device("cpu"), RELEASED: torch.device("meta")}
        for layer, w in zip(self.layers, where, strict=True):
            if w is None:
                continue
            for _, t in (*layer.params, *layer.buffers):
                _place(t, targets[w])
                s = optimizer.state.get(t) if optimizer is not None and w != RELEASED else None
                if s:
                    for k, v in s.items():
                        if isinstance(v, torch.Tensor) and k != "step":
                            s[k] = v.to(t.device)

    def hold(self, optimizer: torch.optim.Optimizer, lo: int, hi: int, device: torch.device
             ) -> None:
        """Keep only layers ``[lo, hi)`` (a stage): on ``device``, with their optimiser
        state; every other layer released (:func:`trainer.pipeline.placement.decide`)."""
        self.keep_only(optimizer, lo, hi)
        self.place(decide(len(self), lo, hi), device, optimizer)

    def place_whole(self, where: str, device: torch.device,
                    optimizer: torch.optim.Optimizer) -> None:
        """Every layer on ``where`` (a head gathering; a whole state about to be loaded)."""
        self.place(decide(len(self), 0, 0, whole=where), device, optimizer)

    def released(self) -> bool:
        """Is some layer released (the model is not whole anywhere on this member)?"""
        return any(t.is_meta for layer in self.layers for _, t in (*layer.params,
                                                                     *layer.buffers))

    def resident(self, optimizer: torch.optim.Optimizer, device: torch.device
                 ) -> tuple[int, int]:
        """Bytes on ``device``: ``(weights and buffers, optimiser state)``."""
        weights = sum(t.numel() * t.element_size() for layer in self.layers
                      for _, t in (*layer.params, *layer.buffers) if _on(t, device))
        opt = sum(v.numel() * v.element_size() for s in optimizer.state.values()
                  for v in s.values() if isinstance(v, torch.Tensor) and _on(v, device))
        return weights, opt

    def checksum(self, optimizer: torch.optim.Optimizer, lo: int, hi: int) -> str:
        """Checksum of layers ``[lo, hi)``: weights, buffers and optimiser state."""
        return st.checksum(self.state(lo, hi), self.opt_state(optimizer, lo, hi))


def place_module(module: torch.nn.Module, device: torch.device) -> None:
    """Put one module's parameters and buffers on ``device`` (their identity kept)."""
    for t in (*module.parameters(), *module.buffers()):
        _place(t, device)


def _on(t: torch.Tensor, device: torch.device) -> bool:
    d = t.device
    return d.type == device.type and (d.index or 0) == (device.index or 0)


def _place(t: torch.Tensor, target: torch.device) -> None:
    if _on(t, target):
        return
    if target.type == "meta" and isinstance(t, torch.nn.Parameter):
        t.grad = None
    new = (torch.empty_like(t, device=target) if t.is_meta or target.type == "meta"
           else t.detach().to(target))
    if isinstance(t, torch.nn.Parameter):
        new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
    torch.utils.swap_tensors(t, new)


def bundle(index: ModelIndex, optimizer: torch.optim.Optimizer, lo: int, hi: int,
           meta: Mapping[str, Any]) -> dict[str, Any]:
    """Layers ``[lo, hi)`` and the shared state ``meta`` as a tree for
    :func:`trainer.state.codec.encode`."""
    return {"lo": lo, "hi": hi, "model": index.state(lo, hi),
            "opt": index.opt_state(optimizer, lo, hi), "meta": dict(meta)}


def load(index: ModelIndex, optimizer: torch.optim.Optimizer, tree: Any, lo: int, hi: int
         ) -> dict[str, Any]:
    """Load a received :func:`bundle` of layers ``[lo, hi)`` into this member's model and
    optimiser after checking it (names, shapes and dtypes of its tensors; the optimiser
    state's shapes). Returns its ``meta``. Raises :class:`trainer.errors.BadState`."""
    if not isinstance(tree, dict) or tree.get("lo") != lo or tree.get("hi") != hi:
        raise BadState(f"the stage state received is not layers {lo}..{hi - 1}")
    model, opt, meta = tree.get("model"), tree.get("opt"), tree.get("meta")
    own = index.state(lo, hi)
    st.check_like(model, own, f"the state of layers {lo}..{hi - 1}")
    if not isinstance(opt, dict) or not isinstance(meta, dict):
        raise BadState("the stage state received lacks its optimiser state or meta")
    params = {str(i): p for layer in index.layers[lo:hi] for (_, p), i in zip(
        [x for x in layer.params if x[1].requires_grad], layer.opt_index, strict=True)}
    if not set(opt) <= set(params):
        raise BadState("the stage state received has optimiser state of other layers")
    for k, s in opt.items():
        p = params[k]
        if not isinstance(s, dict) or any(
                isinstance(v, torch.Tensor) and v.numel() > 1 and v.shape != p.shape
                for v in s.values()):
            raise BadState(f"optimiser state {k}: shapes differ from its parameter")
    with torch.no_grad():
        for name, t in own.items():
            t.copy_(model[name])
    for k, s in opt.items():
        p = params[k]
        optimizer.state[p] = {n: (v.to(p.device) if isinstance(v, torch.Tensor) and n != "step"
                                  else v) for n, v in s.items()}
    return meta


class StagePack:
    """The flat tensor a stage reduces per wave (see the module docstring)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], buffers: Sequence[torch.Tensor]
                 ) -> None:
        self.params, self.buffers = list(params), list(buffers)
        self._n_grad = sum(p.numel() for p in self.params)
        self._n_buf = sum(b.numel() for b in self.buffers)
        self.numel = self._n_grad + len(self.params) + self._n_buf
        self.committed = [b.detach().clone() for b in self.buffers]

    def pack(self, before: Sequence[torch.Tensor], device: torch.device
             ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """This wave's gradients, used flags and buffer changes (since ``before``) as one
        flat float32; clears the gradients. Returns ``(flat, own buffer changes)``."""
        flat = torch.zeros(self.numel, dtype=torch.float32, device=device)
        o = 0
        used = self._n_grad
        for i, p in enumerate(self.params):
            n = p.numel()
            if p.grad is not None:
                flat[o:o + n] = p.grad.detach().reshape(-1)
                flat[used + i] = 1.0
            p.grad = None
            o += n
        o = used + len(self.params)
        deltas = []
        for b, b0 in zip(self.buffers, before, strict=True):
            d = (b.detach() - b0) if b.is_floating_point() else (b.detach() - b0).to(
                torch.float32)
            deltas.append(d.clone())
            flat[o:o + b.numel()] = d.reshape(-1).to(torch.float32)
            o += b.numel()
        return flat, deltas

    def live_buffers(self) -> list[torch.Tensor]:
        return [b.detach().clone() for b in self.buffers]

    def grad_sqnorm(self, reduced: torch.Tensor) -> float:
        """The squared 2-norm of a reduced pack's gradients: the sum over the parameters
        someone used of each gradient's squared norm (float32 norms, as
        ``torch.nn.utils.clip_grad_norm_`` takes them; summed in float64). A stage's part of
        its virtual worker's total norm."""
        used = reduced[self._n_grad:self._n_grad + len(self.params)].tolist()
        total, o = 0.0, 0
        for p, u in zip(self.params, used, strict=True):
            n = p.numel()
            if u > 0:
                total += float(torch.linalg.vector_norm(reduced[o:o + n].to(p.dtype))) ** 2
            o += n
        return total

    def apply(self, reduced: torch.Tensor, optimizer: torch.optim.Optimizer,
              pending: Sequence[Sequence[torch.Tensor]] = (), *,
              clip: float | None = None) -> None:
        """Step the optimiser with a reduced pack (parameters nobody used are not stepped),
        its gradients first multiplied by ``clip`` (the clipping coefficient, as
        ``clip_grad_norm_`` applies it; None: not clipped), move the committed buffers by the
        reduced change, and set the live buffers to them plus this member's own changes of
        the waves computed since (``pending``)."""
        used = reduced[self._n_grad:self._n_grad + len(self.params)].tolist()
        o = 0
        for p, u in zip(self.params, used, strict=True):
            n = p.numel()
            p.grad = reduced[o:o + n].view_as(p).to(p.dtype) if u > 0 else None
            if p.grad is not None and clip is not None:
                p.grad = p.grad * torch.tensor(clip, dtype=p.dtype, device=p.grad.device)
            o += n
        optimizer.step()
        for p in self.params:
            p.grad = None
        o = self._n_grad + len(self.params)
        with torch.no_grad():
            for i, b in enumerate(self.buffers):
                n = b.numel()
                d = reduced[o:o + n].view_as(b)
                c = self.committed[i]
                if c.is_floating_point():
                    c.add_(d.to(c.dtype))
                else:
                    c.add_(torch.round(d).to(c.dtype))
                o += n
        self.restore(pending)

    @contextmanager
    def committed_in_place(self) -> Iterator[None]:
        """Inside the context the live buffers hold the committed ones (what a snapshot, an
        export or a gathered evaluation must see: the state of the newest applied wave);
        after it, exactly what they held before (this member's own changes of the waves in
        flight included), even when the context raised."""
        live = self.live_buffers()
        self.restore()
        try:
            yield
        finally:
            with torch.no_grad():
                for b, v in zip(self.buffers, live, strict=True):
                    b.copy_(v)

    def restore(self, pending: Sequence[Sequence[torch.Tensor]] = ()) -> None:
        """Live buffers := committed plus ``pending`` own changes (none: a discarded wave)."""
        with torch.no_grad():
            for i, b in enumerate(self.buffers):
                v = self.committed[i].clone()
                for deltas in pending:
                    d = deltas[i]
                    v += d.to(v.dtype) if v.is_floating_point() else torch.round(d).to(v.dtype)
                b.copy_(v)


def clip_coefficient(total_norm: float, max_norm: float) -> float:
    """What ``torch.nn.utils.clip_grad_norm_`` multiplies every gradient by for a total norm
    ``total_norm``: ``max_norm / (total_norm + 1e-6)`` in float32, at most 1 (NaN for a
    non-finite norm, as torch's with ``error_if_nonfinite=False``). Pure."""
    coef = torch.tensor(max_norm) / (torch.tensor(total_norm, dtype=torch.float32) + 1e-6)
    return float(torch.clamp(coef, max=1.0))


def whole_checksum(stage_digests: Sequence[tuple[int, int]], mine: str) -> str:
    """A checksum of the whole model from every member's ``(stage + 1, digest)`` (0: no
    stage), the same on every member when every stage's replicas are equal; else it ends
    with this member's own digest ``mine`` ("spare" for a member without a stage). Pure."""
    by_stage: dict[int, set[int]] = {}
    for j, c in stage_digests:
        if j > 0:
            by_stage.setdefault(j, set()).add(c)
    whole = hashlib.sha256(repr(sorted((j, sorted(c)) for j, c in by_stage.items()))
                           .encode()).hexdigest()[:16]
    if any(len(c) > 1 for c in by_stage.values()):
        return f"{whole}:{mine or 'spare'}"
    return whole
