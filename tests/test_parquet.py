"""Parquet image datasets (formats/parquet.py), written by Hugging Face `datasets` and by pyarrow: read exactly
(bytes and labels against what was written), on 1 and 2 ranks, resumed exactly and elastically, bad images
skipped within the budget, labels checked, converted to TFRecord and WebDataset. Real DALI on CPU; the label
of sample i is i (one class per sample), so a label names its sample and counts are checked exactly."""

import collections
import os
import re
import warnings

import numpy as np
import pytest
import torch

from dali_pipes import DaliLoader, DatasetError, SampleKeys, open_source
from dali_pipes.errors import LabelError
from dali_pipes.run.contract import Contract

from conftest import jpeg_bytes

pytest_plugins = ["s3_server", "store_servers"]  # fixtures: s3 (a bucket on a local moto server), hub (a Hub mirror)

datasets = pytest.importorskip("datasets", reason="the tests write Parquet with Hugging Face datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

N = 23  # does not divide by 2 or 3
BATCH = 3
ROWS_PER_GROUP = 4
KW = dict(batch_size=BATCH, image_size=16, device="cpu", num_threads=1, shuffle_buffer=8, seed=7)


def image(i: int) -> bytes:
    return jpeg_bytes(i, 24 + i % 5, 32)


def write_datasets_parquet(folder, n: int = N, files: int = 2, bad: dict[int, bytes] | None = None,
                           labels: list[int] | None = None) -> str:
    """`files` Parquet files train-0000k-of-0000m.parquet written by datasets' to_parquet: an Image column
    and a ClassLabel label (names c000 ...), row groups of ROWS_PER_GROUP rows; sample i holds image(i)
    (or bad[i]) and label i. Given `labels` (which ClassLabel would refuse), a plain int64 label column."""
    os.makedirs(folder, exist_ok=True)
    label = datasets.Value("int64") if labels else datasets.ClassLabel(names=[f"c{i:03d}" for i in range(n)])
    features = datasets.Features({"image": datasets.Image(), "label": label})
    images = [{"bytes": (bad or {}).get(i, image(i)), "path": f"{i:03d}.jpg"} for i in range(n)]
    ds = datasets.Dataset.from_dict({"image": images, "label": labels or list(range(n))}, features=features)
    for k in range(files):
        part = ds.select(range(k * n // files, (k + 1) * n // files))
        part.to_parquet(os.path.join(folder, f"train-{k:05d}-of-{files:05d}.parquet"), batch_size=ROWS_PER_GROUP)
    return str(folder)


def write_plain_parquet(path, n: int = N) -> str:
    """One file written by pyarrow: binary column "jpg", int32 column "cls", no metadata."""
    table = pa.table({"jpg": pa.array([image(i) for i in range(n)], pa.binary()),
                      "cls": pa.array(list(range(n)), pa.int32())})
    pq.write_table(table, str(path), row_group_size=5)
    return str(path)


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return write_datasets_parquet(tmp_path_factory.mktemp("hf") / "data")


def ranks(location, world_size, train, **kw):
    return [DaliLoader(location, rank=r, world_size=world_size, train=train, **{**KW, **kw})
            for r in range(world_size)]


def epoch(loaders) -> list[list[int]]:
    """One epoch's labels per rank; every rank yields the same number of batches (else DDP hangs)."""
    out = [[y for _, labels in loader for y in labels.tolist()] for loader in loaders]
    assert len({len(loader) for loader in loaders}) == 1
    return out


def batches(loader, epochs: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for _ in range(epochs) for x, y in loader]


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))


# ---------------------------------------------------------------------------------------------
# Reading exactly
# ---------------------------------------------------------------------------------------------

def test_a_datasets_folder_is_recognised_with_its_class_names_and_reads_exactly(hf):
    source = open_source(hf)
    assert source.kind == "parquet" and len(source.files) == 2 and source.num_samples == N
    assert source.classes == [f"c{i:03d}" for i in range(N)]  # datasets' ClassLabel names, from the metadata
    assert [(s.data, s.label) for s in source.iter_samples()] == [(image(i), i) for i in range(N)]


def test_the_dali_feed_gives_every_encoded_image_with_its_label(hf):
    """Raw (encoded bytes, label) of one epoch through the pipeline DALI runs: each written sample once."""
    from nvidia.dali import pipeline_def
    source = open_source(hf)

    @pipeline_def(batch_size=4, num_threads=1, device_id=None)
    def pipe():
        return source.dali_reader()

    p = pipe()
    p.build()
    got = collections.Counter()
    for _ in range(-(-N // 4)):
        images, labels = p.run()
        for i in range(len(images)):
            got[(np.array(images[i]).tobytes(), int(np.array(labels[i])))] += 1
    got[(image(N - 1), N - 1)] -= 4 * -(-N // 4) - N  # the last batch is padded with the slice's last sample
    assert +got == collections.Counter((image(i), i) for i in range(N))
    with pytest.raises(StopIteration):
        p.run()
    del p


def test_plain_binary_and_integer_columns_are_named_by_flags(tmp_path):
    path = write_plain_parquet(tmp_path / "plain.parquet")
    with pytest.raises(DatasetError, match=r"no column 'image'; columns: jpg \(binary\), cls \(int32\).*--image-col"):
        open_source(path)
    keys = SampleKeys(image_column="jpg", label_column="cls")
    assert [(s.data, s.label) for s in open_source(path, keys=keys).iter_samples()] == [(image(i), i) for i in range(N)]
    loader = DaliLoader(path, keys=keys, train=False, **KW)
    labels = [y for _, ys in loader for y in ys.tolist()]
    assert labels == list(range(N))  # val: storage order, each sample once


def test_a_column_of_another_type_is_refused_naming_it(tmp_path):
    path = str(tmp_path / "t.parquet")
    pq.write_table(pa.table({"image": pa.array(["a.jpg"]), "label": pa.array([0])}), path)
    with pytest.raises(DatasetError, match=r"column 'image' holds string, not encoded images"):
        open_source(path)


def test_the_cli_flags_reach_the_keys():
    import argparse

    from dali_pipes.config import SourceConfig
    from dali_pipes.options import add_arguments, from_args
    parser = argparse.ArgumentParser()
    add_arguments(parser, SourceConfig, "source")
    keys = from_args(SourceConfig, parser.parse_args(["--image-column", "jpg", "--label-column", "cls"])).open_kwargs()
    assert (keys["keys"].image_column, keys["keys"].label_column) == ("jpg", "cls")


# ---------------------------------------------------------------------------------------------
# Ranks, shuffling, the read order
# ---------------------------------------------------------------------------------------------

def test_two_ranks_val_read_every_sample_exactly_once(hf):
    per_rank = epoch(ranks(hf, 2, False, val_padding="none"))
    assert sorted(per_rank[0] + per_rank[1]) == list(range(N))
    assert per_rank[0] == list(range(0, N // 2)) and per_rank[1] == list(range(N // 2, N))  # ReaderModel's slices


def test_two_ranks_train_yield_each_sample_at_most_once_per_epoch_and_shuffle_per_epoch(hf):
    loaders = ranks(hf, 2, True)
    first, second = epoch(loaders), epoch(loaders)
    for labels in (first, second):
        every = labels[0] + labels[1]
        assert len(every) == len(set(every)) == 2 * (N // 2 // BATCH) * BATCH  # equal steps, full batches
    assert first != second  # another order (and the ranks' slices rotated)


def test_a_train_epoch_is_read_in_the_order_the_reader_model_gives(hf):
    """The bad-sample search and the culprit window come from ReaderModel.read_order: the feed must read in it."""
    from dali_pipes.run.pipeline import PipelineSpec, source_reader
    spec = PipelineSpec(contract=Contract(True, BATCH, False), seed=KW["seed"], shuffle_buffer=KW["shuffle_buffer"])
    model = source_reader(spec, open_source(hf))
    loader = DaliLoader(hf, train=True, **KW)
    for epoch_index in range(2):
        labels = [y for _, ys in loader for y in ys.tolist()]
        assert labels == list(model.read_order(model.shard_of(epoch_index), epoch_index))[:len(labels)]
        assert labels != sorted(labels)


def test_the_read_order_mixes_row_groups_in_windows():
    from dali_pipes.data.formats.parquet_feed import read_order
    blocks = np.arange(0, 100, 10)  # ten row groups of ten rows
    order, windows = read_order(blocks, range(0, 100), seed=1, epoch=0, fill=30, shuffle=True)
    assert sorted(order.tolist()) == list(range(100)) and windows.tolist() == [0, 30, 60, 90]
    for start, stop in zip([0, 30, 60, 90], [30, 60, 90, 100]):  # a window holds whole row groups
        assert len({i // 10 for i in order[start:stop].tolist()}) * 10 == stop - start
    again, _ = read_order(blocks, range(0, 100), seed=1, epoch=0, fill=30, shuffle=True)
    other, _ = read_order(blocks, range(0, 100), seed=1, epoch=1, fill=30, shuffle=True)
    assert again.tolist() == order.tolist() and other.tolist() != order.tolist()
    plain, _ = read_order(blocks, range(15, 45), seed=1, epoch=0, fill=30, shuffle=False)
    assert plain.tolist() == list(range(15, 45))


# ---------------------------------------------------------------------------------------------
# Resume, elastic resume
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
def test_a_mid_epoch_resume_yields_the_uninterrupted_batches(hf, world_size, train):
    whole = [batches(loader, 2) for loader in ranks(hf, world_size, train)]
    stopped = ranks(hf, world_size, train)
    iterators = [iter(loader) for loader in stopped]
    for it in iterators:
        next(it)
    states = [loader.state_dict() for loader in stopped]
    for rank, state in enumerate(states):
        resumed = DaliLoader(hf, rank=rank, world_size=world_size, train=train, **KW)
        resumed.load_state_dict(state)
        assert same(batches(resumed, 2), whole[rank][1:])  # images too: the crops' draws are resumed


def test_a_state_at_the_epoch_end_starts_the_next_epoch(hf):
    whole = batches(DaliLoader(hf, train=True, **KW), 2)
    loader = DaliLoader(hf, train=True, **KW)
    batches(loader)
    resumed = DaliLoader(hf, train=True, **KW)
    resumed.load_state_dict(loader.state_dict())
    assert same(batches(resumed), whole[len(whole) // 2:])


@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
def test_an_elastic_resume_from_two_ranks_to_one_yields_each_sample_once(hf, train):
    kw = dict(val_padding="label")
    old = ranks(hf, 2, train, **kw)
    first = [next(iter(loader))[1].tolist() for loader in old]
    states = [loader.state_dict() for loader in old]
    (new,) = ranks(hf, 1, train, **kw)
    new.load_state_dict(states)
    rest = [y for _, ys in new for y in ys.tolist() if y >= 0]
    labels = first[0] + first[1] + rest
    assert len(labels) == len(set(labels))
    if train:
        assert N - len(labels) < BATCH  # the tail that fills no batch
    else:
        assert sorted(labels) == list(range(N))
    following = [y for _, ys in new for y in ys.tolist() if y >= 0]  # then a loader of the new world size
    assert len(following) == len(set(following)) == (N // BATCH * BATCH if train else N)


# ---------------------------------------------------------------------------------------------
# Bad samples, labels
# ---------------------------------------------------------------------------------------------

GARBAGE = bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8))


def test_a_corrupt_image_is_named_and_skipped_within_the_budget(tmp_path):
    data = write_datasets_parquet(tmp_path / "bad", bad={9: GARBAGE})
    with pytest.raises(DatasetError, match=r"train-00000-of-00002.parquet#9"):
        [None for _ in DaliLoader(data, train=False, **KW)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = DaliLoader(data, train=False, skip_bad=True, max_bad=1, **KW)
        labels = [y for _, ys in loader for y in ys.tolist()]
    warned = [str(w.message) for w in caught if "excluding" in str(w.message)]
    assert sorted(y for y in labels if y >= 0) == [i for i in range(N) if i != 9]
    assert len(warned) == 1 and "train-00000-of-00002.parquet#9" in warned[0]
    assert [y for _, ys in loader for y in ys.tolist() if y >= 0] == [i for i in range(N) if i != 9]  # stays out


def test_a_corrupt_image_met_in_a_shuffled_epoch_is_found_where_the_read_order_says(tmp_path):
    """Train: the bad-sample search looks where ReaderModel.read_order says the feed has read, finds it, and the
    run goes on from the last good batch: every other sample at most once per epoch."""
    data = write_datasets_parquet(tmp_path / "bad", bad={9: GARBAGE})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = DaliLoader(data, train=True, skip_bad=True, max_bad=1, **KW)
        epochs = [[y for _, ys in loader for y in ys.tolist()] for _ in range(2)]
    assert len([w for w in caught if "excluding" in str(w.message) and "#9" in str(w.message)]) == 1
    for labels in epochs:
        real = [y for y in labels if y >= 0]
        assert 9 not in real and len(real) == len(set(real)) and len(labels) == N // BATCH * BATCH


def test_a_corrupt_images_message_suggests_only_what_parquet_can_do_and_each_fix_runs(tmp_path, capsys):
    """Issue 32: the message said "train from a clean list", which Parquet cannot do (clean lists name image files).
    Now it says to find every bad sample with verify, or to exclude them with skip_bad=True; both run as written."""
    import re
    import shlex

    from dali_pipes.tools.cli import main
    data = write_datasets_parquet(tmp_path / "bad", bad={9: GARBAGE})
    with pytest.raises(DatasetError) as error:
        [None for _ in DaliLoader(data, train=False, **KW)]
    assert "clean list" not in str(error.value) and "--write-clean-list" not in str(error.value)
    verify = re.search(rf"Find every bad sample with: (dali-pipes verify {re.escape(data)}), or exclude bad samples "
                       r"as they are met with skip_bad=True \(train: --skip-bad\)$", error.value.fix).group(1)
    assert main([*shlex.split(verify)[1:], "--workers", "1"]) == 1
    assert "train-00000-of-00002.parquet#9" in capsys.readouterr().out
    with pytest.warns(UserWarning, match="excluding a bad sample"):
        labels = [y for _, ys in DaliLoader(data, train=False, skip_bad=True, **KW) for y in ys.tolist() if y >= 0]
    assert labels == [i for i in range(N) if i != 9]


def test_bad_images_over_the_budget_stop_the_loader(tmp_path):
    data = write_datasets_parquet(tmp_path / "bad", bad={3: GARBAGE, 15: GARBAGE})
    with pytest.warns(UserWarning), pytest.raises(DatasetError, match="over the budget of 1"):
        [None for _ in DaliLoader(data, train=False, skip_bad=True, max_bad=1, **KW)]


@pytest.mark.parametrize("label,match", [(N, f"label {N} is not below the {N} classes"), (-3, "label -3 is negative")])
def test_labels_are_checked_at_open_naming_the_row(tmp_path, label, match):
    labels = list(range(N))
    labels[17] = label
    data = str(tmp_path / "d")
    write_datasets_parquet(data, labels=labels, files=1)
    with pytest.raises(LabelError, match=rf"train-00000-of-00001.parquet#17.*{match}"):
        open_source(data, num_classes=N)


def test_labels_are_bounded_by_the_runs_class_count(hf):
    with pytest.raises(LabelError, match=r"#10: label 10 is not below the 10 classes"):
        DaliLoader(hf, train=False, num_classes=10, **KW)


def test_a_label_offset_applies_to_stored_labels(tmp_path):
    data = write_datasets_parquet(tmp_path / "d", labels=[i + 1 for i in range(N)], files=1, n=N)
    keys = SampleKeys(label_offset=1)
    labels = [y for _, ys in DaliLoader(data, keys=keys, train=False, num_classes=N, **KW) for y in ys.tolist()]
    assert labels == list(range(N))


# ---------------------------------------------------------------------------------------------
# Images stored as paths: datasets' imagefolder written with to_parquet, and the Dataset itself
# ---------------------------------------------------------------------------------------------

FOLDER_COUNTS = (4, 3, 5)


@pytest.fixture(scope="module")
def imagefolder(tmp_path_factory):
    """(image folder, the folder of its Parquet file, the Dataset) made the way most people make one:
    datasets.load_dataset("imagefolder", data_dir=...) and .to_parquet(...), which keeps each image's absolute
    path and no bytes. Row groups of 5 rows, so that the file has several."""
    from conftest import write_folder
    root = tmp_path_factory.mktemp("imagefolder")
    write_folder(str(root / "images"), FOLDER_COUNTS)
    ds = datasets.load_dataset("imagefolder", data_dir=str(root / "images"), split="train",
                               cache_dir=str(root / "hf_cache"))
    ds.to_parquet(str(root / "parquet" / "train.parquet"), batch_size=5)
    return str(root / "images"), str(root / "parquet"), ds


def stored_paths(ds) -> list[str]:
    return [cell["path"] for cell in ds.cast_column("image", datasets.Image(decode=False))["image"]]


def test_a_datasets_imagefolder_parquet_of_paths_is_read_from_the_files(imagefolder):
    folder, parquet, ds = imagefolder
    table = pq.read_table(os.path.join(parquet, "train.parquet"))
    assert table.column("image").combine_chunks().field("bytes").null_count == len(ds)  # paths, no bytes
    paths = stored_paths(ds)
    expected = [(open(path, "rb").read(), label) for path, label in zip(paths, ds["label"])]
    source = open_source(parquet)
    assert source.classes == ["cat", "dog", "fish"] and source.num_samples == sum(FOLDER_COUNTS)
    assert [(s.data, s.label) for s in source.iter_samples()] == expected
    kw = dict(batch_size=4, image_size=16, device="cpu", num_threads=1)
    ours = batches(DaliLoader(parquet, train=False, **kw))
    files = batches(DaliLoader(folder, train=False, **kw))  # DALI decoding the very files, sorted as datasets does
    assert sorted(paths) == paths and same(ours, files)


def test_a_datasets_imagefolder_dataset_reads_as_torchs_dataloader_reads_it(imagefolder, torchvision):
    _, _, ds = imagefolder
    import torchvision.transforms as T
    compose = val_transform(T)

    def apply(batch):
        batch["pixel_values"] = [compose(image.convert("RGB")) for image in batch["image"]]
        return batch

    def collate(rows):
        return torch.stack([r["pixel_values"] for r in rows]), torch.tensor([r["label"] for r in rows])

    dataset = ds.with_transform(apply)
    ours = batches(DaliLoader(dataset, batch_size=4, num_workers=1, device="cpu"))
    theirs = batches(torch.utils.data.DataLoader(dataset, batch_size=4, collate_fn=collate))
    assert [y.tolist() for _, y in ours] == [y.tolist() for _, y in theirs] == [[0, 0, 0, 0], [1, 1, 1, 2],
                                                                                 [2, 2, 2, 2]]
    for (x, _), (ref, _) in zip(ours, theirs):
        assert x.shape == ref.shape and (x - ref).abs().mean() < 0.06, (x - ref).abs().mean()


def write_cells(folder, cells: dict[int, object], files: int = 1) -> str:
    """write_datasets_parquet's files with the image cells of `cells` as given: None (a null cell), or a
    {"bytes", "path"} dict (bytes None with a relative or missing path; b"" empty)."""
    os.makedirs(folder, exist_ok=True)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(
        names=[f"c{i:03d}" for i in range(N)])})
    images = [cells.get(i, {"bytes": image(i), "path": f"{i:03d}.jpg"}) for i in range(N)]
    ds = datasets.Dataset.from_dict({"image": images, "label": list(range(N))}, features=features)
    for k in range(files):
        part = ds.select(range(k * N // files, (k + 1) * N // files))
        part.to_parquet(os.path.join(folder, f"train-{k:05d}-of-{files:05d}.parquet"), batch_size=ROWS_PER_GROUP)
    return str(folder)


BAD_CELLS = {  # each kind of cell with no image, at row 9: what it is called, and where it is found
    "null cell": ({9: None}, r"#9: no image \(a null cell\)", "open"),
    "relative path": ({9: {"bytes": None, "path": "009.jpg"}}, r"#9: no image bytes, and its path '009.jpg' is "
                      r"not absolute", "open"),
    "missing file": ({9: {"bytes": None, "path": "/nowhere/009.jpg"}}, r"#9: no image bytes, and its path "
                     r"'/nowhere/009.jpg' does not exist", "open"),
    "empty bytes": ({9: {"bytes": b"", "path": None}}, r"#9: empty image bytes", "feed"),  # no footer counts these
}


@pytest.mark.parametrize("kind", list(BAD_CELLS))
def test_a_row_without_an_image_is_named_and_skipped_with_skip_bad_never_reaching_dali(tmp_path, kind):
    """Null cells are found at open (the footer counts them), empty ones by the feed; neither reaches DALI's
    decoder (nor the bad-sample search's: DALI 2.4 crashes the process on a batch of empty buffers)."""
    cells, problem, where = BAD_CELLS[kind]
    data = write_cells(tmp_path / "d", cells)
    fix = r".*embed_table_storage.*skip_bad=True" if where == "open" else r".*skip_bad=True"
    if where == "open":
        with pytest.raises(DatasetError, match=rf"train-00000-of-00001.parquet{problem}{fix}"):
            open_source(data)
    with pytest.raises(DatasetError, match=rf"train-00000-of-00001.parquet{problem}{fix}"):
        [None for _ in DaliLoader(data, train=False, **KW)]
    with pytest.warns(UserWarning, match=rf"excluding a bad sample.*parquet{problem}"):
        loader = DaliLoader(data, train=True, skip_bad=True, max_bad=1, **KW)
        epochs = [[y for _, ys in loader for y in ys.tolist()] for _ in range(2)]
    for labels in epochs:
        real = [y for y in labels if y >= 0]
        assert 9 not in real and len(real) == len(set(real)) and len(labels) == N // BATCH * BATCH


def test_a_row_without_an_image_in_a_datasets_dataset_is_named(tmp_path, torchvision):
    import torchvision.transforms as T
    ds = datasets.load_dataset("parquet", data_files=write_cells(tmp_path / "d", BAD_CELLS["missing file"][0]) +
                               "/*.parquet", split="train", cache_dir=str(tmp_path / "hf_cache"))
    compose = val_transform(T)
    dataset = ds.with_transform(lambda b: {**b, "pixel_values": [compose(i) for i in b["image"]]})
    with pytest.raises(DatasetError, match=r"\.arrow#9: no image bytes, and its path '/nowhere/009.jpg' does not"):
        DaliLoader(dataset, batch_size=BATCH, device="cpu")


# ---------------------------------------------------------------------------------------------
# Conversion
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["tfrecord", "webdataset"])
def test_convert_turns_parquet_into_shards_with_the_same_samples(hf, tmp_path, fmt):
    from dali_pipes.tools.convert import write_tfrecords, write_webdataset
    write = write_tfrecords if fmt == "tfrecord" else write_webdataset
    out = str(tmp_path / fmt)
    write(open_source(hf), out, shards=3, progress=False, workers=1)
    converted = open_source(out)
    assert converted.kind == fmt and converted.classes == [f"c{i:03d}" for i in range(N)]
    assert sorted((s.label, s.data) for s in converted.iter_samples()) == [(i, image(i)) for i in range(N)]


# ---------------------------------------------------------------------------------------------
# In an object store (s3:// through a local moto server)
# ---------------------------------------------------------------------------------------------

def put_parquet_files(folder: str, put, prefix: str) -> None:
    """Each .parquet file of `folder` stored as PREFIX + its name, through a test store's `put(key, data)`."""
    for name in sorted(os.listdir(folder)):
        if name.endswith(".parquet"):
            with open(os.path.join(folder, name), "rb") as f:
                put(f"{prefix}{name}", f.read())


@pytest.fixture
def s3_parquet(hf, request, tmp_path, monkeypatch):
    """The datasets-written files under s3://BUCKET/hf/, the caches inside the test's tmp_path."""
    pytest.importorskip("moto.server", reason="the S3 tests need a local S3 server: pip install 'moto[server]'")
    s3 = request.getfixturevalue("s3")
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    put_parquet_files(hf, s3.put, "hf/")
    return s3.url("hf/")


def test_an_s3_parquet_dataset_reads_exactly_on_one_and_two_ranks(s3_parquet):
    source = open_source(s3_parquet)
    assert source.kind == "parquet" and source.remote is not None and source.classes == [f"c{i:03d}" for i in range(N)]
    assert [(s.data, s.label) for s in source.iter_samples()] == [(image(i), i) for i in range(N)]
    per_rank = epoch(ranks(s3_parquet, 2, False, val_padding="none"))
    assert per_rank[0] + per_rank[1] == list(range(N))
    train = epoch(ranks(s3_parquet, 2, True))
    assert len(train[0] + train[1]) == len(set(train[0] + train[1])) == 2 * (N // 2 // BATCH) * BATCH


def test_an_s3_parquet_dataset_resumes_exactly(s3_parquet):
    whole = batches(DaliLoader(s3_parquet, train=True, **KW), 2)
    stopped = DaliLoader(s3_parquet, train=True, **KW)
    next(iter(stopped))
    resumed = DaliLoader(s3_parquet, train=True, **KW)
    resumed.load_state_dict(stopped.state_dict())
    assert same(batches(resumed, 2), whole[1:])


@pytest.fixture
def hub_parquet(hf, request, tmp_path, monkeypatch):
    """The datasets-written files in a dataset repo of the Hub mirror, in the Hub's layout (data/train-0000k-of-
    00002.parquet, a test split beside them, a README at the root); the glob of the train split."""
    hub = request.getfixturevalue("hub")
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    put_parquet_files(hf, hub.put, "data/")
    hub.put("data/test-00000-of-00001.parquet", open(write_plain_parquet(tmp_path / "test.parquet", 5), "rb").read())
    hub.put("README.md", b"---\nlicense: mit\n---\n")
    return hub.url("data/train-*.parquet")


def test_a_hub_parquet_dataset_reads_exactly_on_one_and_two_ranks(hub_parquet):
    """The Hub's main use: an image dataset published as Parquet, read through HfFileSystem's URL handling."""
    source = open_source(hub_parquet)
    assert source.kind == "parquet" and source.remote is not None and len(source.files) == 2
    assert source.classes == [f"c{i:03d}" for i in range(N)]
    assert [(s.data, s.label) for s in source.iter_samples()] == [(image(i), i) for i in range(N)]
    assert epoch(ranks(hub_parquet, 1, False, val_padding="none")) == [list(range(N))]
    per_rank = epoch(ranks(hub_parquet, 2, False, val_padding="none"))
    assert per_rank[0] + per_rank[1] == list(range(N))
    train = epoch(ranks(hub_parquet, 2, True))
    assert len(train[0] + train[1]) == len(set(train[0] + train[1])) == 2 * (N // 2 // BATCH) * BATCH


def test_a_hub_repo_root_names_where_its_parquet_files_are(hub_parquet):
    root = hub_parquet.split("data/")[0]
    with pytest.raises(DatasetError, match=r"no images found.*3 shards are in subfolders \(data/test-00000-of-00001"
                                           r"\.parquet ...\): point at one split's files with a glob such as "
                                           r"(\S+/data/train-\*)$") as error:
        open_source(root)
    assert open_source(re.search(r"glob such as (\S+)$", str(error.value)).group(1)).num_samples > 0  # as written


def test_a_parquet_file_replaced_on_gs_after_opening_is_object_changed_not_unreadable(hf, request, tmp_path,
                                                                                      monkeypatch):
    """Issue 32: the GCS emulator ignores the generation a read asks for, so the reads of a file replaced after the
    dataset was opened return the new bytes (here: the same size, its pages scrambled, its footer kept). The error
    says that the file changed, not that it is unreadable and must be re-created."""
    from dali_pipes.storage.remote import ObjectChangedError
    gcs = request.getfixturevalue("gcs")
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    put_parquet_files(hf, gcs.put, "hf/")
    source = open_source(gcs.url("hf/"))
    name = "hf/train-00000-of-00002.parquet"
    data = gcs.admin.cat_file(f"{gcs.bucket}/{name}")
    pages_end = len(data) - 8 - int.from_bytes(data[-8:-4], "little")  # the footer and its length stay
    gcs.put(name, data[:4] + data[4:pages_end][::-1] + data[pages_end:])
    with pytest.raises(ObjectChangedError, match=f"{gcs.url(name)}: the object changed after it was listed"):
        list(source.iter_samples())


# ---------------------------------------------------------------------------------------------
# The DataLoader form with a datasets.Dataset
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def saved_dataset(hf, tmp_path):
    """The datasets-written files loaded as a Dataset and saved to disk: its rows live in Arrow files."""
    ds = datasets.load_dataset("parquet", data_files=sorted(os.path.join(hf, n) for n in os.listdir(hf)
                                                            if n.endswith(".parquet")),
                               split="train", cache_dir=str(tmp_path / "hf_cache"))
    ds.save_to_disk(str(tmp_path / "saved"))
    return datasets.load_from_disk(str(tmp_path / "saved"))


def val_transform(T):
    return T.Compose([T.Resize(20), T.CenterCrop(16), T.ToTensor()])


def test_a_datasets_dataset_is_read_from_its_files_with_its_transform(saved_dataset, torchvision):
    import torchvision.transforms as T
    compose = val_transform(T)

    def apply(batch):
        batch["pixel_values"] = [compose(image.convert("RGB")) for image in batch["image"]]
        return batch

    dataset = saved_dataset.with_transform(apply)
    loader = DaliLoader(dataset, batch_size=BATCH, num_workers=1, device="cpu")
    assert loader.dataset is dataset and not loader.train and len(loader) == -(-N // BATCH)
    got = [(x.shape, y.tolist()) for x, y in loader]
    assert [y for _, ys in got for y in ys] == list(range(N))  # storage order, every sample once
    assert all(shape[1:] == (3, 16, 16) for shape, _ in got)
    assert loader.source.classes == [f"c{i:03d}" for i in range(N)]


def test_a_datasets_dataset_with_a_transform_dali_cannot_run_is_refused_with_a_fix_that_runs(saved_dataset,
                                                                                               torchvision):
    """Issue 32: the refusal said "or build the loader with its own keywords", refused the same way (the Dataset's
    transform is read whatever keywords come with it). Now it gives the call on the Dataset's files, which runs."""
    import re

    import torchvision.transforms as T
    blur = T.Compose([T.Resize(20), T.CenterCrop(16), T.GaussianBlur(3), T.ToTensor()])
    dataset = saved_dataset.with_transform(lambda batch: {"pixel_values": [blur(i) for i in batch["image"]]})
    with pytest.raises(ValueError) as error:
        DaliLoader(dataset, batch_size=BATCH, device="cpu", image_size=16)
    call = re.search(r"pass the Dataset's files with the loader's own keywords: (DaliLoader\(.*\))$",
                     str(error.value)).group(1)
    assert call == "DaliLoader([f['filename'] for f in dataset.cache_files], image_size=..., crop_ratio=..., ...)"
    keywords = "image_size=16, crop_ratio=0.8, batch_size=3, train=False, device='cpu', num_threads=1"
    loader = eval(call.replace("image_size=..., crop_ratio=..., ...", keywords), {"DaliLoader": DaliLoader,
                                                                                   "dataset": dataset})
    assert sorted(y for _, ys in loader for y in ys.tolist() if y >= 0) == list(range(N))
    loader.close()


def test_what_a_datasets_dataset_cannot_be_read_as_is_refused_naming_why(saved_dataset, torchvision):
    import torchvision.transforms as T
    first, second = val_transform(T), val_transform(T)
    with pytest.raises(TypeError, match=r"reads one split: pass dataset\['train'\]"):
        DaliLoader(datasets.DatasetDict({"train": saved_dataset}), batch_size=BATCH)
    with pytest.raises(ValueError, match="indices mapping .*flatten_indices"):
        DaliLoader(saved_dataset.shuffle(seed=0).with_transform(lambda b: b), batch_size=BATCH)
    with pytest.raises(ValueError, match="held in memory only .*save_to_disk"):
        DaliLoader(datasets.Dataset.from_dict({"image": [], "label": []}), batch_size=BATCH)
    with pytest.raises(ValueError, match="refers to 2 torchvision transforms"):
        DaliLoader(saved_dataset.with_transform(lambda b: [first(i) for i in b["image"]] + [second(b)]),
                   batch_size=BATCH)
    with pytest.raises(ValueError, match="no transform"):
        DaliLoader(saved_dataset, batch_size=BATCH)


# ---------------------------------------------------------------------------------------------
# The [parquet] extra
# ---------------------------------------------------------------------------------------------

def _python(code: str) -> str:
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_the_library_imports_neither_pyarrow_nor_datasets():
    assert _python("import sys, dali_pipes; from dali_pipes import DaliLoader, open_source; "
                   "from dali_pipes.data.formats import parquet; "
                   "print(sorted(m for m in ('pyarrow', 'datasets') if m in sys.modules))") == "[]"


def test_without_pyarrow_a_parquet_location_names_the_extra(hf):
    said = _python(f"import sys; sys.modules['pyarrow'] = None\n"  # as if pyarrow were not installed
                   f"from dali_pipes import open_source\n"
                   f"try:\n    open_source({hf!r})\nexcept ImportError as e:\n    print(e)")
    assert "pip install '.[parquet]' (from the dali_pipes checkout)" in said


def test_a_transformers_script_dataset_runs_its_dict_collate_fn_and_stretches_resize_h_w(imagefolder, torchvision):
    """run_image_classification_no_trainer.py's shape: with_transform adds "pixel_values" to each row, a ViT image
    processor's size gives Resize((h, w)) (stretched, as torchvision does) and CenterCrop((h, w)), and its
    collate_fn stacks "pixel_values" into a dict. The collate_fn is run as DataLoader runs it."""
    _, _, ds = imagefolder
    import torchvision.transforms as T
    size = (16, 16)  # image_processor.size {"height", "width"}
    val = T.Compose([T.Resize(size), T.CenterCrop(size), T.ToTensor(), T.Normalize([0.5] * 3, [0.5] * 3)])
    train = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(),
                       T.Normalize([0.5] * 3, [0.5] * 3)])

    def preprocess(transform):
        def apply(example_batch):
            example_batch["pixel_values"] = [transform(image.convert("RGB")) for image in example_batch["image"]]
            return example_batch
        return apply

    def collate_fn(examples):
        pixel_values = torch.stack([example["pixel_values"] for example in examples])
        labels = torch.tensor([example["label"] for example in examples])
        return {"pixel_values": pixel_values, "labels": labels}

    eval_dataset = ds.with_transform(preprocess(val))
    ours = list(DaliLoader(eval_dataset, collate_fn=collate_fn, batch_size=5, device="cpu", num_workers=1))
    theirs = list(torch.utils.data.DataLoader(eval_dataset, collate_fn=collate_fn, batch_size=5))
    assert [sorted(b) for b in ours] == [["labels", "pixel_values"]] * 3
    assert [b["labels"].tolist() for b in ours] == [b["labels"].tolist() for b in theirs]
    for a, b in zip(ours, theirs):  # stretched: a shorter-side resize + crop would differ by far more
        assert a["pixel_values"].shape == b["pixel_values"].shape
        assert (a["pixel_values"] - b["pixel_values"]).abs().mean() < 0.06
    train_dataset = ds.with_transform(preprocess(train))
    loader = DaliLoader(train_dataset, shuffle=True, collate_fn=collate_fn, batch_size=5, device="cpu", num_workers=1)
    steps = list(loader)
    assert len(loader) == len(steps) == len(torch.utils.data.DataLoader(train_dataset, batch_size=5)) == 3
    assert sorted(y for b in steps for y in b["labels"].tolist()) == [0] * 4 + [1] * 3 + [2] * 5


def test_a_datasets_rows_column_the_loader_does_not_carry_is_named_when_a_collate_fn_reads_it(imagefolder,
                                                                                            torchvision):
    _, _, ds = imagefolder
    import torchvision.transforms as T
    compose = val_transform(T)
    dataset = ds.with_transform(lambda b: {**b, "pixel_values": [compose(i) for i in b["image"]]})
    loader = DaliLoader(dataset, collate_fn=lambda rows: [r["image"] for r in rows], batch_size=5, device="cpu")
    with pytest.raises(KeyError, match=r"'image'.*decoded in DALI.*pixel_values"):
        next(iter(loader))
