"""DaliLoader(location) over detection data (issue 35): a COCO JSON with its image folder (images=), or the
detection shards `dali-pipes convert` writes (TFRecord with the Object Detection API's keys, WebDataset with a
JSON member), local or in a store, read as the references' loop expects: (images, targets) tuples, the
references' preset chosen by name, each rank its slice, exact mid-epoch resume and the bad-image budget."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import detection_refs
import numpy as np
import pytest
import torch
from PIL import Image

from dali_pipes import DaliLoader
from dali_pipes.data.formats import coco
from dali_pipes.errors import DatasetError
from dali_pipes.tools.convert_detection import write_detection_shards

pytest_plugins = ["s3_server"]

# (height, width) and boxes (x, y, w, h, category) per image id; image 6 has none (val keeps it, train leaves it
# out, as the references' Subset does); 8 images: 2 ranks read 4 each.
IMAGES = {
    3: ((40, 56), [(4, 6, 20, 12, 1), (30, 10, 20, 24, 3)]),
    5: ((48, 48), [(10, 12, 8, 8, 2)]),
    6: ((36, 44), []),
    11: ((56, 40), [(1, 1, 30, 50, 1), (5, 20, 12, 14, 3), (20, 2, 15, 9, 2)]),
    12: ((32, 60), [(0, 0, 60, 32, 1)]),
    20: ((44, 44), [(2, 30, 40, 12, 2)]),
    21: ((40, 40), [(8, 8, 16, 20, 3)]),
    30: ((36, 52), [(10, 8, 16, 16, 2), (40, 4, 10, 30, 1)]),
}


@pytest.fixture(scope="module")
def coco_dir(tmp_path_factory):
    """images/NNN.jpg (smooth gradients, left to right and top to bottom, so a flip shows) and annotations.json."""
    root = tmp_path_factory.mktemp("coco_location")
    (root / "images").mkdir()
    images, annotations = [], []
    for image_id, ((h, w), boxes) in IMAGES.items():
        y, x = np.mgrid[0:h, 0:w]
        pixels = np.stack([x * 255 // w, y * 255 // h, np.full_like(x, 7 * image_id)], -1).astype(np.uint8)
        Image.fromarray(pixels).save(root / "images" / f"{image_id:03d}.jpg", quality=95)
        images.append({"id": image_id, "file_name": f"{image_id:03d}.jpg", "height": h, "width": w})
        annotations += [{"id": 100 * image_id + k, "image_id": image_id, "bbox": [bx, by, bw, bh], "category_id": c,
                         "iscrowd": 0, "area": float(bw * bh)} for k, (bx, by, bw, bh, c) in enumerate(boxes)]
    categories = [{"id": i, "name": f"c{i}"} for i in (1, 2, 3)]
    with open(root / "annotations.json", "w") as f:
        json.dump({"images": images, "annotations": annotations, "categories": categories}, f)
    return root


@pytest.fixture(scope="module")
def locations(coco_dir):
    """{format: (location, keywords)}: the COCO JSON and its shards in both formats (2 shards each)."""
    found = coco.coco_set(str(coco_dir / "annotations.json"), str(coco_dir / "images"))
    out = {"coco": (str(coco_dir / "annotations.json"), {"images": str(coco_dir / "images")})}
    for kind in ("tfrecord", "webdataset"):
        write_detection_shards(found, str(coco_dir / kind), kind=kind, shards=2, prefix="val", progress=False)
        out[kind] = (str(coco_dir / kind), {})
    return out


def read_all(loader) -> list[tuple[torch.Tensor, dict]]:
    return [pair for images, targets in loader for pair in zip(images, targets)]


def by_id(pairs) -> dict[int, tuple[torch.Tensor, dict]]:
    return {int(target["image_id"]): (image, target) for image, target in pairs}


def as_file_says(coco_dir) -> dict[int, tuple[list, list]]:
    """{image id: (xyxy boxes, labels)} of the annotation file itself."""
    return {s.image_id: (s.boxes.tolist(), s.labels.tolist())
            for s in coco.read_coco(str(coco_dir / "annotations.json"), str(coco_dir / "images"))}


@pytest.mark.parametrize("kind", ["coco", "tfrecord", "webdataset"])
def test_each_format_by_location_reads_the_annotation_file_exactly(coco_dir, locations, kind):
    location, keywords = locations[kind]
    loader = DaliLoader(location, batch_size=3, device="cpu", **keywords)
    assert len(loader) == 3  # val: 8 images, the last batch short
    for _ in range(2):  # two epochs
        got = by_id(read_all(loader))
        assert sorted(got) == sorted(IMAGES)  # each image once per epoch
        for image_id, (boxes, labels) in as_file_says(coco_dir).items():
            image, target = got[image_id]
            (h, w), _ = IMAGES[image_id]
            assert image.dtype == torch.float32 and tuple(image.shape) == (3, h, w) and 0 <= image.min() <= 1
            assert target["labels"].tolist() == labels and target["labels"].dtype == torch.int64
            np.testing.assert_allclose(target["boxes"].numpy(), np.array(boxes, np.float32).reshape(-1, 4), atol=1e-3)
            assert set(target) == {"boxes", "labels", "image_id", "area", "iscrowd"}


def test_by_location_is_the_coco_detection_form_with_the_eval_transform(torchvision, coco_dir, locations):
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2
    from torchvision.transforms import v2
    preset = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float, scale=True), v2.ToPureTensor()])  # DetectionPresetEval
    base = CocoDetection(str(coco_dir / "images"), str(coco_dir / "annotations.json"), transforms=preset)
    dataset = wrap_dataset_for_transforms_v2(base, target_keys=["boxes", "labels", "image_id"])
    theirs = by_id(read_all(DaliLoader(dataset, batch_size=2, device="cpu", collate_fn=lambda b: tuple(zip(*b)))))
    for kind, (location, keywords) in locations.items():
        ours = by_id(read_all(DaliLoader(location, batch_size=2, device="cpu", **keywords)))
        assert sorted(ours) == sorted(theirs), kind
        for image_id, (image, target) in theirs.items():
            assert torch.equal(ours[image_id][0], image), (kind, image_id)  # the same decode, the same pixels
            if "boxes" in target:  # the v2 wrapper gives an image without annotations its image_id alone
                assert ours[image_id][1]["labels"].tolist() == target["labels"].tolist()
                np.testing.assert_allclose(ours[image_id][1]["boxes"], target["boxes"].float(), atol=1e-3)


def test_train_hflip_moves_the_boxes_with_the_flipped_pixels(locations):
    location, keywords = locations["tfrecord"]
    originals = by_id(read_all(DaliLoader(location, batch_size=4, device="cpu")))
    loader = DaliLoader(location, batch_size=2, device="cpu", train=True, data_augmentation="hflip", seed=3)
    flips = 0
    for _ in range(3):  # three epochs
        got = by_id(read_all(loader))
        assert len(got) == 6 and 6 not in got  # 7 with boxes; 3 per rank... one rank here: 7 // 2 * 2 = 6
        for image_id, (image, target) in got.items():
            original, expected = originals[image_id]
            width = original.shape[-1]
            flipped = torch.equal(image, original.flip(-1))
            assert flipped or torch.equal(image, original)  # a flip is read back from the pixels
            boxes = expected["boxes"].clone()
            if flipped:
                boxes[:, [0, 2]] = width - expected["boxes"][:, [2, 0]]
            flips += flipped
            assert (target["boxes"] - boxes).abs().max() <= 1.0 and target["labels"].tolist() == \
                expected["labels"].tolist()
    assert 0 < flips < 18  # p=0.5 over 18 draws


def test_presets_by_name_are_the_references_v2_presets(torchvision):
    """preset_augment(name) reads as the references' DetectionPresetTrain(data_augmentation=name, use_v2=True)."""
    from collections import defaultdict

    from torchvision import tv_tensors
    from torchvision.transforms import v2

    from dali_pipes.graph.detection_transforms import detection_augment, preset_augment
    mean = (123.0, 117.0, 104.0)
    steps = {"hflip": [v2.RandomHorizontalFlip(p=0.5)],
             "multiscale": [v2.RandomShortestSize(min_size=(480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800),
                                                  max_size=1333), v2.RandomHorizontalFlip(p=0.5)],
             "ssd": [v2.RandomPhotometricDistort(),
                     v2.RandomZoomOut(fill=defaultdict(lambda: mean, {tv_tensors.Mask: 0})), v2.RandomIoUCrop(),
                     v2.RandomHorizontalFlip(p=0.5)],
             "ssdlite": [v2.RandomIoUCrop(), v2.RandomHorizontalFlip(p=0.5)],
             "lsj": [v2.ScaleJitter(target_size=(1024, 1024), antialias=True),
                     detection_refs.FixedSizeCrop(size=(1024, 1024), fill=mean), v2.RandomHorizontalFlip(p=0.5)]}
    tail = [v2.ToDtype(torch.float, scale=True), v2.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.XYXY),
            v2.SanitizeBoundingBoxes(), v2.ToPureTensor()]
    for name, middle in steps.items():
        theirs, _ = detection_augment(v2.Compose([v2.ToImage(), *middle, *tail]))
        assert preset_augment(name, train=True) == theirs, name
    theirs, _ = detection_augment(v2.Compose([v2.ToImage(), v2.ToDtype(torch.float, scale=True), v2.ToPureTensor()]))
    assert dataclasses.replace(preset_augment("ssd", train=False), steps=()) == dataclasses.replace(theirs, steps=())
    with pytest.raises(ValueError, match=r"data_augmentation='mosaic': the presets read are hflip, .*lsj"):
        preset_augment("mosaic", train=True)


def test_a_mid_epoch_state_resumes_exactly(locations):
    location, keywords = locations["webdataset"]

    def make():
        return DaliLoader(location, batch_size=2, device="cpu", train=True, data_augmentation="ssdlite", seed=5)
    first = make()
    read_all(first)  # epoch 0
    it = iter(first)
    head = [next(it), next(it)]
    state = first.state_dict()
    rest = list(it) + list(first)  # the rest of epoch 1, then epoch 2
    second = make()
    second.load_state_dict(state)
    again = list(second) + list(second)
    assert len(rest) == len(again) == 1 + 3 and head
    for (images, targets), (images2, targets2) in zip(rest, again):
        assert [t["image_id"] for t in targets] == [t["image_id"] for t in targets2]
        assert all(torch.equal(a, b) for a, b in zip(images, images2))  # the same random crops and flips
        assert all(torch.equal(a["boxes"], b["boxes"]) for a, b in zip(targets, targets2))


def images_with_a_bad_one(coco_dir, tmp_path):
    """A copy of the COCO set's images in which image 11 (011.jpg) does not decode."""
    images = tmp_path / "images"
    images.mkdir()
    for name in os.listdir(coco_dir / "images"):
        (images / name).write_bytes((coco_dir / "images" / name).read_bytes())
    (images / "011.jpg").write_bytes(b"not a JPEG at all, only its name")
    return images


def test_a_bad_image_is_named_and_skipped_with_skip_bad(coco_dir, tmp_path):
    images = images_with_a_bad_one(coco_dir, tmp_path)
    annotations = str(coco_dir / "annotations.json")
    with pytest.raises(DatasetError, match=r"decoding failed: .*011.jpg \(image 11\).*does not decode"):
        read_all(DaliLoader(annotations, images=str(images), batch_size=3, device="cpu"))
    loader = DaliLoader(annotations, images=str(images), batch_size=3, device="cpu", skip_bad=True)
    with pytest.warns(UserWarning, match=r"excluding a bad image.*011.jpg \(image 11\)"):
        got = by_id(read_all(loader))
    assert sorted(got) == sorted(set(IMAGES) - {11}) and len(loader.bad_samples) == 1
    assert sorted(by_id(read_all(loader))) == sorted(set(IMAGES) - {11})  # the next epoch leaves it out too
    with pytest.raises(DatasetError, match="over the budget of 0"), pytest.warns(UserWarning, match="011.jpg"):
        read_all(DaliLoader(annotations, images=str(images), batch_size=3, device="cpu", skip_bad=True, max_bad=0))


def test_object_storage_reads_as_local(s3, coco_dir, locations):
    for root, _, names in os.walk(coco_dir):
        for name in names:
            path = os.path.join(root, name)
            s3.put(f"det/{os.path.relpath(path, coco_dir)}", open(path, "rb").read())
    local = {kind: by_id(read_all(DaliLoader(loc, batch_size=3, device="cpu", **kw)))
             for kind, (loc, kw) in locations.items()}
    remote_forms = {"coco": (s3.url("det/annotations.json"), {"images": s3.url("det/images")}),
                    "tfrecord": (s3.url("det/tfrecord/"), {}), "webdataset": (s3.url("det/webdataset"), {})}
    for kind, (location, keywords) in remote_forms.items():
        got = by_id(read_all(DaliLoader(location, batch_size=3, device="cpu", storage_attempts=2, **keywords)))
        assert sorted(got) == sorted(local[kind]), kind
        for image_id, (image, target) in local[kind].items():
            assert torch.equal(got[image_id][0], image) and torch.equal(got[image_id][1]["boxes"], target["boxes"])


def test_errors_name_the_file_and_the_fix(coco_dir, locations, tmp_path, s3, monkeypatch):
    from dali_pipes.data.source import open_source
    from dali_pipes.storage import remote

    from s3_server import closed_endpoint
    annotations = str(coco_dir / "annotations.json")
    with pytest.raises(DatasetError, match=r"annotations.json: a COCO JSON is read with its image folder. Pass "
                                           r"images="):
        DaliLoader(annotations, batch_size=2, device="cpu")
    for name in os.listdir(coco_dir / "images"):
        if name != "012.jpg":
            (tmp_path / name).write_bytes((coco_dir / "images" / name).read_bytes())
    with pytest.raises(DatasetError, match=r"/012.jpg: image 12 of .*annotations.json: file missing. Check the image "
                                           r"folder \(images="):
        DaliLoader(annotations, images=str(tmp_path), batch_size=2, device="cpu")
    with pytest.raises(DatasetError, match=r"tfrecord/manifest.json: detection shards .*DaliLoader\(location"):
        open_source(locations["tfrecord"][0])
    classification = tmp_path / "cls"
    classification.mkdir()
    (classification / "manifest.json").write_text(json.dumps({"format": "dali_pipes manifest", "kind": "tfrecord"}))
    with pytest.raises(DatasetError, match=r"data_augmentation= given, but this is no detection data \(its manifest "
                                           r".*cls/manifest.json says task 'classification'\).*dali-pipes convert"):
        DaliLoader(str(classification), batch_size=2, data_augmentation="hflip", device="cpu")
    with pytest.raises(TypeError, match=r"takes no image_size; its keywords: .*data_augmentation"):
        DaliLoader(locations["webdataset"][0], batch_size=2, image_size=224, device="cpu")
    signed = "https://store.invalid/coco/annotations.json?X-Amz-Signature=s3cr3t&token=t0k3n"
    for call in ({}, {"images": "https://store.invalid/coco/images", "image_size": 224}):
        with pytest.raises((DatasetError, TypeError)) as refused:  # told a COCO JSON by its name, not its query
            DaliLoader(signed, batch_size=2, device="cpu", **call)
        assert "store.invalid/coco/annotations.json" in str(refused.value)
        assert "s3cr3t" not in str(refused.value) and "t0k3n" not in str(refused.value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed := closed_endpoint())
    with pytest.raises(remote.UnreachableError, match=f"cannot reach the S3 endpoint {closed} after 2 attempts"):
        DaliLoader("s3://any-bucket/det/", batch_size=2, device="cpu", storage_attempts=2, storage_timeout=2)


JOB = """
import json, sys
from dali_pipes import DaliLoader
location, out = sys.argv[1], sys.argv[2]
result = {}
for name, train in (("val", False), ("train", True)):
    loader = DaliLoader(location, batch_size=2, device="cpu", train=train, seed=1)
    result[name] = [[int(t["image_id"]) for t in targets] for _ in range(2) for images, targets in loader]
    result[name + "_len"] = len(loader)
import os
json.dump(result, open(f"{out}/rank{os.environ['RANK']}.json", "w"))
"""


def test_two_ranks_under_torchrun_read_disjoint_slices(locations, tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(tmp_path / "job.py"), locations["tfrecord"][0], str(tmp_path)],
                          env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(2)]
    val = [sum(r["val"], []) for r in ranks]  # two epochs each
    for rank in val:
        assert rank[:4] == rank[4:]  # val: the same slice every epoch
    assert not set(val[0][:4]) & set(val[1][:4]) and sorted(val[0][:4] + val[1][:4]) == sorted(IMAGES)
    assert ranks[0]["val_len"] == ranks[1]["val_len"] == 2
    train = [r["train"] for r in ranks]  # 7 images with boxes: 3 per rank, one batch of 2 each epoch
    assert ranks[0]["train_len"] == 1 and all(len(r) == 2 and all(len(b) == 2 for b in r) for r in train)
    for epoch in range(2):
        assert not set(train[0][epoch]) & set(train[1][epoch]) and 6 not in train[0][epoch] + train[1][epoch]


def ids_of(batches) -> list[list[int]]:
    return [[int(t["image_id"]) for t in targets] for images, targets in batches]


def old_ranks_after_one_batch(location, keywords, world, **options):
    """(the image ids each old rank delivered, every old rank's state): each rank reads one batch of epoch 0."""
    delivered, states = [], []
    for rank in range(world):
        loader = DaliLoader(location, rank=rank, world_size=world, **keywords, **options)
        delivered += sum(ids_of([next(iter(loader))]), [])
        states.append(loader.state_dict())
    return delivered, states


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("new_world", [3, 1])
def test_elastic_resume_gives_the_rest_of_the_epoch_once_then_the_new_world_size_epochs(locations, train,
                                                                                         new_world):
    location, keywords = locations["tfrecord"]
    options = {"batch_size": 1 if train else 2, "device": "cpu", "train": train, "seed": 3, "val_padding": "none"}
    full = set(IMAGES) - ({6} if train else set())
    epoch = {i for rank in range(2) for i in sum(ids_of(DaliLoader(location, rank=rank, world_size=2, **keywords,
                                                                   **options)), [])}  # epoch 0 on 2 ranks
    assert epoch <= full and len(full - epoch) == (1 if train else 0)  # train: 7 images = 2 ranks x 3 + a tail
    before, states = old_ranks_after_one_batch(location, keywords, 2, **options)
    new = [DaliLoader(location, rank=rank, world_size=new_world, **keywords, **options) for rank in range(new_world)]
    for loader in new:
        loader.load_state_dict(states)
    rest = [sum(ids_of(loader), []) for loader in new]
    after = before + sum(rest, [])
    assert len(after) == len(set(after)) and set(after) <= epoch  # none twice, nothing outside the epoch
    if train:  # the rest (4 images) split evenly: the tail that fills no rank's share is left out, as in an epoch
        assert len(set(epoch) - set(after)) == 4 % new_world and len({len(r) for r in rest}) == 1
    else:
        assert set(after) == epoch
    for rank, loader in enumerate(new):  # then the new world size's epochs, as a fresh run on it draws them
        fresh = DaliLoader(location, rank=rank, world_size=new_world, **keywords, **options)
        fresh.set_epoch(1)
        assert ids_of(loader) == ids_of(fresh)


def test_a_state_taken_in_the_rest_of_an_epoch_resumes_exactly_and_elastically(locations):
    location, keywords = locations["webdataset"]
    options = {"batch_size": 1, "device": "cpu", "val_padding": "none"}
    before, states = old_ranks_after_one_batch(location, keywords, 2, **options)  # 6 of 8 images left

    def resumed(world, states):
        loaders = [DaliLoader(location, rank=rank, world_size=world, **keywords, **options) for rank in range(world)]
        for loader in loaders:
            loader.load_state_dict(states)
        return loaders
    middle = resumed(3, states)
    iters = [iter(loader) for loader in middle]
    head = sum((ids_of([next(it)]) for it in iters), [])  # one batch of its 2 on each of 3 ranks
    later = [loader.state_dict() for loader in middle]
    tails = [list(it) for it in iters]
    for rank, loader in enumerate(resumed(3, later)):  # the same world size: the rest of each rank's part exactly
        again = list(loader)
        assert ids_of(again) == ids_of(tails[rank]) and all(
            torch.equal(a, b) for (x, _), (y, _) in zip(again, tails[rank]) for a, b in zip(x, y))
    rest = sum((sum(ids_of(loader), []) for loader in resumed(2, later)), [])  # and on 2 ranks again
    assert sorted(before + sum(head, []) + rest) == sorted(IMAGES)


def test_elastic_resume_merges_the_old_ranks_bad_images(coco_dir, tmp_path):
    images = images_with_a_bad_one(coco_dir, tmp_path)
    keywords = {"images": str(images)}
    options = {"batch_size": 2, "device": "cpu", "skip_bad": True, "val_padding": "none"}
    with pytest.warns(UserWarning, match=r"excluding a bad image.*011.jpg \(image 11\)"):  # old rank 1's first batch
        before, states = old_ranks_after_one_batch(str(coco_dir / "annotations.json"), keywords, 2, **options)
    new = [DaliLoader(str(coco_dir / "annotations.json"), rank=rank, world_size=3, **keywords, **options)
           for rank in range(3)]
    for loader in new:
        loader.load_state_dict(states)
        assert [b.origin for b in loader.bad_samples] == [f"{images / '011.jpg'} (image 11)"]
    after = before + sum((sum(ids_of(loader), []) for loader in new), [])
    assert sorted(after) == sorted(set(IMAGES) - {11})
    with pytest.raises(ValueError, match=r"another detection dataset or loader \(batch_size: 2 in the state, 3 here"):
        DaliLoader(str(coco_dir / "annotations.json"), rank=0, world_size=3, **keywords,
                   **{**options, "batch_size": 3}).load_state_dict(states)
    with pytest.raises(ValueError, match=r"pass the state of every old rank, in rank order: got 1 state"):
        new[0].load_state_dict(states[:1])


def test_a_state_saved_right_after_an_elastic_resume_resumes_exactly_on_every_rank(locations, tmp_path):
    """2 ranks -> 3 after one batch of 3 each: 2 images left, one for new rank 0, one for rank 1, none for rank 2,
    which still runs an empty rest of the epoch before the next, in step with the others. Each rank's state saved
    before it iterates, loaded into a fresh loader, gives every epoch the loader that was never saved gives."""
    location, keywords = locations["coco"]
    options = {"batch_size": 3, "device": "cpu", "train": False, "val_padding": "none"}
    _, states = old_ranks_after_one_batch(location, keywords, 2, **options)

    def resumed(rank, state):
        loader = DaliLoader(location, rank=rank, world_size=3, **keywords, **options)
        loader.load_state_dict(state)
        return loader
    for rank in range(3):
        torch.save(resumed(rank, states).state_dict(), tmp_path / f"rank{rank}.pt")
        state = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        if rank < 2:  # a state written before "unfinished" was kept: its position tells, as it did
            older = {key: value for key, value in state.items() if key != "unfinished"}
            assert ids_of(resumed(rank, older)) == ids_of(resumed(rank, states))
        again, kept = resumed(rank, state), resumed(rank, states)
        for epoch in range(3):  # the rest of epoch 0 (empty on rank 2), then epochs 1 and 2
            want, got = list(kept), list(again)
            assert ids_of(got) == ids_of(want), (rank, epoch)
            assert all(torch.equal(a, b) for (x, _), (y, _) in zip(got, want) for a, b in zip(x, y))
            assert epoch or (len(ids_of(want)) == (0 if rank == 2 else 1))
