"""A membership in the hybrid mode: all-reduce inside a zone, parameter-server shards across
zones, asynchronous large mini-batches with bounded staleness.

Design. :class:`HybridMode` is a mode of the member skeleton (:mod:`trainer.worker.member`:
wait, form, drain, the commit, snapshots and reports are the skeleton's) whose state
transfer is the ring's (:class:`trainer.worker.modes.ring.RingMode`, over the generation's
full group) and that steps differently inside a generation. Forming: then a group per zone
(prefix ``g<n>/z<k>/``) and one of the zone leaders (``g<n>/ps/``), each bound to the
worker's ring address. Then every zone runs *rounds*; in
each, the zone's leader decides and broadcasts to its zone a header ``[action, ticket,
apply, remote, final, newest]`` (plus the other zones' updates its members lack):

* **apply** the next updates in version order (:meth:`trainer.hybrid.update.UpdateLayout.
  apply`), the zone's own ones from memory, the others' as the shards relayed them; each
  applied update is one commit of the skeleton (``step``, data cursor, metrics line, rank
  0's evaluation, progress and snapshots); with ``Job.grad_clip`` every replica clips the
  update's gradients as it applies them (the norm over the update, one global batch's
  gradients, as the ring clips a step's), the same bits on every replica;
* **compute** ticket ``v`` (``action`` 1) once the weights are at most ``s`` versions behind
  ``v`` (:func:`trainer.hybrid.staleness.may_compute`): the zone's members split the batch
  of ``v`` (the data cursor after ``v`` updates; sizes by the ring's batch planner over the
  zone's members), compute, reduce over the zone (:class:`trainer.hybrid.update.
  ZoneStepper`) and keep the update; the leader pushes it to the shards
  (:class:`trainer.hybrid.server.Exchange`) and asks for its next ticket meanwhile;
* **done** (``action`` 2): the sequencer stopped (the data ended, or a newer generation was
  published), every update below ``final`` is applied and served: the leader closes the
  exchange and the zone leaves the generation at ``final``, the same version as every zone.

A leader that waits (for a ticket, or for another zone's update) broadcasts a header with
nothing to do at least every quarter of the collective timeout, so a zone member that
hangs is still found by the collective timeout while a slow zone is waited for.

Faults. A killed or hung member breaks its zone's collectives or a leader's links (gloo
reports a closed connection; a hang, the heartbeat); the generation is declared broken as
in the ring and the next one forms from the survivors, who agree on the newest version (the
replica that applied the most updates sends its state to the others). A shard host lost
loses nothing committed: every zone holds a whole replica of the weights and optimiser
state, the shards only carry updates. An update computed but applied nowhere is computed
again on the same samples (the samples of an update are fixed by its version), so every
sample is still seen once per epoch; every member holding the state lost at once resumes
from the durable snapshot as the ring does. The samples of an update are recorded by each
member of the zone that computed it, its own share, when it applies it, or at the next
forming when a peer applied it; the shares of zone members gone by then (killed, dropped
while hung) are recorded by the first of the zone still there.

Memory. A member's share above its cap (``Job.micro_batch``, lowered when it runs out of
memory) is computed in slices (:class:`trainer.hybrid.update.ZoneStepper`). A member that
runs out of memory marks its row in the zone's reduction: every member of the zone discards
that computation (nothing pushed to the shards, nothing applied), the member's cap halves
(kept in its runtime across generations) and the zone computes the same ticket, the same
samples, again: never a job error while the cap can halve, exactly-once data kept.

Ends. Every zone stops at one version: the data's end, ``Job.max_steps`` or the run's
``--until-steps`` and ``--until-epochs`` (the sequencer issues no ticket beyond the first of
them: :func:`trainer.hybrid.staleness.end_update` over :meth:`trainer.job.Job.ends_at`).

Rule for callers: as :class:`~trainer.worker.modes.base.Mode`. ``HybridSettings(staleness=0)``
runs the ring itself.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch.distributed import PrefixStore

from trainer.collective import groups
from trainer.collective.step import B_COL, COMPUTE_COL
from trainer.data import batching
from trainer.data.sampler import CursorState, scale_sizes, split
from trainer.errors import GenerationBroken
from trainer.hybrid import settings_of
from trainer.hybrid.placement import place, shard_hosts, zone_layout
from trainer.hybrid.server import Exchange
from trainer.hybrid.staleness import (Sequencer, contiguous, cursor_after, end_update,
                                      may_compute)
from trainer.hybrid.update import LOSS_SUM, SAMPLES, STALENESS, UpdateLayout, ZoneStepper
from trainer.protocol import messages as mb
from trainer.worker.modes.base import HYBRID_LACKS, Commit, Transferred, Unsettled, lacking
from trainer.worker.modes.ring import RingMode

if TYPE_CHECKING:
    from trainer.worker.member import Member

log = logging.getLogger(__name__)

WAIT, COMPUTE, DONE = 0, 1, 2
HEADER = 6  # action, ticket, apply, remote, final, newest; then the zone's batch sizes


@dataclass
class _Own:
    """An update this zone computed, kept until its turn: the vector and this member's
    samples (recorded when it is applied), and every zone member's (``shares`` in zone rank
    order, ``zkeys`` theirs: for members that are gone when a peer applied it)."""

    update: torch.Tensor
    epoch: int
    ids: list[int]
    shares: list[list[int]] = field(default_factory=list)
    zkeys: list[str] = field(default_factory=list)


@dataclass
class _Gen:
    """The hybrid machinery of one generation."""

    zone: int
    zrank: int
    zkeys: list[str]
    zgroup: groups.Group
    stepper: ZoneStepper
    layout: UpdateLayout
    end: int
    psgroup: groups.Group | None = None
    exchange: Exchange | None = None
    held: list[int] = field(default_factory=list)  # tickets this zone holds (leader)
    asked: int = 0  # requests without an answer yet (leader)
    stop_asked: bool = False
    final: int | None = None
    newest: int = 0
    closed: bool = False
    timing: dict[int, tuple[int, float, float]] = field(default_factory=dict)


class HybridMode:
    """The hybrid mode (see the module docstring)."""

    def __init__(self, member: Member) -> None:
        self.m = member
        self.ring = RingMode(member)  # the state transfer; everything at staleness 0
        job = member.w.job
        self._problem: str | None = None
        try:
            self.settings = settings_of(job)
        except ValueError as e:
            self.settings = None  # type: ignore[assignment]
            self._problem = str(e)
        if self._problem is None and job.precision == "fp16":
            self._problem = ("precision fp16 is not supported in the hybrid mode (its loss "
                             "scale would have to follow every zone's updates); use bf16")
        self.ring_mode = self._problem is None and self.settings.staleness == 0
        self.gen: _Gen | None = None
        self.own: dict[int, _Own] = {}

    def problem(self) -> str | None:
        if self._problem is None and not self.ring_mode:
            return lacking(self.m.w.job, HYBRID_LACKS, "hybrid (staleness > 0)")
        return None if self._problem is None else f"hybrid mode: {self._problem}"

    def is_head(self) -> bool:
        return self.m.rank == 0

    def whole_model(self) -> AbstractContextManager[bool]:
        return self.ring.whole_model()  # every zone holds a whole replica

    def epoch_ended(self, epoch: int) -> None:
        if self.ring_mode:  # staleness 0: the ring's steps, the ring's comparison
            self.ring.epoch_ended(epoch)

    def describe(self) -> str:
        return ""

    def checksum(self) -> str:
        return self.ring.checksum()

    def transfer_state(self) -> Transferred:
        return self.ring.transfer_state()

    def close(self) -> None:
        self.drop()

    def unsettled(self) -> Unsettled | None:
        # staleness 0 steps as the ring; above it, the zone's first member left records a
        # gone member's shares (prepare)
        return self.ring.unsettled()

    # -- forming -----------------------------------------------------------------------------

    def prepare(self) -> int:
        """The zone's group and stepper; the leader's group of leaders and its exchange.
        Returns the updates this zone computed that no member applied (computed again)."""
        if self.ring_mode:
            return self.ring.prepare()
        m, w = self.m, self.m.w
        job, cfg, plan, rank, rt = w.job, w.cfg, m.plan, m.rank, w.runtime
        assert plan is not None
        step, cursor = w.state.progress.step, w.state.progress.cursor
        here = set(plan.keys())
        for v in sorted(self.own):  # updates this zone computed that a peer applied count
            o = self.own[v]
            if v < step:
                m.record_samples(v, o.epoch, o.ids)
                # the shares of zone members gone since (killed, dropped while hung) are
                # recorded by the first of the zone still here: they count, and no one else
                # will record them (a hung member rejoins as a new member, knowing nothing)
                stay = [k for k in o.zkeys if k in here]
                if stay and stay[0] == plan.keys()[rank]:
                    gone = [i for k, ids in zip(o.zkeys, o.shares, strict=True)
                            if k not in here for i in ids]
                    if gone:
                        m.record_samples(v, o.epoch, gone)
        lost = sum(1 for v in self.own if v >= step)  # applied nowhere: computed again
        self.own.clear()
        zl = zone_layout(plan.zones, len(plan.members))
        zone = zl.zone_of(rank)
        ranks = zl.ranks[zone]
        keys = plan.keys()
        layout = UpdateLayout(job.model)
        end = end_update(  # the epochs, Job.max_steps, --until-*: every zone stops there
            cursor, step, len(job), job.global_batch, rt.min_batch,
            lambda s, e: job.ends_at(s, e, until_steps=cfg.until_steps,
                                     until_epochs=cfg.until_epochs))
        zgroup = self._subgroup(f"z{zone}", ranks.index(rank), len(ranks))
        stepper = ZoneStepper(job.model, layout, job.loss_fn, world=len(ranks),
                              rank=ranks.index(rank), device=rt.device,
                              precision=job.precision, bucket_mb=cfg.bucket_mb,
                              forward_loss=job.forward_loss, micro_batch=rt.micro_cap,
                              min_batch=rt.min_batch)
        g = self.gen = _Gen(zone, ranks.index(rank), [keys[r] for r in ranks], zgroup,
                            stepper, layout, end, newest=plan.generation)
        self.ring.plan_sizes(plan, keys=g.zkeys)
        if rank != zl.leader(zone):
            return lost
        zones = len(zl.ranks)
        shards = self.settings.shards or zones
        placement = place(layout.items(), shards, tolerance=self.settings.tolerance)
        g.psgroup = self._subgroup("ps", zone, zones)
        seq = Sequencer(plan.generation, step, end) if zone == 0 else None
        g.exchange = Exchange(g.psgroup.ctl, zone, zones, layout.numel, placement,
                              layout.item_offsets(), shard_hosts(shards, zones),
                              start=step, end=end,
                              sequencer=seq,
                              p2p_timeout_s=max(600.0, 20 * cfg.collective_timeout_s)).start()
        log.info("hybrid generation %d: zone %d/%d (%s) of %d, leader; %d shards (imbalance "
                 "%.3f), staleness %d, updates %d..%d", plan.generation, zone, zones,
                 zl.names[zone] or "-", len(ranks), shards, placement.imbalance,
                 self.settings.staleness, step, end)
        return lost

    def _subgroup(self, name: str, rank: int, world: int) -> groups.Group:
        """A process group of some members of the generation, its rendezvous under
        ``g<n>/<name>/`` (the coordinator deletes ``g<n>/`` with the generation)."""
        m, cfg, plan = self.m, self.m.w.cfg, self.m.plan
        assert plan is not None
        gen = plan.generation
        conn = m.store.clone()
        try:
            group = groups.form_group(PrefixStore(f"{mb.group_prefix(gen)}{name}/", conn), gen,
                                      rank, world, cfg.collective_timeout_s,
                                      lambda: m.broken(gen), backend=plan.backend,
                                      hostname=cfg.ring_host or m.store.local_address)
        except GenerationBroken:
            groups.bury(conn)
            conn.close()
            raise
        if plan.backend != "nccl":
            conn.close()  # gloo's rendezvous is over
        else:
            group.store = conn  # NCCL reads the store again lazily: closed with the group
        return group

    def drop(self) -> None:
        g, self.gen = self.gen, None
        if g is not None:
            if g.exchange is not None and not g.closed:
                g.exchange.abandon()
            g.stepper.close()
            for grp in (g.zgroup, g.psgroup):
                if grp is not None:
                    grp.abort()
                    groups.bury(grp)
        self.ring.drop()

    # -- one round -----------------------------------------------------------------------------

    def step(self) -> int:
        """One round of this zone (module docstring); at the end of the generation, the
        rounds until the zone is done. Returns the newest generation known (the current
        one while the zone goes on). Raises :class:`trainer.errors.GenerationBroken`,
        :class:`trainer.errors.JobCodeError`."""
        if self.ring_mode:
            return self.ring.step()
        g, plan, w = self.gen, self.m.plan, self.m.w
        assert g is not None and plan is not None and self.m.hb is not None
        self._round()
        while not g.closed and (w.over() or (
                g.final is not None and w.state.progress.step >= g.final)):
            self._round()  # the end of the generation: leave it only together
        return max(g.newest, self.m.hb.latest) if g.closed else plan.generation

    def _aborted(self) -> bool:
        g = self.gen
        return self.m.abort() or (
            g is not None and g.exchange is not None and g.exchange.failed is not None)

    def _round(self) -> None:
        g, w = self.gen, self.m.w
        assert g is not None
        lead = g.exchange is not None
        head = torch.zeros(HEADER + len(g.zkeys), dtype=torch.int64)
        remote: list[torch.Tensor] = []
        if lead:
            action, ticket, n, versions = self._lead()
            remote = [g.exchange.take(v) for v in versions]  # type: ignore[union-attr]
            sizes = self._zone_sizes(ticket) if action == COMPUTE else [0] * len(g.zkeys)
            head[:] = torch.tensor([action, ticket, n, len(remote),
                                    -1 if g.final is None else g.final, g.newest, *sizes])
        self._zone_broadcast(head, "zone header")
        action, ticket, n, n_remote, final, newest = (int(x) for x in head[:HEADER].tolist())
        g.final = None if final < 0 else final
        g.newest = max(g.newest, newest)
        if n_remote:
            body = (torch.cat(remote) if lead else
                    torch.empty(n_remote * g.layout.numel, dtype=torch.float32))
            self._zone_broadcast(body, "zone updates")
            remote = list(body.split(g.layout.numel))
        if n and self.m.abort():
            # a member that was frozen (its heartbeat too) asks the store before it commits:
            # what it would apply now may have been computed again by the survivors
            raise GenerationBroken("the generation was broken while this member waited")
        for _ in range(n):
            v = w.state.progress.step
            own = self.own.pop(v, None)
            self._apply(v, own.update if own is not None else remote.pop(0), own)
        if action == COMPUTE:
            self._compute(ticket, [int(x) for x in head[HEADER:].tolist()])
        elif action == DONE:
            if lead:
                assert g.exchange is not None
                g.exchange.close(self._wait_until)
            g.closed = True

    def _zone_broadcast(self, t: torch.Tensor, what: str) -> None:
        g = self.gen
        assert g is not None
        groups.wait(g.zgroup.ctl.broadcast(t, 0), self._aborted, what)

    def _wait_until(self, done: Callable[[], bool]) -> None:
        """Wait for ``done()`` (arrivals on the exchange), abortably."""
        g = self.gen
        assert g is not None and g.exchange is not None
        while not done():
            if self._aborted():
                raise GenerationBroken("aborted (the generation was declared broken)")
            g.exchange.wait(groups.WAIT_SLICE_S)

    def _lead(self) -> tuple[int, int, int, list[int]]:
        """The leader's decision for this round: ``(action, ticket, apply, remote versions)``.
        Waits (abortably) while there is nothing to do, at most a keepalive period."""
        g, m, s = self.gen, self.m, self.settings.staleness
        assert g is not None and g.exchange is not None and m.plan is not None
        assert m.hb is not None
        x, gen = g.exchange, m.plan.generation
        deadline = time.monotonic() + m.w.cfg.collective_timeout_s / 4
        while True:
            if self._aborted():
                if x.failed is not None:
                    raise GenerationBroken(f"cross-zone exchange: {x.failed}")
                raise GenerationBroken("aborted (the generation was declared broken)")
            while (t := x.ticket()) is not None:
                g.asked -= 1
                g.newest = max(g.newest, t.newest)
                if t.version is None:
                    g.final = t.final
                else:
                    g.held.append(t.version)
            latest = m.hb.latest
            if g.final is None and latest > gen and not g.stop_asked:
                x.request(latest)  # the sequencer stops: every zone leaves at one version
                g.asked += 1
                g.stop_asked = True
            if g.final is None and not g.held and g.asked == 0:
                x.request(latest)
                g.asked += 1
            step = m.w.state.progress.step
            remote = x.available()
            n = contiguous(step, set(self.own) | remote, self.settings.max_apply)
            versions = [v for v in range(step, step + n) if v not in self.own]
            if g.held and may_compute(g.held[0], step + n, s):
                v = g.held.pop(0)
                if not g.held and g.final is None and g.asked == 0:
                    x.request(latest)  # the next ticket arrives while this one computes
                    g.asked += 1
                return COMPUTE, v, n, versions
            if (g.final is not None and not g.held and step + n == g.final
                    and x.close_ready(g.final)):
                return DONE, -1, n, versions
            if n or time.monotonic() >= deadline:
                return WAIT, -1, n, versions
            x.wait(groups.WAIT_SLICE_S)

    # -- compute and apply ---------------------------------------------------------------------

    def _cursor(self, v: int) -> tuple[CursorState, int]:
        """The data cursor before update ``v`` and the samples of ``v``."""
        w = self.m.w
        job, p, lo = w.job, w.state.progress, w.runtime.min_batch
        cur = cursor_after(p.cursor, v - p.step, len(job), job.global_batch, lo)
        return cur, cur.step_total(len(job), job.global_batch, min_batch=lo)

    def _zone_sizes(self, v: int) -> list[int]:
        """The leader's split of update ``v`` over its zone (zone rank order): the zone's
        members may hold different speed models (a joiner's came from another zone), so
        the leader's plan is the one every member of the zone follows."""
        w, g = self.m.w, self.gen
        assert g is not None
        return scale_sizes([w.state.sizes.get(k, 0) for k in g.zkeys], self._cursor(v)[1],
                           min_batch=w.runtime.min_batch)

    def _compute(self, v: int, sizes: list[int]) -> None:
        """Compute ticket ``v`` with the zone (this member's share ``sizes[zone rank]``)."""
        g, m = self.gen, self.m
        w, plan, rt = m.w, m.plan, m.w.runtime
        assert g is not None and plan is not None and m.hb is not None
        step = w.state.progress.step
        cur, total = self._cursor(v)
        if sum(sizes) != total:
            raise GenerationBroken(f"the leader split update {v} into {sum(sizes)} samples, "
                                   f"not {total}")
        shares = split(rt.order(cur.epoch), cur, sizes)
        ids = shares[g.zrank]
        b = int(ids.numel())
        rt.maybe_fault(step)
        batch = rt.batch(ids, step) if b > 0 else None
        while True:  # a member out of memory: every member of the zone computes it again
            res = g.stepper.compute(g.zgroup.pg, batch, b, total, step=step,
                                    latest=m.hb.latest, eval_s=w.outputs.eval_s,
                                    staleness=v - step, zone=g.zone,
                                    should_abort=self._aborted, after_compute=rt.slow)
            rt.micro_cap = g.stepper.micro_cap  # this member's limit, kept across generations
            if not res.discarded:
                break
        self.own[v] = _Own(res.update, cur.epoch, ids.tolist(),
                           [t.tolist() for t in shares], list(g.zkeys))
        g.timing[v] = (b, res.compute_s, res.wait_s)
        if g.exchange is not None:
            g.exchange.push(v, res.update)
        rows = res.rows
        self.ring.plan_sizes(plan, [batching.StepTiming(g.zkeys[r], int(rows[r, B_COL]),
                                                        float(rows[r, COMPUTE_COL]))
                                    for r in range(len(g.zkeys)) if rows[r, B_COL] > 0],
                             keys=g.zkeys)
        rt.note_speed(b, res.compute_s)

    def _apply(self, v: int, update: torch.Tensor, own: _Own | None) -> None:
        """Apply update ``v`` (the next version) on this replica and commit it: one step."""
        g, w = self.gen, self.m.w
        assert g is not None
        job, p = w.job, w.state.progress
        meta = g.layout.meta(update)
        total = int(meta[SAMPLES])
        expect = p.cursor.step_total(len(job), job.global_batch, min_batch=w.runtime.min_batch)
        if total != expect:
            raise GenerationBroken(f"update {v} carries {total} samples, its step {expect}")
        norm = g.layout.apply(update, job.optimizer, clip=job.grad_clip)
        b, compute_s, wait_s = g.timing.pop(v, (0, 0.0, 0.0))
        record = {
            "batch": b, "compute_s": round(compute_s, 6), "wait_s": round(wait_s, 6),
            "step_s": round(compute_s + wait_s, 6), "skipped": False, "head_start_s": 0.0,
            "zone": g.zone, "own": own is not None, "staleness": int(meta[STALENESS]),
            **({"grad_norm": norm} if norm is not None else {})}
        if g.exchange is not None:
            record["ps_bytes"] = {str(k): n for k, n in g.exchange.shard_bytes.items()}
        self.m.commit(Commit(total, meta[LOSS_SUM] / total,
                             own.ids if own is not None else (), record))
