"""Detection's exact mid-epoch resume and bad-sample budget (issue 35): a state taken between batches continues,
on a fresh loader, with exactly the batches the uninterrupted loader gives (the drawn order, the random draws);
damaged or missing images are named by file and image id, or excluded within max_bad."""

from __future__ import annotations

import io
import shutil

import pytest
import torch
from test_detection import coco_dir, collate_fn, ssd_steps, v2_dataset, v2_hflip  # noqa: F401 - coco_dir: fixture
from torch.utils.data import BatchSampler, RandomSampler, Subset

from dali_pipes import DaliLoader
from dali_pipes.errors import DatasetError


def batch_record(images, targets):
    return [(t["image_id"], t["boxes"].clone(), t["labels"].clone(), image.clone())
            for image, t in zip(images, targets)]


def assert_batches_equal(got, want):
    assert [[r[0] for r in batch] for batch in got] == [[r[0] for r in batch] for batch in want]
    for batch, ref in zip(got, want):
        for (_, boxes, labels, image), (_, ref_boxes, ref_labels, ref_image) in zip(batch, ref):
            assert torch.equal(boxes, ref_boxes) and torch.equal(labels, ref_labels)
            assert torch.equal(image, ref_image)


def roundtrip(state):
    """A state as a script saves and loads it (torch.save, torch.load with weights_only)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("case", ["hflip-seeded-sampler", "ssd-random-global-stream"])
def test_resume_midway_gives_the_uninterrupted_batches(torchvision, coco_dir, case):  # noqa: F811
    """Uninterrupted: 2 epochs. Interrupted: epoch 0's first 2 batches, the state, a fresh loader (a fresh sampler,
    as a new process builds it) restored from it: the rest of epoch 0 and epoch 1 equal, image ids, boxes, labels
    and pixels, for a deterministic transform and for random crops and flips."""
    steps = v2_hflip(torchvision, 1.0) if case.startswith("hflip") else ssd_steps(torchvision, zoom=True)
    dataset = v2_dataset(torchvision, coco_dir, steps)

    def make():
        generator = torch.Generator().manual_seed(3) if case.endswith("seeded-sampler") else None
        return DaliLoader(dataset, batch_sampler=BatchSampler(RandomSampler(dataset, generator=generator), 1, False),
                          collate_fn=collate_fn, device="cpu", seed=11)

    torch.manual_seed(7)
    whole = make()
    want = [batch_record(*batch) for _ in range(2) for batch in whole]
    torch.manual_seed(7)
    first = make()
    got = []
    for images, targets in first:
        got.append(batch_record(images, targets))
        if len(got) == 2:
            state, rng = roundtrip(first.state_dict()), torch.get_rng_state()  # the script saves its own rng too
            break
    first.close()
    torch.manual_seed(123)  # a new process
    resumed = make()
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    got += [batch_record(*batch) for _ in range(2) for batch in resumed]
    assert len(want) == len(got) == 8  # the resumed loader's first pass is epoch 0's last 2 batches, then epoch 1
    assert_batches_equal(got, want)


def test_a_state_taken_between_epochs_starts_the_next(torchvision, coco_dir):  # noqa: F811
    dataset = v2_dataset(torchvision, coco_dir, ssd_steps(torchvision, zoom=False))

    def make():
        sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(5))
        return DaliLoader(dataset, batch_size=2, sampler=sampler, collate_fn=collate_fn, device="cpu", seed=4)

    whole = make()
    want = [batch_record(*batch) for _ in range(2) for batch in whole]
    first = make()
    got = [batch_record(*batch) for batch in first]
    state = roundtrip(first.state_dict())
    resumed = make()
    resumed.load_state_dict(state)
    got += [batch_record(*batch) for batch in resumed]
    assert_batches_equal(got, want)


def test_a_state_of_another_dataset_is_refused_naming_what_differs(torchvision, coco_dir):  # noqa: F811
    whole = v2_dataset(torchvision, coco_dir, v2_hflip(torchvision), subset=False)
    loader = DaliLoader(Subset(whole, [0, 1, 2, 3]), batch_size=2, collate_fn=collate_fn, device="cpu")
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(ValueError, match=r"number of images: 4 in the state, 5 in this dataset"):
        DaliLoader(whole, batch_size=2, collate_fn=collate_fn, device="cpu").load_state_dict(state)
    with pytest.raises(ValueError, match=r"image ids differ.*\[1, 2, 3, 4\].*\[1, 2, 3, 5\]"):
        DaliLoader(Subset(whole, [0, 1, 2, 4]), batch_size=2, collate_fn=collate_fn,
                   device="cpu").load_state_dict(state)


@pytest.fixture
def damaged_coco(coco_dir, tmp_path):  # noqa: F811
    """The fixture's COCO folder with image 3 a truncated JPEG and image 5 a text file named 005.jpg."""
    shutil.copytree(coco_dir, tmp_path / "coco")
    images = tmp_path / "coco" / "images"
    data = (images / "003.jpg").read_bytes()
    (images / "003.jpg").write_bytes(data[:len(data) // 2])
    (images / "005.jpg").write_text("not an image, a text file with a .jpg name\n")
    return tmp_path / "coco"


def test_a_damaged_image_is_named_by_file_and_image_id(torchvision, damaged_coco):
    dataset = v2_dataset(torchvision, damaged_coco, v2_hflip(torchvision))
    loader = DaliLoader(dataset, batch_size=2, collate_fn=collate_fn, device="cpu")
    with pytest.raises(DatasetError, match=r"003\.jpg \(image 3\).*skip_bad=True"):
        list(loader)


def test_skip_bad_excludes_damaged_images_within_max_bad(torchvision, damaged_coco):
    dataset = v2_dataset(torchvision, damaged_coco, v2_hflip(torchvision))  # images 1, 2, 3, 5
    loader = DaliLoader(dataset, batch_size=3, collate_fn=collate_fn, device="cpu", skip_bad=True, max_bad=2)
    with pytest.warns(UserWarning) as caught:
        ids = [[t["image_id"] for t in targets] for _, targets in loader]
    assert ids == [[1, 2]]  # batch [1, 2, 3] given without 3; batch [5] passed over
    messages = " ".join(str(w.message) for w in caught)
    assert "003.jpg (image 3)" in messages and "005.jpg (image 5)" in messages
    assert [[t["image_id"] for t in targets] for _, targets in loader] == [[1, 2]]  # the next epoch: no new warning
    assert len(loader.bad_samples) == 2
    over = DaliLoader(dataset, batch_size=2, collate_fn=collate_fn, device="cpu", skip_bad=True, max_bad=1)
    with pytest.raises(DatasetError, match=r"2 bad images excluded, over the budget of 1"), pytest.warns(UserWarning):
        list(over)


def test_skip_bad_excludes_a_missing_image_and_resumes_with_its_exclusions(torchvision, coco_dir, tmp_path):  # noqa: F811
    shutil.copytree(coco_dir, tmp_path / "coco")
    (tmp_path / "coco" / "images" / "002.jpg").unlink()
    dataset = v2_dataset(torchvision, tmp_path / "coco", v2_hflip(torchvision))
    loader = DaliLoader(dataset, batch_size=1, collate_fn=collate_fn, device="cpu", skip_bad=True)
    with pytest.warns(UserWarning, match=r"002\.jpg \(image 2\)"):
        ids = [t["image_id"] for _, targets in loader for t in targets]
    assert ids == [1, 3, 5]
    state = loader.state_dict()
    resumed = DaliLoader(dataset, batch_size=1, collate_fn=collate_fn, device="cpu", skip_bad=True)
    resumed.load_state_dict(state)
    assert [t["image_id"] for _, targets in resumed for t in targets] == [1, 3, 5]
    assert [str(b) for b in resumed.bad_samples] == [str(b) for b in loader.bad_samples]


def test_a_state_before_the_first_batch_resumes_at_the_start(torchvision, coco_dir):  # noqa: F811
    dataset = v2_dataset(torchvision, coco_dir, ssd_steps(torchvision, zoom=False))
    want = [batch_record(*batch) for batch in DaliLoader(dataset, batch_size=2, collate_fn=collate_fn, device="cpu",
                                                         seed=9)]
    resumed = DaliLoader(dataset, batch_size=2, collate_fn=collate_fn, device="cpu", seed=9)
    resumed.load_state_dict(roundtrip(DaliLoader(dataset, batch_size=2, collate_fn=collate_fn, device="cpu",
                                                 seed=9).state_dict()))
    assert_batches_equal([batch_record(*batch) for batch in resumed], want)


def test_a_dropped_detection_loader_is_freed_by_reference_counting_alone(torchvision, coco_dir):  # noqa: F811
    """As DataLoaders are dropped between epochs: its DALI pipeline's threads go with it, no close() needed."""
    import gc
    import os
    import time
    import weakref
    dataset = v2_dataset(torchvision, coco_dir, v2_hflip(torchvision))

    def used() -> DaliLoader:
        loader = DaliLoader(dataset, batch_size=2, collate_fn=collate_fn, device="cpu", seed=4)
        next(iter(loader))
        return loader

    used().close()  # threads the process starts once (DALI's, torch's) are running from here on
    threads = len(os.listdir("/proc/self/task"))
    gc.collect()
    gc.disable()
    try:
        loader = used()
        assert len(os.listdir("/proc/self/task")) > threads
        gone = weakref.ref(loader)
        del loader
        assert gone() is None, [type(r).__name__ for r in gc.get_referrers(gone())]
        deadline = time.monotonic() + 5
        while len(os.listdir("/proc/self/task")) > threads and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(os.listdir("/proc/self/task")) == threads
    finally:
        gc.enable()


def test_elastic_resume_refuses_a_per_rank_sampler_and_replays_any_other(torchvision, coco_dir):  # noqa: F811
    """As classification's drawn orders: every old rank's state (a list) on another world size is refused, naming
    the sampler, where each rank's draw comes from its num_replicas (the references' DistributedSampler in the
    batch sampler); on the same world size each rank takes its own state; a sampler that knows no ranks is
    replayed: the new rank goes on with old rank (its rank mod the old world size)'s batches exactly."""
    from torch.utils.data import DistributedSampler
    dataset = v2_dataset(torchvision, coco_dir, ssd_steps(torchvision, zoom=False))

    def distributed(rank, world):
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=5)
        return DaliLoader(dataset, batch_sampler=BatchSampler(sampler, 1, False), collate_fn=collate_fn, device="cpu",
                          seed=11)

    states, rests = [], []
    for rank in range(2):
        loader = distributed(rank, 2)
        batches = iter(loader)
        next(batches)
        states.append(roundtrip(loader.state_dict()))
        rests.append([batch_record(*batch) for batch in batches])
    with pytest.raises(ValueError, match=r"elastic resume refused: sampler DistributedSampler draws each rank's "
                                         r"indices from its num_replicas \(3\).*Resume on 2 ranks"):
        distributed(0, 3).load_state_dict(states)
    with pytest.raises(ValueError, match=r"num_replicas \(1\).*Resume on 2 ranks"):
        distributed(0, 1).load_state_dict(states[1])  # one old rank's state on another world size: the same
    again = distributed(1, 2)
    again.load_state_dict(states)
    assert_batches_equal([batch_record(*batch) for batch in again], rests[1])

    def drawn(seed):
        sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
        return DaliLoader(dataset, batch_sampler=BatchSampler(sampler, 1, False), collate_fn=collate_fn, device="cpu",
                          seed=11)

    states, rests = [], []
    for process in range(2):  # two processes, each reading its whole draw (DataLoader's way: no ranks)
        loader = drawn(process)
        batches = iter(loader)
        next(batches)
        state = roundtrip(loader.state_dict())
        states.append({**state, "rank": process, "world_size": 2})  # as two ranks of a process group record it
        rests.append([batch_record(*batch) for batch in batches])
    resumed = drawn(9)  # one process now (rank 0): it goes on with old rank 0's draw
    resumed.load_state_dict(states)
    assert_batches_equal([batch_record(*batch) for batch in resumed], rests[0])


class RankedSampler(RandomSampler):
    """A sampler that knows its rank but draws as if alone (no num_replicas): a script's own."""
    rank = 2


def test_an_elastic_rank_replaying_another_ranks_draw_draws_its_own_flips(torchvision, coco_dir):  # noqa: F811
    """On more ranks, new rank 2 replays old rank 0's batches (its draw knows no ranks) but not old rank 0's random
    state: ranks seeded alike must not flip alike (rank_of)."""
    dataset = v2_dataset(torchvision, coco_dir, v2_hflip(torchvision))

    def make(sampler_class, seed):
        sampler = sampler_class(dataset, generator=torch.Generator().manual_seed(seed))
        return DaliLoader(dataset, batch_sampler=BatchSampler(sampler, 1, False), collate_fn=collate_fn, device="cpu",
                          seed=11)

    states, rests = [], []
    for process in range(2):
        loader = make(RandomSampler, process)
        batches = iter(loader)
        next(batches)
        states.append({**roundtrip(loader.state_dict()), "rank": process, "world_size": 2})
        rests.append([batch_record(*batch) for batch in batches])
    grown = make(RankedSampler, 9)  # rank 2: it goes on with old rank 0's draw
    grown.load_state_dict(states)
    got = [batch_record(*batch) for batch in grown]
    assert [[r[0] for r in batch] for batch in got] == [[r[0] for r in batch] for batch in rests[0]]
    assert any(not torch.equal(r[3], ref[3]) for batch, want in zip(got, rests[0]) for r, ref in zip(batch, want))
