"""A loader dropped without close(), as scripts drop DataLoaders, frees its DALI pipeline at once.

A DaliLoader in a reference cycle is freed only by Python's cycle collector, which runs by object counts,
not by memory: dropped loaders' pipelines (their threads and buffers) then pile up between collections
and the heap does not shrink afterwards. These tests hold the loader to reference counting alone."""

from __future__ import annotations

import gc
import os
import statistics
import time
import weakref

import pytest

from dali_pipes import DaliLoader
from dali_pipes.run import heap

from conftest import jpeg_bytes
from s3_server import S3Bucket

pytest_plugins = ["s3_server", "store_servers"]  # fixtures: s3 (a bucket on a local moto server), gcs (an emulator)

KW = dict(batch_size=4, device="cpu", image_size=16, num_threads=1)

COUNTS = (12, 12, 12)  # the `folder` fixture's images per class (conftest.py)


@pytest.fixture
def no_cycle_collector():
    """The cycle collector off: what is freed now is freed by reference counting alone."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def _first_batches(loader, n: int) -> None:
    for i, _ in enumerate(loader):
        if i + 1 == n:
            break


def _train_auto(folder):  # the tuner mid-search: its trial callback and rebuilds are live
    loader = DaliLoader(folder, train=True, **{**KW, "num_threads": "auto", "prefetch_queue_depth": "auto"})
    _first_batches(loader, 2)
    return loader


def _val_whole_epoch(folder):
    loader = DaliLoader(folder, train=False, **KW)
    list(loader)
    return loader


def _skip_bad_resumed(folder):  # keeps a checkpoint after every batch; restored from a state mid-epoch
    first = DaliLoader(folder, train=True, skip_bad=True, **KW)
    _first_batches(first, 2)
    state = first.state_dict()
    del first
    loader = DaliLoader(folder, train=True, skip_bad=True, **KW)
    loader.load_state_dict(state)
    _first_batches(loader, 1)
    return loader


def _elastic(folder):  # two old ranks' states resumed on one rank: the remainder epoch's subset pipeline
    states = []
    for rank in range(2):
        old = DaliLoader(folder, train=True, rank=rank, world_size=2, **KW)
        _first_batches(old, 1)
        states.append(old.state_dict())
        del old
    loader = DaliLoader(folder, train=True, rank=0, world_size=1, **KW)
    loader.load_state_dict(states)
    _first_batches(loader, 1)
    return loader


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _thread_names() -> dict[str, str]:
    names = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names[tid] = f.read().strip()
        except FileNotFoundError:  # ended between the listing and the read
            pass
    return names


def _wait_for_threads(count: int, seconds: float = 5.0) -> int:
    """The thread count once it is down to `count`, or after `seconds`: a worker told to stop ends on its
    own schedule (a pool thread finishing its task), which is freed, not leaked."""
    deadline = time.monotonic() + seconds
    while _threads() > count and time.monotonic() < deadline:
        time.sleep(0.05)
    return _threads()


@pytest.mark.parametrize("make", [_train_auto, _val_whole_epoch, _skip_bad_resumed, _elastic])
def test_a_dropped_loader_is_freed_by_reference_counting_alone(folder, no_cycle_collector, make):
    # process-wide threads (DALI's, tqdm's, torch's pools, started lazily by whatever ran first) start once:
    # one loader of the same kind made and closed first leaves only the next loader's own threads to count
    make(folder).close()
    before = _thread_names()
    loader = make(folder)
    assert _threads() > len(before)  # its DALI pipeline's threads run
    gone = weakref.ref(loader)
    del loader
    assert gone() is None, [type(r).__name__ for r in gc.get_referrers(gone())]
    left = _wait_for_threads(len(before))
    assert left == len(before), {t: n for t, n in _thread_names().items() if t not in before}  # went with it


def test_a_dropped_dataloader_form_loader_is_freed_by_reference_counting_alone(folder, torchvision,
                                                                              no_cycle_collector):
    from torch.utils.data import DistributedSampler
    T = torchvision.transforms
    dataset = torchvision.datasets.ImageFolder(folder, T.Compose([T.Resize(16), T.CenterCrop(16), T.ToTensor()]))
    loader = DaliLoader(dataset, batch_size=4, sampler=DistributedSampler(dataset, num_replicas=1, rank=0),
                        device="cpu", num_threads=1)
    loader.sampler.set_epoch(0)
    len(loader.sampler)
    _first_batches(loader, 1)
    gone = weakref.ref(loader)
    del loader
    assert gone() is None


def test_a_dropped_loader_reading_s3_through_the_shard_cache_is_freed_and_its_threads_stop(
        s3: S3Bucket, tmp_path, monkeypatch, no_cycle_collector):
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    for i in range(12):
        s3.put(f"images/c{i % 3}/{i:03d}.jpg", jpeg_bytes(i))
    warm = DaliLoader(s3.url("images/"), train=True, remote_feed="cache", **KW)  # process-wide threads start
    warm.close()  # (tqdm's monitor, boto3's pools): counted before the loader under test
    threads = len(os.listdir("/proc/self/task"))
    loader = DaliLoader(s3.url("images/"), train=True, remote_feed="cache", **KW)
    _first_batches(loader, 2)
    assert len(os.listdir("/proc/self/task")) > threads  # its DALI and shard-cache threads run
    gone = weakref.ref(loader)
    del loader
    assert gone() is None
    assert len(os.listdir("/proc/self/task")) <= threads


KINDS = ("folder", "tfrecord", "webdataset", "parquet", "parquet on gs")


@pytest.fixture(scope="module")
def local_kinds(folder, tmp_path_factory) -> dict[str, str]:
    """The `folder` fixture's images as every local source kind: TFRecord and WebDataset shards, and Parquet as
    most people write it (datasets' imagefolder, then to_parquet: absolute paths, no bytes); and the same
    Parquet with its images embedded, for an object store."""
    from dali_pipes import open_source
    from dali_pipes.tools.convert import write_tfrecords, write_webdataset
    datasets = pytest.importorskip("datasets", reason="the Parquet files are written with Hugging Face datasets")
    root = tmp_path_factory.mktemp("kinds")
    source = open_source(folder)
    write_tfrecords(source, str(root / "tfrecord"), shards=2, progress=False, workers=1)
    write_webdataset(source, str(root / "webdataset"), shards=2, progress=False, workers=1)
    ds = datasets.load_dataset("imagefolder", data_dir=folder, split="train", cache_dir=str(root / "hf_cache"))
    ds.to_parquet(str(root / "parquet" / "train.parquet"), batch_size=8)
    embedded = ds.with_format("arrow").map(datasets.table.embed_table_storage, batched=True)
    embedded.to_parquet(str(root / "embedded" / "train.parquet"), batch_size=8)
    return {"folder": folder, **{kind: str(root / kind) for kind in ("tfrecord", "webdataset", "parquet", "embedded")}}


@pytest.fixture(params=KINDS)
def location(request, local_kinds, tmp_path, monkeypatch) -> str:
    """Where a loader of each source kind reads (the gs:// one from the GCS emulator)."""
    if request.param != "parquet on gs":
        return local_kinds[request.param]
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    gcs = request.getfixturevalue("gcs")
    with open(os.path.join(local_kinds["embedded"], "train.parquet"), "rb") as f:
        return gcs.put("data/train.parquet", f.read()).rpartition("/")[0] + "/"


def test_thirty_loaders_dropped_without_close_leave_rss_threads_and_descriptors_flat(location):
    """Each loader is dropped mid-life with `del`, the cycle collector left to run as it does (by object
    counts). Before the fix, every dropped loader kept its DALI threads until a collection, and the
    process grew by tens of MB over 30 loaders at 224 px; then every dropped Parquet loader kept its feed's
    threads (9 to 121 over 30 loaders) and row groups."""
    def usage() -> tuple[float, int, int]:
        heap.release_free_memory()  # free heap pages back first: what stays resident is what something holds
        pages = int(open("/proc/self/statm").read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20, len(os.listdir("/proc/self/task")), \
            len(os.listdir("/proc/self/fd"))

    gc.collect()  # what earlier tests left for the collector goes first: not counted here
    seen = []
    for _round in range(30):
        loader = DaliLoader(location, train=True, batch_size=16, device="cpu", image_size=224, num_threads=2)
        for _ in loader:
            pass
        del loader
        seen.append(usage())
    threads, fds = seen[0][1], seen[0][2]
    assert all(threads <= s[1] <= threads + _pool_room(location) for s in seen), \
        ("threads outlived their dropped loader", [s[1] for s in seen])
    assert [s[2] for s in seen] == [fds] * 30, "file descriptors outlived their dropped loader"
    # RSS read after a trim (the loader's own trims are rate-limited, so fragmentation alone moved the untrimmed
    # figure by up to 160 MB over 30 loaders, old code and new alike): medians, early against late. Measured on
    # the 2-core CPU machine, TFRecord: -29 to 11 MB; 30 loaders kept alive: +575 MB (before the fix the
    # process grew from 350 to 700-840 MB, threads from 7 to 57).
    if location.startswith("gs://"):  # open: 30 gs:// loaders grew the process by 0-105 MB (native memory; no
        return  # Python object piles up, threads and descriptors stay flat): not yet explained, so not asserted
    early, late = statistics.median(s[0] for s in seen[2:7]), statistics.median(s[0] for s in seen[-10:])
    assert late - early < 100, str([round(s[0]) for s in seen])


def _pool_room(location: str) -> int:
    """How many threads a process-wide pool may still start while loaders come and go: pyarrow's IO threads
    (up to pyarrow.io_thread_count(), started as Parquet reads need them). None of them is a loader's."""
    if "parquet" not in location and not location.startswith("gs://"):
        return 0
    import pyarrow
    return pyarrow.io_thread_count()


def test_a_dropped_loader_of_every_source_kind_is_freed_and_its_threads_stop(location, no_cycle_collector):
    """Reference counting alone frees each kind's loader and all it started. A Parquet loader's feed was held
    by DALI's operator graph, a reference cycle, with its 4 row-group threads; a gs:// loader was pinned by the
    frames of a missed HEAD's error (fsspec's sync holds the error it raises: a cycle through every caller)."""
    warm = DaliLoader(location, train=True, **KW)  # process-wide threads (DALI's, pyarrow's, the stores')
    _first_batches(warm, 2)
    warm.close()
    del warm
    threads = _threads()
    loader = DaliLoader(location, train=True, **KW)
    _first_batches(loader, 2)
    gone = weakref.ref(loader)
    del loader
    assert gone() is None
    assert not [o for o in gc.get_objects() if type(o).__name__ == "ParquetFeed"]  # nor its feed
    assert threads <= _threads() <= threads + _pool_room(location)
