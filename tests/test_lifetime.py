"""A loader's life around its iterations (run/lifetime.py), with real DALI on CPU: a second thread's iteration is
refused at once and the first goes on; a KeyboardInterrupt landing inside DALI leaves a loader whose next `for`
is a whole new epoch; a loader kept in a module's global is closed at exit without a word on stderr."""

import contextlib
import subprocess
import sys
import threading

import pytest

from dali_pipes import DaliLoader

N = 23


def make(numbered, **kw):
    return DaliLoader(numbered, **{"batch_size": 4, "train": True, "device": "cpu", "image_size": 16,
                                   "num_threads": 1, "seed": 3, **kw})


def epoch_labels(loader):
    return [label for _, labels in loader for label in labels.tolist()]


def test_a_second_thread_is_refused_at_once_and_the_first_finishes_its_epoch(numbered):
    loader = make(numbered)
    started, tried, got, refused = threading.Event(), threading.Event(), [], []

    def first():
        for _, labels in loader:
            got.append(labels.tolist())
            started.set()
            tried.wait(60)  # the other thread tries while this epoch is midway

    def second():
        started.wait(60)
        try:
            next(iter(loader))
        except RuntimeError as error:
            refused.append(str(error))
        finally:
            tried.set()

    threads = [threading.Thread(target=first, name="first"), threading.Thread(target=second, name="second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(refused) == 1 and "being iterated by thread 'first' (at epoch 0, batch 1)" in refused[0]
    assert "one iteration at a time" in refused[0] and "one loader per thread" in refused[0]
    assert len(got) == len(loader) == 5  # the first thread's epoch, whole (23 // 4 full batches)
    assert len({label for batch in got for label in batch}) == 20
    after = epoch_labels(loader)  # the loader is usable afterwards, from any thread
    assert len(after) == 20 and len(set(after)) == 20 and loader.epoch == 2


class InterruptIn:
    """Raises KeyboardInterrupt, as a Ctrl-C would, when DALI's Python function `name` is entered for the
    `nth` time (a trace function's exception lands in the frame it traces). Deterministic, DALI untouched."""

    def __init__(self, name: str, nth: int) -> None:
        self.name, self.left = name, nth

    def __call__(self, frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_name == self.name and "nvidia/dali" in code.co_filename.replace("\\", "/") \
                and self.left > 0:
            self.left -= 1
            if self.left == 0:
                raise KeyboardInterrupt
        return None

    def __enter__(self):
        self.before = sys.gettrace()
        sys.settrace(self)
        return self

    def __exit__(self, *exc):
        sys.settrace(self.before)


class InterruptAt:
    """A batch transform (DaliLoader's batch_transform=, run on each batch after DALI gave it) that raises
    KeyboardInterrupt at its `nth` batch: the interrupt lands after DALI moved on, before the loader counted it."""

    def __init__(self, nth: int) -> None:
        self.left = nth

    def __call__(self, images, labels):
        self.left -= 1
        if self.left == 0:
            raise KeyboardInterrupt
        return images, labels


@pytest.mark.parametrize("where,nth,set_epoch,yielded", [
    ("schedule_run", 2, None, 2),  # inside DALI's iterator: a batch released, the next run never scheduled
    ("build", 1, 1, 0),            # while set_epoch's jump builds the pipeline
    ("batch_transform", 3, None, 2),  # after DALI gave the batch, before the loader counted it: DALI whole
])
def test_a_keyboard_interrupt_inside_next_leaves_a_loader_whose_next_for_is_a_new_epoch(numbered, where, nth,
                                                                                         set_epoch, yielded):
    """The next for is the whole next epoch (the same one if none of it was yielded). Interrupted inside DALI,
    from a fresh pipeline: exactly a loader's that jumps there with set_epoch; interrupted after DALI gave the
    batch, DALI's own next epoch: exactly an uninterrupted loader's. And so on after it."""
    transform = InterruptAt(nth) if where == "batch_transform" else None
    loader = make(numbered, batch_transform=transform)
    if set_epoch is not None:
        loader.set_epoch(set_epoch)
    got = []
    with pytest.raises(KeyboardInterrupt), InterruptIn(where, nth) if transform is None else contextlib.nullcontext():
        for _, labels in loader:
            got.append(labels)
    assert len(got) == yielded
    assert len(loader) == 5  # DataLoader's count, asked before the next for (tqdm does)
    after = [epoch_labels(loader), epoch_labels(loader)]
    next_epoch = (set_epoch or 0) + (yielded > 0)  # the interrupted epoch ended where it stopped
    reference = make(numbered)
    if transform is None:
        reference.set_epoch(next_epoch)
    else:
        epoch_labels(reference)  # the epoch the other was interrupted in, uninterrupted
    assert after == [epoch_labels(reference), epoch_labels(reference)]
    assert len(after[0]) == 20 and len(set(after[0])) == 20  # a whole train epoch, each sample at most once
    assert loader.epoch == next_epoch + 2


def test_a_val_loader_interrupted_midway_gives_every_sample_next_epoch(numbered):
    loader = make(numbered, train=False, val_padding="none")
    with pytest.raises(KeyboardInterrupt), InterruptIn("schedule_run", 3):
        for _ in loader:
            pass
    state = loader.state_dict()  # taken before the next for: the next epoch's start
    assert (state["loader"]["epoch"], state["loader"]["position"]) == (1, 0)
    assert sorted(epoch_labels(loader)) == list(range(N))


def test_a_loader_kept_in_a_module_global_exits_without_a_word(numbered, tmp_path):
    """The module holding the loader is torn down after dali_pipes' own (imported later): its __del__ then
    ran with dali_pipes' module names already None ("Exception ignored in: DaliLoader.__del__")."""
    (tmp_path / "held.py").write_text(
        "from dali_pipes import DaliLoader\n"
        f"loader = DaliLoader({numbered!r}, batch_size=3, train=True, device='cpu', image_size=16, num_threads=1)\n")
    (tmp_path / "main.py").write_text(
        "import dali_pipes.loader\nimport held\nbatches = iter(held.loader)\n"
        "for _ in range(3):\n    next(batches)\nprint('ok')\n")
    run = subprocess.run([sys.executable, str(tmp_path / "main.py")], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
    assert "Exception ignored" not in run.stderr and "Traceback" not in run.stderr, run.stderr
