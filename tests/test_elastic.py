"""Elastic resume on CPU with real DALI: states of every old rank, loaded on another world size,
finish the interrupted epoch with the samples the old ranks had not yielded (none twice, train loses
less than new world size x batch size), then run as a loader built for the new world size."""

import collections
import os

import numpy as np
import pytest
import torch

from dali_pipes import DaliLoader, open_source
from dali_pipes.run.delivery import identity
from dali_pipes.run.elastic import subset_source

from conftest import jpeg_bytes

N = 23  # does not divide by 2, 3 or 4
BATCH = 3
KW = dict(batch_size=BATCH, image_size=16, device="cpu", num_threads=1, shuffle_buffer=8, seed=7,
          val_padding="label")  # val: every sample exactly once, padding labelled -1 (checked as such)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """An image folder of N classes with one image each (so a label names its sample), and the same
    images as 3 TFRecord shards and 2 WebDataset shards."""
    from dali_pipes.tools.convert import write_tfrecords, write_webdataset
    root = tmp_path_factory.mktemp("elastic")
    for i in range(N):
        os.makedirs(root / "images" / f"c{i:03d}")
        (root / "images" / f"c{i:03d}" / "0.jpg").write_bytes(jpeg_bytes(i, 24 + i % 5, 32))
    folder = open_source(str(root / "images"))
    write_tfrecords(folder, str(root / "tfrecord"), shards=3, progress=False)
    write_webdataset(folder, str(root / "webdataset"), shards=2, progress=False)
    return {kind: open_source(str(root / kind)) for kind in ("images", "tfrecord", "webdataset")}


def ranks(source, world_size, train):
    return [DaliLoader(source, rank=r, world_size=world_size, train=train, **KW) for r in range(world_size)]


def run_until(loaders, stop):
    """Step every rank in lockstep through batches (epoch, batch) up to `stop` inclusive; returns
    the labels each epoch yielded (all ranks) and every rank's state after the stop batch."""
    yielded = collections.defaultdict(list)
    iterators = [None] * len(loaders)
    while True:
        epoch, batch = loaders[0].next_batch
        for r, loader in enumerate(loaders):
            if loader.next_batch[1] == 0:
                iterators[r] = iter(loader)
            yielded[epoch] += next(iterators[r])[1].tolist()
        if (epoch, batch) == stop:
            return yielded, [loader.state_dict() for loader in loaders]


def epoch_rest(loaders):
    """What the ranks yield until the end of their current epoch: (epoch, labels of all ranks)."""
    epoch = loaders[0].next_batch[0]
    assert all(l.next_batch[0] == epoch for l in loaders)
    lengths = {len(l) - l.next_batch[1] for l in loaders}
    assert len(lengths) == 1  # equal batch counts on every rank, else DDP hangs
    return epoch, [y for l in loaders for _, labels in l for y in labels.tolist()]


def epoch_length(world_size, train):
    """Batches per rank and epoch of a loader built for `world_size` (loader.py's epoch contract)."""
    if train:
        return N // world_size // BATCH
    longest = max((r + 1) * N // world_size - r * N // world_size for r in range(world_size))
    return -(-longest // BATCH)


def check_epoch(labels, train, world_size, resumed):
    """Each sample at most once (val: exactly once); a train epoch finished by `world_size` ranks
    loses less than world_size * batch size of what was left."""
    real = [y for y in labels if y >= 0]
    assert len(real) == len(set(real)) and set(real) <= set(range(N))
    if not train:
        assert sorted(real) == list(range(N))
    elif resumed:
        assert N - len(real) < world_size * BATCH


# (old world, new world): old epoch lengths in train are 3 (2 ranks) and 2 (3 ranks) batches.
# Stops: first batch, one batch before the epoch boundary, the boundary's last batch (the state
# names the next epoch), and the first batch after it.
CASES = [(2, 1), (2, 3), (2, 4), (3, 2)]


@pytest.mark.parametrize("kind", ["images", "tfrecord"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
@pytest.mark.parametrize("old,new", CASES)
def test_elastic_resume_yields_the_rest_of_the_epoch_once(sources, kind, train, old, new):
    source = sources[kind]
    last = epoch_length(old, train) - 1
    for stop in sorted({(0, 0), (0, last - 1), (0, last), (1, 0)}):
        yielded, states = run_until(ranks(source, old, train), stop)
        new_loaders = ranks(source, new, train)
        for loader in new_loaders:
            loader.load_state_dict(states)
        epoch, rest = epoch_rest(new_loaders)
        mid_epoch = epoch == stop[0]
        if not mid_epoch:  # the stop was the epoch's last batch, or the rest fills no batch on 4 ranks
            assert epoch == stop[0] + 1
            assert stop[1] == last or (train and N - len(yielded[stop[0]]) < new * BATCH)
        check_epoch(yielded[epoch] * mid_epoch + rest, train, new, resumed=mid_epoch)
        # from the next epoch on: as a loader built for the new world size
        assert [len(l) for l in new_loaders] == [epoch_length(new, train)] * new
        following, labels = epoch_rest(new_loaders)
        assert following == epoch + 1
        check_epoch(labels, train, new, resumed=False)
        assert len([y for y in labels if y >= 0]) == sum(l.samples_per_epoch for l in new_loaders)
        assert sum(l.samples_per_epoch for l in new_loaders) == (N // new // BATCH * BATCH * new if train else N)


def test_the_rest_is_read_without_the_delivered_samples(sources, tmp_path, monkeypatch):
    """Each new rank's reader holds only its slice of the rest, through subset indexes over the
    TFRecord shards: nothing the old ranks delivered is read, let alone decoded, again. The subset
    indexes go under the cache folder and are gone once DALI has read them."""
    import dali_pipes.run.elastic as elastic
    from dali_pipes.data.formats import read_sample
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path))  # subset indexes go to its elastic/ folder
    source, refs = sources["tfrecord"], sources["tfrecord"].refs()
    written = []  # (the subset source each remainder pipeline reads, the storage-order indices it holds)

    def recording(source, indices, *args, **kwargs):
        written.append((subset_source(source, indices, *args, **kwargs), list(indices)))
        return written[-1][0]

    monkeypatch.setattr(elastic, "subset_source", recording)
    yielded, states = run_until(ranks(source, 2, False), (0, 1))
    new_loaders = ranks(source, 3, False)
    for loader in new_loaders:
        loader.load_state_dict(states)
    read = []
    for loader, (subset, indices) in zip(new_loaders, written):  # what each rank's remainder pipeline reads
        assert subset.counts and sum(subset.counts) == -(-(N - len(yielded[0])) // 3)  # its slice, then padding
        assert all(os.path.dirname(p) == str(tmp_path / "elastic") and not os.path.exists(p)
                   for p in subset.index_files)
        read += [read_sample(refs[i]).label for i in indices[:loader.samples_per_epoch]]
    assert sorted(read) == sorted(set(range(N)) - set(yielded[0]))
    epoch, rest = epoch_rest(new_loaders)
    check_epoch(yielded[0] + rest, False, 3, resumed=True)
    assert sorted(y for y in rest if y >= 0) == sorted(read)


@pytest.mark.parametrize("kind", ["tfrecord", "webdataset"])
def test_a_state_taken_in_the_rest_resumes_exactly_and_elastically_again(sources, kind):
    """3 ranks stop mid-epoch; 2 ranks take over and stop after the rest's first batch. Their
    states resume (a) on 2 ranks: the very same batches, images and labels, through the next epoch;
    (b) on 1 rank: over the three runs each sample of the epoch is yielded at most once."""
    source = sources[kind]
    yielded, states = run_until(ranks(source, 3, True), (0, 0))
    two = ranks(source, 2, True)
    for loader in two:
        loader.load_state_dict(states)
    assert [len(l) for l in two] == [2, 2]  # (23 - 9) // 2 // 3
    iterators = [iter(l) for l in two]
    first = [y for it in iterators for y in next(it)[1].tolist()]
    middle = [l.state_dict() for l in two]
    continued = [[(x.clone(), y.clone()) for x, y in it] + [(x.clone(), y.clone()) for x, y in l]
                 for it, l in zip(iterators, two)]
    again = ranks(source, 2, True)
    for loader in again:
        loader.load_state_dict(middle)
    replayed = [[(x.clone(), y.clone()) for x, y in l] + [(x.clone(), y.clone()) for x, y in l] for l in again]
    assert [len(b) for b in replayed] == [len(b) for b in continued] == [1 + 3, 1 + 3]
    for a, b in zip(continued, replayed):
        assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))
    one = ranks(source, 1, True)
    one[0].load_state_dict(middle)
    epoch, rest = epoch_rest(one)
    assert epoch == 0 and len(rest) == (N - 9 - 6) // 3 * 3
    labels = yielded[0] + first + rest
    assert len(labels) == len(set(labels)) == N - 2


def test_the_list_on_the_same_world_size_is_each_ranks_own_state(sources):
    source = sources["images"]
    _, states = run_until(ranks(source, 2, True), (0, 1))
    by_list, by_entry = ranks(source, 2, True), ranks(source, 2, True)
    for rank in range(2):
        by_list[rank].load_state_dict(states)
        by_entry[rank].load_state_dict(states[rank])
    for a, b in zip(by_list, by_entry):
        assert [y.tolist() for _, y in a] == [y.tolist() for _, y in b]
        assert a.epoch == b.epoch == 1


def test_states_that_do_not_fit_are_refused(sources):
    source = sources["images"]
    _, states = run_until(ranks(source, 2, True), (0, 1))
    loader = DaliLoader(source, rank=0, world_size=3, train=True, **{**KW, "batch_size": 2})
    with pytest.raises(ValueError, match="does not fit this loader.*batch_size"):
        loader.load_state_dict(states)
    loader = DaliLoader(source, rank=0, world_size=3, train=True, **KW)
    with pytest.raises(ValueError, match="no record of delivered samples"):
        loader.load_state_dict([{k: v for k, v in s.items() if k != "record"} for s in states])
    with pytest.raises(ValueError, match="different epochs"):
        loader.load_state_dict([states[0], {**states[1], "loader": {**states[1]["loader"], "epoch": 1}}])
    with pytest.raises(ValueError, match="every old rank, in rank order"):
        loader.load_state_dict(states[:1])


def test_old_states_with_and_without_a_world_size_are_named():
    """States of which one names no world size (None) are refused listing the sizes they name, never a
    TypeError from sorting None among ints."""
    from dali_pipes.run.elastic import check_states
    identity = dict(version=1, num_samples=8, batch_size=2, seed=0, train=True)
    state = {**identity, "delivered": "", "delivered_complete": True, "epoch": 0}
    with pytest.raises(ValueError, match=r"got 2 states with world sizes \[None, 2\]"):
        check_states([{**state, "world_size": 2}, state], identity)


def test_dali_names_each_sample_as_the_identity_table_expects(sources):
    """The sample_ids output (DALI's source_info) of every sample, for each format, is what
    elastic.identity expects and marks its storage-order index (checked on DALI 2.4.0)."""
    from nvidia.dali import pipeline_def

    from dali_pipes.data.reader import identity_rows as sample_ids
    from dali_pipes.run.delivery import IdentityTable
    @pipeline_def(batch_size=N, num_threads=1, device_id=None)
    def pipe(source):
        jpegs, _ = source.dali_reader()
        return sample_ids(jpegs)

    for source in sources.values():
        p = pipe(source)
        p.build()
        (ids,) = p.run()
        keys = [np.array(ids[i]).tobytes().rstrip(b"\0").decode() for i in range(N)]
        assert sorted(keys) == sorted(identity(ref) for ref in source.refs())
        marked = np.zeros(N, bool)
        assert IdentityTable(source).mark(keys, marked) == [] and marked.all()
        del p


def test_subset_source_reads_exactly_the_chosen_records(sources, tmp_path):
    """A subset with gaps, out of storage order and with a repeat reads exactly those records."""
    from dali_pipes.data.formats import read_sample

    from conftest import dali_read_epoch
    for kind in ("tfrecord", "webdataset"):
        source = sources[kind]
        refs = source.refs()
        chosen = [20, 3, 4, 4, 11]
        subset = subset_source(source, chosen, str(tmp_path))
        expected = collections.Counter((read_sample(refs[i]).data, read_sample(refs[i]).label) for i in chosen)
        assert dali_read_epoch(subset, batch_size=5) == expected


def test_repeated_files_are_marked_once_per_listing(tmp_path):
    """A file listed twice (and the placeholders of excluded samples, all one file) is two samples:
    each delivery marks the next of its listings."""
    from dali_pipes.run.delivery import IdentityTable
    for name in ("a", "b"):
        (tmp_path / f"{name}.jpg").write_bytes(jpeg_bytes(1))
    (tmp_path / "list.txt").write_text("a.jpg 0\nb.jpg 1\na.jpg 2\n")
    with pytest.warns(UserWarning, match="listed twice"):
        source = open_source(str(tmp_path / "list.txt"), allow_duplicates=True)
    table, marked = IdentityTable(source), np.zeros(3, bool)
    a, b = source.files[0], source.files[1]
    assert table.mark([a], marked) == [] and marked.tolist() == [True, False, False]
    assert table.mark([b, a, "/elsewhere.jpg"], marked) == ["/elsewhere.jpg"] and marked.all()
    marked[:] = False
    table.mark([a, a], marked)
    assert marked.tolist() == [True, False, True]
