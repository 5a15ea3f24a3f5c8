"""Online tuning (tuning.py) with real DALI on CPU: num_threads / prefetch_queue_depth "auto" try other
settings in the first epoch by rebuilding the pipeline at its checkpoint, and the batches (images and
labels) are exactly those of a loader with the chosen values fixed: plain, after a resume taken while
the search runs, and after an elastic resume taken then. The choice is remembered per machine."""

import json
import logging
import os

import numpy as np
import pytest

from dali_pipes import DaliLoader, open_source
from dali_pipes.options import auto_or_count
from dali_pipes.run import tuning

from conftest import write_numbered

N = 240  # 120 batches of 2: a tuning budget of 12 batches, room for 4 trials of 2 measured batches
KW = dict(batch_size=2, image_size=16, device="cpu", train=True, shuffle_buffer=16, seed=3)


@pytest.fixture(scope="module")
def numbered(tmp_path_factory):
    return open_source(write_numbered(str(tmp_path_factory.mktemp("tuning")), N))


@pytest.fixture(autouse=True)
def private_memory(tmp_path, monkeypatch):
    """Each test tunes from scratch: its own cache root, so no remembered choice."""
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))


def epochs(loader, count=2, stop_at=None):
    """Batches (images, labels) as numpy, `count` epochs; with stop_at, the state after that many."""
    out, state = [], None
    for _ in range(count):
        for images, labels in loader:
            out.append((images.numpy().copy(), labels.numpy().copy()))
            if stop_at is not None and len(out) == stop_at:
                return out, loader.state_dict()
    return out, state


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


def test_auto_tries_settings_and_its_batches_equal_the_chosen_values_fixed(numbered, caplog):
    caplog.set_level(logging.INFO, logger="dali_pipes")
    auto = DaliLoader(numbered, **KW)  # "auto" is the default
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
    chosen = settings(view["chosen"])
    reference, _ = epochs(fixed(chosen, numbered))
    assert_same(got, reference)
    stats = auto.stats()
    assert stats["batches"] == len(auto) and stats["images"] == len(auto) * 2 and stats["epoch"] == 1
    assert 0 <= stats["data_wait_fraction"] <= 1 and stats["num_threads"] == chosen.num_threads


def test_a_resume_taken_while_tuning_gives_the_batches_of_the_fixed_choice(numbered):
    auto = DaliLoader(numbered, **KW)
    head, state = epochs(auto, stop_at=7)  # trial 2 (or later) is running: a rebuilt pipeline
    assert not tuned(auto)["done"] and len(tuned(auto)["trials"]) >= 2
    resumed = DaliLoader(numbered, **KW)
    resumed.load_state_dict(state)
    rest, _ = epochs(resumed)
    chosen = settings(tuned(resumed)["chosen"])
    assert chosen is not None
    reference, _ = epochs(fixed(chosen, numbered), count=3)
    assert_same(head + rest, reference[:len(head) + len(rest)])


def test_an_elastic_resume_taken_while_tuning_matches_one_of_fixed_loaders(numbered):
    def old_world(**kw):
        loaders = [DaliLoader(numbered, rank=r, world_size=2, **{**KW, **kw}) for r in range(2)]
        states = [epochs(loader, stop_at=5)[1] for loader in loaders]
        return loaders, states

    auto_loaders, auto_states = old_world()
    assert all(len(tuned(l)["trials"]) >= 2 and not tuned(l)["done"] for l in auto_loaders)
    fixed_loaders, fixed_states = old_world(num_threads=1, prefetch_queue_depth=2)
    new_auto = DaliLoader(numbered, **KW)
    new_auto.load_state_dict(auto_states)
    new_fixed = fixed(tuning.Settings(2, 3), numbered)
    new_fixed.load_state_dict(fixed_states)
    assert_same(epochs(new_auto)[0], epochs(new_fixed)[0])


def test_the_choice_is_remembered_and_the_next_run_only_confirms_it(numbered, tmp_path):
    first = DaliLoader(numbered, **KW)
    epochs(first, count=1)
    memory = json.load(open(tmp_path / "cache" / "tuning.json"))["entries"]
    (entry,) = memory.values()
    chosen = tuned(first)["chosen"]
    assert (entry["num_threads"], entry["prefetch_queue_depth"]) == (chosen["num_threads"],
                                                                    chosen["prefetch_queue_depth"])
    second = DaliLoader(numbered, **KW)
    assert tuned(second)["start"] == chosen and tuned(second)["remembered"]
    epochs(second, count=1)
    assert tuned(second)["done"] and settings(tuned(second)["trials"][0]) == settings(chosen)


def test_fixed_values_are_not_tuned_and_one_fixed_knob_leaves_the_other_to_tune(numbered):
    both = DaliLoader(numbered, num_threads=1, prefetch_queue_depth=2, **KW)
    assert tuned(both) is None and both.stats()["num_threads"] == 1
    depth_only = DaliLoader(numbered, num_threads=1, **KW)
    epochs(depth_only, count=1)
    assert {t["num_threads"] for t in tuned(depth_only)["trials"]} == {1}


def test_a_short_first_epoch_is_not_tuned_and_says_why(numbered, caplog):
    caplog.set_level(logging.INFO, logger="dali_pipes")
    loader = DaliLoader(numbered, **{**KW, "batch_size": 16})  # 15 batches: 1 batch of budget
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
    trial = tuning.Trial(tuning.Settings(2, 2), measured=3, wait=0.003, wall=0.030, cpu=0.045,
                         walls=[0.009, 0.010, 0.011])
    assert trial.describe() == ("num_threads=2 prefetch_queue_depth=2: waits 1.0 ms of 10.0 ms per batch (median "
                                "[min, max] 10.0 [9.0, 11.0] ms), 1.50 cores busy")


def test_the_flag_takes_auto_or_a_count():
    assert auto_or_count("auto") == "auto" and auto_or_count("AUTO") == "auto" and auto_or_count("4") == 4
    with pytest.raises(Exception):
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
    """What DaliLoader hands tuning.plan for a CPU train graph (both knobs "auto": plan's flags)."""
    from dali_pipes.run.pipeline import PipelineSpec
    return PipelineSpec(train=True, batch_size=2, device="cpu")


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
    spec, hook = tuning.plan(plan_spec(), "tfrecord", LoaderClock(), tune_threads=True, tune_depth=True)
    assert settings(hook.describe()["start"]) == tuning.Settings(tuning.default_threads(), 2)
    assert not hook.describe()["remembered"] and spec.num_threads == tuning.default_threads()
    tuning.remember(key, {"prefetch_queue_depth": 3, "source": "online"})  # as a run that tuned the depth only
    (warning,) = memory_warnings(caplog, path)
    assert problem in warning and f"entry {key}" in warning
    entries = json.loads(path.read_text())["entries"]
    assert {k: v for k, v in entries[key].items() if k != "date"} == {"prefetch_queue_depth": 3, "source": "online"}
    assert entries["other"] == {"num_threads": 1}  # another machine's entry is kept as it was


def test_a_loader_over_a_memory_that_is_a_list_tunes_and_leaves_a_good_memory(numbered, tmp_path, caplog):
    """Issue 24: the whole first epoch, as a training job runs it (today's main raised AttributeError at 10%)."""
    caplog.set_level(logging.WARNING, logger="dali_pipes")
    path = tmp_path / "cache" / "tuning.json"
    path.parent.mkdir()
    path.write_text("[]")
    loader = DaliLoader(numbered, **KW)
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


def test_a_locations_resolved_reads_keep_the_remembered_key(numbered):
    """A location's loader says exif_orientation=True, png16="scale" (DALI's own reads); `dali-pipes profile`
    leaves them None. Both find the same remembered settings: the key they had before these fields existed."""
    import dataclasses

    from dali_pipes.run.pipeline import PipelineSpec
    loader = DaliLoader(numbered, **KW, num_threads=1, prefetch_queue_depth=2)
    augment = loader.augment
    assert (augment.exif_orientation, augment.png16) == (True, "scale")
    spec = PipelineSpec(train=True, batch_size=2, augment=augment)
    as_profile = dataclasses.replace(spec, augment=dataclasses.replace(augment, exif_orientation=None, png16=None))
    assert tuning.memory_key(spec, numbered.kind) == tuning.memory_key(as_profile, numbered.kind)
    assert not {"exif_orientation", "png16"} & set(tuning.graph_key(spec, numbered.kind)["augment"])
    as_pil = dataclasses.replace(spec, augment=dataclasses.replace(augment, exif_orientation=False, png16="pil"))
    assert tuning.memory_key(as_pil, numbered.kind) != tuning.memory_key(spec, numbered.kind)
