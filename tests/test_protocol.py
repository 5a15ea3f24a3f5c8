"""The measurement protocol (dali_pipes_bench/protocol.py) on a simulated clock: the alternation order, the
window lengths, medians, the synchronisation at the end of each window, the spread check that withholds a
ranking under noise, the CPU cores busy, and the cold reads' page-cache drops on real files."""

from __future__ import annotations

import os

import pytest

from dali_pipes.run.stats import Spread
from dali_pipes_bench.protocol import (
    Case,
    ProtocolConfig,
    Runner,
    batch_case,
    check_cold,
    compare,
    drop_page_cache,
    epoch_case,
)


class SimulatedClock:
    """Wall and CPU seconds that advance only when a simulated step says so."""

    def __init__(self) -> None:
        self.now, self.cpu = 0.0, 0.0

    def advance(self, seconds: float, cores: float = 1.0) -> None:
        self.now += seconds
        self.cpu += seconds * cores


def simulated_case(clock: SimulatedClock, log: list, name: str, seconds_per_unit, images: int = 10,
                   units_per_epoch: int = 1, cores: float = 1.0) -> Case:
    """A case whose every unit takes `seconds_per_unit(n)` simulated seconds (n: the units it ran so far)."""
    done = [0]

    def step() -> int:
        log.append(name)
        clock.advance(seconds_per_unit(done[0]), cores)
        done[0] += 1
        return images

    return Case(name, step, units_per_epoch)


def runner(clock: SimulatedClock, config: ProtocolConfig, syncs: list | None = None, **kw) -> Runner:
    return Runner(config, clock=lambda: clock.now, cpu_clock=lambda: clock.cpu,
                  sync=(lambda: syncs.append(clock.now)) if syncs is not None else (lambda: None), **kw)


def test_cases_alternate_a_b_c_after_a_warm_up_of_each():
    clock, log = SimulatedClock(), []
    cases = [simulated_case(clock, log, name, lambda n: 1.0) for name in "ABC"]
    config = ProtocolConfig(min_seconds=3, min_epochs=0, rounds=3, warmup=2)
    result = runner(clock, config).compare(cases)
    assert log == list("AABBCC") + list("ABC") * 3  # each window: 1 s of 1 s units, its share of 3 s
    assert [len(r.windows) for r in result.results] == [3, 3, 3]


def test_a_window_lasts_its_share_of_the_seconds_and_of_the_epochs_in_whole_units():
    clock, log = SimulatedClock(), []
    # 10 batches an epoch at 0.25 s each: 3 epochs over 3 rounds = 10 batches a window; 15 s over 3 rounds = 5 s
    case = simulated_case(clock, log, "A", lambda n: 0.25, units_per_epoch=10)
    result = runner(clock, ProtocolConfig(min_seconds=15, min_epochs=3, rounds=3, warmup=0)).compare([case])
    assert [w.units for w in result["A"].windows] == [20, 20, 20]  # the seconds dominate: 5 s of 0.25 s units
    clock, log = SimulatedClock(), []
    case = simulated_case(clock, log, "A", lambda n: 0.25, units_per_epoch=10)
    result = runner(clock, ProtocolConfig(min_seconds=0.75, min_epochs=6, rounds=3, warmup=0)).compare([case])
    assert [w.units for w in result["A"].windows] == [20, 20, 20]  # the epochs dominate: 2 whole epochs a window
    assert Runner(ProtocolConfig(min_seconds=0, min_epochs=1, rounds=3)).window_size(case) == (0.0, 4)  # ceil(10/3)


def test_medians_min_max_and_cores_busy_per_case():
    clock, log = SimulatedClock(), []
    # A: 10 images a unit, its rounds at 1.0, 0.625 and 1.25 s a unit -> 10, 16, 8 images/s; 2 cores busy
    a = simulated_case(clock, log, "A", lambda n: (1.0, 0.625, 1.25)[n // 2], cores=2.0)
    result = runner(clock, ProtocolConfig(min_seconds=0, min_epochs=6, rounds=3, warmup=0)).compare([a])
    rate = result["A"].rate
    assert (rate.median, rate.low, rate.high) == (10.0, 8.0, 16.0)
    assert rate.spread == pytest.approx(0.8)
    assert result["A"].cores.median == pytest.approx(2.0)
    row = result["A"].row()
    assert (row["images_per_s"], row["min"], row["max"], row["rounds"]) == (10.0, 8.0, 16.0, 3)
    assert result["A"].text() == "10 [8, 16] images/s, 2.00 cores busy, spread 80.0%"


def test_each_window_ends_with_the_synchronisation_hook_inside_its_time():
    clock, log, syncs = SimulatedClock(), [], []
    case = simulated_case(clock, log, "A", lambda n: 1.0)
    gpu_tail = 0.5  # work a GPU finishes only when synchronised: it belongs to the window that queued it

    def sync() -> None:
        clock.advance(gpu_tail)
        syncs.append(clock.now)

    result = Runner(ProtocolConfig(min_seconds=3, min_epochs=0, rounds=3, warmup=1), clock=lambda: clock.now,
                    cpu_clock=lambda: clock.cpu, sync=sync).compare([case])
    assert len(syncs) == 3  # one per window, none in the warm-up
    assert [w.seconds for w in result["A"].windows] == [1.5, 1.5, 1.5]


def test_steady_cases_are_ranked_fastest_first():
    clock, log = SimulatedClock(), []
    cases = [simulated_case(clock, log, "slow", lambda n: 1.0 + 0.01 * (n % 2)),
             simulated_case(clock, log, "fast", lambda n: 0.5 + 0.01 * (n % 3))]
    result = runner(clock, ProtocolConfig(min_seconds=0, min_epochs=3, rounds=3, warmup=0)).compare(cases)
    assert result.unranked_because() is None
    assert [r.name for r in result.ranked()] == ["fast", "slow"]
    assert result.ranking_text().startswith("ranking: fast > slow (")
    assert result.ratio("fast", "slow") == pytest.approx(1.01 / 0.51, rel=0.05)


def test_no_ranking_when_a_case_spreads_more_than_ten_percent_between_rounds():
    clock, log = SimulatedClock(), []
    # "noisy" meets a machine that slows down by 30% in its second round (rates 10, 7.7, 10: 23%)
    noisy = simulated_case(clock, log, "noisy", lambda n: (1.0, 1.3, 1.0)[n])
    steady = simulated_case(clock, log, "steady", lambda n: 1.1)
    result = runner(clock, ProtocolConfig(min_seconds=0, min_epochs=3, rounds=3, warmup=0)).compare([noisy, steady])
    assert result.ranked() is None
    assert result.unranked_because().startswith("not ranked: spread 23% between rounds (noisy;")
    assert result.lines()[-1] == result.unranked_because()
    relaxed = runner(SimulatedClock(), ProtocolConfig(min_seconds=0, min_epochs=3, rounds=3, max_spread=0.5))
    assert relaxed.config.max_spread == 0.5


def test_fewer_than_three_rounds_are_never_ranked():
    clock, log = SimulatedClock(), []
    cases = [simulated_case(clock, log, name, lambda n: 1.0) for name in "AB"]
    result = runner(clock, ProtocolConfig(min_seconds=0, min_epochs=2, rounds=2, warmup=0)).compare(cases)
    assert result.ranked() is None and result.unranked_because() == "not ranked: 2 rounds (at least 3 are needed)"


def test_spread_summary():
    s = Spread.of([100.0, 90.0, 110.0, 105.0])
    assert (s.median, s.low, s.high) == (102.5, 90.0, 110.0)
    assert s.spread == pytest.approx(20 / 102.5) and s.noisy
    assert s.text() == "102 [90, 110]" and s.text(1e-3, 2) == "0.10 [0.09, 0.11]"
    assert Spread.of([5.0]).spread == 0.0 and not Spread.of([5.0]).noisy and Spread.of([]).median == 0.0


def test_loader_cases_count_images_and_close(jpeg_folder):
    """A batch case steps one batch at a time across epochs; an epoch case a whole epoch; both are closed.
    Real DALI loaders: 12 images, batches of 4 (train: 3 whole batches an epoch)."""
    from dali_pipes import DaliLoader
    make = lambda: DaliLoader(str(jpeg_folder), batch_size=4, train=True, device="cpu", image_size=16, num_threads=1)
    first, second = make(), make()
    closed, seen = [], []
    by_batch = batch_case("batches", first, len(first), each=seen.append,
                          close=lambda: (first.close(), closed.append("batches")))
    by_epoch = epoch_case("epochs", second, close=lambda: (second.close(), closed.append("epochs")))
    assert [by_batch.step() for _ in range(4)] == [4, 4, 4, 4] and len(seen) == 4  # into the second epoch
    assert by_epoch.step() == 12 and by_epoch.units_per_epoch == 1 and by_batch.units_per_epoch == 3
    result = compare([by_batch, by_epoch], ProtocolConfig(min_seconds=0, min_epochs=1, rounds=1, warmup=0))
    assert [(w.units, w.images) for w in result["batches"].windows] == [(3, 12)]  # 1 epoch of 3 batches
    assert [(w.units, w.images) for w in result["epochs"].windows] == [(1, 12)]
    assert closed == ["batches", "epochs"]


def test_cold_drops_every_file_before_each_window_and_each_epoch(tmp_path):
    """--cold: posix_fadvise(DONTNEED) on every data file of the case, before each window and before each
    epoch inside one, outside the timed span (the drop's own seconds are not counted)."""
    files = []
    for i in range(5):
        path = tmp_path / f"{i}.bin"
        path.write_bytes(os.urandom(4096))
        files.append(str(path))
    assert drop_page_cache(files) == 5  # the real call, on real files
    clock, log, dropped = SimulatedClock(), [], []

    def drop(paths) -> int:
        clock.advance(7.0)  # a slow drop: never inside a window's time
        dropped.append(drop_page_cache(paths))
        return dropped[-1]

    case = simulated_case(clock, log, "A", lambda n: 1.0)  # one unit = one epoch
    case.files = files
    result = runner(clock, ProtocolConfig(min_seconds=0, min_epochs=6, rounds=3, warmup=0, cold=True),
                    drop=drop).compare([case])
    # 3 windows of 2 epochs: a drop before each window and before its second epoch
    assert dropped == [5] * 6
    assert [w.seconds for w in result["A"].windows] == [2.0, 2.0, 2.0]


def test_cold_is_refused_clearly_where_it_cannot_work(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="s3://bucket/a.tfrecord is not a local file"):
        check_cold(["s3://bucket/a.tfrecord"])
    with pytest.raises(ValueError, match="name no data files"):
        check_cold([])
    monkeypatch.delattr(os, "posix_fadvise")  # as on macOS and Windows
    with pytest.raises(ValueError, match=r"no posix_fadvise .* it works on Linux. Run without --cold"):
        check_cold([str(tmp_path)])
    with pytest.raises(ValueError, match="works on Linux"):
        Runner(ProtocolConfig(cold=True)).compare([Case("A", lambda: 1, files=[str(tmp_path)])])


def test_protocol_settings_are_checked():
    with pytest.raises(ValueError, match="rounds >= 1"):
        ProtocolConfig(rounds=0)
