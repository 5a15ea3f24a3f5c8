"""Validation loops shaped like real scripts' (tests/val_loop_job.py), 2 ranks under torchrun (gloo, CPU),
with a val count that is not a multiple of the batch and one small against world_size x batch: no crash,
no nan, equal batch counts, and the counts and top-1 the data says (the oracle is right on even labels)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from conftest import write_folder, write_one_per_class

JOB = os.path.join(os.path.dirname(__file__), "val_loop_job.py")
_LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "TORCHELASTIC_RUN_ID")
SETS = {"65 at batch 32": ((20, 21, 24), 32), "5 at batch 4": ((2, 1, 2), 4)}


@pytest.fixture(scope="module", params=list(SETS))
def val_set(request, tmp_path_factory):
    counts, batch = SETS[request.param]
    root = tmp_path_factory.mktemp("val") / "images"
    write_folder(str(root), counts=counts)
    return str(root), counts, batch


LOOPS = ("per_batch", "at_end", "examples")


@pytest.fixture(scope="module")
def loop_results(val_set, tmp_path_factory, torchvision) -> dict:
    """Each loop's result on val_set: {loop: result}. One torchrun job runs the three loops one after the other
    (a job is 3 processes importing torch); each test case below checks its own loop's result."""
    folder, _, batch = val_set
    out = tmp_path_factory.mktemp("loops")
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a rank that aborts (a rare SIGABRT seen twice, cause unknown) shows its stacks
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", JOB, folder,
           str(out), "--loop", *LOOPS, "--batch", str(batch)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return read_each(out, LOOPS)


def read_each(out, names) -> dict:
    """{name: the JSON a job wrote to OUT/NAME.json} for each name."""
    results = {}
    for name in names:
        with open(out / f"{name}.json") as f:
            results[name] = json.load(f)
    return results


@pytest.mark.parametrize("loop", LOOPS)
def test_validation_loop_counts_exactly_without_nan(val_set, loop_results, loop):
    _, counts, batch = val_set
    n, even = sum(counts), counts[0] + counts[2]
    result = loop_results[loop]
    assert result["finite"] and len(set(result["batches"])) == 1 or loop == "at_end"
    if loop == "per_batch":  # DistributedSampler's count per rank, repeats included
        assert result["count"] == math.ceil(n / 2) and 0 <= result["top1"] <= 100
        assert result["batches"] == [math.ceil(math.ceil(n / 2) / batch)] * 2
    else:  # every sample exactly once
        assert result["count"] == n
        assert result["top1"] == pytest.approx(100 * even / n)


FORMS = ("location", "dataset")


@pytest.fixture(scope="module")
def sync_metrics(val_set, tmp_path_factory, torchvision) -> dict:
    """Rank 0's logged metrics after a fit on val_set, per form: {form: metrics}. One 2-rank Lightning job fits
    once per form, one after the other (a job is 2 processes importing Lightning); each test case below checks
    its own form's metrics."""
    pytest.importorskip("lightning", reason="Lightning is an optional extra: "
                        "pip install '.[lightning]' (from the dali_pipes checkout)")
    folder, _, batch = val_set
    out = tmp_path_factory.mktemp("sync")
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV}
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env.update(PYTHONPATH=os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p), MASTER_ADDR="127.0.0.1")
    job = os.path.join(os.path.dirname(__file__), "lightning_sync_job.py")
    done = subprocess.run([sys.executable, job, folder, str(out), str(batch), *FORMS], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return read_each(out, FORMS)


@pytest.mark.parametrize("form", FORMS)
def test_lightning_module_logging_with_sync_dist(val_set, sync_metrics, form):
    _, counts, _ = val_set
    metrics = sync_metrics[form]
    assert all(math.isfinite(metrics[k]) for k in ("val_loss", "val_acc"))
    assert metrics["val_count"] == 2 * math.ceil(sum(counts) / 2)  # DistributedSampler's count: sharded


# --- torchvision's references' recipes, DataLoader -> DaliLoader, under torchrun (tests/recipes_job.py) ----------

RECIPES_JOB = os.path.join(os.path.dirname(__file__), "recipes_job.py")
TRAIN_N, VAL_N = 22, 23  # one image per class; 22 per-rank halves of 11 (batches 4, 4, 3); 23: a val remainder
TRAIN_RECIPES = ("mixup_cutmix_erasing", "bicubic_augmix", "repeated_augmentation")
DRAWN_RECIPES = ("bicubic_augmix", "repeated_augmentation")  # WeightedRandomSampler, repeated augmentation


@pytest.fixture(scope="module")
def recipes(tmp_path_factory, torchvision):
    """Both ranks' results of tests/recipes_job.py: {recipe: {"DataLoader"|"DaliLoader": [epoch, ...]}}."""
    root = tmp_path_factory.mktemp("recipes")
    train, val = write_one_per_class(str(root / "train"), TRAIN_N), write_one_per_class(str(root / "val"), VAL_N)
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in (os.path.dirname(RECIPES_JOB),
                                                                           env.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           RECIPES_JOB, train, val, str(root)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = []
    for rank in range(2):
        with open(root / f"rank{rank}.json") as f:
            results.append(json.load(f))
    return results


def _shapes(epochs: list) -> list:
    return [(e["len"], [(b["images"], b["targets"], b["dtype"]) for b in e["batches"]]) for e in epochs]


def _gathered(results: list, recipe: str, loader: str, epoch: int) -> list:
    """The labels both ranks' batches held in `epoch`, rank 0's first."""
    return [label for result in results for batch in result[recipe][loader][epoch]["batches"]
            for label in batch["labels"]]


def test_the_references_recipes_under_torchrun_batch_as_dataloader_does(recipes):
    """Renaming DataLoader to DaliLoader keeps, on every rank and epoch, len(loader), the batches per epoch and
    each batch's image and target shapes and dtype, for the mixup + cutmix + erasing, bicubic + AugMix and
    repeated-augmentation recipes and both val forms."""
    for result in recipes:
        for recipe, loaders in result.items():
            assert _shapes(loaders["DaliLoader"]) == _shapes(loaders["DataLoader"]), recipe
    batch_sizes = {recipe: [b["images"][0] for b in loaders["DaliLoader"][0]["batches"]]
                   for recipe, loaders in recipes[0].items()}
    assert batch_sizes == {"mixup_cutmix_erasing": [4, 4, 3], "bicubic_augmix": [4, 4, 4, 4, 2],
                           "repeated_augmentation": [4, 4, 2], "references_val": [4, 4, 4],
                           "examples_val": [4, 4, 3, 1]}


def test_drawn_samplers_under_torchrun_give_each_rank_dataloaders_samples_in_order(recipes):
    """A WeightedRandomSampler on each rank and a repeated-augmentation sampler (set_epoch, 3 repetitions,
    trimmed) give each rank DataLoader's samples in DataLoader's order, epoch after epoch."""
    for result in recipes:
        for recipe in DRAWN_RECIPES:
            ours, theirs = ([[b["labels"] for b in epoch["batches"]] for epoch in result[recipe][loader]]
                            for loader in ("DaliLoader", "DataLoader"))
            assert ours == theirs and ours[0] != ours[1], recipe  # set_epoch (or the generator) drew anew
    first = [[b["labels"] for b in result["repeated_augmentation"]["DaliLoader"][0]["batches"]] for result in recipes]
    assert first[0] != first[1]  # each rank its own part of the repeated draw


def test_mixup_cutmix_from_the_references_closure_under_torchrun_mixes_every_sample_once(recipes):
    """The collate_fn closure over v2 RandomChoice([MixUp, CutMix]) with a DistributedSampler: soft targets
    (N, classes) whose rows sum to 1 and whose per-class mass, gathered over the ranks, is each sample once
    per epoch, as DataLoader's."""
    for loader in ("DaliLoader", "DataLoader"):
        for epoch in range(2):
            batches = [b for result in recipes for b in result["mixup_cutmix_erasing"][loader][epoch]["batches"]]
            assert all(s == pytest.approx(1.0, abs=1e-5) for b in batches for s in b["row_sums"]), loader
            mass = [sum(b["mass"][c] for b in batches) for c in range(TRAIN_N)]
            assert mass == pytest.approx([1.0] * TRAIN_N, abs=1e-4), (loader, epoch)


def test_val_under_torchrun_counts_as_dataloader_and_the_subset_remainder_reads_each_sample_once(recipes):
    """The references' DistributedSampler(shuffle=False) val: DataLoader's count (ceil(N / 2) per rank, every
    sample, the one repeat included). pytorch/examples' drop_last=True sampler plus the Subset remainder read
    on every rank: each val sample counted exactly once, as DataLoader's."""
    for loader in ("DaliLoader", "DataLoader"):
        for epoch in range(2):
            references = _gathered(recipes, "references_val", loader, epoch)
            assert len(references) == 2 * math.ceil(VAL_N / 2) and set(references) == set(range(VAL_N)), loader
            examples = [result["examples_val"][loader][epoch] for result in recipes]
            sampled = [label for part in examples for b in part["batches"][:-part["rest"]] for label in b["labels"]]
            rest = [label for b in examples[0]["batches"][-examples[0]["rest"]:] for label in b["labels"]]
            assert sorted(sampled + rest) == list(range(VAL_N)) and rest == [VAL_N - 1], loader
