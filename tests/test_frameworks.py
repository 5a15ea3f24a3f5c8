"""DaliLoader where frameworks expect a stateful loader, each against the real library (skipped, with the reason,
where it is missing; all are in the [test] extra):
  * torchdata's StatefulDataLoader is the oracle of state_dict / load_state_dict: the same script runs both over
    the same torchvision ImageFolder, and the batches after a resume must be the same samples (ids, not pixels:
    DALI's decode differs slightly from PIL's);
  * torchdata.nodes: dali_pipes.nodes.DaliNode against torchdata's own nodes over the same folder;
  * Hugging Face Accelerate and Trainer on 2 processes (torchrun, CPU, gloo; tests/frameworks_job.py).
The folders hold one image per class, so a label names its sample."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys

import pytest
import torch

import dali_pipes
from dali_pipes import DaliLoader

from conftest import jpeg_bytes

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata 0.11's, at every loader

BATCH = 4
N = 10  # 3 batches an epoch: 4, 4, 2
JOB = os.path.join(os.path.dirname(__file__), "frameworks_job.py")
REPO = os.path.dirname(os.path.dirname(dali_pipes.__file__))
_LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "TORCHELASTIC_RUN_ID")


def need(module: str):
    return pytest.importorskip(module, reason=f"{module} is in the [test] extra: "
                               f"pip install '.[test]' (from the dali_pipes checkout)")


def write_one_per_class(root: str, n: int) -> str:
    """ROOT/c<i>/<i>.jpg for i < n: ImageFolder's label of each image is its index."""
    for i in range(n):
        os.makedirs(os.path.join(root, f"c{i:03d}"))
        with open(os.path.join(root, f"c{i:03d}", f"{i}.jpg"), "wb") as f:
            f.write(jpeg_bytes(i, 20 + i % 7, 28))
    return root


@pytest.fixture(scope="module")
def ids_folder(tmp_path_factory) -> str:
    return write_one_per_class(str(tmp_path_factory.mktemp("frameworks") / "images"), N)


@pytest.fixture
def val_dataset(ids_folder, torchvision):
    T = torchvision.transforms
    return torchvision.datasets.ImageFolder(ids_folder, T.Compose([T.Resize(16), T.CenterCrop(16), T.ToTensor()]))


def checkpointed(state: dict) -> dict:
    """A state as a checkpoint gives it back: torch.save, then torch.load's default (weights_only) load."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer)


def labels_of(loader) -> list[list[int]]:
    return [labels.tolist() for _, labels in loader]


def resume_script(make, stop, iterations: int = 2) -> list[list[list[int]]]:
    """Two epochs, the state taken at `stop` ("before" any batch, (epoch, batch) inside the loop, ("end", epoch)
    after the loop), then a new loader loads it and is iterated `iterations` times: its labels per iteration."""
    original, state = make(), None
    if stop == "before":
        state = original.state_dict()
    for epoch in range(2):
        for batch, _ in enumerate(original):
            if stop == (epoch, batch):
                state = original.state_dict()
        if stop == ("end", epoch):
            state = original.state_dict()
    resumed = make()
    resumed.load_state_dict(checkpointed(state))
    return [labels_of(resumed) for _ in range(iterations)]


# StatefulDataLoader's contract, the oracle


def stateful_dataloader(dataset, **kwargs):
    return need("torchdata.stateful_dataloader").StatefulDataLoader(dataset, batch_size=BATCH, **kwargs)


@pytest.mark.parametrize("stop", ["before", (0, 0), (0, 1), ("end", 0), (1, 0), ("end", 1)])
def test_a_state_resumes_where_statefuldataloaders_does(val_dataset, stop):
    """A state after k batches resumes at batch k; one taken before any batch, at the first; one taken after an
    epoch's loop ended, at the next epoch's start."""
    theirs = resume_script(lambda: stateful_dataloader(val_dataset, shuffle=False), stop)
    ours = resume_script(lambda: DaliLoader(val_dataset, batch_size=BATCH, shuffle=False), stop)
    assert ours == theirs
    assert sum(map(len, ours[0])) == N - {"before": 0, (0, 0): 4, (0, 1): 8, (1, 0): 4}.get(stop, 0)


@pytest.mark.parametrize("epoch", [0, 1])
def test_an_in_loop_state_after_an_epochs_last_batch_skips_statefuldataloaders_empty_epoch(val_dataset, epoch):
    """The one difference: StatefulDataLoader resumes a state taken inside the loop after the epoch's last batch
    with an empty epoch (its iterator had not yet raised StopIteration); DaliLoader with the next epoch at once.
    The batches in order are the same."""
    theirs = resume_script(lambda: stateful_dataloader(val_dataset, shuffle=False), (epoch, 2), iterations=3)
    ours = resume_script(lambda: DaliLoader(val_dataset, batch_size=BATCH, shuffle=False), (epoch, 2), iterations=2)
    whole = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert theirs == [[], whole, whole] and ours == [whole, whole]
    assert [b for it in theirs for b in it] == [b for it in ours for b in it]


def test_a_resumed_loader_states_what_it_loaded_and_an_empty_state_loads_nothing(val_dataset):
    for make in (lambda: stateful_dataloader(val_dataset, shuffle=False),
                 lambda: DaliLoader(val_dataset, batch_size=BATCH, shuffle=False)):
        original = make()
        next(iter(original))
        state = original.state_dict()
        resumed = make()
        resumed.load_state_dict(state)
        assert resumed.state_dict() == state  # before its first batch, as StatefulDataLoader's
        assert labels_of(resumed) == [[4, 5, 6, 7], [8, 9]]
        fresh = make()
        fresh.load_state_dict({})  # StatefulDataLoader's "nothing saved": load_state_dict(ckpt.get("loader", {}))
        assert labels_of(fresh) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_a_shuffled_epoch_resumes_exactly_in_both(ids_folder, torchvision):
    """Train, shuffled, a random transform: the rest after a resume is what the uninterrupted loader yielded,
    through the next epoch (each loader against itself: the two shuffle differently), and each epoch holds every
    sample once. (StatefulDataLoader given generator= resumes its interrupted epoch but not the next one's order,
    torchdata 0.11: its oracle runs on torch's global seed; DaliLoader takes the generator's seed.)"""
    T = torchvision.transforms
    dataset = torchvision.datasets.ImageFolder(ids_folder, T.Compose([T.RandomResizedCrop(16), T.ToTensor()]))
    seeded = torch.Generator().manual_seed(3)
    for make in (lambda: stateful_dataloader(dataset, shuffle=True),
                 lambda: DaliLoader(dataset, batch_size=BATCH, shuffle=True, generator=seeded)):
        original = make()
        epochs, state = [], None
        for epoch in range(2):
            epochs.append([])
            for batch, (_, labels) in enumerate(original):
                epochs[-1].append(labels.tolist())
                if (epoch, batch) == (0, 0):
                    state = original.state_dict()
        assert [sorted(sum(epoch, [])) for epoch in epochs] == [list(range(N))] * 2
        resumed = make()
        resumed.load_state_dict(checkpointed(state))
        assert [labels_of(resumed), labels_of(resumed)] == [epochs[0][1:], epochs[1]]


# torchdata.nodes


def torchdata_nodes(dataset):
    """torchdata's own nodes over the dataset: DataLoader's sequential batches, then a Mapper."""
    tn = need("torchdata.nodes")
    from torch.utils.data import SequentialSampler, default_collate
    node = tn.Mapper(tn.SamplerWrapper(SequentialSampler(dataset)), dataset.__getitem__)
    return tn.Loader(tn.Mapper(tn.Mapper(tn.Batcher(node, BATCH, drop_last=False), default_collate), tuple))


def dali_nodes(dataset):
    tn = need("torchdata.nodes")
    from dali_pipes.nodes import DaliNode
    return tn.Loader(tn.Mapper(DaliNode(DaliLoader(dataset, batch_size=BATCH, shuffle=False)), tuple))


@pytest.mark.parametrize("stop", ["before", (0, 0), (0, 2), ("end", 0), (1, 1)])
def test_a_dali_node_resumes_as_torchdatas_own_nodes(val_dataset, stop):
    """DaliNode in a nodes graph (a Mapper after it, torchdata's Loader at the root): the same batches as
    torchdata's own nodes, epoch after epoch and after a resume from Loader.state_dict(), the last batch of an
    epoch included (Loader restarts an exhausted iterator)."""
    theirs = resume_script(lambda: torchdata_nodes(val_dataset), stop)
    ours = resume_script(lambda: dali_nodes(val_dataset), stop)
    assert ours == theirs
    fresh = dali_nodes(val_dataset)
    assert [labels_of(fresh) for _ in range(2)] == [[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]] * 2
    assert len(fresh.root.source) == 3


# Hugging Face Accelerate and Trainer: 2 processes


def job_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV}  # a fresh launch, whatever runs pytest
    path = os.pathsep.join(p for p in (REPO, os.path.dirname(JOB), env.get("PYTHONPATH")) if p)
    return {**env, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}


def run_job(train: str, val: str, out: str, *phases: str) -> dict[str, list[dict]]:
    """torchrun with 2 CPU processes (Accelerate's CPU environment) running the phases one after the other; per
    phase, each rank's record, rank 0 first."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           JOB, train, val, out, *phases], capture_output=True, text=True, env=job_env(), timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return {phase: [json.load(open(os.path.join(out, f"{phase}_rank{rank}.json"))) for rank in range(2)]
            for phase in phases}


TRAIN_N, VAL_N = 40, 11  # train: 20 a rank, 5 batches; val: 6 + 5 a rank, 2 batches each (padded to 8)


@pytest.fixture(scope="module")
def job_folders(tmp_path_factory, torchvision) -> tuple[str, str, str]:
    root = tmp_path_factory.mktemp("hf")
    return write_one_per_class(str(root / "train"), TRAIN_N), write_one_per_class(str(root / "val"), VAL_N), str(root)


@pytest.fixture(scope="module")
def accelerate_jobs(job_folders) -> dict[str, list[dict]]:
    """Per phase of tests/frameworks_job.py, each rank's record. Two torchrun jobs: "first", then "resume" (a
    fresh job, as after a restart) followed in the same job by the Hugging Face Trainer's phase where transformers
    is installed (one job start fewer: each is 3 processes importing torch)."""
    need("accelerate")
    train, val, out = job_folders
    second = ("resume", "trainer") if importlib.util.find_spec("transformers") is not None else ("resume",)
    return {**run_job(train, val, out, "first"), **run_job(train, val, out, *second)}


@pytest.fixture(scope="module")
def accelerate_run(accelerate_jobs) -> tuple[list[dict], list[dict]]:
    return accelerate_jobs["first"], accelerate_jobs["resume"]


def test_accelerate_prepare_hands_daliloader_back_and_each_rank_reads_its_own_part(accelerate_run):
    first, _ = accelerate_run
    assert [r["passed_through"] for r in first] == [True, True]  # not re-wrapped: no second sharding, no move
    assert [(r["rank"], r["world_size"], r["backend"]) for r in first] == [(0, 2, "gloo"), (1, 2, "gloo")]
    for epoch in range(2):
        ranks = [sum(r["epochs"][epoch], []) for r in first]
        assert [len(labels) for labels in ranks] == [TRAIN_N // 2] * 2  # DataLoader(drop_last=False) counts
        assert sorted(ranks[0] + ranks[1]) == list(range(TRAIN_N))  # each sample once, on one rank


def test_accelerate_gather_for_metrics_counts_each_val_sample_once_with_label_padding(accelerate_run):
    first, _ = accelerate_run
    for rank in first:
        for val in rank["val"]:
            assert val["masked"] == list(range(VAL_N))  # labels -1 dropped: every val sample exactly once
            assert val["gathered"] == 2 * 2 * BATCH  # "label": the padding is not last on the last step, none cut
            assert val["repeat"] == VAL_N  # val_padding="repeat": the repeat cut off the last gathered step


def test_accelerate_save_state_and_load_state_resume_every_rank_exactly(accelerate_run):
    first, resumed = accelerate_run
    for rank in range(2):
        epochs = first[rank]["epochs"]
        assert resumed[rank]["rest"] == [epochs[0][3:], epochs[1]]  # saved after batch 2 of epoch 0


def test_a_daliloader_registered_by_itself_is_refused_on_rank_1_naming_rankstates(accelerate_run):
    _, resumed = accelerate_run
    assert resumed[0]["registered_itself"] == "loaded"
    message = resumed[1]["registered_itself"]
    assert "state of rank 0 loaded into rank 1" in message and "RankStates(loader)" in message


def test_hugging_face_trainer_trains_on_2_processes_and_counts_val_exactly(accelerate_jobs):
    need("transformers")
    ranks = accelerate_jobs["trainer"]
    assert [r["global_step"] for r in ranks] == [10, 10]  # 2 epochs of 5 steps: len(DaliLoader) per rank
    for epoch in range(2):
        seen = [r["seen"][epoch * 20:(epoch + 1) * 20] for r in ranks]
        assert sorted(seen[0] + seen[1]) == list(range(TRAIN_N))
    for rank in ranks:
        assert rank["counted"] == [list(range(VAL_N))] * 2
        assert [(e["eval_count"], e["eval_gathered"]) for e in rank["evals"]] == [(VAL_N, 16)] * 2
        assert "ignore_data_skip=True" in rank["resume_refused"]  # a mid-epoch resume, refused naming the way
        assert rank["resumed_global_step"] == 10


# transformers' run_image_classification_no_trainer.py, DataLoader renamed to DaliLoader (tests/hf_script_job.py)

HF_TRAIN, HF_VAL = (4, 3, 3), (3, 2, 2)  # 10 train, 7 val: an odd val split


@pytest.fixture(scope="module")
def hf_script_data(tmp_path_factory, torchvision) -> str:
    from conftest import write_folder
    root = tmp_path_factory.mktemp("hf_script")
    write_folder(str(root / "data" / "train"), HF_TRAIN)
    write_folder(str(root / "data" / "validation"), HF_VAL)
    return str(root)


def run_hf_script(root: str, loaders: tuple[str, ...], processes: int) -> list[list[dict]]:
    """One job runs the script once per loader class, one after the other; per loader, each rank's record."""
    job = os.path.join(os.path.dirname(JOB), "hf_script_job.py")
    launch = [sys.executable, job] if processes == 1 else [sys.executable, "-m", "torch.distributed.run",
                                                            "--standalone", "--nproc_per_node", str(processes), job]
    done = subprocess.run(launch + [os.path.join(root, "data"), root, *loaders], capture_output=True, text=True,
                          env=job_env(), timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return [[json.load(open(os.path.join(root, f"{loader}_{processes}_rank{rank}.json"))) for rank in range(processes)]
            for loader in loaders]


@pytest.mark.parametrize("processes", [1, 2])
def test_the_transformers_script_renamed_counts_train_steps_and_gathered_val_samples_as_dataloader(hf_script_data,
                                                                                               processes):
    need("accelerate")
    theirs, ours = run_hf_script(hf_script_data, ("DataLoader", "DaliLoader"), processes)
    for a, b in zip(ours, theirs):
        assert (a["len"], a["steps"]) == (b["len"], b["steps"])
        assert a["gathered"] == b["gathered"] == [sum(HF_VAL)] * 2
        assert a["labels"] == b["labels"]


def accumulation_syncs(loader, accelerator) -> list[tuple[bool, bool]]:
    """(end_of_dataloader, sync_gradients) at each step of one epoch under accumulate(), 2 steps accumulated."""
    model = torch.nn.Linear(1, 1)
    seen = []
    for _ in loader:
        with accelerator.accumulate(model):
            seen.append((accelerator.gradient_state.end_of_dataloader, accelerator.sync_gradients))
    return seen


def test_accumulate_syncs_the_gradients_at_a_daliloaders_last_batch_as_at_a_dataloaders(val_dataset):
    """3 batches an epoch, 2 steps accumulated: the third (the epoch's last) syncs, as Accelerate does for its own
    loaders; from the next epoch the count starts again. One process, in this process (its state reset after)."""
    accelerate = need("accelerate")
    from accelerate.state import AcceleratorState, GradientState
    from torch.utils.data import DataLoader
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
    try:
        theirs = accelerator.prepare(DataLoader(val_dataset, batch_size=BATCH))
        ours = DaliLoader(val_dataset, batch_size=BATCH)
        expected = [(False, False), (False, True), (True, True)]
        assert [accumulation_syncs(theirs, accelerator) for _ in range(2)] == [expected] * 2
        assert [accumulation_syncs(ours, accelerator) for _ in range(2)] == [expected] * 2
        assert accelerator.gradient_state.dataloader_references == [None]  # each epoch left it
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
