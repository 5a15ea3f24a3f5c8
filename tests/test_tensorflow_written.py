"""Records written by TensorFlow's own tf.io.TFRecordWriter (fixtures in tests/data, made by
tests/data/make_tf_fixtures.py) read correctly through DALI, and compressed ones are converted."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from dali_pipes import DatasetError, SampleKeys, open_source

from conftest import dali_read_epoch

DATA = os.path.join(os.path.dirname(__file__), "data")
EXPECTED = json.load(open(os.path.join(DATA, "tf_written_expected.json")))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def tf_copy(tmp_path):
    """A writable copy (indexes are written beside the shards)."""
    def copy(name):
        return shutil.copytree(os.path.join(DATA, name), tmp_path / name)
    return copy


def test_tensorflow_written_records_read_through_dali(tf_copy):
    folder = tf_copy("tf_written")
    source = open_source(str(folder), keys=SampleKeys(label_offset=1))
    got = dali_read_epoch(source, batch_size=2)
    assert sorted(label for _, label in got) == [label - 1 for label in EXPECTED["labels"]]
    assert sorted(len(data) for data, _ in got) == sorted(EXPECTED["jpeg_sizes"])
    assert all(data[:2] == b"\xff\xd8" for data, _ in got)
    assert sorted(got) == sorted((s.data, s.label) for s in source.iter_samples())


@pytest.mark.parametrize("name,kind", [("tf_written_gz", "GZIP"), ("tf_written_zz", "ZLIB")])
def test_compressed_tensorflow_records_are_refused_then_decompressed(tf_copy, tmp_path, name, kind):
    folder = tf_copy(name)
    with pytest.raises(DatasetError, match=f"{kind}-compressed TFRecord. DALI reads only uncompressed"):
        open_source(str(folder))
    out = tmp_path / "plain"
    run = subprocess.run([sys.executable, "scripts/to_tfrecord.py", str(folder), str(out), "--decompress"],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "3 samples -> 1 shards" in run.stdout
    got = dali_read_epoch(open_source(str(out), keys=SampleKeys(label_offset=1)))
    assert sorted(label for _, label in got) == [0, 1, 2]
    assert os.path.getsize(out / "train-00000-of-00001") == os.path.getsize(os.path.join(DATA, "tf_written",
                                                                                       "train-00000-of-00001"))
