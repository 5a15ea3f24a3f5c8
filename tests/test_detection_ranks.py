"""Detection under torchrun on 2 ranks (gloo, CPU), as torchvision's detection references run it
(tests/detection_ranks_job.py): training through DistributedSampler with aspect-ratio groups or a plain
BatchSampler, set_epoch each epoch, and evaluation through DistributedSampler(shuffle=False) with batch_size=1;
each rank's batches of image ids are DataLoader's under the same sampler, v1 and v2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

JOB = os.path.join(os.path.dirname(__file__), "detection_ranks_job.py")
# (height, width) of the training images: wide, tall and square ones (three aspect-ratio groups); the last has
# no annotation (the references' Subset leaves it out), so 10 of 11 are trained on, 5 per rank.
TRAIN_SIZES = [(24, 48), (32, 32), (48, 24), (24, 40), (30, 30), (40, 20), (20, 44), (36, 36), (44, 22), (28, 28),
               (26, 26)]
VAL_SIZES = [(30, 40), (40, 30), (32, 32), (24, 48), (36, 28)]  # 5: DistributedSampler pads rank 1's share
VAL_IDS = [101, 102, 103, 104, 105]


def _write(root, name: str, sizes, first_id: int, empty: set[int]) -> list[int]:
    images, annotations = [], []
    for n, (h, w) in enumerate(sizes):
        image_id = first_id + n
        y, x = np.mgrid[0:h, 0:w]
        pixels = np.stack([x * 255 // w, y * 255 // h, np.full_like(x, 9 * n)], -1).astype(np.uint8)
        Image.fromarray(pixels).save(root / "images" / f"{image_id}.jpg", quality=95)
        images.append({"id": image_id, "file_name": f"{image_id}.jpg", "height": h, "width": w})
        if image_id not in empty:
            annotations.append({"id": 1000 + image_id, "image_id": image_id, "bbox": [2, 3, w // 2, h // 2],
                                "category_id": 1 + n % 2, "iscrowd": 0, "area": float(w // 2 * h // 2),
                                "segmentation": [[2, 3, 2 + w // 2, 3, 2 + w // 2, 3 + h // 2]]})
    categories = [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    with open(root / name, "w") as f:
        json.dump({"images": images, "annotations": annotations, "categories": categories}, f)
    return [image["id"] for image in images]


@pytest.fixture(scope="module")
def coco_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("coco_ranks")
    (root / "images").mkdir()
    _write(root, "train.json", TRAIN_SIZES, 1, empty={len(TRAIN_SIZES)})
    _write(root, "val.json", VAL_SIZES, VAL_IDS[0], empty={VAL_IDS[2]})  # an image without boxes is evaluated too
    return root


@pytest.fixture(scope="module")
def coco_ranks_run(torchvision, coco_ranks, tmp_path_factory):
    """tests/detection_ranks_job.py on 2 ranks over the fixture's COCO set: each rank's results."""
    out = tmp_path_factory.mktemp("coco_ranks_out")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([os.path.dirname(JOB), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           JOB, str(coco_ranks), str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.load(open(out / f"rank{rank}.json")) for rank in range(2)]


def test_references_train_and_eval_loaders_under_torchrun_are_dataloaders_on_each_rank(coco_ranks_run):
    ranks = coco_ranks_run
    trained = set(range(1, len(TRAIN_SIZES)))
    for form in ("v1", "v2"):  # v1 through aspect-ratio groups, v2 through a plain BatchSampler
        runs = [result[f"train_{form}"] for result in ranks]
        for run in runs:
            assert run["ours"] == run["theirs"], form  # per epoch, per batch, in order
            assert run["len"] == [2, 2] and all(len(epoch) == 2 for epoch in run["ours"])
            assert run["ours"][0] != run["ours"][1]  # set_epoch: each epoch its own draw
        for epoch in range(2):
            seen = [set(sum(run["ours"][epoch], [])) for run in runs]
            assert seen[0] | seen[1] <= trained and seen[0] != seen[1]  # each rank its own share
        val = [result[f"val_{form}"] for result in ranks]
        for result in val:
            assert result["ours"] == result["theirs"] and result["len"] == [3, 3]
            assert result["gathered_ours"] == result["gathered_theirs"] == [val[0]["ours"], val[1]["ours"]]
            assert result["pixels"] <= 2 / 255 and result["boxes"] <= 1.0
        reads = val[0]["ours"] + val[1]["ours"]
        # every val image read, in DistributedSampler's order; its padding repeats the first image on rank 1, as
        # under DataLoader (the references' evaluator keeps one result per image id)
        assert sorted(set(reads)) == VAL_IDS and len(reads) == 6
        assert val[0]["ours"] == VAL_IDS[0::2] and val[1]["ours"] == VAL_IDS[1::2] + VAL_IDS[:1]


def test_ranks_seeded_alike_draw_their_own_flips(coco_ranks_run):
    """torch.manual_seed(0) on every rank (DaliLoader's seed is torch's): each rank's DALI draws are its own,
    as the classification pipelines' are (ranks must not flip or crop the same positions alike)."""
    for form in ("v1", "v2"):
        flips = [result[f"train_{form}"]["flips"] for result in coco_ranks_run]
        assert sum(len(batch) for batch in flips[0]) == 8 and flips[0] != flips[1], form


def test_each_ranks_state_taken_mid_epoch_resumes_that_rank_exactly(coco_ranks_run):
    """Under torchrun, each rank's state_dict taken after the first batch of an epoch (DistributedSampler in the
    references' GroupedBatchSampler, v1, or a BatchSampler, v2), loaded into a fresh loader over a fresh sampler:
    the rest of the epoch and the next one are the uninterrupted rank's, image ids, boxes and flips."""
    for form in ("v1", "v2"):
        runs = [result[f"resume_{form}"] for result in coco_ranks_run]
        for run in runs:
            assert run["rest"] and run["next"], form
            assert run["resumed_rest"] == run["rest"] and run["resumed_next"] == run["next"], form
        assert runs[0]["rest"] != runs[1]["rest"]  # each rank resumed its own share
