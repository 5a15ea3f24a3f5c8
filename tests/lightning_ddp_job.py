"""One Lightning DDP fit over DaliDataModule, 2 ranks on CPU (gloo), for tests/test_lightning.py.

    python tests/lightning_ddp_job.py LIST OUT [--epochs 2] [--checkpoint-every K] [--ckpt PATH]
                                      [--on-exception-checkpoint] [--wait-for-sigterm-at-step K]

A script, not a test: Lightning's "ddp" strategy starts the other ranks by running sys.argv again, which a
pytest process cannot be. Labels are sample indices (LIST is a file list), so what a rank saw identifies samples.
Each rank writes OUT/rank<R>.json: {"train": [[epoch, batch_idx, labels], ...], "val": [[epoch, real labels],
...], "len_train", "len_val", "num_training_batches", "train_loader_type"}.
--checkpoint-every K: Lightning's ModelCheckpoint writes OUT/epoch=E-step=S.ckpt every K train steps, and
training goes on. --ckpt PATH resumes from one in a fresh job, as after a job killed right after that step.
--on-exception-checkpoint: Lightning's OnExceptionCheckpoint writes OUT/on_exception.ckpt when fit ends in an
exception, Lightning's SIGTERMException included (the job then exits 143), and a later job with the flag resumes
from it by itself (Lightning's fit(ckpt_path=None) takes it as "last"). --wait-for-sigterm-at-step K: after train
step K each rank writes OUT/waiting-rank<R> and waits (up to 60 s) until Lightning has seen a SIGTERM (Recorder).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning_ddp_args import BATCH_SIZE, LOADER_ARGS, RANKS  # the test's reference too

from dali_pipes.lightning import DaliDataModule


class Recorder(pl.LightningModule):
    """A linear layer on pooled pixels that records the labels of every batch it is given."""

    def __init__(self, num_classes: int, wait_at_step: int = 0, out: str = "") -> None:
        super().__init__()
        self.head = torch.nn.Linear(3, num_classes)
        self.train_seen: list = []
        self.val_seen: list = []
        self.wait_at_step, self.out = wait_at_step, out
        self.facts: dict = {}

    def training_step(self, batch, batch_idx):
        images, labels = batch
        self.train_seen.append([self.current_epoch, batch_idx, labels.tolist()])
        return torch.nn.functional.cross_entropy(self.head(images.mean((2, 3))), labels)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        """At step wait_at_step, both ranks wait in Python for the test's SIGTERM (to rank 0, which Lightning
        forwards to rank 1). Lightning 2.6's handler runs a broadcast inside the signal handler, which pairs
        up only if every rank is in Python code when its signal arrives, not inside a collective."""
        if self.global_step != self.wait_at_step or self.trainer.received_sigterm:
            return
        open(os.path.join(self.out, f"waiting-rank{self.global_rank}"), "w").close()
        deadline = time.monotonic() + 60
        while not self.trainer.received_sigterm and time.monotonic() < deadline:
            time.sleep(0.01)

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        if not self.trainer.sanity_checking:  # the sanity check reads 2 batches, then abandons the epoch
            self.val_seen.append([self.current_epoch, labels[labels >= 0].tolist()])  # -1: padding

    def on_train_start(self) -> None:  # the loaders are closed once fit returns
        loader = self.trainer.train_dataloader
        self.facts = {"len_train": len(loader), "len_val": len(self.trainer.val_dataloaders),
                      "num_training_batches": self.trainer.num_training_batches,
                      "train_loader_type": type(loader).__name__}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(args: argparse.Namespace) -> None:
    os.makedirs(args.out, exist_ok=True)
    data = DaliDataModule(args.list, args.list, batch_size=BATCH_SIZE, **LOADER_ARGS)
    model = Recorder(num_classes=64, wait_at_step=args.wait_for_sigterm_at_step, out=args.out)
    every = args.checkpoint_every
    saver = [ModelCheckpoint(args.out, every_n_train_steps=every, save_top_k=-1)] if every else []
    if args.on_exception_checkpoint:
        saver.append(OnExceptionCheckpoint(args.out))
    trainer = pl.Trainer(accelerator="cpu", devices=RANKS, strategy="ddp", callbacks=saver,
                         max_epochs=args.epochs, logger=False, enable_checkpointing=bool(saver),
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=args.out)
    try:
        trainer.fit(model, datamodule=data, ckpt_path=args.ckpt)
    except SIGTERMException:  # a SystemExit without a code: the process would exit 0, as if done
        raise SystemExit(128 + signal.SIGTERM) from None
    finally:  # also when fit ends in SIGTERMException: what was trained until then
        record = {"train": model.train_seen, "val": model.val_seen, **model.facts}
        with open(os.path.join(args.out, f"rank{trainer.global_rank}.json"), "w") as f:
            json.dump(record, f)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("list", help="file list of `path label` lines, label = sample index")
    parser.add_argument("out", help="folder for rank<R>.json and checkpoints")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--checkpoint-every", type=int, default=0, help="train steps; 0: no checkpoints")
    parser.add_argument("--ckpt", default=None)
    parser.add_argument("--on-exception-checkpoint", action="store_true")
    parser.add_argument("--wait-for-sigterm-at-step", type=int, default=0, help="0: no wait")
    return parser.parse_args()


if __name__ == "__main__":
    main(parse_args())
