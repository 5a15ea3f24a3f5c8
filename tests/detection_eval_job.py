"""One rank of a torchrun job (gloo, CPU) that evaluates tests/test_detection_eval.py's seeded model over a COCO
val set as torchvision's detection references do on several processes: DistributedSampler(dataset_test,
shuffle=False), batch_size=1, each rank's predictions gathered (CocoEvaluator.synchronize_between_processes),
COCOeval over them; once through DataLoader, once through DaliLoader. Writes OUT/rank<R>.json: the image ids
each rank read and, gathered, both loaders' 12 stats. Not a test: tests/test_detection_eval.py runs it.

    torchrun --nproc_per_node 2 tests/detection_eval_job.py IMAGES ANNOTATIONS OUT
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def main(images: str, annotations: str, out: str) -> None:
    from torchvision_side import import_torchvision
    import_torchvision()
    from test_detection_eval import PixelDetector, coco_stats, collate_fn, evaluate, v1_val

    from dali_pipes import DaliLoader
    warnings.filterwarnings("ignore", message=".*without masks")  # v1: said once per loader, expected here
    dist.init_process_group("gloo")
    dataset, model = v1_val((images, annotations)), PixelDetector().eval()
    result: dict = {}
    for name, make in (("theirs", DataLoader), ("ours", DaliLoader)):
        kwargs = {"device": "cpu"} if make is DaliLoader else {}
        loader = make(dataset, batch_size=1, sampler=DistributedSampler(dataset, shuffle=False),
                      collate_fn=collate_fn, **kwargs)
        predictions, _ = evaluate(model, loader)
        result[f"read_{name}"] = list(predictions)
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, {k: {n: t.tolist() for n, t in v.items()} for k, v in predictions.items()})
        merged = {k: {n: torch.tensor(t) for n, t in v.items()} for part in gathered for k, v in part.items()}
        result[f"stats_{name}"] = coco_stats(dataset.coco, merged)
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
