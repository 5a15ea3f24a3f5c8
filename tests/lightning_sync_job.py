"""A LightningModule shaped like Lightning's ImageNet example, its loaders built in its own hooks with
DaliLoader called the dali_pipes way, validation logged with sync_dist=True; 2 ranks, DDP on CPU (gloo).

    python tests/lightning_sync_job.py FOLDER OUT BATCH location|dataset [location|dataset ...]

With "location", the hooks build DaliLoader the dali_pipes way (the folder). With "dataset", they build it the
DataLoader way (torchvision ImageFolder, class name swapped), which a real DataLoader would get Lightning's
DistributedSampler for: it must be sharded the same way. Each form named is one fit by a Trainer of its own,
one after the other in the same 2 processes (the second Trainer finds the ranks started, as a script that fits
twice does): one job start, Lightning imported once per rank.

A script, not a test: Lightning's "ddp" strategy starts rank 1 by running sys.argv again. Rank 0 writes
OUT/<form>.json for each form: the epoch's val_loss, val_acc (means over ranks, sync_dist) and val_count (summed).
"""

from __future__ import annotations

import json
import os
import sys

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

from dali_pipes import DaliLoader

LOADER_ARGS = dict(device="cpu", image_size=16, num_threads=1)


class ImagenetLike(pl.LightningModule):
    def __init__(self, folder: str, batch_size: int, form: str) -> None:
        super().__init__()
        self.folder, self.batch_size, self.form = folder, batch_size, form
        self.head = torch.nn.Linear(3, 3)

    def forward(self, images):
        return self.head(images.mean((2, 3)))

    def training_step(self, batch, batch_idx):
        images, target = batch
        return F.cross_entropy(self(images), target)

    def validation_step(self, batch, batch_idx):
        images, target = batch
        output = self(images)
        loss_val = F.cross_entropy(output, target)  # no masking: a -1 label would crash here
        acc1 = (output.argmax(1) == target).float().mean()
        self.log("val_loss", loss_val, sync_dist=True)
        self.log("val_acc", acc1, sync_dist=True)
        self.log("val_count", float(target.size(0)), reduce_fx="sum", sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        if self.form == "dataset":
            return DaliLoader(image_folder(self.folder, train=True), batch_size=self.batch_size, shuffle=True)
        return DaliLoader(self.folder, batch_size=self.batch_size, train=True, drop_last=False, **LOADER_ARGS)

    def val_dataloader(self):
        if self.form == "dataset":
            return DaliLoader(image_folder(self.folder, train=False), batch_size=self.batch_size)
        return DaliLoader(self.folder, batch_size=self.batch_size, train=False, **LOADER_ARGS)


def image_folder(folder: str, train: bool):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torchvision_side import import_torchvision
    import_torchvision()
    from torchvision import datasets
    from torchvision import transforms as T
    steps = [T.RandomResizedCrop(16)] if train else [T.Resize(20), T.CenterCrop(16)]
    return datasets.ImageFolder(folder, T.Compose(steps + [T.ToTensor()]))


def fit(folder: str, out: str, batch_size: int, form: str) -> None:
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, limit_train_batches=1,
                         num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=out)
    trainer.fit(ImagenetLike(folder, batch_size, form))
    if trainer.global_rank == 0:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        with open(os.path.join(out, f"{form}.json"), "w") as f:
            json.dump(metrics, f)


if __name__ == "__main__":
    for name in sys.argv[4:]:
        fit(sys.argv[1], sys.argv[2], int(sys.argv[3]), name)
