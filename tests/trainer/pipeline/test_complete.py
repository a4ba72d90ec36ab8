"""Completing the waves a failure left started and not agreed (trainer.pipeline.complete), and
what the table carries of them."""

from __future__ import annotations

import torch

from trainer.pipeline import complete as cp
from trainer.pipeline import table as tb
from trainer.pipeline.partition import Layout

BOUNDS = (0, 3, 6)
# two VWs of two stages: ranks 0, 1 (VW 0) and 2, 3 (VW 1); 8 micro-batches of 8, 4 each
OLD = Layout(((0, 1), (2, 3)), BOUNDS, (1.0, 1.0))
SIZES = [(8,) * 8] * 3
VW0, VW1 = (0, 1, 2, 3), (4, 5, 6, 7)


def _h(rank: int, stage: int | None, *kept: cp.Kept, current: bool = True,
       bounds: tuple[int, ...] | None = BOUNDS, first: int = 10,
       backup: tuple[cp.Kept, ...] = ()) -> cp.Holder:
    return cp.Holder(rank, stage, bounds, current, first, kept, backup)


def _done(cover: tuple[int, ...], reduced: bool = False) -> cp.Kept:
    return cp.Kept(cover, True, reduced)


def test_the_dead_vw_s_share_is_computed_again_the_rest_kept() -> None:
    # rank 3 (VW 1, stage 1) died; the survivors form 1 VW (0, 1) and a spare (2). VW 0
    # computed waves 10..12, VW 1's rank 2 computed 10 and started 11
    new = Layout(((0, 1),), BOUNDS, (1.0,), spares=(2,))
    holders = [_h(0, 0, _done(VW0), _done(VW0), _done(VW0)),
               _h(1, 1, _done(VW0), _done(VW0), _done(VW0)),
               _h(2, 0, _done(VW1), cp.Kept(VW1))]
    got = cp.plan(holders, new, 10, 13, SIZES)
    assert [wp.recompute for wp in got.waves] == [VW1] * 3
    for wp in got.waves:
        assert wp.role(0, 0) == ("kept", VW0, (False,))
        assert wp.role(1, 1) == ("kept", VW0, (False,))
        assert wp.reduced == (None, None)
    # VW 1 had computed wave 10 (lost) and started 11 (in flight when its member died)
    assert (got.lost_samples, got.in_flight_samples, got.lost) == (32, 32, 1)


def test_a_stage_reduced_before_the_failure_is_complete_and_its_share_kept() -> None:
    # wave 10's stage-1 reduction completed on rank 1 before rank 3 died: the dead member's
    # stage-1 gradient is in it, and rank 2 (VW 1, stage 0) kept its own
    new = Layout(((0, 1), (2, 4)), BOUNDS, (1.0, 1.0))  # rank 4 replaces rank 3
    holders = [_h(0, 0, _done(VW0)), _h(1, 1, _done(VW0, reduced=True)), _h(2, 0, _done(VW1)),
               cp.Holder(4, None, None, False, 0)]
    got = cp.plan(holders, new, 10, 11, SIZES[:1])
    (wp,) = got.waves
    assert wp.recompute == () and got.lost == 0
    assert wp.reduced == (None, 1)
    assert wp.role(1, 1) == ("reduced", (), ()) and wp.role(4, 1) == ("zero", (), ())
    assert wp.role(0, 0) == ("kept", VW0, (False,)) and wp.role(2, 0) == ("kept", VW1, (False,))
    parts = cp.parts(wp, new, wp.recompute, (0, 0), 8, 0)
    assert parts == {0: VW0, 2: VW1}  # every micro-batch recorded once at stage 0


def test_the_dead_vw_s_finished_packs_come_from_the_backups_the_next_vw_holds() -> None:
    # at D = 2 with 2 VWs each pack is also sent to the same stage of the next VW: rank 3
    # (VW 1, stage 1) died after finishing waves 10 and 11 (VW 0 was behind), its backups
    # are on rank 1, its partner's on rank 0 (and on rank 2 itself, now a spare)
    new = Layout(((0, 1),), BOUNDS, (1.0,), spares=(2,))
    holders = [_h(0, 0, _done(VW0), cp.Kept(VW0), backup=(_done(VW1), _done(VW1))),
               _h(1, 1, _done(VW0), cp.Kept(VW0), backup=(_done(VW1), _done(VW1))),
               _h(2, 0, _done(VW1), _done(VW1), cp.Kept(VW1), backup=(_done(VW0),))]
    got = cp.plan(holders, new, 10, 13, SIZES)
    w10, w11, w12 = got.waves
    assert w10.recompute == () and w10.role(0, 0) == ("kept", tuple(range(8)), (False, True))
    assert w10.role(1, 1) == ("kept", tuple(range(8)), (False, True))
    assert w11.recompute == VW0 and w11.role(1, 1) == ("kept", VW1, (True,))
    assert w12.recompute == tuple(range(8))
    assert got.lost_samples == 0 and got.in_flight_samples == 32 + 32  # VW 0 in 11, VW 1 in 12
    assert got.lost == 1  # the passes in flight count, as the ring's step in flight


def test_kept_packs_of_other_boundaries_or_members_behind_are_not_used() -> None:
    new = Layout(((0, 1),), (0, 2, 6), (1.0,), spares=(2,))  # the boundaries moved
    holders = [_h(0, 0, _done(VW0)), _h(1, 1, _done(VW0))]
    got = cp.plan(holders, new, 10, 11, SIZES[:1])
    assert got.waves[0].recompute == tuple(range(8)) and got.lost == 1
    same = Layout(((0, 1),), BOUNDS, (1.0,))
    behind = [_h(0, 0, _done(VW0)), _h(1, 1, _done(VW0), current=False)]
    assert cp.plan(behind, same, 10, 11, SIZES[:1]).waves[0].recompute == tuple(range(8))


def test_a_kept_pack_is_dropped_when_part_of_it_must_be_computed_again() -> None:
    # after a second failure, stage 0 kept (0..5) on one member, stage 1 kept 0..3 and 4..7:
    # only 0..3 are covered at both stages, but stage 0's one pack also covers 4, 5: it
    # cannot be split, so everything is computed again at stage 0 and stage 1 drops 0..3 too
    new = Layout(((0, 1),), BOUNDS, (1.0,))
    holders = [_h(0, 0, _done((0, 1, 2, 3, 4, 5))),
               _h(1, 1, _done(VW0), _done(VW1), first=10)]
    wp = cp.plan(holders, new, 10, 11, SIZES[:1]).waves[0]
    assert wp.recompute == tuple(range(8))
    assert wp.kept == ((), ())


def test_without_a_layout_every_started_wave_is_lost() -> None:
    holders = [_h(0, 0, _done(VW0), cp.Kept(VW0)), _h(2, 0, _done(VW1))]
    got = cp.plan(holders, None, 10, 12, SIZES[:2])
    assert got.waves == () and got.lost == 2  # wave 10 computed whole, wave 11 half started
    assert (got.lost_samples, got.in_flight_samples) == (64, 32)


def test_the_kept_waves_travel_through_the_table() -> None:
    row = tb.Row(1.0, lo=0, hi=3, step=10, reach=11, agreed=10, started=12, fresh=False,
                 slot=(1, 0), layout_gen=4, bounds=BOUNDS,
                 kept=(_done(VW1, reduced=True), cp.Kept((4, 5))),
                 backup=(cp.Kept(), _done(VW0)))
    dims = (2, 6, 3, 8)
    table = torch.stack([tb.encode(row, *dims), tb.encode(tb.Row(2.0), *dims)])
    got = tb.decode(table, *dims)
    assert got[0] == row and got[1] == tb.Row(2.0)
    (h, j) = tb.holders(got, 10)
    assert h == cp.Holder(0, 0, BOUNDS, True, 10, row.kept, row.backup)
    assert j.stage is None and not j.current


def test_survivors_record_the_dead_stage_0_member_s_part_of_the_waves_it_may_have_missed(
        ) -> None:
    """A stage-0 member applies agreed waves only as the gate needs them (up to D behind):
    when it dies, the waves the survivors roll forward through may be agreed and unapplied
    there, so unrecorded: each surviving stage-0 member records the dead one's part of its
    newest waves (from ``target - D - 1``); a drained member applied every wave."""
    history = [(w, 1, w != 7, ((1, [1, 2]), (5, [w, 3]), (6, [4]), (9, [5])))
               for w in range(5, 10)]  # member 5 died; 6 drained; 9 lives on
    got = cp.records_for_the_dead(history, {1, 9, 6}, target=10, staleness=2)
    # waves 7..9 (target - D - 1 on); wave 7's part is not this member's (it held no stage 0)
    assert [(p.wave, p.member, list(p.ids)) for p in got] == [(8, 5, [8, 3]), (9, 5, [9, 3])]


def test_the_reduced_packs_are_kept_only_until_their_wave_is_applied() -> None:
    """A stage's reduced pack of a wave not applied is kept (a failure rolls forward with it,
    or completes the wave from it); once the wave is applied it is dropped: a generation that
    lasts the whole job kept every wave's pack before."""
    import datetime

    import torch.distributed as dist

    from trainer.pipeline.agree import ROW, Agreement

    pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30))
    a = Agreement(pg, pg, 1, lambda: False)
    try:
        for w in range(4):
            a.submit(w, torch.full((3,), float(w)), torch.zeros(1, ROW, dtype=torch.float64))
        for w in range(4):
            assert float(a.wait(w).pack[0]) == w
            assert min(a.reduced) == w
    finally:
        a.stop()
        a.join(5.0)
