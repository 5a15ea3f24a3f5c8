"""ReaderModel (reader.py) against DALI itself: the samples each rank's reader delivers per epoch (from
DALI's source_info), and a reader that never reads a file before the model's read-ahead says it may."""

import os
import shutil

import pytest

from dali_pipes import open_source
from dali_pipes.data.reader import ReaderModel
from dali_pipes.run.contract import Contract
from dali_pipes.run.dist import Shard
from dali_pipes.run.pipeline import PipelineSpec, TunedKnobs, build_pipeline

from conftest import jpeg_bytes

N, BATCH = 23, 3




def iterator(source, rank, world, train, prefetch_queue_depth=2):
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    knobs = TunedKnobs(num_threads=1, prefetch_queue_depth=prefetch_queue_depth)
    spec = PipelineSpec(contract=Contract(train, BATCH, False), shard=Shard(rank, world), knobs=knobs, shuffle_buffer=5)
    pipe = build_pipeline(source, spec, sample_ids=True)
    return DALIGenericIterator(pipe, ["images", "labels", "ids"], reader_name="Reader",
                               last_batch_policy=LastBatchPolicy.FILL, auto_reset=True)


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_slices_rotation_and_padding_are_dalis(numbered_source, world, train):
    index_of = {path: i for i, path in enumerate(numbered_source.files)}
    for rank in range(world):
        model = ReaderModel(N, rank, world, train, BATCH, shuffle_buffer=5, list_shuffled=train)  # a file list
        it = iterator(numbered_source, rank, world, train)
        for epoch in range(3):
            ids = [index_of[bytes(row.numpy()).rstrip(b"\0").decode()] for (b,) in it for row in b["ids"]]
            expected = model.slice(model.shard_of(epoch))
            assert sorted(ids[:len(expected)]) == sorted(expected)  # the slice, each sample once
            assert set(ids[len(expected):]) <= set(expected)  # then repeats of its samples
            assert len(ids) == -(-model.longest() // BATCH) * BATCH  # padded to the longest slice's batches


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_no_file_is_read_before_the_read_ahead_allows_it(numbered_source, tmp_path, train, depth):
    """Files appear only as the model allows: a read beyond it fails DALI's reader ("File mapping failed")."""
    folder = tmp_path / "lazy"
    folder.mkdir()
    for i in range(N):
        shutil.copy(numbered_source.files[i], folder / os.path.basename(numbered_source.files[i]))
    (folder / "list.txt").write_text("".join(f"{i:03d}.jpg {i}\n" for i in range(N)))
    source = open_source(str(folder / "list.txt"))
    for path in source.files:
        os.remove(path)
    world, rank = 2, 1
    model = ReaderModel(N, rank, world, train, BATCH, shuffle_buffer=5, prefetch_queue_depth=depth,
                        list_shuffled=train)
    stream = [i for epoch in range(3) for i in model.slice(model.shard_of(epoch))]

    def allow(count: int) -> None:
        for i in stream[:count]:
            if not os.path.exists(source.files[i]):
                shutil.copy(numbered_source.files[i], source.files[i])

    def allow_last_of(epoch: int) -> None:  # train: the file reader reads its slice's last sample first
        if train:
            last = model.slice(model.shard_of(epoch))[-1]
            shutil.copy(numbered_source.files[last], source.files[last])

    allow_last_of(0)
    allow(model.read_ahead)
    it = iterator(source, rank, world, train, prefetch_queue_depth=depth)
    before = 0  # samples of the stream in earlier epochs
    for epoch in range(2):
        allow_last_of(epoch + 1)
        size = len(model.slice(model.shard_of(epoch)))
        position = 0
        while True:
            allow(before + min(position * BATCH, size) + model.read_ahead)
            try:
                next(it)  # raises if DALI read a file the model did not allow yet
            except StopIteration:
                break
            position += 1
        before += size


def test_tfrecord_slices_keep_storage_order(jpeg_folder, tmp_path):
    """TFRecord readers do not shuffle their list: train slices are contiguous in storage order."""
    import numpy as np

    from dali_pipes.run.delivery import IdentityTable
    from dali_pipes.tools.convert import write_tfrecords
    write_tfrecords(open_source(jpeg_folder), str(tmp_path / "tfr"), shards=3, progress=False)
    source = open_source(str(tmp_path / "tfr"))
    n = source.num_samples
    for rank in range(2):
        model = ReaderModel(n, rank, 2, True, BATCH, shuffle_buffer=5)
        it, table = iterator(source, rank, 2, True), IdentityTable(source)
        for epoch in range(3):
            marked = np.zeros(n, bool)
            keys = [bytes(row.numpy()).rstrip(b"\0").decode() for (b,) in it for row in b["ids"]]
            assert not table.mark(keys, marked)
            assert np.flatnonzero(marked).tolist() == list(model.slice(model.shard_of(epoch)))


def test_dali_list_order_matches_the_file_reader_past_65536_files(tmp_path):
    """Beyond 65,535 files libstdc++ draws one swap per draw: checked on a list of 70,001 entries
    (one small file, labels = line numbers) read by DALI's file reader alone, no decoding."""
    import numpy as np
    from nvidia.dali import fn, pipeline_def

    from dali_pipes.data.reader import dali_list_order
    (tmp_path / "a.jpg").write_bytes(jpeg_bytes(1))
    n = 70_001
    (tmp_path / "list.txt").write_text("".join(f"a.jpg {i}\n" for i in range(n)))

    @pipeline_def(batch_size=1000, num_threads=1, device_id=None)
    def labels_only():
        _, labels = fn.readers.file(file_list=str(tmp_path / "list.txt"), shard_id=0, num_shards=2,
                                    random_shuffle=True, initial_fill=16, pad_last_batch=True)
        return labels

    pipe = labels_only()
    pipe.build()
    got = [int(x) for _ in range(36) for x in np.array(pipe.run()[0].as_tensor()).ravel()]
    assert set(got[:n // 2]) == set(dali_list_order(n)[:n // 2])
