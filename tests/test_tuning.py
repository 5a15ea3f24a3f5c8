"""Online tuning (tuning.py) with real DALI on CPU: num_threads / prefetch_queue_depth "auto" try other
settings in the first epoch by rebuilding the pipeline at its checkpoint, and the batches (images and
labels) are exactly those of a loader with the chosen values fixed: plain, after a resume taken while
the search runs, and after an elastic resume taken then. The choice is remembered per machine.

The search's decisions on a simulated clock (SimulatedLoop: no DALI, deterministic pseudo-noise): the first
training steps and a transient step decide nothing, settings alike within noise keep the cheaper, a clear
winner wins, and hw_decoder_load="auto" (a GPU's mixed decoder) searched towards the hardware decoder. On a
GPU (`-m gpu`): the decoders' rounding between loads, measured, and the search with real rebuilds."""

import argparse
import dataclasses
import json
import logging
import os
import re

import numpy as np
import pytest

from dali_pipes import DaliLoader
from dali_pipes.options import auto_or_count
from dali_pipes.run import tuning, tuning_memory
from dali_pipes.run.contract import Contract

N = 240  # 120 batches of 2: a warm-up of 4-6 batches, then a tuning budget of 12: 4 trials of 2 measured batches
KW = dict(batch_size=2, image_size=16, device="cpu", train=True, shuffle_buffer=16, seed=3)




@pytest.fixture(autouse=True)
def private_memory(tmp_path, monkeypatch):
    """Each test tunes from scratch: its own cache root, so no remembered choice."""
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))


def epochs(loader, count=2, stop_at=None, stop_when=None):
    """Batches (images, labels) as numpy, `count` epochs; with stop_at, the state after that many; with
    stop_when, the state after the first batch where stop_when(loader) holds."""
    out, state = [], None
    for _ in range(count):
        for images, labels in loader:
            out.append((images.numpy().copy(), labels.numpy().copy()))
            if len(out) == stop_at or (stop_when is not None and stop_when(loader)):
                return out, loader.state_dict()
    return out, state


def second_trial_runs(loader) -> bool:
    """The search has rebuilt the pipeline for its second trial and goes on (a state taken now is mid-search)."""
    view = tuned(loader)
    return len(view["trials"]) >= 2 and view["trials"][-1]["seen"] >= 1 and not view["done"]


def tuned(loader) -> dict | None:
    """Online tuning as the loader's stats() tell it (its start, trials and choice), or None when not tuned."""
    return loader.stats().get("tuned")


def settings(view: dict | None) -> tuning.Settings | None:
    return tuning.Settings(view["num_threads"], view["prefetch_queue_depth"]) if view else None


def assert_same(got, expected):
    assert len(got) == len(expected)
    for i, ((gi, gl), (ei, el)) in enumerate(zip(got, expected)):
        assert np.array_equal(gl, el), f"batch {i}: labels differ"
        assert np.array_equal(gi, ei), f"batch {i}: images differ"


def fixed(settings: tuning.Settings, source, **kw):
    return DaliLoader(source, num_threads=settings.num_threads, prefetch_queue_depth=settings.prefetch_queue_depth,
                      **{**KW, **kw})


def test_auto_tries_settings_and_its_batches_equal_the_chosen_values_fixed(numbered_source, caplog):
    caplog.set_level(logging.INFO, logger="dali_pipes")
    auto = DaliLoader(numbered_source, **KW)  # "auto" is the default
    got, _ = epochs(auto, count=1)
    assert {e[0] for e in auto.stats()["events"]} >= {"rebuild", "tuning trial"}  # on the first epoch's clock
    got += epochs(auto, count=1)[0]
    view = tuned(auto)
    trials = [settings(t) for t in view["trials"]]
    assert view["done"] and len(trials) >= 2, "the search ran trials"
    assert len(set(trials)) == len(trials) and len(trials) <= tuning.MAX_TRIALS
    assert sum(t["seen"] for t in view["trials"]) <= tuning.MAX_FRACTION * len(auto), "within 10% of the first epoch"
    assert sum(1 for t in trials if t != settings(view["start"])) >= 1, "the pipeline was rebuilt"
    assert "chose num_threads=" in caplog.text and "trial 2:" in caplog.text
    assert view["decision"].startswith("chose num_threads=") and view["decision"] in caplog.text
    assert view["warmup"]["batches"] >= tuning.WARMUP_WINDOW and "trials start after" in caplog.text
    assert all({"wait_ms", "wait_error_ms", "wall_ms", "cpu_cores", "discarded"} <= set(t) for t in view["trials"])
    chosen = settings(view["chosen"])
    reference, _ = epochs(fixed(chosen, numbered_source))
    assert_same(got, reference)
    stats = auto.stats()
    assert stats["batches"] == len(auto) and stats["images"] == len(auto) * 2 and stats["epoch"] == 1
    assert 0 <= stats["data_wait_fraction"] <= 1 and stats["num_threads"] == chosen.num_threads


def test_a_resume_taken_while_tuning_gives_the_batches_of_the_fixed_choice(numbered_source):
    auto = DaliLoader(numbered_source, **KW)
    head, state = epochs(auto, stop_when=second_trial_runs)  # trial 2 (or later) is running: a rebuilt pipeline
    assert second_trial_runs(auto) and len(head) < len(auto)
    resumed = DaliLoader(numbered_source, **KW)
    resumed.load_state_dict(state)
    rest, _ = epochs(resumed)
    chosen = settings(tuned(resumed)["chosen"])
    assert chosen is not None
    reference, _ = epochs(fixed(chosen, numbered_source), count=3)
    assert_same(head + rest, reference[:len(head) + len(rest)])


def test_an_elastic_resume_taken_while_tuning_matches_one_of_fixed_loaders(numbered_source):
    def old_world(stops, **kw):
        loaders = [DaliLoader(numbered_source, rank=r, world_size=2, **{**KW, **kw}) for r in range(2)]
        runs = [epochs(loader, **stop) for loader, stop in zip(loaders, stops)]
        return loaders, [len(batches) for batches, _ in runs], [state for _, state in runs]

    # each auto rank stops once its search runs a second trial; each fixed rank after as many batches
    auto_loaders, counts, auto_states = old_world([{"stop_when": second_trial_runs}] * 2)
    assert all(second_trial_runs(l) for l in auto_loaders)
    fixed_loaders, _, fixed_states = old_world([{"stop_at": n} for n in counts], num_threads=1, prefetch_queue_depth=2)
    new_auto = DaliLoader(numbered_source, **KW)
    new_auto.load_state_dict(auto_states)
    new_fixed = fixed(tuning.Settings(2, 3), numbered_source)
    new_fixed.load_state_dict(fixed_states)
    assert_same(epochs(new_auto)[0], epochs(new_fixed)[0])


def test_the_choice_is_remembered_and_the_next_run_only_confirms_it(numbered_source, tmp_path):
    first = DaliLoader(numbered_source, **KW)
    epochs(first, count=1)
    memory = json.load(open(tmp_path / "cache" / "tuning.json"))["entries"]
    (entry,) = memory.values()
    chosen = tuned(first)["chosen"]
    assert (entry["num_threads"], entry["prefetch_queue_depth"]) == (chosen["num_threads"],
                                                                    chosen["prefetch_queue_depth"])
    second = DaliLoader(numbered_source, **KW)
    assert tuned(second)["start"] == chosen and tuned(second)["remembered"]
    epochs(second, count=1)
    assert tuned(second)["done"] and settings(tuned(second)["trials"][0]) == settings(chosen)


def test_fixed_values_are_not_tuned_and_one_fixed_knob_leaves_the_other_to_tune(numbered_source):
    both = DaliLoader(numbered_source, num_threads=1, prefetch_queue_depth=2, **KW)
    assert tuned(both) is None and both.stats()["num_threads"] == 1
    depth_only = DaliLoader(numbered_source, num_threads=1, **KW)
    epochs(depth_only, count=1)
    assert {t["num_threads"] for t in tuned(depth_only)["trials"]} == {1}


def test_a_short_first_epoch_is_not_tuned_and_says_why(numbered_source, caplog):
    caplog.set_level(logging.INFO, logger="dali_pipes")
    loader = DaliLoader(numbered_source, **{**KW, "batch_size": 16})  # 15 batches: 1 batch of budget
    epochs(loader, count=1)
    assert tuned(loader)["done"] and not tuned(loader)["trials"] and "too few" in caplog.text


def test_the_tuning_lines_name_the_loader_they_are_about(numbered, caplog):
    """Issue 28: a training job runs a train and a val loader, each tuning its own knobs; each line names which."""
    caplog.set_level(logging.INFO, logger="dali_pipes")
    for train in (True, False):
        loader = DaliLoader(numbered, **{**KW, "batch_size": 16, "train": train})
        epochs(loader, count=1)
        loader.close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("tuning rank")]
    assert [line.split(":")[0] for line in lines] == ["tuning rank 0, train loader", "tuning rank 0, val loader"]
    assert all("too few" in line for line in lines)


def test_a_trials_line_gives_its_steps_as_median_min_max():
    trial = tuning.Trial(tuning.Settings(2, 2))
    for wait, wall in ((0.0005, 0.009), (0.001, 0.010), (0.0015, 0.011)):
        trial.add(wait, wall, 1.5 * wall)
    assert trial.describe() == ("num_threads=2 prefetch_queue_depth=2: waits 1.0 ms (standard error 0.3 ms) of "
                                "10.0 ms per batch (median [min, max] 10.0 [9.0, 11.0] ms) over 3 batches, "
                                "1.50 cores busy")


def test_the_flag_takes_auto_or_a_count():
    assert auto_or_count("auto") == "auto" and auto_or_count("AUTO") == "auto" and auto_or_count("4") == 4
    with pytest.raises(argparse.ArgumentTypeError, match="'auto' or a count of at least 1"):
        auto_or_count("0")


def test_the_search_prefers_less_cpu_when_the_loop_never_waits():
    tuner = tuning.Tuner(tuning.Settings(4, 2), True, True, cores=4)
    tuner.begin(200)  # budget 20: window 2, at most 6 trials
    step = 0.1
    cpu = {4: 0.4, 2: 0.25, 1: 0.2}
    while not tuner.done:
        threads = tuner.current.num_threads
        wait = 0.0 if threads >= 2 else 0.03  # one thread makes the loop wait
        tuner.observe(wait, step + wait, cpu[threads])
    assert [t.settings.num_threads for t in tuner.trials][:3] == [4, 2, 1]
    assert tuner.chosen.num_threads == 2


# ---------------------------------------------------------------------------------------------
# Issue 24: the memory is a file a person may edit, and several jobs may write at once
# ---------------------------------------------------------------------------------------------

def plan_spec():
    """What DaliLoader hands tuning.plan for a CPU train graph (both knobs "auto": the spec's `tuned`)."""
    from dali_pipes.run.pipeline import PipelineSpec
    return PipelineSpec(contract=Contract(True, 2, False), device="cpu", tuned=("num_threads", "prefetch_queue_depth"))


def memory_warnings(caplog, path) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and str(path) in r.getMessage()]


@pytest.mark.parametrize("text, problem", [
    ("[]", "the file is a list"), ('"entries"', "the file is a str"), ('{"entries": [1]}', '"entries" is a list'),
    ("{not json", "unreadable")])
def test_a_memory_that_is_not_one_is_absent_with_one_warning_and_replaced(tmp_path, caplog, text, problem):
    """Issue 24: `[]` crashed every run at the first write (AttributeError, no file named)."""
    caplog.set_level(logging.WARNING, logger="dali_pipes")
    path = tmp_path / "cache" / "tuning.json"
    path.parent.mkdir()
    path.write_text(text)
    assert tuning.recall("k") is None
    tuning.remember("k", {"num_threads": 1, "source": "online"})
    (warning,) = memory_warnings(caplog, path)  # one, though the file was read twice
    assert problem in warning and "treated as absent" in warning
    memory = json.loads(path.read_text())
    assert memory["version"] == 1 and list(memory["entries"]) == ["k"] and tuning.recall("k")["num_threads"] == 1


@pytest.mark.parametrize("entry, problem", [
    (5, "not an object"), ([2, 2], "not an object"), ({"num_threads": "4"}, "num_threads '4'"),
    ({"num_threads": True}, "num_threads True"), ({"num_threads": 0}, "num_threads 0"),
    ({"num_threads": 5000}, "num_threads 5000"), ({"num_threads": 1, "prefetch_queue_depth": 0},
                                                  "prefetch_queue_depth 0"),
    ({"prefetch_queue_depth": 100000}, "prefetch_queue_depth 100000"), ({"prefetch_queue_depth": 2.0}, "2.0"),
    ({"num_threads": 1, "hw_decoder_load": 1.5}, "hw_decoder_load 1.5"), ({"source": 7}, "source 7"),
    ({"num_threads": 1, "stage_images_per_s": {"read": "fast"}}, "stage_images_per_s")])
def test_a_bad_entry_is_not_a_start_and_never_written_back(tmp_path, caplog, entry, problem):
    """Issue 24: 5,000 remembered threads were used as the start (and written back as the best); depth 0 or
    a string of threads gave a traceback naming no file. Now: absent, one warning naming the file."""
    caplog.set_level(logging.WARNING, logger="dali_pipes")
    path = tmp_path / "cache" / "tuning.json"
    path.parent.mkdir()
    key = tuning.memory_key(plan_spec(), "tfrecord")
    path.write_text(json.dumps({"version": 1, "entries": {key: entry, "other": {"num_threads": 1}}}))
    from dali_pipes.run.stats import LoaderClock
    spec, hook = tuning.plan(plan_spec(), "tfrecord", LoaderClock())
    assert settings(hook.describe()["start"]) == tuning.Settings(tuning.default_threads(), 2)
    assert not hook.describe()["remembered"] and spec.knobs.num_threads == tuning.default_threads()
    tuning.remember(key, {"prefetch_queue_depth": 3, "source": "online"})  # as a run that tuned the depth only
    (warning,) = memory_warnings(caplog, path)
    assert problem in warning and f"entry {key}" in warning
    entries = json.loads(path.read_text())["entries"]
    assert {k: v for k, v in entries[key].items() if k != "date"} == {"prefetch_queue_depth": 3, "source": "online"}
    assert entries["other"] == {"num_threads": 1}  # another machine's entry is kept as it was


def test_a_loader_over_a_memory_that_is_a_list_tunes_and_leaves_a_good_memory(numbered_source, tmp_path, caplog):
    """Issue 24: the whole first epoch, as a training job runs it (today's main raised AttributeError at 10%)."""
    caplog.set_level(logging.WARNING, logger="dali_pipes")
    path = tmp_path / "cache" / "tuning.json"
    path.parent.mkdir()
    path.write_text("[]")
    loader = DaliLoader(numbered_source, **KW)
    assert len(epochs(loader, count=1)[0]) == len(loader)
    (entry,) = json.loads(path.read_text())["entries"].values()
    chosen = settings(tuned(loader)["chosen"])
    assert (entry["num_threads"], entry["prefetch_queue_depth"]) == (chosen.num_threads, chosen.prefetch_queue_depth)
    assert len(memory_warnings(caplog, path)) == 1


WRITER = """
import sys
from dali_pipes.run import tuning
print("ready", flush=True)
sys.stdin.readline()  # every writer starts at once
for i in range({count}):
    tuning.remember(f"{{sys.argv[1]}}-{{i}}", {{"num_threads": 1, "source": "online"}})
"""


def test_writers_at_once_lose_no_entry(tmp_path):
    """Issue 24: two processes writing at once lost 132 of 400 entries (read, modify, rename: last wins)."""
    import subprocess
    import sys
    processes, count = 4, 100
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER.format(count=count), str(p)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env) for p in range(processes)]
    assert [writer.stdout.readline().strip() for writer in writers] == ["ready"] * processes
    for writer in writers:
        writer.stdin.write("go\n")
        writer.stdin.flush()
    assert [writer.wait(timeout=300) for writer in writers] == [0] * processes
    entries = json.loads((tmp_path / "cache" / "tuning.json").read_text())["entries"]
    assert sorted(entries) == sorted(f"{p}-{i}" for p in range(processes) for i in range(count))


def test_a_locations_resolved_reads_keep_the_remembered_key(numbered_source):
    """A location's loader says exif_orientation=True, png16="scale" (DALI's own reads); `dali-pipes profile`
    leaves them None. Both find the same remembered settings: the key they had before these fields existed."""

    from dali_pipes.run.pipeline import PipelineSpec
    loader = DaliLoader(numbered_source, **KW, num_threads=1, prefetch_queue_depth=2)
    augment = loader.augment
    assert (augment.exif_orientation, augment.png16) == (True, "scale")
    spec = PipelineSpec(contract=Contract(True, 2, False), augment=augment)
    as_profile = dataclasses.replace(spec, augment=dataclasses.replace(augment, exif_orientation=None, png16=None))
    assert tuning.memory_key(spec, numbered_source.kind) == tuning.memory_key(as_profile, numbered_source.kind)
    assert not {"exif_orientation", "png16"} & set(tuning_memory.graph_key(spec, numbered_source.kind)["augment"])
    as_pil = dataclasses.replace(spec, augment=dataclasses.replace(augment, exif_orientation=False, png16="pil"))
    assert tuning.memory_key(as_pil, numbered_source.kind) != tuning.memory_key(spec, numbered_source.kind)


# ---------------------------------------------------------------------------------------------
# Issue 28: the tuner's decisions on a simulated clock (no DALI): warm-up, transients, noise, hw_decoder_load
# ---------------------------------------------------------------------------------------------

class SimulatedLoop:
    """A training loop and its loader on a simulated clock, deterministic (random.Random(seed)). The loader
    makes the loop wait `wait_ms(settings)` per batch, plus noise of `noise_ms` (never below 0); the loop's own
    step takes `step_ms` (+- 2 ms), but for `long_steps` (batch index -> seconds of the step before it: the
    first CUDA/cuDNN steps, a checkpoint). During a long step DALI fills its queue: the next batches, as many
    as the prefetch depth, come without a wait. The process's CPU per batch is `cpu_ms(settings)` +- noise."""

    def __init__(self, wait_ms, *, noise_ms=1.0, step_ms=100.0, long_steps=None, cpu_ms=None, seed=0):
        import random
        self.wait_ms, self.noise_ms, self.step_ms = wait_ms, noise_ms, step_ms
        self.long_steps, self.cpu_ms = long_steps or {}, cpu_ms or (lambda settings: 150.0)
        self.rng, self.queue_full_until = random.Random(seed), -1

    def batch(self, settings, i) -> tuple[float, float, float]:
        """Batch i's (wait, wall, cpu) in seconds, as LoaderClock gives them."""
        step = self.long_steps.get(i, (self.step_ms + self.rng.uniform(-2, 2)) / 1e3)
        if step > 4 * self.step_ms / 1e3:
            self.queue_full_until = i + settings.prefetch_queue_depth
        wait = max(0.0, self.wait_ms(settings) + self.rng.gauss(0, self.noise_ms)) / 1e3
        if i < self.queue_full_until:
            wait = 0.0
        cpu = max(0.0, self.cpu_ms(settings) + self.rng.gauss(0, 20)) / 1e3
        return wait, step + wait, cpu


def simulate(tuner, loop, batches=400):
    """The first epoch of `batches` batches (400: a budget of 40, windows of 4 measured batches, a warm-up of
    at most 20), the pipeline rebuilt whenever the tuner asks (its settings apply from the next batch on)."""
    tuner.begin(batches)
    for i in range(batches):
        if tuner.done:
            break
        tuner.observe(*loop.batch(tuner.current, i))
    tuner.epoch_ended()
    return tuner


def threads_tried(tuner) -> list[int]:
    return [t.settings.num_threads for t in tuner.trials]


def test_the_first_training_steps_decide_nothing():
    """Issue 28 (H100): the 16-thread trial's window held the 1.3 s first training step, the 8-thread trial's
    did not. Here 16 and 8 threads make the loop wait alike (the GPU decodes: more threads do not help), 4 wait
    more; the first steps fill DALI's queue, so a window holding them looked like 16 threads never wait."""
    loop = SimulatedLoop(lambda s: {16: 10.0, 8: 10.0, 4: 30.0}.get(s.num_threads, 60.0),
                         long_steps={1: 1.3, 2: 0.4})
    tuner = simulate(tuning.Tuner(tuning.Settings(16, 2), True, True, cores=16), loop)
    assert tuner.chosen == tuning.Settings(8, 2), threads_tried(tuner)  # the cheaper of two alike
    assert tuner.warmup >= 5 and tuner.steady  # the long steps (batches 1 and 2) fell before any trial
    assert all(t.per_batch()[1] < 0.2 for t in tuner.trials) and threads_tried(tuner)[:3] == [16, 8, 4]
    assert {t.measured for t in tuner.trials} == {tuner.window}  # like with like: the same number of batches


def test_a_window_with_a_transient_step_is_measured_again():
    """A long step inside a trial (a checkpoint, a late cuDNN search) fills DALI's queue: the next batches come
    without a wait. 8 and 16 threads make the loop wait alike (10 ms), so the cheaper 8 must stay; the 8-thread
    start waits, so 16 are tried, and a 2 s step falls in their window, after its first measured batch."""
    loop = SimulatedLoop(lambda s: {16: 10.0, 8: 10.0}.get(s.num_threads, 30.0))
    tuner = tuning.Tuner(tuning.Settings(8, 2), True, False, cores=16)
    tuner.begin(400)
    for i in range(400):
        if tuner.done:
            break
        if tuner.current.num_threads == 16 and tuner.trials[-1].measured == 1 and not loop.long_steps:
            loop.long_steps[i] = 2.0
        tuner.observe(*loop.batch(tuner.current, i))
    tuner.epoch_ended()
    assert loop.long_steps and tuner.chosen == tuning.Settings(8, 2), [t.describe() for t in tuner.trials]
    assert threads_tried(tuner)[:2] == [8, 16] and [t.discarded for t in tuner.trials][:2] == [0, 1]
    assert all(t.measured == tuner.window and t.per_batch()[1] < 0.2 for t in tuner.trials)


def test_settings_equal_within_noise_keep_the_cheaper():
    """Every setting makes the loop wait 20 ms, +- 8 ms per batch: whichever trial's few batches happened to
    wait least must not win; the fewest threads and the shallowest queue do, said to be within noise."""
    for seed in range(5):
        loop = SimulatedLoop(lambda s: 20.0, noise_ms=8.0, seed=seed)
        tuner = simulate(tuning.Tuner(tuning.Settings(4, 2), True, True, cores=4), loop)
        assert tuner.chosen == tuning.Settings(1, 2), (seed, tuner.chosen)
        assert threads_tried(tuner)[:3] == [4, 2, 1] and tuner.decision.startswith("chose num_threads=1")


def test_a_clear_winner_wins_and_the_decision_says_by_how_much():
    """4 threads wait 30 ms, 8 threads 2 ms (+- 1 ms): the loop waits, so all 8 cores are tried and win."""
    loop = SimulatedLoop(lambda s: {8: 2.0, 4: 30.0}.get(s.num_threads, 60.0))
    tuner = simulate(tuning.Tuner(tuning.Settings(4, 2), True, True, cores=8), loop)
    assert tuner.chosen == tuning.Settings(8, 2) and threads_tried(tuner)[:2] == [4, 8]
    assert re.fullmatch(r"chose num_threads=8 prefetch_queue_depth=2: [\d.]+ ms less wait per batch than "
                        r"num_threads=4 prefetch_queue_depth=2, beyond the spread of [\d.]+ ms", tuner.decision)


def test_when_the_loop_never_waits_the_fewest_threads_win_whatever_the_cpu_noise():
    """The loader is not the bottleneck at any setting: the process's CPU per batch (the model's included) is
    noise, not a reason for more threads. The fewest threads and depth 2 leave the model its cores."""
    for seed in range(5):
        loop = SimulatedLoop(lambda s: 0.0, noise_ms=0.0, cpu_ms=lambda s: 400.0 - 10 * s.num_threads, seed=seed)
        tuner = simulate(tuning.Tuner(tuning.Settings(8, 2), True, True, cores=8), loop)
        assert tuner.chosen == tuning.Settings(1, 2), (seed, tuner.chosen)


def trial(settings, waits_ms, wall_ms=100.0):
    t = tuning.Trial(settings)
    for wait in waits_ms:
        t.add(wait / 1e3, wall_ms / 1e3, 0.1)
    return t


def test_a_difference_within_the_spread_never_decides():
    """16 threads' mean wait is 4.5 ms below 8 threads', but all of it from one batch of four: its spread
    (3 standard errors) is far larger than the difference, so the cheaper 8 threads stay."""
    costly, cheap = trial(tuning.Settings(16, 2), [0, 0, 0, 30]), trial(tuning.Settings(8, 2), [12, 12, 12, 12])
    chosen, why = tuning.decide([costly, cheap])
    assert chosen is cheap and why.startswith("within noise, the cheaper") and "within the spread of 22.5 ms" in why
    steady_costly = trial(tuning.Settings(16, 2), [7, 8, 7, 8])  # the same 4.5 ms less, steadily: it counts
    chosen, why = tuning.decide([steady_costly, cheap])
    assert chosen is steady_costly and why.startswith("4.5 ms less wait per batch than num_threads=8")


# -- hw_decoder_load on a GPU: the search on simulated measurements, the interface on CPU --------------------

def hw_tuner(start_load=0.65):
    return tuning.Tuner(tuning.Settings(16, 2, start_load), True, True, cores=16, tune_hw=True)


def loads_tried(tuner) -> list[float]:
    return [t.settings.hw_decoder_load for t in tuner.trials]


def test_hw_decoder_load_alike_waits_choose_the_hardware_decoder_then_fewer_threads():
    """0.65 and 0.99 make the loop wait alike (the hardware decoder keeps up): 0.99 leaves CPU cores to the model
    (issue 28: about 4 on the H100), and 0 (CUDA only) is never tried; threads are then searched at 0.99."""
    loop = SimulatedLoop(lambda s: 5.0 if s.num_threads >= 4 else 25.0)
    tuner = simulate(hw_tuner(), loop)
    assert loads_tried(tuner)[:2] == [0.65, 0.99] and 0.0 not in loads_tried(tuner)
    assert tuner.chosen == tuning.Settings(4, 2, 0.99), tuner.decision
    assert {t.settings.hw_decoder_load for t in tuner.trials[2:]} == {0.99}
    assert tuner.tuned_values() == {"num_threads": 4, "prefetch_queue_depth": 2, "hw_decoder_load": 0.99}


def test_hw_decoder_load_towards_cuda_only_when_the_hardware_decoder_saturates():
    """0.99 waits more than 0.65 (the hardware decoder saturates): 0 is tried, waits more still (issue 28: 0 is
    2.1-3.5x slower on the H100), and 0.65 stays."""
    loop = SimulatedLoop(lambda s: {0.99: 20.0, 0.65: 5.0, 0.0: 40.0}[s.hw_decoder_load])
    tuner = simulate(hw_tuner(), loop)
    assert loads_tried(tuner)[:3] == [0.65, 0.99, 0.0] and tuner.chosen.hw_decoder_load == 0.65, tuner.decision


def test_a_remembered_hw_decoder_load_is_the_start_and_only_confirmed():
    loop = SimulatedLoop(lambda s: 0.0, noise_ms=0.0)
    tuner = tuning.Tuner(tuning.Settings(4, 2, 0.99), True, True, cores=16, tune_hw=True, remembered=True)
    simulate(tuner, loop)
    assert loads_tried(tuner) == [0.99] and tuner.chosen == tuning.Settings(4, 2, 0.99)
    assert "the remembered settings, confirmed" in tuner.decision


def gpu_spec(load, decode_device=None, num_threads=None, device="gpu"):
    """A spec as DaliLoader makes it for these requests (TunedKnobs.requested: the knobs left "auto")."""
    from dali_pipes.graph.augment_config import AugmentConfig
    from dali_pipes.run.pipeline import PipelineSpec, TunedKnobs
    knobs, tuned = TunedKnobs.requested(num_threads, 2, load)
    return PipelineSpec(contract=Contract(True, 2, False), device=device, decode_device=decode_device,
                        augment=AugmentConfig(hw_decoder_load=load), knobs=knobs, tuned=tuned)


def test_hw_decoder_load_auto_is_searched_on_a_gpus_mixed_decoder_only():
    """"auto" on a GPU's mixed decoder: searched from 0.65 (or the remembered load); a number stays fixed; a
    CPU decode (device cpu, or the hybrid) has no hardware decoder to share with: "auto" reads as 0.65."""
    from dali_pipes.run.pipeline import PipelineSpec
    from dali_pipes.run.stats import LoaderClock

    def plan(spec):
        return tuning.plan(spec, "file_list", LoaderClock())

    spec, hook = plan(gpu_spec("auto"))
    assert spec.knobs.hw_decoder_load == 0.65 and hook.tuner.tune_hw
    assert hook.describe()["start"] == {"num_threads": spec.knobs.num_threads, "prefetch_queue_depth": 2,
                                        "hw_decoder_load": 0.65}
    for fixed_or_cpu in (gpu_spec(0.99), gpu_spec("auto", decode_device="cpu"), gpu_spec("auto", device="cpu")):
        spec, hook = plan(fixed_or_cpu)
        assert hook is None and spec.knobs.hw_decoder_load == (0.99 if fixed_or_cpu.augment.hw_decoder_load
                                                               == 0.99 else 0.65)
    key = tuning.memory_key(gpu_spec("auto"), "file_list")
    assert key == tuning.memory_key(gpu_spec(0.99), "file_list")  # the load is no part of the graph's key
    tuning.remember(key, {"hw_decoder_load": 0.99, "source": "online"})
    spec, hook = plan(gpu_spec("auto"))
    assert spec.knobs.hw_decoder_load == 0.99 and hook.describe()["remembered"]
    assert PipelineSpec(contract=Contract(True, 2, False)).knobs.hw_decoder_load == 0.65  # the default stays, fixed


class RecordingRank:
    """The part of a rank's pipeline (hooks.RankView) the tuning hook uses: its spec, and rebuilds, recorded."""

    def __init__(self, spec):
        self.spec, self.rebuilds = spec, []

    def rebuild(self, spec, *, now=False):
        self.spec = spec
        self.rebuilds.append(spec)


def test_the_hook_rebuilds_a_new_graph_per_load_and_remembers_the_choice(tmp_path):
    """OnlineTuning on a GPU spec, fed a simulated clock: each trial's hw_decoder_load reaches the rank as a new
    TunedKnobs (the graph is rebuilt for it), the choice is in stats()["tuned"] and in the memory."""
    from dali_pipes.run.stats import LoaderClock
    clock = LoaderClock()
    spec, hook = tuning.plan(gpu_spec("auto", num_threads="auto"), "file_list", clock)
    rank = RecordingRank(spec)
    loop = SimulatedLoop(lambda s: 5.0 if s.num_threads >= 2 else 25.0)
    hook.begin_epoch(rank, 400)
    for i in range(400):
        clock.last = loop.batch(hook.tuner.current, i)  # what LoaderClock.after_batch sets
        hook.after_batch(rank, None)
    loads = [s.knobs.hw_decoder_load for s in rank.rebuilds]
    assert loads[0] == 0.99 and set(loads) == {0.99}  # 0.65 ran from the start; 0.99 chosen, threads after
    view = hook.describe()
    assert view["done"] and view["chosen"]["hw_decoder_load"] == 0.99 and view["decision"].startswith("chose ")
    assert [t["hw_decoder_load"] for t in view["trials"]][:2] == [0.65, 0.99]
    assert all({"wait_ms", "wait_error_ms", "wall_ms", "cpu_cores", "discarded"} <= set(t) for t in view["trials"])
    (entry,) = json.loads((tmp_path / "cache" / "tuning.json").read_text())["entries"].values()
    assert entry["hw_decoder_load"] == 0.99 and entry["num_threads"] == view["chosen"]["num_threads"]
    assert hook.state() == view["chosen"]


def test_the_tuner_leaves_the_batch_path_once_it_chose(tmp_path):
    """While it searches the tuner hears each batch; once it chose it is no longer listening, so the rank leaves it
    off the batch path from the next epoch's start (hooks.acts_after_batch, rank.begin_epoch)."""
    from dali_pipes.run.hooks import acts_after_batch
    from dali_pipes.run.stats import LoaderClock
    clock = LoaderClock()
    spec, hook = tuning.plan(gpu_spec("auto", num_threads="auto"), "file_list", clock)
    rank, loop = RecordingRank(spec), SimulatedLoop(lambda s: 5.0 if s.num_threads >= 2 else 25.0)
    hook.begin_epoch(rank, 400)
    assert acts_after_batch(hook)
    for i in range(400):
        clock.last = loop.batch(hook.tuner.current, i)
        hook.after_batch(rank, None)
    assert hook.tuner.done and not acts_after_batch(hook)


def test_hw_decoder_load_takes_auto_or_a_number_in_0_1():
    from dali_pipes.graph.augment_config import AugmentConfig
    from dali_pipes.options import add_arguments, auto_or_fraction
    from dali_pipes.run.pipeline import PipelineSpec
    parser = argparse.ArgumentParser()
    add_arguments(parser, AugmentConfig, "augment")
    assert parser.parse_args(["--hw-decoder-load", "AUTO"]).hw_decoder_load == "auto"
    assert parser.parse_args(["--hw-decoder-load", "0.99"]).hw_decoder_load == 0.99
    assert parser.parse_args([]).hw_decoder_load == 0.65
    for bad in ("1.5", "fast", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="'auto' or a number in"):
            auto_or_fraction(bad)
    with pytest.raises(ValueError, match=r"hw_decoder_load must be in \[0, 1\] or 'auto', got 'fast'"):
        AugmentConfig(hw_decoder_load="fast")
    # a spec built outside the loader (dali-pipes profile) reads "auto" as the default
    spec = PipelineSpec(contract=Contract(True, 2, False), augment=AugmentConfig(hw_decoder_load="auto"))
    assert spec.knobs.hw_decoder_load == 0.65


# -- on a GPU: the decoders' rounding between loads, and the search with real rebuilds ------------------------

def photo_list(root, n: int) -> str:
    """ROOT/list.txt over n photo-like JPEGs of 256 x 320 (smooth colour fields and fine texture, 4:2:0, the
    size the hardware decoder takes) labelled by index."""
    from PIL import Image
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:256, 0:320]
    with open(os.path.join(root, "list.txt"), "w") as f:
        for i in range(n):
            fields = [128 + 100 * np.sin((x * (i % 7 + 1) + y * c) / 40 + c) for c in range(3)]
            pixels = np.stack(fields, -1) + rng.normal(0, 12, (256, 320, 3))
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(os.path.join(root, f"{i:03d}.jpg"),
                                                                            quality=90)
            f.write(f"{i:03d}.jpg {i}\n")
    return os.path.join(root, "list.txt")


PLAIN = dict(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))  # images out as pixel / 255: differences in 8-bit levels


def rounding(batches, reference) -> dict:
    """Labels identical batch by batch; the images' absolute difference in 8-bit levels (max, mean, 99th pct)."""
    assert len(batches) == len(reference)
    for (_, labels), (_, expected) in zip(batches, reference):
        np.testing.assert_array_equal(labels, expected)
    levels = np.concatenate([np.abs(a - b).ravel() for (a, _), (b, _) in zip(batches, reference)]) * 255
    return {"max": float(levels.max()), "mean": float(levels.mean()), "p99": float(np.percentile(levels, 99))}


def gpu_batches(loader) -> list:
    return [(images.float().cpu().numpy(), labels.cpu().numpy()) for images, labels in loader]


@pytest.mark.gpu
@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
def test_the_decoders_rounding_between_hw_decoder_loads_is_measured(tmp_path, train, record_property):
    """The same batches at hw_decoder_load 0 (CUDA decoding only) and 0.99 (the hardware decoder): the same
    samples, crops and flips, so labels are identical and pixels differ by the decoders' rounding alone. The
    figures are recorded (junit property, and printed) for the docs: what a tuner's change of load may do."""
    source = photo_list(str(tmp_path), 32)

    def at(load):
        return gpu_batches(DaliLoader(source, batch_size=8, train=train, device="gpu", image_size=224, seed=5,
                                      num_threads=2, prefetch_queue_depth=2, shuffle_buffer=16,
                                      hw_decoder_load=load, **PLAIN))

    figures = rounding(at(0.0), at(0.99))
    record_property("hw_decoder_load_rounding", figures)
    print(f"\nhw_decoder_load 0 vs 0.99 ({'train' if train else 'val'}), |difference| in 8-bit levels: {figures}")
    assert figures["mean"] < 2 and figures["p99"] < 17, figures  # the bounds of GPU vs CPU decoding (test_loader)


@pytest.mark.gpu
def test_auto_hw_decoder_load_tries_loads_and_keeps_the_batches_but_for_rounding(tmp_path, record_property):
    """hw_decoder_load="auto" on a GPU: the search rebuilds the graph at other loads from DALI's checkpoint
    mid-epoch; the batches are those of a loader with the chosen values fixed (labels exactly, pixels up to the
    decoders' rounding: the trials before the choice decoded at other loads), and the load is remembered."""
    source = photo_list(str(tmp_path), 240)
    kw = dict(batch_size=2, train=True, device="gpu", image_size=64, seed=3, shuffle_buffer=16, **PLAIN)
    auto = DaliLoader(source, hw_decoder_load="auto", **kw)
    got = gpu_batches(auto)
    view = tuned(auto)
    assert view["done"] and len({t["hw_decoder_load"] for t in view["trials"]}) >= 2, view
    chosen = view["chosen"]
    assert chosen["hw_decoder_load"] in tuning.HW_LOADS
    fixed_loader = DaliLoader(source, num_threads=chosen["num_threads"],
                              prefetch_queue_depth=chosen["prefetch_queue_depth"],
                              hw_decoder_load=chosen["hw_decoder_load"], **kw)
    figures = rounding(got, gpu_batches(fixed_loader))
    record_property("auto_against_fixed_rounding", figures)
    print(f"\nauto ({view['decision']}) against the choice fixed, |difference| in 8-bit levels: {figures}")
    assert figures["mean"] < 2 and figures["p99"] < 17, figures
    (entry,) = json.loads((tmp_path / "cache" / "tuning.json").read_text())["entries"].values()
    assert entry["hw_decoder_load"] == chosen["hw_decoder_load"]
