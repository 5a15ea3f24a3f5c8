"""DaliDataModule under Lightning: 2-rank DDP on CPU (gloo) counts every sample exactly, and resumes mid-epoch.

The DDP runs are subprocesses (tests/lightning_ddp_job.py): Lightning starts rank 1 by re-running sys.argv.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from lightning_ddp_args import BATCH_SIZE, LOADER_ARGS, RANKS

import dali_pipes
from dali_pipes import DaliLoader

N = 43  # odd: train drops a tail on each rank, val pads the two ranks' shards (21, 22) differently
EPOCHS = 2
BATCHES = (N // RANKS) // BATCH_SIZE  # train batches per rank per epoch: 5
JOB = os.path.join(os.path.dirname(__file__), "lightning_ddp_job.py")
REPO = os.path.dirname(os.path.dirname(dali_pipes.__file__))
_LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


@pytest.fixture(scope="module")
def pl():
    """lightning.pytorch, imported by the tests that need it, not at collection (~5 s of CPU in every xdist
    worker, most of which run none of these tests); skipped where the optional extra is not installed."""
    return pytest.importorskip("lightning.pytorch", reason="Lightning is an optional extra: "
                               "pip install '.[lightning]' (from the dali_pipes checkout)")


def job_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV}  # a fresh launch, whatever runs pytest
    path = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)  # the dali_pipes under test
    return {**env, "PYTHONPATH": path, "MASTER_ADDR": "127.0.0.1"}


def run_job(file_list: str, out: str, *args: str) -> list[dict]:
    """Run the DDP job to its end; each rank's record, rank 0 first."""
    done = subprocess.run([sys.executable, JOB, file_list, out, *args], capture_output=True, text=True,
                          env=job_env(), timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return read_records(out)


def read_records(out: str) -> list[dict]:
    records = []
    for rank in range(RANKS):
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            records.append(json.load(f))
    return records


@pytest.fixture(scope="module")
def uninterrupted(numbered, tmp_path_factory, pl) -> tuple[str, list[dict]]:
    """2 epochs on 2 ranks; checkpoints every 3 train steps (ModelCheckpoint), and training goes on."""
    out = tmp_path_factory.mktemp("uninterrupted")
    return out, run_job(numbered, str(out), "--epochs", str(EPOCHS), "--checkpoint-every", "3")


def train_labels(record: dict, epoch: int) -> list[int]:
    return [label for e, _, labels in record["train"] if e == epoch for label in labels]


def assert_val_counts_each_sample_once(records: list[dict], epochs: int) -> None:
    for epoch in range(epochs):
        real = [label for r in records for e, labels in r["val"] if e == epoch for label in labels]
        assert sorted(real) == list(range(N)), f"epoch {epoch}"


def test_ddp_counts_every_val_sample_once_and_loses_no_train_batch(numbered, uninterrupted):
    _, records = uninterrupted
    for record in records:
        # Lightning got our iterable, not a DataLoader it could re-shard with a DistributedSampler
        assert record["train_loader_type"] == "_LoaderView"
        assert record["len_train"] == record["num_training_batches"] == BATCHES
        assert record["len_val"] == 6  # shards of 21 and 22 samples, both padded with -1 to 6 batches of 4
        assert [(e, i) for e, i, _ in record["train"]] == [(e, i) for e in range(EPOCHS) for i in range(BATCHES)]
    for epoch in range(EPOCHS):
        labels = [label for record in records for label in train_labels(record, epoch)]
        assert len(labels) == len(set(labels)) == RANKS * BATCHES * BATCH_SIZE  # each sample at most once
        assert set(labels) <= set(range(N))
    assert_val_counts_each_sample_once(records, EPOCHS)
    # Lightning trained on exactly the batches the rank's loader yields alone: none dropped, added or reordered
    for rank, record in enumerate(records):
        loader = DaliLoader(numbered, batch_size=BATCH_SIZE, train=True, rank=rank, world_size=RANKS, **LOADER_ARGS)
        alone = [[epoch, i, labels.tolist()] for epoch in range(EPOCHS) for i, (_, labels) in enumerate(loader)]
        loader.close()
        assert record["train"] == alone


def test_resume_mid_epoch_continues_with_the_uninterrupted_batches(numbered, uninterrupted, tmp_path):
    """A fresh job resumes from the checkpoint written after step 3 of epoch 0's 5 (as after a job killed
    there): it trains on exactly the batches the uninterrupted run went on to, in order, across the epoch
    boundary that follows, and validates each sample once per epoch."""
    out, records = uninterrupted
    checkpoint = os.path.join(out, "epoch=0-step=3.ckpt")
    states = torch.load(checkpoint, weights_only=False)["DaliDataModule"]["train"]
    positions = [(s["loader"]["rank"], s["loader"]["epoch"], s["loader"]["position"]) for s in states]
    assert positions == [(0, 0, 3), (1, 0, 3)]  # rank 0 wrote both
    resumed = run_job(numbered, str(tmp_path), "--epochs", str(EPOCHS), "--ckpt", checkpoint)
    for after, whole in zip(resumed, records):
        assert after["train"] == whole["train"][3:]
    assert_val_counts_each_sample_once(resumed, EPOCHS)


def test_sigterm_under_lightning_checkpoints_that_step_and_a_rerun_goes_on_exactly(numbered, uninterrupted, tmp_path):
    """Lightning's own preemption handling with Lightning's OnExceptionCheckpoint: a real SIGTERM to rank 0
    of a 2-rank DDP job after step 7 (epoch 1, batch 1 of 5). Lightning forwards it to rank 1, both ranks stop
    after that step (SIGTERMException), and on_exception.ckpt holds both ranks' loader positions (gathered by
    DaliDataModule.state_dict). The same command run again resumes from it by itself and trains on exactly the
    batches the uninterrupted run went on to; then the checkpoint is removed (a finished run leaves none)."""
    out = str(tmp_path)
    job = subprocess.Popen([sys.executable, JOB, numbered, out, "--epochs", str(EPOCHS), "--on-exception-checkpoint",
                            "--wait-for-sigterm-at-step", "7"], env=job_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        while not all(os.path.exists(os.path.join(out, f"waiting-rank{r}")) for r in range(RANKS)):
            assert job.poll() is None, job.stdout.read()[-5000:]
            time.sleep(0.05)
        os.kill(job.pid, signal.SIGTERM)  # rank 0: the process the user (or the scheduler) started
        output = job.communicate(timeout=120)[0]
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 128 + signal.SIGTERM, output[-5000:]  # the job's except SIGTERMException
    assert "[rank: 1] Received SIGTERM" in output  # forwarded by Lightning: the test signalled rank 0 only
    stopped = read_records(out)
    checkpoint = torch.load(os.path.join(out, "on_exception.ckpt"), weights_only=False)
    assert checkpoint["global_step"] == 7
    states = checkpoint["DaliDataModule"]["train"]
    positions = [(s["loader"]["rank"], s["loader"]["epoch"], s["loader"]["position"]) for s in states]
    assert positions == [(0, 1, 2), (1, 1, 2)]
    rerun = run_job(numbered, out, "--epochs", str(EPOCHS), "--on-exception-checkpoint")  # no --ckpt: as requeued
    for before, after, whole in zip(stopped, rerun, uninterrupted[1]):
        assert before["train"] == whole["train"][:7]
        assert after["train"] == whole["train"][7:]
    real = sorted(label for r in rerun for e, labels in r["val"] if e == 1 for label in labels)
    assert real == list(range(N))  # epoch 1's validation, in the resumed job: each sample once
    assert not os.path.exists(os.path.join(out, "on_exception.ckpt"))


@pytest.mark.filterwarnings("ignore:Total length of `list` across ranks is zero")  # no val loader: on purpose
def test_one_device_without_val(numbered, tmp_path, pl):
    """No val location: Lightning skips validation. One process: nothing to gather. After fit() the
    pipelines are closed, but a checkpoint saved then still holds where the loader ended."""
    from lightning_ddp_job import Recorder

    from dali_pipes.lightning import DaliDataModule
    data = DaliDataModule(numbered, batch_size=BATCH_SIZE, **LOADER_ARGS)
    model = Recorder(num_classes=64)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(model, datamodule=data)
    labels = train_labels({"train": model.train_seen}, 0)
    assert len(labels) == len(set(labels)) == N // BATCH_SIZE * BATCH_SIZE and model.val_seen == []
    assert data.train_loader is None  # teardown closed the pipelines
    (state,) = data.state_dict()["train"]
    assert (state["loader"]["epoch"], state["loader"]["position"]) == (1, 0)


def test_state_waits_for_the_loader_and_must_fit_the_rank_count(numbered, pl):
    """A state loaded before setup() is applied when the loader is built; states that are not every old
    rank's, in order, are refused."""
    from dali_pipes.lightning import DaliDataModule
    data = DaliDataModule(numbered, batch_size=BATCH_SIZE, **LOADER_ARGS)
    batches = iter(data.train_dataloader())
    for _ in range(2):
        next(batches)
    state = data.state_dict()
    rest = [labels.tolist() for _, labels in batches]
    resumed = DaliDataModule(numbered, batch_size=BATCH_SIZE, **LOADER_ARGS)
    resumed.load_state_dict(state)  # no loader yet: kept until setup builds it
    assert resumed.state_dict() == state
    resumed.setup("fit")
    assert [labels.tolist() for _, labels in resumed.train_dataloader()] == rest
    with pytest.raises(ValueError, match="pass the state of every old rank, in rank order"):
        resumed.load_state_dict({"train": state["train"] * 2})  # two copies of rank 0 of 1 are no 2-rank state
    for module in (data, resumed):
        module.teardown("fit")


def test_missing_lightning_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "lightning", None)  # None in sys.modules: import raises ImportError
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    monkeypatch.delitem(sys.modules, "dali_pipes.lightning", raising=False)  # imported by an earlier test, or not
    monkeypatch.delitem(sys.modules, "dali_pipes.adapters.lightning", raising=False)  # where it imports it from
    with pytest.raises(ImportError, match=r"pip install '\.\[lightning\]' \(from the dali_pipes checkout\)"):
        importlib.import_module("dali_pipes.lightning")


def test_pyprojects_entry_points_name_the_factories_lightning_calls(pl):
    """The entry points pyproject.toml registers (adapters/lightning_trainer.py) load and give the callback; the
    installed metadata may still name the module's earlier path (kept for installs made before 0.4), so the test
    of a Trainer below alone cannot tell a wrong path in pyproject.toml."""
    import tomllib

    project = tomllib.loads(open(os.path.join(REPO, "pyproject.toml"), "rb").read().decode())["project"]
    groups = {"lightning.pytorch.callbacks_factory": "lightning.pytorch",
              "pytorch_lightning.callbacks_factory": "pytorch_lightning"}
    for group, package in groups.items():
        module, function = project["entry-points"][group]["dali_pipes"].split(":")
        assert module == "dali_pipes.adapters.lightning_trainer"
        if package == "pytorch_lightning" and importlib.util.find_spec(package) is None:
            continue  # the older package name is not installed: its factory is only named
        (callback,) = getattr(importlib.import_module(module), function)()
        assert isinstance(callback, importlib.import_module(f"{package}.callbacks").Callback)


def test_every_trainer_adds_the_callback_that_notes_it_through_lightnings_entry_point(numbered, pl):
    """Issue 25: the running trainer is found through Lightning's callback entry points (pyproject.toml), not
    the caller's stack: every Trainer adds it; it survives pickling (ddp_spawn); a trainer counts only while
    it runs (set up, not torn down), so a loader built outside one is never sharded by it."""
    import pickle

    from dali_pipes import running_framework
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    seen = [c for c in trainer.callbacks if type(c).__name__ == "LightningTrainerSeen"]
    assert len(seen) == 1 and isinstance(seen[0], pl.Callback)
    assert type(pickle.loads(pickle.dumps(seen[0]))) is type(seen[0])

    class Probe(pl.Callback):  # what a loader built in this trainer's hooks would read, and after it
        def on_train_start(self, trainer, pl_module):
            self.during = list(running_framework._TRAINERS)

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch, _):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(2, 1)), batch_size=1)

    probe = Probe()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[probe])
    trainer.fit(Tiny())
    assert [ref() for ref in probe.during] == [trainer]  # noted while it ran
    assert running_framework._TRAINERS == [] and running_framework.lightning_shard() is None  # forgotten after
