"""The training loop's verdict line (train/observe.py) from constructed figures (no timing is measured): waits
judged in the steady state only (start-up, rebuilds and tuning trials named apart), the per-batch host cost
told from a loader running short, a stage named only below the model's need, and the loader named."""

from __future__ import annotations

import pytest

from train.observe import Waits, rank_figures, verdict, wait_parts


def epoch(waits: list[float], step: float = 0.015, start: float = 100.0) -> list[tuple[float, float]]:
    """(asked, got) of batches whose waits are `waits`, each followed by `step` seconds of the loop's own."""
    out, tick = [], start
    for wait in waits:
        out.append((tick, tick + wait))
        tick += wait + step
    return out


def figures(batches, events=(), rank: int = 0, images_per_batch: int = 256) -> dict:
    waits = Waits()
    for asked, got in batches:
        waits.add(asked, got)
    seconds = batches[-1][1] - batches[0][0] + 0.015
    return rank_figures(rank, waits, seconds, len(batches), images_per_batch * len(batches), {"events": list(events)})


def test_the_tuners_rebuild_and_the_start_up_are_not_input_bound():
    """Issue 28: epoch 0's "input-bound at 17%" was mostly the tuner's own rebuild. A first batch that fills the
    pipeline and a batch that held a rebuild are named apart; the steady state alone is judged."""
    waits = [1.2] + [0.0002] * 9 + [0.6] + [0.0002] * 9  # start-up 1.2 s; batch 10 held a 0.6 s rebuild
    batches = epoch(waits)
    rebuild = ("rebuild", batches[10][0] + 0.01, batches[10][1] - 0.01, {"settings": "num_threads=8"})
    parts = wait_parts(batches, [rebuild])
    assert (parts["rebuilds"], parts["steady_batches"]) == (1, 18)
    assert parts["startup_s"] == pytest.approx(1.2) and parts["rebuild_s"] == pytest.approx(0.6)
    assert parts["steady_wait_fraction"] == pytest.approx(0.0002 / 0.0152)
    ranks = [figures(batches, [rebuild])]
    assert ranks[0]["data_wait_fraction"] > 0.5  # the old judgement: input-bound
    line = verdict(0, ranks, None)
    assert line.startswith("epoch 0, train loader: not input-bound (steady-state wait 1.3%, slowest rank 0 at 1.3%)")
    assert line.endswith("(not counted: start-up 1.20 s, 1 rebuild 0.60 s)")


def test_a_wait_in_a_tuning_trial_is_the_searchs_cost():
    waits = [0.5] + [0.008] * 6 + [0.0003] * 13  # a trial of 1 thread runs short; then the choice runs full
    batches = epoch(waits)
    trial = ("tuning trial", batches[1][0], batches[6][1], {"settings": "num_threads=1"})
    parts = wait_parts(batches, [trial])
    assert parts["tuning_s"] == pytest.approx(6 * 0.008) and parts["steady_batches"] == 13
    line = verdict(0, [figures(batches, [trial])], None)
    assert "not input-bound" in line and "tuning trials 0.05 s" in line


def test_a_per_batch_host_cost_is_not_a_loader_running_short():
    """Issue 28: epoch 1's 6% was about 0.9 ms of per-batch host cost, not a loader running short."""
    batches = epoch([0.0009] * 40, step=0.014)
    ranks = [figures(batches, rank=0), figures(epoch([0.0002] * 40), rank=1)]
    assert ranks[0]["host_s_per_batch"] == pytest.approx(0.0009)
    assert ranks[0]["short_wait_fraction"] == pytest.approx(0.0)
    line = verdict(1, ranks, None)
    assert line.startswith("epoch 1, train loader: not input-bound, host-bound: next() costs 0.90 ms of host time per "
                           "batch with a full queue (6.0% of rank 0's steady-state steps; the loader runs short 0.0%)")


def test_input_bound_names_a_stage_only_below_the_models_need():
    # every 2nd batch waits 10 ms more than the 0.3 ms floor: the loader runs short
    batches = epoch([0.5] + [0.0003, 0.0103] * 20, step=0.010)
    ranks = [figures(batches, rank=0), figures(epoch([0.0003] * 41), rank=1)]
    need = ranks[0]["model_images_per_s"]
    line = verdict(3, ranks, None, loader="train")
    assert line.startswith("epoch 3, train loader: input-bound: rank 0 waits 33% of its steady-state steps beyond "
                           "0.30 ms of host cost per batch; the loader gives")
    assert "run dali-pipes profile DATA to see whether a stage alone is below the model's need" in line
    below = {"read": 40_000.0, "decode": need * 0.8, "augment": need * 0.7, "iterator": need * 0.6}
    assert f"decode binds: alone it gives {need * 0.8:,.0f} images/s, below the model's {need:,.0f}" in \
        verdict(3, ranks, below)
    above = {"read": 40_000.0, "decode": need * 1.5, "augment": need * 1.2, "iterator": need * 1.1}
    assert "no single stage binds: each alone gives more than the model's" in verdict(3, ranks, above)


def test_the_line_names_the_loader():
    assert verdict(2, [figures(epoch([0.0001] * 5))], None, loader="val").startswith("epoch 2, val loader: ")
