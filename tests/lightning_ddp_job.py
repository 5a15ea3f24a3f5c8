"""One Lightning DDP fit over DaliDataModule, 2 ranks on CPU (gloo), for tests/test_lightning.py.

    python tests/lightning_ddp_job.py LIST OUT [--epochs 2] [--checkpoint-every K] [--ckpt PATH]

A script, not a test: Lightning's "ddp" strategy starts the other ranks by running sys.argv again, which a
pytest process cannot be. Labels are sample indices (LIST is a file list), so what a rank saw identifies samples.
Each rank writes OUT/rank<R>.json: {"train": [[epoch, batch_idx, labels], ...], "val": [[epoch, real labels],
...], "len_train", "len_val", "num_training_batches", "train_loader_type"}.
--checkpoint-every K: Lightning's ModelCheckpoint writes OUT/epoch=E-step=S.ckpt every K train steps, and
training goes on. --ckpt PATH resumes from one in a fresh job, as after a job killed right after that step.
"""

from __future__ import annotations

import argparse
import json
import os

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from dali_pipes.lightning import DaliDataModule

RANKS, BATCH_SIZE = 2, 4
LOADER_ARGS = dict(device="cpu", image_size=16, num_threads=1, seed=7, shuffle_buffer=8)  # the test's reference too


class Recorder(pl.LightningModule):
    """A linear layer on pooled pixels that records the labels of every batch it is given."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.head = torch.nn.Linear(3, num_classes)
        self.train_seen: list = []
        self.val_seen: list = []

    def training_step(self, batch, batch_idx):
        images, labels = batch
        self.train_seen.append([self.current_epoch, batch_idx, labels.tolist()])
        return torch.nn.functional.cross_entropy(self.head(images.mean((2, 3))), labels)

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
    model = Recorder(num_classes=64)
    every = args.checkpoint_every
    saver = [ModelCheckpoint(args.out, every_n_train_steps=every, save_top_k=-1)] if every else []
    trainer = pl.Trainer(accelerator="cpu", devices=RANKS, strategy="ddp", callbacks=saver,
                         max_epochs=args.epochs, logger=False, enable_checkpointing=bool(every),
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=args.out)
    trainer.fit(model, datamodule=data, ckpt_path=args.ckpt)
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
    return parser.parse_args()


if __name__ == "__main__":
    main(parse_args())
