"""One rank of a torchrun job (gloo, CPU) for tests/test_sharding.py: reads a numbered file list for
two epochs with DaliLoader built as MODE says, and writes OUT/rank<R>.json: the labels it got per
epoch, or the error that stopped it. Not a test: torchrun runs it once per rank.

    torchrun --nproc_per_node 2 tests/sharding_job.py LIST OUT MODE
MODE: right (rank and world size from the environment), all_rank0 (every rank built with rank=0,
world_size=2), local_as_rank (rank=LOCAL_RANK), val_right, val_all_rank0; listing (LIST is an image folder: rank 1
opens it after an image was added to it, then both build a loader: OUT/rank<R>.json holds the error and the
seconds the build took).
"""

import json
import os
import shutil
import sys
import time

import torch.distributed as dist

from dali_pipes import DaliLoader, DatasetError, open_source


def listing(folder: str, out: str) -> None:
    """The ranks list the folder at different moments: an image is added between rank 0's listing and rank 1's."""
    rank = dist.get_rank()
    if rank == 0:
        source = open_source(folder)
    dist.barrier()
    if rank == 1:
        first = sorted(os.listdir(os.path.join(folder, "cat")))[0]
        shutil.copy(os.path.join(folder, "cat", first), os.path.join(folder, "cat", "added.jpg"))
        source = open_source(folder)
    start, result = time.monotonic(), {}
    try:
        DaliLoader(source, batch_size=2, train=True, device="cpu", num_threads=1, image_size=16, seed=0).close()
    except DatasetError as error:
        result["error"] = str(error)
    result["seconds"] = time.monotonic() - start
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def main(data: str, out: str, mode: str) -> None:
    dist.init_process_group("gloo")
    if mode == "listing":
        listing(data, out)
        dist.destroy_process_group()
        return
    train = not mode.startswith("val_")
    shard = {"right": {}, "all_rank0": {"rank": 0, "world_size": 2},
             "local_as_rank": {"rank": int(os.environ["LOCAL_RANK"]), "world_size": 2}}[mode.removeprefix("val_")]
    loader = DaliLoader(data, batch_size=4, train=train, device="cpu", num_threads=1, image_size=16, seed=0, **shard)
    result = {"epochs": []}
    try:
        for epoch in range(2):
            loader.set_epoch(epoch)
            result["epochs"].append([label for _, labels in loader for label in labels.tolist()])
    except DatasetError as error:
        result["error"] = str(error)
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(result, f)
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
