"""s3:// locations end to end, against a real S3 API (moto's server in a child process on 127.0.0.1):
every format and location shape through open_source and DaliLoader, exact-once per rank, resume,
index reuse and rebuild, and a clear error for each kind of bad input.

Client-level failures (retries, timeouts, If-Match, truncated bodies, 403) are covered where they
are made, in tests/test_object_store.py and tests/test_shard_cache.py; here they are checked
through open_source and DaliLoader."""

import collections
import io
import json
import os
import re
import shutil
import tarfile

import pytest

from dali_pipes import DaliLoader, DatasetError, SampleKeys, open_source
from dali_pipes.data import indexes
from dali_pipes.data.formats import tfrecord, webdataset
from dali_pipes.storage import object_store, remote, transfer
from dali_pipes.storage.remote import ObjectChangedError, TruncatedDownloadError
from dali_pipes.storage.shard_cache import CacheTooSmallError, ShardTooLargeError
from dali_pipes_bench.servers.latency_proxy import Fault

from conftest import jpeg_bytes
from s3_server import closed_endpoint

pytest_plugins = ["s3_server"]  # fixtures: s3 (a bucket on a local moto server), proxy, restricted_s3
pytest.importorskip("boto3", reason="s3:// support needs boto3: pip install '.[s3]' (from the dali_pipes checkout)")
pytest.importorskip("moto.server", reason="the S3 tests need a local S3 server: pip install 'moto[server]'")

DATA = os.path.join(os.path.dirname(__file__), "data")
TF_EXPECTED = json.load(open(os.path.join(DATA, "tf_written_expected.json")))
N = 23  # samples of the numbered sets: does not divide by 2 or 3
KW = dict(image_size=16, device="cpu", num_threads=1, val_padding="label")  # val: exactly once, -1 padding


@pytest.fixture
def cache_dirs(tmp_path, monkeypatch):
    """Index cache and shard cache of the test, inside its tmp_path."""
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def tfrecord_shards(s3, prefix="train", n=N, shards=3, name="train-{:05d}-of-{:05d}"):
    """`shards` TFRecord shards of the numbered samples (image i, label i), i dealt to shard i % shards."""
    records = [[] for _ in range(shards)]
    for i in range(n):
        records[i % shards].append(tfrecord.frame_record(tfrecord.encode_example(
            {"image/encoded": jpeg_bytes(i), "image/class/label": i})))
    return [s3.put(f"{prefix}/{name.format(s, shards)}", b"".join(r)) for s, r in enumerate(records)]


def tar_shards(s3, prefix="wds", n=N, shards=3):
    urls = []
    for s in range(shards):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
            for i in range(s, n, shards):
                webdataset.add_member(tar, f"{i:04d}.jpg", jpeg_bytes(i))
                webdataset.add_member(tar, f"{i:04d}.cls", str(i).encode())
        urls.append(s3.put(f"{prefix}/shard-{s:03d}.tar", out.getvalue()))
    return urls


def image_objects(s3, prefix="images", n=N):
    """An image folder below a prefix (class c{i % 3}) and a file list beside it (label i)."""
    lines = []
    for i in range(n):
        s3.put(f"{prefix}/c{i % 3}/{i:03d}.jpg", jpeg_bytes(i))
        lines.append(f"c{i % 3}/{i:03d}.jpg {i}")
    return s3.put(f"{prefix}/list.txt", "\n".join(lines).encode())


def val_labels(ranks):
    real = []
    for loader in ranks:
        real += [l for _, labels in loader for l in labels.tolist() if l >= 0]
    return sorted(real)


def make_loaders(location, world_size, **kw):
    return [DaliLoader(location, rank=r, world_size=world_size, **{**KW, **kw}) for r in range(world_size)]


def close_all(loaders):
    for loader in loaders:
        loader.close()


# ---------------------------------------------------------------------------------------------
# Done when: TensorFlow-written records from a bucket, exactly once, right labels
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("feed", ["cache", "native"])
def test_tensorflow_written_shard_in_a_bucket_reads_exactly_once(s3, cache_dirs, feed):
    with open(os.path.join(DATA, "tf_written", "train-00000-of-00001"), "rb") as f:
        s3.put("tf/train-00000-of-00001", f.read())
    keys = SampleKeys(label_offset=1)
    loader = DaliLoader(s3.url("tf/"), batch_size=2, train=False, keys=keys, remote_feed=feed, **KW)
    labels = val_labels([loader])
    assert labels == sorted(label - 1 for label in TF_EXPECTED["labels"])
    source = loader.source
    assert source.files == [s3.url("tf/train-00000-of-00001")]
    assert sorted(len(s.data) for s in source.iter_samples()) == sorted(TF_EXPECTED["jpeg_sizes"])
    loader.close()


# ---------------------------------------------------------------------------------------------
# Every format and location shape, val exactly once
# ---------------------------------------------------------------------------------------------

def _prefix(s3):
    tfrecord_shards(s3)
    return s3.url("train/")


def _glob(s3):
    tfrecord_shards(s3)
    s3.put("train/train-00000-of-00003.idx", b"0 1\n")  # beside the shards: never taken for one
    return s3.url("train/train-*-of-00003")


def _url_list(s3):
    return tfrecord_shards(s3)


def _shard_list_object(s3):
    tfrecord_shards(s3)
    return s3.put("train/shards.txt", b"train-00000-of-00003\ntrain-00001-of-00003\ntrain-00002-of-00003\n")


def _webdataset(s3):
    tar_shards(s3)
    return s3.url("wds/")


def _file_list(s3):
    return image_objects(s3)


LOCATIONS = {"tfrecord prefix": _prefix, "tfrecord glob": _glob, "list of URLs": _url_list,
             "shard list object": _shard_list_object, "webdataset prefix": _webdataset, "file list": _file_list}


@pytest.mark.parametrize("make", LOCATIONS.values(), ids=LOCATIONS.keys())
def test_every_location_shape_val_exactly_once(s3, cache_dirs, make):
    location = make(s3)
    loader = DaliLoader(location, batch_size=4, train=False, **KW)
    assert val_labels([loader]) == list(range(N))
    assert all(object_store.is_remote(f) for f in loader.source.files)
    loader.close()


def test_image_folder_below_a_prefix_val_exactly_once(s3, cache_dirs):
    image_objects(s3)
    loader = DaliLoader(s3.url("images/"), batch_size=4, train=False, **KW)
    assert loader.source.classes == ["c0", "c1", "c2"]
    assert collections.Counter(val_labels([loader])) == collections.Counter(i % 3 for i in range(N))
    samples = list(loader.source.iter_samples())  # Python reads (verification, bad-sample search) by URL
    assert sorted(s.data for s in samples) == sorted(jpeg_bytes(i) for i in range(N))
    loader.close()


# ---------------------------------------------------------------------------------------------
# Ranks, epochs, resume
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("feed", ["cache", "native"])
def test_val_exactly_once_across_ranks(s3, cache_dirs, world_size, feed):
    ranks = make_loaders(tfrecord_shards(s3), world_size, batch_size=3, train=False, remote_feed=feed)
    for _ in range(2):  # and the next epoch
        assert val_labels(ranks) == list(range(N))
    close_all(ranks)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_train_at_most_once_per_epoch_and_the_cache_follows_the_shard_rotation(s3, cache_dirs, world_size):
    """stick_to_shard=False: in epoch e rank r reads DALI's slice (r + e) % world_size. The cache
    fetches only that slice and deletes what the rank has read: a wrong guess would be a file the
    reader cannot open (DALI fails the batch)."""
    tfrecord_shards(s3, shards=6)
    ranks = make_loaders(s3.url("train/"), world_size, batch_size=2, train=True, shuffle_buffer=4, cache_prefetch=1)
    from dali_pipes.data.reader import ReaderModel
    counts = ranks[0].source.counts
    starts = [sum(counts[:i]) for i in range(len(counts))]
    # storage order of the numbered shards: shard s holds s, s + 6, ... -> sample index -> label
    label_at = [i for s in range(6) for i in range(s, N, 6)]
    for epoch in range(3):
        seen = []
        for rank, loader in enumerate(ranks):
            labels = [l for _, b in loader for l in b.tolist()]
            model = ReaderModel(sum(counts), rank, world_size, train=True)
            expected = {label_at[starts[i] + k] for i, n in model.files_of(counts, model.shard_of(epoch))
                        for k in range(counts[i])} if world_size > 1 else set(range(N))
            sliced = set(range(N * ((rank + epoch) % world_size) // world_size,
                               N * ((rank + epoch) % world_size + 1) // world_size))
            assert set(labels) <= {label_at[i] for i in sliced} and set(labels) <= expected
            seen += labels
        assert len(seen) == len(set(seen))
    close_all(ranks)


@pytest.mark.parametrize("feed", ["cache", "native"])
def test_resume_mid_epoch_from_s3_yields_the_uninterrupted_batches(s3, cache_dirs, feed):
    kw = dict(batch_size=3, train=True, shuffle_buffer=4, seed=3, remote_feed=feed, **KW)
    location = tfrecord_shards(s3, shards=4)
    original = DaliLoader(location, **kw)
    list(original)
    it = iter(original)
    for _ in range(2):
        next(it)
    state = original.state_dict()
    rest = [labels.tolist() for _, labels in it] + [labels.tolist() for _, labels in original]
    original.close()
    resumed = DaliLoader(location, **kw)
    resumed.load_state_dict(state)
    again = [labels.tolist() for _, labels in resumed] + [labels.tolist() for _, labels in resumed]
    assert again == rest
    resumed.close()


# ---------------------------------------------------------------------------------------------
# Indexes: reused while the object is unchanged, rebuilt when it changes
# ---------------------------------------------------------------------------------------------

def test_index_reused_then_rebuilt_after_the_object_changes(s3, cache_dirs, monkeypatch):
    urls = tfrecord_shards(s3)
    first = open_source(s3.url("train/"))
    built = []
    real = indexes.build_remote_index
    monkeypatch.setattr(indexes, "build_remote_index",
                        lambda info, *a, **k: built.append(info.url) or real(info, *a, **k))
    again = open_source(s3.url("train/"))
    assert built == [] and again.index_files == first.index_files
    # shard 1 rewritten with 2 records: only it gets a new index, and it reads the new records
    s3.put("train/train-00001-of-00003", b"".join(tfrecord.frame_record(tfrecord.encode_example(
        {"image/encoded": jpeg_bytes(100 + i), "image/class/label": 100 + i})) for i in range(2)))
    changed = open_source(s3.url("train/"))
    assert built == [urls[1]]
    assert changed.index_files[1] != first.index_files[1] and changed.counts[1] == 2
    loader = DaliLoader(changed, batch_size=4, train=False, **KW)
    assert val_labels([loader]) == sorted([i for i in range(N) if i % 3 != 1] + [100, 101])
    loader.close()


# ---------------------------------------------------------------------------------------------
# Cached indexes: checked like local ones, rebuilt (one warning naming the cache file) when they fail
# ---------------------------------------------------------------------------------------------

MANY = 240  # two TensorFlow-style shards of 120 records, no manifest: nothing else counts the samples


def _shorten(lines):
    return lines[:-10]  # the last 10 records unlisted: DALI would silently read 230 of 240


def _shift(lines):
    offset, size = map(int, lines[5].split())
    return lines[:5] + [f"{offset + 4} {size}\n"] + lines[6:]  # one record's offset moved by 4 bytes


def _shift_contiguous(lines):
    """Records 6 and 7 re-cut 4 bytes later: still contiguous and ending at the object's size, so only the
    record headers where the index puts them tell (record 7 is one of the checked entries of 120)."""
    (a, s), (b, t) = (map(int, line.split()) for line in lines[6:8])
    return lines[:6] + [f"{a} {s + 4}\n", f"{b + 4} {t - 4}\n"] + lines[8:]


@pytest.mark.parametrize("damage", [_shorten, _shift, _shift_contiguous, "garbage"])
def test_a_damaged_cached_index_is_rebuilt_with_one_warning_and_no_sample_lost(s3, cache_dirs, damage):
    tfrecord_shards(s3, prefix="many", n=MANY, shards=2)
    cached = open_source(s3.url("many/")).index_files[1]
    with open(cached) as f:
        lines = f.readlines()
    with open(cached, "wb") as f:
        f.write(os.urandom(4096) if damage == "garbage" else "".join(damage(lines)).encode())
    with pytest.warns(UserWarning) as caught:
        loader = DaliLoader(s3.url("many/"), batch_size=16, train=False, skip_bad=True, **KW)
        labels = val_labels([loader])
    assert labels == list(range(MANY)) and loader.bad_samples == []
    assert [str(w.message) for w in caught] == [
        f"{cached}: this cached index does not describe {s3.url('many/train-00001-of-00002')} (its entries, the "
        f"object's size or the record headers where it puts them differ): the cache file was altered or damaged, "
        f"not the data; rebuilding it"]
    with open(cached) as f:
        assert f.readlines() == lines  # rebuilt in place
    loader.close()


def test_a_cached_index_wrong_between_its_checked_entries_is_named_never_a_sample_excluded(s3, cache_dirs):
    """Records 2 and 3 re-cut: no checked entry, so the index is used; the records where DALI fails are read
    (record headers checked where they are read) and the index is named, no good sample is excluded."""
    tfrecord_shards(s3, prefix="many", n=MANY, shards=2)
    cached = open_source(s3.url("many/")).index_files[1]
    with open(cached) as f:
        lines = f.readlines()
    (a, s), (b, t) = (map(int, line.split()) for line in lines[2:4])
    with open(cached, "w") as f:
        f.writelines(lines[:2] + [f"{a} {s + 4}\n", f"{b + 4} {t - 4}\n"] + lines[4:])
    with pytest.raises(DatasetError, match=f"{cached}: this index and {s3.url('many/train-00001-of-00002')} "
                       f"disagree .*#2: no record header .* Delete the index"):
        _read_all(s3.url("many/"), batch_size=16, train=False, skip_bad=True)


# ---------------------------------------------------------------------------------------------
# Bad input: a clear error naming the object, the endpoint or the fix, never a hang
# (the client-level cases are in tests/test_object_store.py; here through open_source/DaliLoader)
# ---------------------------------------------------------------------------------------------

def test_a_prefix_missing_one_numbered_shard_is_refused(s3, cache_dirs):
    """A conversion to s3:// cut short: 2 of train-*-of-00003 below the prefix. Refused, naming the gap."""
    tfrecord_shards(s3, prefix="cut", shards=3)
    s3.client.delete_object(Bucket=s3.bucket, Key="cut/train-00001-of-00003")
    for location in (s3.url("cut/"), s3.url("cut/train-*")):
        with pytest.raises(DatasetError, match=r"1 of 3 shards train-\*-of-00003 are missing \(first: train-00001"):
            open_source(location)


def test_a_prefix_holding_two_sets_or_images_beside_shards_is_refused(s3, cache_dirs):
    """Issue 32, below a prefix as in a folder: train-* and val-* sets, or class folders of images beside shards."""
    tfrecord_shards(s3, prefix="both", shards=2)
    tfrecord_shards(s3, prefix="both", shards=1, name="val-{:05d}-of-{:05d}")
    with pytest.raises(DatasetError, match=r"holds 2 numbered shard sets \(train-\*-of-00002 \(2 shards\), "
                                           r"val-\*-of-00001 \(1 shards\)\).*glob: s3://.*/both/train-\*-of-\*$"):
        open_source(s3.url("both/"))
    assert open_source(s3.url("both/train-*-of-*")).num_samples == N
    tfrecord_shards(s3, prefix="mixed", shards=2)
    s3.put("mixed/cat/0.jpg", jpeg_bytes(0))
    with pytest.raises(DatasetError, match=r"/mixed/: holds both shard files and images \(cat/\)"):
        open_source(s3.url("mixed/"))


def test_missing_bucket(s3, cache_dirs):
    with pytest.raises(FileNotFoundError, match="bucket 'no-such-bucket' does not exist at http://127.0.0.1"):
        DaliLoader("s3://no-such-bucket/train/", batch_size=2, train=False, **KW)


@pytest.mark.parametrize("location", ["nothing/", "train/val-*"])
def test_missing_prefix_or_no_match(s3, cache_dirs, location):
    tfrecord_shards(s3)
    with pytest.raises(FileNotFoundError, match="no objects match"):
        open_source(s3.url(location))


def test_only_indexes_match(s3, cache_dirs):
    s3.put("train/a.idx", b"0 10\n")
    with pytest.raises(FileNotFoundError, match="no shards match"):
        open_source(s3.url("train/*"))


def test_no_credentials(s3, cache_dirs, monkeypatch):
    tfrecord_shards(s3)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(PermissionError, match="no AWS credentials found .* AWS_ACCESS_KEY_ID"):
        DaliLoader(s3.url("train/"), batch_size=2, train=False, **KW)


def test_access_denied(restricted_s3, cache_dirs):
    server = restricted_s3  # moto with IAM: this user may list the bucket, not read its objects
    with pytest.raises(PermissionError, match="access denied .* s3:GetObject"):
        open_source([f"s3://{server.bucket}/{server.key}"])


def test_access_denied_on_read(proxy, s3, cache_dirs):
    tfrecord_shards(s3)
    proxy.add_fault(Fault("/train/train-00001", method="GET", status=403))
    with pytest.raises(PermissionError, match="access denied by http://127.0.0.1"):
        open_source(s3.url("train/"))


def test_unreachable_endpoint_fails_after_the_set_attempts_and_names_it(s3, cache_dirs, monkeypatch):
    closed = closed_endpoint()
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    with pytest.raises(ConnectionError, match=f"cannot reach the S3 endpoint {closed} after 2 attempts"):
        DaliLoader("s3://any-bucket/train/", batch_size=2, train=False, storage_attempts=2, storage_timeout=1, **KW)


def _read_all(location, **kw):
    """Two epochs of a loader over `location`; the loader is closed whatever happens (its cache
    threads and folder go at once, not when the traceback that holds it is collected)."""
    loader = None
    try:
        loader = DaliLoader(location, **{**KW, **kw})
        for _ in range(2):
            for _ in loader:
                pass
    finally:
        if loader is not None:
            loader.close()


def test_object_changed_mid_epoch(s3, cache_dirs):
    tfrecord_shards(s3)
    source = open_source(s3.url("train/"))  # listed and indexed: the epoch's view of the data
    s3.put("train/train-00002-of-00003", tfrecord.frame_record(tfrecord.encode_example(
        {"image/encoded": jpeg_bytes(99), "image/class/label": 99})))
    with pytest.raises(ObjectChangedError, match="train-00002-of-00003: the object changed after it was listed"):
        _read_all(source, batch_size=2, train=False, cache_prefetch=1)


def test_object_deleted_mid_epoch(s3, cache_dirs):
    tfrecord_shards(s3)
    source = open_source(s3.url("train/"))
    s3.delete("train/train-00002-of-00003")
    with pytest.raises(FileNotFoundError, match="train-00002-of-00003: the object disappeared after it was listed"):
        _read_all(source, batch_size=2, train=False, cache_prefetch=1)


def test_truncated_download(proxy, s3, cache_dirs):
    tfrecord_shards(s3)
    source = open_source(s3.url("train/"))
    proxy.add_fault(Fault("/train/train-00001", method="GET", truncate_at=100))
    with pytest.raises(TruncatedDownloadError, match="train-00001-of-00003: download cut short: 100 of"):
        _read_all(source, batch_size=2, train=False)


def test_truncated_stream_while_indexing(proxy, s3, cache_dirs):
    tfrecord_shards(s3)
    proxy.add_fault(Fault("/train/train-00001", method="GET", truncate_at=100))
    with pytest.raises(DatasetError, match="train-00001-of-00003"):
        open_source(s3.url("train/"))


@pytest.mark.parametrize("shards", [3, 12])  # 12: shards the rank still downloads once the folder is gone
def test_shard_cache_folder_deleted_mid_epoch_is_named_with_the_flag(s3, cache_dirs, shards):
    tfrecord_shards(s3, n=48, shards=shards)
    loader = DaliLoader(s3.url("train/"), batch_size=2, train=False, cache_prefetch=1, **KW)
    try:
        batches = iter(loader)
        next(batches)
        folder = loader.stats()["shard_cache"]["folder"]
        shutil.rmtree(folder)
        with pytest.raises(FileNotFoundError, match=f"{re.escape(folder)}: the shard cache folder was deleted while "
                           f"the loader read from it.* --cache-dir"):
            for _ in batches:
                pass
    finally:
        loader.close()


def test_shard_larger_than_the_cache_is_refused(s3, cache_dirs):
    tfrecord_shards(s3)
    with pytest.raises(ShardTooLargeError, match="larger than the whole shard cache .* raise the cache size"):
        DaliLoader(s3.url("train/"), batch_size=2, train=False, cache_bytes=100, **KW)


# ---------------------------------------------------------------------------------------------
# The commands: convert to S3, verify on S3, train from S3
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["tfrecord", "webdataset"])
def test_convert_writes_shards_to_s3_that_verify_and_the_loader_read(s3, cache_dirs, tmp_path, fmt, capsys):
    from dali_pipes.tools.cli import main

    from conftest import write_folder
    expected = write_folder(str(tmp_path / "images"))
    assert main(["convert", fmt, str(tmp_path / "images"), s3.url("out/"), "--shards", "2", "--workers", "1",
                 "--prefix", "train"]) == 0
    keys = sorted(object_store.S3Url.parse(o.url).key for o in remote.list_objects(s3.url("out/")))
    ext = ".tfrecord" if fmt == "tfrecord" else ".tar"
    assert keys == sorted(["out/classes.json", "out/manifest.json"] + [f"out/train-{i:05d}-of-00002{ext}{idx}"
                                                                       for i in range(2) for idx in ("", ".idx")])
    loader = DaliLoader(s3.url("out/"), batch_size=4, train=False, **KW)
    assert collections.Counter(val_labels([loader])) == collections.Counter(expected.values())
    assert loader.source.classes == ["cat", "dog", "fish"]
    loader.close()
    assert main(["verify", s3.url("out/"), "--workers", "1"]) == 0
    assert f"{len(expected)} samples checked, 0 problems" in capsys.readouterr().out


def test_a_bucket_shard_that_differs_from_the_manifest_is_refused(s3, cache_dirs, tmp_path, capsys):
    """Issue 19: the manifest convert uploads last names each shard's size; a shard object of another size
    (a partial re-upload) is refused by open_source and verify, naming it and the manifest."""
    from dali_pipes.tools.cli import main

    from conftest import write_folder
    write_folder(str(tmp_path / "images"))
    assert main(["convert", "tfrecord", str(tmp_path / "images"), s3.url("m/"), "--shards", "2", "--workers", "1",
                 "--prefix", "train"]) == 0
    manifest = json.loads(transfer.read_bytes(s3.url("m/manifest.json")))
    assert [s["name"] for s in manifest["shards"]] == [f"train-{i:05d}-of-00002.tfrecord" for i in range(2)]
    shard = s3.url("m/train-00001-of-00002.tfrecord")
    extra = tfrecord.frame_record(tfrecord.encode_example({"image/encoded": jpeg_bytes(3), "image/class/label": 1}))
    s3.put("m/train-00001-of-00002.tfrecord", transfer.read_bytes(shard) + extra)
    s3.client.delete_object(Bucket=s3.bucket, Key="m/train-00001-of-00002.tfrecord.idx")
    with pytest.raises(DatasetError,
                       match=r"train-00001-of-00002.tfrecord: \d+ bytes, but s3://.*/m/manifest.json lists"):
        open_source(s3.url("m/"))
    assert main(["verify", s3.url("m/"), "--workers", "1"]) == 1
    assert "manifest.json lists" in capsys.readouterr().out


def test_converting_again_to_a_prefix_is_refused_and_overwrite_replaces_the_old_set(s3, cache_dirs, tmp_path, capsys):
    """Issue 24 on s3://: a second conversion to a prefix holding one is refused naming the prefix; --overwrite
    deletes the old set's objects first, so the prefix lists the new set alone. A shard object the manifest
    does not list is refused at open and flagged by verify, named."""
    from dali_pipes.tools.cli import main

    from conftest import write_folder
    write_folder(str(tmp_path / "images"))
    convert = ["convert", "tfrecord", str(tmp_path / "images"), s3.url("out/"), "--workers", "1", "--prefix", "train"]
    assert main(convert + ["--shards", "3"]) == 0
    with pytest.raises(SystemExit, match=r"^error: s3://.*/out/: not empty: holds an earlier conversion "
                                         r"\(classes.json, manifest.json, train-00000-of-00003.tfrecord"):
        main(convert + ["--shards", "2"])
    assert main(convert + ["--shards", "2", "--overwrite"]) == 0
    keys = sorted(object_store.S3Url.parse(o.url).key for o in remote.list_objects(s3.url("out/")))
    assert keys == sorted(["out/classes.json", "out/manifest.json"] + [f"out/train-{i:05d}-of-00002.tfrecord{idx}"
                                                                       for i in range(2) for idx in ("", ".idx")])
    assert open_source(s3.url("out/")).num_samples == 12
    extra = tfrecord.frame_record(tfrecord.encode_example({"image/encoded": jpeg_bytes(3), "image/class/label": 1}))
    s3.put("out/extra.tfrecord", extra)
    with pytest.raises(DatasetError, match=r"^s3://.*/out/extra.tfrecord: not listed in s3://.*/out/manifest.json "
                                           r"\(2 shards, 12 samples\), but found with its shards: 3 shards"):
        open_source(s3.url("out/"))
    capsys.readouterr()
    assert main(["verify", s3.url("out/"), "--workers", "1"]) == 1
    assert "out/extra.tfrecord: not listed in" in capsys.readouterr().out


def test_verify_names_a_bad_image_by_its_url(s3, cache_dirs, capsys):
    from dali_pipes.tools.cli import main
    image_objects(s3, n=6)
    s3.put("images/c1/004.jpg", jpeg_bytes(4)[:40])  # cut short
    assert main(["verify", s3.url("images/"), "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert s3.url("images/c1/004.jpg") in out and "6 samples checked, 1 problems" in out


def test_train_from_s3(s3, cache_dirs, tmp_path):
    import subprocess
    import sys
    tfrecord_shards(s3, n=32, shards=2)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, "-m", "train", "--data", s3.url("train/"), "--device", "cpu", "--arch", "resnet10",
           "--width", "8", "--image-size", "16", "--batch-size", "8", "--epochs", "1",
           "--workdir", str(tmp_path / "run"), "--threads", "1", "--val-data", s3.url("train/"),
           "--cache-prefetch", "2", "--num-classes", "32"]
    run = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(l) for l in open(tmp_path / "run" / "metrics.jsonl")]
    assert lines and lines[-1]["epoch"] == 0


# ---------------------------------------------------------------------------------------------
# Bad samples in remote data: found by ranged reads, excluded like local ones
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["tfrecord", "images"])
def test_bad_sample_in_s3_data_is_named_or_excluded(s3, cache_dirs, layout):
    if layout == "tfrecord":
        records = [tfrecord.frame_record(tfrecord.encode_example(
            {"image/encoded": jpeg_bytes(i) if i != 5 else b"not a jpeg", "image/class/label": i})) for i in range(12)]
        s3.put("bad/train-00000-of-00002", b"".join(records[:6]))
        s3.put("bad/train-00001-of-00002", b"".join(records[6:]))
        location, culprit = s3.url("bad/"), s3.url("bad/train-00000-of-00002") + "#5"
    else:
        for i in range(12):
            s3.put(f"bad/c0/{i:03d}.jpg", jpeg_bytes(i) if i != 5 else b"not a jpeg")
        location, culprit = s3.url("bad/"), s3.url("bad/c0/005.jpg")
    with pytest.raises(DatasetError, match=culprit.replace(".", r"\.")):
        _read_all(location, batch_size=2, train=False)
    loader = DaliLoader(location, batch_size=2, train=False, skip_bad=True, **KW)
    with pytest.warns(UserWarning, match="excluding a bad sample"):
        labels = val_labels([loader])
    assert len(loader.bad_samples) == 1 and culprit in str(loader.bad_samples[0])
    assert labels == ([i for i in range(12) if i != 5] if layout == "tfrecord" else [0] * 11)
    loader.close()


def test_cache_stays_within_its_bound_and_deletes_what_the_rank_read(s3, cache_dirs):
    urls = tfrecord_shards(s3, shards=6)
    bound = 5 * max(remote.head(u).size for u in urls)  # the reader's reach: 12 samples, 3-4 shards
    loader = DaliLoader(s3.url("train/"), batch_size=2, train=True, shuffle_buffer=2, cache_bytes=bound, **KW)
    seen = [l for _ in range(3) for _, b in loader for l in b.tolist()]
    stats = loader.stats()["shard_cache"]
    assert stats["peak_bytes"] <= bound and stats["downloads"] > 6  # shards fetched again each epoch
    assert len(seen) == 3 * (N // 2) * 2
    folder = stats["folder"]
    loader.close()
    assert not os.path.exists(folder)


@pytest.mark.parametrize("old,new", [(2, 1), (1, 3)])
def test_elastic_resume_from_s3_on_another_world_size(s3, cache_dirs, old, new):
    """The rest of the interrupted epoch (read by DALI's own s3:// reader through subset indexes),
    then the new world's own epochs through the cache, each sample at most once per epoch."""
    kw = dict(batch_size=2, train=True, shuffle_buffer=4, seed=5, **KW)
    location = tfrecord_shards(s3, n=24, shards=4)
    before = make_loaders(location, old, **kw)
    iterators = [iter(l) for l in before]
    first = [l for it in iterators for l in next(it)[1].tolist()]
    states = [l.state_dict() for l in before]
    close_all(before)
    after = make_loaders(location, new, **kw)
    for loader in after:
        loader.load_state_dict(states)
    rest = [l for loader in after for _, b in loader for l in b.tolist()]
    assert len(first + rest) == len(set(first + rest))  # the interrupted epoch: none twice
    for _ in range(2):  # then whole epochs of the new world
        labels = [l for loader in after for _, b in loader for l in b.tolist()]
        assert len(labels) == len(set(labels)) == new * (24 // new // 2) * 2
    close_all(after)


def test_convert_reads_an_s3_source(s3, cache_dirs, tmp_path):
    from dali_pipes.tools.cli import main
    image_objects(s3)
    assert main(["convert", "webdataset", s3.url("images/list.txt"), str(tmp_path / "out"), "--shards", "2",
                 "--workers", "1"]) == 0
    assert sorted(s.label for s in open_source(str(tmp_path / "out")).iter_samples()) == list(range(N))


def test_zero_byte_objects_are_named(s3, cache_dirs):
    tfrecord_shards(s3)
    s3.put("train/train-00003-of-00003", b"")
    with pytest.raises(DatasetError, match="train-00003-of-00003: empty TFRecord file"):
        open_source(s3.url("train/"))
    image_objects(s3, n=4)
    s3.put("images/c0/empty.jpg", b"")
    with pytest.raises(DatasetError, match="images/c0/empty.jpg: empty .0-byte. file"):
        open_source(s3.url("images/"))


def test_mid_epoch_resume_that_the_cache_cannot_replay_says_what_to_do(s3, cache_dirs):
    """DALI replays a restored epoch from its start: a resume late in an epoch needs that much of it
    local at once. A bound that runs the epoch but cannot hold its replay is a clear error."""
    urls = tfrecord_shards(s3, shards=6)
    kw = dict(batch_size=2, train=True, shuffle_buffer=2, cache_bytes=5 * max(remote.head(u).size for u in urls))
    original = DaliLoader(s3.url("train/"), **{**KW, **kw})
    it = iter(original)
    for _ in range(8):
        next(it)
    state = original.state_dict()
    rest = [b.tolist() for _, b in it]
    original.close()
    with pytest.raises(CacheTooSmallError, match="mid-epoch resume needs .* remote_feed='native'"):
        DaliLoader(s3.url("train/"), **{**KW, **kw}).load_state_dict(state)
    resumed = DaliLoader(s3.url("train/"), **{**KW, **kw, "remote_feed": "native"})
    resumed.load_state_dict(state)
    assert [b.tolist() for _, b in resumed] == rest
    resumed.close()
