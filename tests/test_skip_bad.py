"""skip_bad covers every per-sample fault, within a budget (issue 12): zero-byte files, a truncated
last TFRecord record, a truncated tar member, records missing the image or the label key, and
undecodable images are each excluded with one warning naming the file (and record); every good
sample is still delivered exactly once (val). Container damage that leaves nothing readable still
raises. Real DALI on CPU, tiny data; labels are the sample numbers, so counts are checked exactly."""

import gzip
import os
import resource
import struct
import warnings

import pytest
from test_recovery import BAD, N, epoch_labels, numbered_folder

from dali_pipes import DaliLoader, DatasetError, SampleKeys, open_source
from dali_pipes.data.formats import tfrecord, webdataset
from dali_pipes.tools.convert import write_tfrecords, write_webdataset

from conftest import jpeg_bytes

KW = dict(batch_size=4, train=False, device="cpu", image_size=16, num_threads=1)


def val_epoch(location, **kw) -> tuple[list[int], list[str]]:
    """(real labels of one val epoch, the warnings' texts) with skip_bad=True."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = DaliLoader(location, skip_bad=True, **{**KW, **kw})
        labels = [l for l in epoch_labels(loader) if l >= 0]
    return sorted(labels), [str(w.message) for w in caught if "excluding" in str(w.message)]


def shards(tmp_path, fmt: str, count: int = 2) -> str:
    out = str(tmp_path / fmt)
    write = write_tfrecords if fmt == "tfrecord" else write_webdataset
    write(open_source(numbered_folder(tmp_path / "src", {})), out, shards=count, progress=False)
    for name in os.listdir(out):
        if name.endswith(".idx"):
            os.remove(os.path.join(out, name))  # built again from the damaged shards
    return out


def last_shard(out: str) -> str:
    return sorted(os.path.join(out, n) for n in os.listdir(out) if n.endswith((".tfrecord", ".tar")))[-1]


def labels_in(shard: str, fmt: str) -> list[int]:
    return [s.label for s in open_source([shard]).iter_samples()]


def test_zero_byte_file_is_excluded_with_one_warning(tmp_path):
    labels, warned = val_epoch(numbered_folder(tmp_path / "d", {5: BAD["zero-byte"], 9: BAD["truncated"]}))
    assert labels == [i for i in range(N) if i not in (5, 9)]
    assert len(warned) == 2 and "005.jpg: zero-byte file" in warned[0] and "009.jpg" in warned[1]


def test_truncated_last_tfrecord_record_keeps_the_records_before_it(tmp_path):
    out = shards(tmp_path, "tfrecord")
    shard = last_shard(out)
    cut_label = labels_in(shard, "tfrecord")[-1]
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 100)
    with pytest.raises(DatasetError, match="truncated"):
        open_source(out)  # without skip_bad: refused, as before
    labels, warned = val_epoch(out)
    assert labels == [i for i in range(N) if i != cut_label]
    assert len(warned) == 1 and os.path.basename(shard) + "#" in warned[0] and "truncated" in warned[0]


def test_truncated_tar_member_keeps_the_samples_before_it(tmp_path):
    out = shards(tmp_path, "webdataset")
    shard = last_shard(out)
    cut_label = labels_in(shard, "webdataset")[-1]
    last = webdataset.scan_members(shard)[-1]
    with open(shard, "r+b") as f:
        f.truncate(last.offset + last.size // 2)  # the last sample's last member cut in half
    with pytest.raises(DatasetError):
        open_source(out)
    labels, warned = val_epoch(out)
    assert labels == [i for i in range(N) if i != cut_label]
    assert warned and all(os.path.basename(shard) in w for w in warned)


def write_records(path: str, records: list[dict]) -> None:
    with open(path, "wb") as f:
        for features in records:
            f.write(tfrecord.frame_record(tfrecord.encode_example(features)))


@pytest.mark.parametrize("missing", ["image/encoded", "image/class/label"])
def test_record_missing_a_key_is_named_and_excluded(tmp_path, missing):
    shard = str(tmp_path / "train-00000-of-00001.tfrecord")
    records = [{"image/encoded": jpeg_bytes(i), "image/class/label": i} for i in range(N)]
    del records[7][missing]
    write_records(shard, records)
    with pytest.raises(DatasetError, match=rf"00001.tfrecord#7.*no feature '{missing}'"):
        epoch_labels(DaliLoader(shard, **KW))
    labels, warned = val_epoch(shard)
    assert labels == [i for i in range(N) if i != 7]
    assert len(warned) == 1 and "#7" in warned[0]


def test_every_fault_at_once_with_one_based_labels(tmp_path):
    """Several kinds in one shard, TensorFlow's 1-based labels: only the good records come out."""
    shard = str(tmp_path / "train-00000-of-00001.tfrecord")
    records = [{"image/encoded": jpeg_bytes(i), "image/class/label": i + 1} for i in range(N)]
    records[3]["image/encoded"] = BAD["garbage"]
    del records[11]["image/class/label"]
    del records[15]["image/encoded"]
    write_records(shard, records)
    with open(shard, "ab") as f:
        f.write(tfrecord.frame_record(tfrecord.encode_example(records[0]))[:-30])  # a cut-off last record
    labels, warned = val_epoch(shard, keys=SampleKeys(label_offset=1))
    assert labels == [i for i in range(N) if i not in (3, 11, 15)]
    assert len(warned) == 4


def test_container_damage_still_raises(tmp_path):
    out = shards(tmp_path, "tfrecord")
    shard = last_shard(out)
    with open(shard, "rb") as f:
        data = f.read()
    with open(shard, "wb") as f:
        f.write(gzip.compress(data))
    with pytest.raises(DatasetError, match="GZIP-compressed"):
        DaliLoader(out, skip_bad=True, **KW)
    with open(shard, "wb") as f:
        f.write(b"this is not a TFRecord shard at all" * 10)
    with pytest.raises(DatasetError):
        DaliLoader([shard], skip_bad=True, **KW)


@pytest.mark.parametrize("max_bad", [2, 0.05])
def test_budget_stops_with_the_count_the_budget_and_the_fix(tmp_path, max_bad):
    bad = {3: BAD["garbage"], 9: BAD["truncated"], 15: BAD["not a JPEG"]}  # 3 bad: over 2, and over 0.05 x 24
    budget = 2 if isinstance(max_bad, int) else int(max_bad * N)
    with pytest.warns(UserWarning), pytest.raises(DatasetError) as raised:  # at the first batch, or later
        epoch_labels(DaliLoader(numbered_folder(tmp_path / "d", bad), skip_bad=True, max_bad=max_bad, **KW))
    e = raised.value
    assert f"over the budget of {budget}" in str(e) and "verify_dataset.py" in str(e) and "--write-clean-list" in str(e)
    assert any(name in str(e) for name in ("003.jpg", "009.jpg", "015.jpg"))


def test_within_budget_goes_on(tmp_path):
    labels, warned = val_epoch(numbered_folder(tmp_path / "d", {3: BAD["garbage"]}), max_bad=1)
    assert labels == [i for i in range(N) if i != 3] and len(warned) == 1


def test_bad_max_bad_values_are_refused(tmp_path):
    location = numbered_folder(tmp_path / "d", {})
    for value, match in ((1.5, r"\(0, 1\)"), (-1, ">= 0"), ("3", "int count")):
        with pytest.raises(ValueError, match=match):
            DaliLoader(location, skip_bad=True, max_bad=value, **KW)


def bomb_jpeg(width: int = 60000, height: int = 60000) -> bytes:
    """A small valid JPEG whose header claims width x height pixels (10.8 GB decoded at 60,000²)."""
    data = bytearray(jpeg_bytes(1, 8, 8))
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def test_pixel_guard_refuses_a_60000_by_60000_header_before_decoding(tmp_path):
    location = numbered_folder(tmp_path / "d", {6: bomb_jpeg()})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(DatasetError, match=r"006.jpg: oversized: 60000 x 60000 = 3,600,000,000 pixels"):
        epoch_labels(DaliLoader(location, **KW))
    labels, warned = val_epoch(location)
    assert labels == [i for i in range(N) if i != 6] and len(warned) == 1 and "oversized" in warned[0]
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 1_000_000  # KiB: never 10.8 GB


def test_pixel_guard_limit_is_an_option(tmp_path):
    """An image just over a low limit is refused; max_pixels=None turns the guard off."""
    location = numbered_folder(tmp_path / "d", {})  # images are at most 23 x 28 = 644 pixels
    with pytest.raises(DatasetError, match="oversized"):
        epoch_labels(DaliLoader(location, max_pixels=500, **KW))
    assert sorted(l for l in epoch_labels(DaliLoader(location, max_pixels=None, **KW)) if l >= 0) == list(range(N))


def test_bad_sample_right_after_a_resume_is_found_from_the_resumed_position(tmp_path):
    """The iterator runs a batch while it is built: after load_state_dict that batch is searched from
    the restored position, so a bad sample there is excluded, not reported as unfindable."""
    location = numbered_folder(tmp_path / "d", {21: BAD["garbage"]})
    loader = DaliLoader(location, skip_bad=True, **KW)
    batches = iter(loader)
    seen = [l for _ in range(4) for l in next(batches)[1].tolist()]  # 16 samples, before the bad one
    state = loader.state_dict()
    loader.close()
    with pytest.warns(UserWarning, match="021.jpg"):
        resumed = DaliLoader(location, skip_bad=True, **KW)
        resumed.load_state_dict(state)
        rest = [l for _, labels in resumed for l in labels.tolist()]
    assert sorted(l for l in seen + rest if l >= 0) == [i for i in range(N) if i != 21]
