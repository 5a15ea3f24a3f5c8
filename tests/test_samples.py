"""samples.py: where a sample is, said the same way in every message."""

from dali_pipes.data.samples import PADDING_LABEL, SampleRef


def test_origin_names_the_file_the_record_or_the_tar_member():
    assert SampleRef("folder", "/data/a.jpg").origin == SampleRef("file", "/data/a.jpg").origin == "/data/a.jpg"
    assert SampleRef("tfrecord", "/data/t.tfrecord", index=7, offset=1024).origin == "/data/t.tfrecord#7 (byte 1024)"
    assert SampleRef("webdataset", "/data/s.tar", key="k_001").origin == "/data/s.tar#k_001"
    assert PADDING_LABEL == -1  # CrossEntropyLoss(ignore_index=-1) and labels >= 0 masks rely on it


def test_sample_keys_name_every_format_and_the_old_name_warns_for_a_release():
    import pytest

    import dali_pipes
    from dali_pipes.data import samples
    keys = samples.SampleKeys(label_offset=1, image_column="img")  # TFRecord features and Parquet columns alike
    assert (keys.image, keys.label, keys.label_column) == ("image/encoded", "image/class/label", "label")
    for module in (samples, dali_pipes):
        with pytest.warns(DeprecationWarning, match="TFRecordKeys is now SampleKeys"):
            assert module.TFRecordKeys is samples.SampleKeys
    assert "TFRecordKeys" not in dali_pipes.__all__ and "SampleKeys" in dali_pipes.__all__
