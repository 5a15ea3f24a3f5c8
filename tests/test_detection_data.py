"""Detection data: COCO JSON + an image folder read as DetectionSamples (boxes xyxy in pixels, every bad
annotation named), detection shards (TFRecord with the TensorFlow Object Detection API's keys, WebDataset with a
JSON member) written and read back exactly, `convert` / `verify` on them, and the built-in detection sample."""

import copy
import json
import os

import numpy as np
import pytest

from dali_pipes.data.formats import coco
from dali_pipes.errors import DatasetError

from conftest import jpeg_bytes

pytest_plugins = ["s3_server"]

CATEGORIES = [{"id": 1, "name": "cat"}, {"id": 3, "name": "dog"}]  # sparse ids, as COCO's (1..90)
IMAGES = [  # listed out of id order: samples come in ascending id, as CocoDetection's
    {"id": 42, "file_name": "b.jpg", "width": 40, "height": 30},
    {"id": 7, "file_name": "a.jpg", "width": 32, "height": 24},
    {"id": 9, "file_name": "sub/c.jpg", "width": 36, "height": 28},  # no annotations
]
ANNOTATIONS = [
    {"id": 100, "image_id": 7, "category_id": 1, "bbox": [2, 3, 10, 5], "iscrowd": 0, "area": 44.5},
    {"id": 101, "image_id": 42, "category_id": 3, "bbox": [0, 0, 40, 30], "iscrowd": 1, "area": 1000.0},
    {"id": 102, "image_id": 7, "category_id": 3, "bbox": [20.5, 10.25, 11.5, 13.75], "iscrowd": 0},
]


def write_coco(root, images=IMAGES, annotations=ANNOTATIONS, categories=CATEGORIES) -> tuple[str, str]:
    """ROOT/images/<file_name> (a JPEG of the listed size each) and ROOT/instances.json; returns both paths."""
    folder = os.path.join(root, "images")
    for level, image in enumerate(images):
        path = os.path.join(folder, image["file_name"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(jpeg_bytes(level, image["height"], image["width"]))
    annotation_file = os.path.join(root, "instances.json")
    with open(annotation_file, "w") as f:
        json.dump({"images": images, "annotations": annotations, "categories": categories}, f)
    return annotation_file, folder


@pytest.fixture
def coco_files(tmp_path):
    return write_coco(str(tmp_path))


def rewrite(annotation_file: str, change) -> None:
    with open(annotation_file) as f:
        data = json.load(f)
    change(data)
    with open(annotation_file, "w") as f:
        json.dump(data, f)


# ---------------------------------------------------------------------------------------------
# COCO JSON
# ---------------------------------------------------------------------------------------------

def test_coco_samples_exact(coco_files):
    annotations, images = coco_files
    found = coco.coco_set(annotations, images)
    assert found.categories == {1: "cat", 3: "dog"}
    samples = found.samples
    assert [s.image_id for s in samples] == [7, 9, 42]
    assert [os.path.relpath(s.path, images) for s in samples] == ["a.jpg", "sub/c.jpg", "b.jpg"]
    assert [(s.width, s.height) for s in samples] == [(32, 24), (36, 28), (40, 30)]
    first = samples[0]
    np.testing.assert_array_equal(first.boxes, np.array([[2, 3, 12, 8], [20.5, 10.25, 32, 24]], np.float32))
    assert first.labels.tolist() == [1, 3] and first.labels.dtype == np.int64
    assert first.annotation_ids.tolist() == [100, 102]
    assert first.iscrowd.tolist() == [0, 0]
    assert first.area.tolist() == [44.5, 11.5 * 13.75]  # COCO's area where given, else the box's
    assert len(samples[1].labels) == 0 and samples[1].boxes.shape == (0, 4)
    assert samples[2].iscrowd.tolist() == [1] and samples[2].boxes.tolist() == [[0, 0, 40, 30]]


def test_images_without_annotations_dropped_on_request(coco_files):
    annotations, images = coco_files
    assert [s.image_id for s in coco.read_coco(annotations, images, keep_empty=False)] == [7, 42]


def test_malformed_json_named(coco_files):
    annotations, images = coco_files
    with open(annotations, "a") as f:
        f.write("{")
    with pytest.raises(DatasetError, match=r"instances.json: malformed JSON \(Extra data"):
        coco.read_coco(annotations, images)


def test_entry_missing_a_key_named(coco_files):
    annotations, images = coco_files
    rewrite(annotations, lambda d: d["annotations"][1].pop("bbox"))
    with pytest.raises(DatasetError, match=r"instances.json \(image 42, annotation 101\): an annotation entry "
                                           r"lacks bbox"):
        coco.read_coco(annotations, images)


def test_missing_image_named(coco_files):
    annotations, images = coco_files
    os.remove(os.path.join(images, "b.jpg"))
    with pytest.raises(DatasetError, match=r"images/b.jpg: image 42 of .*instances.json: file missing"):
        coco.read_coco(annotations, images)


@pytest.mark.parametrize("bbox,problem", [
    ([30, 3, 10, 5], r"bbox \[30, 3, 10, 5\] \(xyxy 30, 3, 40, 8\) is outside the 32 x 24 image"),
    ([-5, 3, 10, 5], r"bbox \[-5, 3, 10, 5\] .* is outside the 32 x 24 image"),
    ([2, 3, 0, 5], r"bbox \[2, 3, 0, 5\] has no area \(width 0, height 5\)"),
    ([2, 3, 10, -1], r"bbox \[2, 3, 10, -1\] has no area \(width 10, height -1\)"),
    ([2, 3, 10], r"bbox \[2, 3, 10\] is not four finite numbers"),
])
def test_bad_box_named_with_image_and_annotation(coco_files, bbox, problem):
    annotations, images = coco_files
    rewrite(annotations, lambda d: d["annotations"][0].update(bbox=bbox))
    with pytest.raises(DatasetError, match=r"instances.json \(image 7, annotation 100\): " + problem):
        coco.read_coco(annotations, images)


def test_box_within_the_edge_tolerance_is_clipped(coco_files):
    annotations, images = coco_files
    rewrite(annotations, lambda d: d["annotations"][0].update(bbox=[-0.5, 3, 32.9, 5]))  # 0.5 px past each side
    assert coco.read_coco(annotations, images)[0].boxes[0].tolist() == [0, 3, 32, 8]


def test_unknown_category_named(coco_files):
    annotations, images = coco_files
    rewrite(annotations, lambda d: d["annotations"][1].update(category_id=2))
    with pytest.raises(DatasetError, match=r"\(image 42, annotation 101\): category_id 2 is not among the "
                                           r"categories \(1, 3\)\. Add the category"):
        coco.read_coco(annotations, images)


def test_annotation_of_unknown_image_named(coco_files):
    annotations, images = coco_files
    rewrite(annotations, lambda d: d["annotations"][2].update(image_id=8))
    with pytest.raises(DatasetError, match=r"\(image 8, annotation 102\): no image with this id"):
        coco.read_coco(annotations, images)


def test_bad_annotations_dropped_on_request_and_counted(coco_files):
    annotations, images = coco_files

    def spoil(data):
        data["annotations"][0]["bbox"] = [2, 3, 0, 5]
        data["annotations"][1]["category_id"] = 5
    rewrite(annotations, spoil)
    with pytest.raises(DatasetError, match=r"annotation 100\): .* has no area .* \(1 more bad annotations"):
        coco.read_coco(annotations, images)
    with pytest.warns(UserWarning, match="2 bad annotations left out"):
        found = coco.coco_set(annotations, images, bad_boxes="drop", keep_empty=False)
    assert [d.where.rsplit("annotation ", 1)[1] for d in found.dropped] == ["100)", "101)"]
    assert [s.image_id for s in found.samples] == [7]  # 42 lost its only annotation, 9 never had one
    assert found.samples[0].annotation_ids.tolist() == [102]


def test_duplicate_ids_named(coco_files):
    annotations, images = coco_files
    rewrite(annotations, lambda d: d["images"].append(copy.deepcopy(d["images"][0])))
    with pytest.raises(DatasetError, match=r"\(image 42\): image id listed twice"):
        coco.read_coco(annotations, images)
    rewrite(annotations, lambda d: (d["images"].pop(), d["annotations"].append(dict(d["annotations"][0]))))
    with pytest.raises(DatasetError, match=r"\(image 7, annotation 100\): annotation id listed twice"):
        coco.read_coco(annotations, images)


def test_coco_from_object_storage(s3, tmp_path):
    annotations, images = write_coco(str(tmp_path))
    for root, _, names in os.walk(tmp_path):
        for name in names:
            path = os.path.join(root, name)
            s3.put(f"coco/{os.path.relpath(path, tmp_path)}", open(path, "rb").read())
    samples = coco.read_coco(s3.url("coco/instances.json"), s3.url("coco/images"))
    assert [(s.image_id, s.path) for s in samples] == [
        (7, s3.url("coco/images/a.jpg")), (9, s3.url("coco/images/sub/c.jpg")), (42, s3.url("coco/images/b.jpg"))]
    assert samples[0].boxes.tolist() == [[2, 3, 12, 8], [20.5, 10.25, 32, 24]]
    s3.client.delete_object(Bucket=s3.bucket, Key="coco/images/b.jpg")
    with pytest.raises(DatasetError, match=r"coco/images/b.jpg: image 42 of s3://.*file missing"):
        coco.read_coco(s3.url("coco/instances.json"), s3.url("coco/images"))


# ---------------------------------------------------------------------------------------------
# Detection shards: TFRecord (Object Detection API keys) and WebDataset (a JSON member per sample)
# ---------------------------------------------------------------------------------------------

def assert_same_samples(got, expected, exact_boxes=True):
    """Ids, labels, annotation ids, crowd flags exact; boxes exact or (normalised floats) within 1e-3 px."""
    assert [s.image_id for s in got] == [s.image_id for s in expected]
    assert [(s.width, s.height) for s in got] == [(s.width, s.height) for s in expected]
    for g, e in zip(got, expected):
        assert g.labels.tolist() == e.labels.tolist() and g.labels.dtype == np.int64
        assert g.annotation_ids.tolist() == e.annotation_ids.tolist()
        assert g.iscrowd.tolist() == e.iscrowd.tolist()
        np.testing.assert_allclose(g.area, e.area, rtol=1e-6)
        if exact_boxes:
            np.testing.assert_array_equal(g.boxes, e.boxes)
        else:
            np.testing.assert_allclose(g.boxes, e.boxes, atol=1e-3)


def _images_of(samples):
    return [open(s.path, "rb").read() for s in samples]


def test_tfrecord_shard_round_trip(coco_files, tmp_path):
    from dali_pipes.data.formats import detection_tfrecord as od
    annotations, images = coco_files
    samples = coco.read_coco(annotations, images)
    shard = str(tmp_path / "det.tfrecord")
    assert od.write_shard(shard, zip(samples, _images_of(samples)), {1: "cat", 3: "dog"}) == 3
    got = od.read_shards([shard])
    assert_same_samples(got, samples, exact_boxes=False)
    assert [od.image_bytes(s) for s in got] == _images_of(samples)
    assert [tuple(map(int, line.split())) for line in open(shard + ".idx")] == [s.extra for s in got]


def test_tfrecord_record_without_detection_keys_named(tmp_path):
    from dali_pipes.data.formats import detection_tfrecord as od
    from dali_pipes.data.formats.tfrecord import encode_example, frame_record
    shard = tmp_path / "classification.tfrecord"
    shard.write_bytes(frame_record(encode_example({"image/encoded": b"\xff\xd8", "image/class/label": 3})))
    with pytest.raises(DatasetError, match=r"classification.tfrecord#0: no feature image/height, image/width, "
                                           r"image/object/bbox/xmin"):
        od.read_shards([str(shard)])


def test_webdataset_shard_round_trip(coco_files, tmp_path):
    from dali_pipes.data.formats import detection_webdataset as wds
    annotations, images = coco_files
    samples = coco.read_coco(annotations, images)
    shard = str(tmp_path / "det.tar")
    items = [(f"s{i:03d}", s, data, "jpg") for i, (s, data) in enumerate(zip(samples, _images_of(samples)))]
    assert wds.write_shard(shard, items) == 3
    got = wds.read_shards([shard])
    assert_same_samples(got, samples)
    assert [wds.image_bytes(s) for s in got] == _images_of(samples)
    assert open(shard + ".idx").readline().split() == ["v1.2", "3"]


def test_webdataset_sample_without_json_named(tmp_path):
    import tarfile

    from dali_pipes.data.formats import detection_webdataset as wds
    from dali_pipes.data.formats.webdataset import add_member
    shard = str(tmp_path / "bad.tar")
    with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT) as tar:
        add_member(tar, "a.jpg", jpeg_bytes(1))
        add_member(tar, "a.json", b'{"image_id": 1, "width": 32, "height": 24, "boxes": [], "labels": []}')
        add_member(tar, "b.jpg", jpeg_bytes(2))
        add_member(tar, "b.cls", b"3")
    with pytest.raises(DatasetError, match=r"bad.tar#b: sample without an image or a .json member "
                                           r"\(members: cls, jpg\)"):
        wds.read_shards([shard])
    with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT) as tar:
        add_member(tar, "a.jpg", jpeg_bytes(1))
        add_member(tar, "a.json", b'{"image_id": 1, "width": 32, "boxes": [], "labels": []}')
    with pytest.raises(DatasetError, match=r"bad.tar#a: .json member lacks height"):
        wds.read_shards([shard])


# tf.train.Example's messages (tensorflow/core/example/{example,feature}.proto), built with the protobuf
# package itself: records serialized the way TensorFlow serializes them, with no code of ours.
def _tf_example_class():
    descriptor_pb2 = pytest.importorskip("google.protobuf.descriptor_pb2")
    from google.protobuf import descriptor_pool, message_factory
    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="dali_pipes_test_example.proto", package="tftest",
                                               syntax="proto3")

    def message(name, *fields, parent=None):
        m = (parent.nested_type if parent else proto.message_type).add(name=name)
        for number, field_name, kind, label, type_name in fields:
            m.field.add(name=field_name, number=number, type=kind, label=label, type_name=type_name or None)
        return m
    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    message("BytesList", (1, "value", F.TYPE_BYTES, rep, ""))
    message("FloatList", (1, "value", F.TYPE_FLOAT, rep, ""))
    message("Int64List", (1, "value", F.TYPE_INT64, rep, ""))
    feature = message("Feature", (1, "bytes_list", F.TYPE_MESSAGE, opt, ".tftest.BytesList"),
                      (2, "float_list", F.TYPE_MESSAGE, opt, ".tftest.FloatList"),
                      (3, "int64_list", F.TYPE_MESSAGE, opt, ".tftest.Int64List"))
    feature.oneof_decl.add(name="kind")
    for field in feature.field:
        field.oneof_index = 0
    features = message("Features", (1, "feature", F.TYPE_MESSAGE, rep, ".tftest.Features.FeatureEntry"))
    entry = message("FeatureEntry", (1, "key", F.TYPE_STRING, opt, ""), (2, "value", F.TYPE_MESSAGE, opt,
                                                                         ".tftest.Feature"), parent=features)
    entry.options.map_entry = True
    message("Example", (1, "features", F.TYPE_MESSAGE, opt, ".tftest.Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tftest.Example"))


def _od_api_example(Example, image: dict, anns: list, jpeg: bytes, names: dict):
    """One image's Example as the OD API's create_coco_tf_record.create_tf_example builds it."""
    w, h = image["width"], image["height"]
    example = Example()
    feature = example.features.feature
    feature["image/height"].int64_list.value.append(h)
    feature["image/width"].int64_list.value.append(w)
    feature["image/filename"].bytes_list.value.append(image["file_name"].encode())
    feature["image/source_id"].bytes_list.value.append(str(image["id"]).encode())
    feature["image/key/sha256"].bytes_list.value.append(b"0" * 64)
    feature["image/encoded"].bytes_list.value.append(jpeg)
    feature["image/format"].bytes_list.value.append(b"jpeg")
    for key, index, scale in (("xmin", 0, w), ("xmax", 0, w), ("ymin", 1, h), ("ymax", 1, h)):
        ends = [(a["bbox"][index] + (a["bbox"][index + 2] if key.endswith("max") else 0)) / scale for a in anns]
        feature[f"image/object/bbox/{key}"].float_list.value.extend(ends)
    feature["image/object/class/text"].bytes_list.value.extend(names[a["category_id"]].encode() for a in anns)
    feature["image/object/class/label"].int64_list.value.extend(a["category_id"] for a in anns)
    feature["image/object/is_crowd"].int64_list.value.extend(a["iscrowd"] for a in anns)
    feature["image/object/area"].float_list.value.extend(a.get("area", 0.0) for a in anns)
    return example


def _tf_frame(data: bytes) -> bytes:
    """TFRecordWriter's frame, from the TFRecord format's text (not tfrecord.py's)."""
    import struct

    import google_crc32c

    def masked(b):
        crc = google_crc32c.value(b)
        return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)
    length = struct.pack("<Q", len(data))
    return length + masked(length) + data + masked(data)


def test_tfrecord_written_as_the_od_api_writes_it_reads_back(coco_files, tmp_path):
    from dali_pipes.data.formats import detection_tfrecord as od
    Example = _tf_example_class()
    annotations, images = coco_files
    names = {c["id"]: c["name"] for c in CATEGORIES}
    shard = tmp_path / "od_api.tfrecord"
    ordered = sorted(IMAGES, key=lambda i: i["id"])
    with open(shard, "wb") as f:
        for image in ordered:
            anns = [a for a in ANNOTATIONS if a["image_id"] == image["id"]]
            jpeg = open(os.path.join(images, image["file_name"]), "rb").read()
            f.write(_tf_frame(_od_api_example(Example, image, anns, jpeg, names).SerializeToString()))
    got = od.read_shards([str(shard)])
    expected = coco.read_coco(annotations, images)
    assert [s.annotation_ids.tolist() for s in got] == [[-1, -1], [], [-1]]  # the OD API writes no annotation ids
    np.testing.assert_allclose(np.concatenate([s.boxes for s in got]), np.concatenate([s.boxes for s in expected]),
                               atol=1e-4)
    assert [s.labels.tolist() for s in got] == [[1, 3], [], [3]]
    assert [s.image_id for s in got] == [7, 9, 42] and [s.iscrowd.tolist() for s in got] == [[0, 0], [], [1]]
    assert [od.image_bytes(s)[:2] for s in got] == [b"\xff\xd8"] * 3


def test_tfrecord_we_write_parses_as_tensorflows_example(coco_files, tmp_path):
    from dali_pipes.data.formats import detection_tfrecord as od
    from dali_pipes.data.formats.tfrecord import walk_records
    Example = _tf_example_class()
    annotations, images = coco_files
    samples = coco.read_coco(annotations, images)
    shard = str(tmp_path / "ours.tfrecord")
    od.write_shard(shard, zip(samples, _images_of(samples)), {1: "cat", 3: "dog"})
    parsed = [Example.FromString(data).features.feature for _, _, data, _ in walk_records(shard)]
    first, empty = parsed[0], parsed[1]
    assert first["image/object/bbox/xmin"].float_list.value == pytest.approx([2 / 32, 20.5 / 32])
    assert first["image/object/bbox/ymax"].float_list.value == pytest.approx([8 / 24, 1.0])
    assert list(first["image/object/class/label"].int64_list.value) == [1, 3]
    assert list(first["image/object/class/text"].bytes_list.value) == [b"cat", b"dog"]
    assert first["image/source_id"].bytes_list.value == [b"7"] and first["image/format"].bytes_list.value == [b"jpeg"]
    assert (first["image/height"].int64_list.value, first["image/width"].int64_list.value) == ([24], [32])
    # an image without boxes: every list present, each of its own type (TensorFlow's parser checks types)
    assert empty["image/object/bbox/xmin"].WhichOneof("kind") == "float_list"
    assert empty["image/object/class/label"].WhichOneof("kind") == "int64_list"
    assert len(empty["image/object/bbox/xmin"].float_list.value) == 0


# ---------------------------------------------------------------------------------------------
# dali-pipes convert / verify
# ---------------------------------------------------------------------------------------------

def run_cli(capsys, *argv):
    from dali_pipes.tools.cli import main
    try:
        status = main(list(argv))
    except SystemExit as e:  # a bad-input error: sys.exit("error: ...")
        status = e.code if isinstance(e.code, int) else 1
        capsys.readouterr()
        return status, str(e.code)
    out = capsys.readouterr()
    return status, out.out + out.err


@pytest.mark.parametrize("kind,ext", [("tfrecord", ".tfrecord"), ("webdataset", ".tar")])
def test_convert_coco_to_detection_shards_with_manifest(coco_files, tmp_path, capsys, kind, ext):
    from dali_pipes.data import manifest
    from dali_pipes.data.formats import detection_tfrecord, detection_webdataset
    annotations, images = coco_files
    out = tmp_path / "shards"
    status, text = run_cli(capsys, "convert", kind, annotations, str(out), "--images", images, "--shards", "2")
    assert status == 0, text
    assert "3 samples -> 2 shards" in text and "3 boxes in 2 categories" in text
    shards = sorted(str(p) for p in out.glob(f"instances-*{ext}"))
    assert [os.path.basename(s) for s in shards] == [f"instances-0000{i}-of-00002{ext}" for i in (0, 1)]
    written = manifest.read(str(out / "manifest.json"))
    assert written["task"] == "detection" and written["kind"] == kind and written["samples"] == 3
    assert written["categories"] == [{"id": 1, "name": "cat"}, {"id": 3, "name": "dog"}]
    assert sum(s["boxes"] for s in written["shards"]) == 3
    reader = detection_tfrecord if kind == "tfrecord" else detection_webdataset
    got = sorted(reader.read_shards(shards), key=lambda s: s.image_id)
    assert_same_samples(got, coco.read_coco(annotations, images), exact_boxes=kind == "webdataset")
    status, text = run_cli(capsys, "verify", str(out))
    assert status == 0 and text.endswith(f"{kind} detection shards, 3 samples checked, 0 problems\n"), text


def test_convert_refuses_an_image_of_another_size(coco_files, tmp_path, capsys):
    annotations, images = coco_files
    rewrite(annotations, lambda d: d["images"][0].update(width=41))
    status, text = run_cli(capsys, "convert", "tfrecord", annotations, str(tmp_path / "o"), "--images", images,
                           "--shards", "1")
    assert status != 0
    assert "b.jpg: image 42: the file is 40 x 30, the JSON says 41 x 30" in text


def test_convert_coco_needs_its_images(coco_files, tmp_path, capsys):
    annotations, _ = coco_files
    status, text = run_cli(capsys, "convert", "webdataset", annotations, str(tmp_path / "o"))
    assert status != 0 and "instances.json: a COCO JSON comes with its image folder. Pass --images" in text


def test_verify_coco_names_every_bad_annotation(coco_files, capsys):
    annotations, images = coco_files

    def spoil(data):
        data["annotations"][0]["bbox"] = [30, 3, 10, 5]  # past the right edge of the 32 px image
        data["annotations"][1]["category_id"] = 2
        data["annotations"][2]["bbox"] = [1, 1, 0, 4]
        data["annotations"].append({"id": 103, "image_id": 5, "category_id": 1, "bbox": [0, 0, 1, 1]})
    rewrite(annotations, spoil)
    os.remove(os.path.join(images, "sub", "c.jpg"))
    status, text = run_cli(capsys, "verify", annotations, "--images", images)
    assert status == 1
    lines = text.splitlines()
    named = [line.split("): ", 1)[0].rsplit("(", 1)[1] for line in lines if ", annotation " in line]
    assert named == ["image 7, annotation 100", "image 42, annotation 101", "image 7, annotation 102",
                     "image 5, annotation 103"]
    assert any(line.endswith("sub/c.jpg: image 9 of " + annotations + ": file missing") for line in lines)
    assert lines[-1].endswith("coco, 3 samples checked, 5 problems")


def test_verify_detection_shards_names_bad_boxes_and_labels(coco_files, tmp_path, capsys):
    from dali_pipes.data.detection import detection_sample
    from dali_pipes.tools.convert_detection import write_detection_shards
    annotations, images = coco_files
    found = coco.coco_set(annotations, images)
    a, b = found.samples[0], found.samples[2]
    bad = detection_sample(a.path, a.image_id, a.width, a.height, [[2, 3, 40, 8], [5, 5, 5, 9]], [1, 4],
                           annotation_ids=[100, 102])  # outside the 32 px width; no area; label 4 unknown
    spoiled = coco.CocoSet([bad, b], found.categories, [])
    for kind in ("tfrecord", "webdataset"):
        out = tmp_path / kind
        write_detection_shards(spoiled, str(out), kind=kind, shards=1, progress=False)
        status, text = run_cli(capsys, "verify", str(out))
        assert status == 1, text
        problems = [line.split("#0 ", 1)[1] for line in text.splitlines() if "#0 " in line]
        assert problems == [
            "(image 7, annotation 100): box [2.0, 3.0, 40.0, 8.0] (xyxy) is outside the 32 x 24 image",
            "(image 7, annotation 102): box [5.0, 5.0, 5.0, 9.0] (xyxy) has no area",
            "(image 7, annotation 102): label 4 is not among the categories (1, 3) of the manifest"], text


# ---------------------------------------------------------------------------------------------
# dali-pipes sample --detection
# ---------------------------------------------------------------------------------------------

def test_sample_detection_boxes_are_where_the_objects_are(tmp_path, capsys):
    from PIL import Image

    from dali_pipes.tools.sample_data import load_photo
    from dali_pipes.tools.sample_detection import OBJECTS
    from dali_pipes.tools.verify_detection import verify_coco
    status, text = run_cli(capsys, "sample", str(tmp_path), "--detection", "--categories", "3", "--train-images",
                           "6", "--val-images", "2", "--min-side", "96", "--max-side", "128", "--workers", "1")
    assert status == 0, text
    found = coco.coco_set(str(tmp_path / "annotations" / "instances_train.json"), str(tmp_path / "images" / "train"))
    assert found.categories == {1: "astronaut", 2: "chelsea", 3: "coffee"}
    assert [s.image_id for s in found.samples] == [1, 2, 3, 4, 5, 6]
    boxes = sum(len(s.labels) for s in found.samples)
    assert f"instances_train.json: 6 train images, {boxes} boxes in 3 categories" in text and boxes > 0
    for sample in found.samples:
        pixels = np.asarray(Image.open(sample.path).convert("RGB"), np.float32)
        for (x0, y0, x1, y1), label in zip(sample.boxes.astype(int).tolist(), sample.labels.tolist()):
            obj = Image.fromarray(load_photo(OBJECTS[label - 1])).resize((x1 - x0, y1 - y0), Image.BILINEAR)
            ref = np.asarray(obj, np.float32)
            crop = pixels[y0:y1, x0:x1]
            error = min(np.abs(crop - ref).mean(), np.abs(crop - ref[:, ::-1]).mean())  # pasted flipped or not
            assert error < 12, (sample.image_id, label, error)  # JPEG's error; another object or place: >> 12
    assert verify_coco(found.samples[0].path.rsplit("/images/", 1)[0] + "/annotations/instances_val.json",
                       str(tmp_path / "images" / "val")).problems == []


def test_sample_detection_same_seed_same_bytes(tmp_path):
    from dali_pipes.tools.sample_detection import DetectionSampleConfig, make_detection_sample
    cfg = DetectionSampleConfig(categories=2, train_images=2, val_images=0, min_side=64, max_side=64)
    for name in ("a", "b"):
        make_detection_sample(str(tmp_path / name), cfg, workers=1, progress=False)
    for relative in ("annotations/instances_train.json", "images/train/train_000001.jpg"):
        assert (tmp_path / "a" / relative).read_bytes() == (tmp_path / "b" / relative).read_bytes()


def test_train_and_val_converted_into_one_folder_keep_the_detection_manifest(coco_files, tmp_path, capsys):
    from dali_pipes.data import manifest
    annotations, images = coco_files
    out = str(tmp_path / "shards")
    for prefix in ("train", "val"):
        status, text = run_cli(capsys, "convert", "webdataset", annotations, out, "--images", images, "--shards",
                               "1", "--prefix", prefix)
        assert status == 0, text
    written = manifest.read(os.path.join(out, "manifest.json"))
    assert [s["name"] for s in written["shards"]] == ["train-00000-of-00001.tar", "val-00000-of-00001.tar"]
    assert written["task"] == "detection" and written["samples"] == 6 and len(written["categories"]) == 2


@pytest.mark.parametrize("kind", ["tfrecord", "webdataset"])
def test_convert_to_and_verify_in_object_storage(coco_files, s3, capsys, kind):
    from dali_pipes.data.formats import detection_tfrecord, detection_webdataset
    from dali_pipes.storage import remote, remote_urls
    annotations, images = coco_files
    out = s3.url(f"det/{kind}/")
    status, text = run_cli(capsys, "convert", kind, annotations, out, "--images", images, "--shards", "2")
    assert status == 0, text
    names = sorted(remote_urls.basename(o.url) for o in remote.list_objects(out))
    ext = ".tfrecord" if kind == "tfrecord" else ".tar"
    assert names == sorted(["manifest.json"] + [f"instances-0000{i}-of-00002{ext}{idx}" for i in (0, 1)
                                                for idx in ("", ".idx")])
    reader = detection_tfrecord if kind == "tfrecord" else detection_webdataset
    shards = [s3.url(f"det/{kind}/instances-0000{i}-of-00002{ext}") for i in (0, 1)]
    got = sorted(reader.read_shards(shards), key=lambda s: s.image_id)
    assert [s.image_id for s in got] == [7, 9, 42] and [s.labels.tolist() for s in got] == [[1, 3], [], [3]]
    assert reader.image_bytes(got[0]) == open(os.path.join(images, "a.jpg"), "rb").read()
    status, text = run_cli(capsys, "verify", out)
    assert status == 0 and "detection shards, 3 samples checked, 0 problems" in text, text


def test_dali_tfrecord_reader_reads_our_detection_records(coco_files, tmp_path):
    """DALI's own TFRecord reader (CPU) parses the records: images, box lists (an empty one too) and labels."""
    from nvidia.dali import fn, pipeline_def
    from nvidia.dali import tfrecord as tfrec

    from dali_pipes.data.formats import detection_tfrecord as od
    annotations, images = coco_files
    samples = coco.read_coco(annotations, images)
    shard = str(tmp_path / "det.tfrecord")
    od.write_shard(shard, zip(samples, _images_of(samples)), {1: "cat", 3: "dog"})
    features = {od.IMAGE: tfrec.FixedLenFeature((), tfrec.string, ""), od.LABEL: tfrec.VarLenFeature(tfrec.int64, 0),
                **{k: tfrec.VarLenFeature(tfrec.float32, 0.0) for k in (od.XMIN, od.YMIN, od.XMAX, od.YMAX)}}

    @pipeline_def(batch_size=3, num_threads=1, device_id=None)
    def pipe():
        read = fn.readers.tfrecord(path=shard, index_path=shard + ".idx", features=features, name="Reader")
        return tuple(read[k] for k in (od.IMAGE, od.LABEL, od.XMIN, od.YMIN, od.XMAX, od.YMAX))

    p = pipe()
    p.build()
    image, label, *corners = p.run()
    del p
    for i, sample in enumerate(samples):
        assert np.array(image[i]).tobytes() == _images_of([sample])[0]
        assert np.array(label[i]).tolist() == sample.labels.tolist()
        boxes = np.stack([np.array(c[i]) for c in corners], axis=-1) * np.array([sample.width, sample.height] * 2)
        np.testing.assert_allclose(boxes.reshape(-1, 4), sample.boxes, atol=1e-3)


def test_sample_detection_reads_through_the_references_v1_conversion(torchvision, tmp_path):
    """The references' v1 get_coco (ConvertCocoPolysToMask) reads every annotation's polygon, as real COCO has
    one: the built-in set gives each paste its rectangle, so their script runs on it under DataLoader too."""
    import detection_refs as R
    import torch

    from dali_pipes.tools.sample_detection import DetectionSampleConfig, make_detection_sample
    make_detection_sample(str(tmp_path), DetectionSampleConfig(categories=2, train_images=3, val_images=0,
                                                               min_side=64, max_side=80), workers=1, progress=False)
    annotations = json.load(open(tmp_path / "annotations" / "instances_train.json"))["annotations"]
    for a in annotations:
        x, y, w, h = a["bbox"]
        assert a.get("segmentation") == [[x, y, x + w, y, x + w, y + h, x, y + h]]
    dataset = R.v1_coco_detection(str(tmp_path / "images" / "train"),
                                  str(tmp_path / "annotations" / "instances_train.json"),
                                  R.Compose([R.ConvertCocoPolysToMask(), R.PILToTensor()]))
    batches = list(torch.utils.data.DataLoader(dataset, batch_size=1, collate_fn=lambda b: tuple(zip(*b))))
    assert sum(len(targets[0]["boxes"]) for _, targets in batches) == len(annotations) > 0
