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
