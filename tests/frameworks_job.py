"""One rank of a 2-process Hugging Face Accelerate job (torchrun with Accelerate's CPU environment, gloo) for
tests/test_frameworks.py. Not a test: torchrun runs it once per rank.

    ACCELERATE_USE_CPU=true torchrun --nproc_per_node 2 tests/frameworks_job.py TRAIN VAL OUT PHASE [PHASE ...]

TRAIN and VAL are image folders of one image per class (a label names its sample), read as torchvision
ImageFolders and handed to DaliLoader as DataLoader takes them. Writes OUT/<PHASE>_rank<R>.json.
PHASE "first": accelerator.prepare(model, optimizer, train, val) with DaliLoaders, 2 epochs of training; after
batch SAVE_AT of epoch 0, accelerator.save_state(OUT/ckpt) with RankStates(train) registered. Each epoch
validates: gather_for_metrics of the val_padding="label" loader (masked), and of a "repeat" loader (not masked).
PHASE "resume": fresh Accelerator and loaders, load_state(OUT/ckpt), the rest of the 2 epochs; then a DaliLoader
registered by itself, saved and loaded: what each rank's load_state says.
PHASE "trainer": Hugging Face Trainer (trainer() below). The phases named run one after the other in the same
processes (one torchrun start for them: each start is 3 processes importing torch); "resume" needs a job of its
own after "first", as after a restart.
"""

import json
import os
import sys

import torch
from accelerate import Accelerator

from dali_pipes import PADDING_LABEL, DaliLoader
from dali_pipes.frameworks import RankStates

from torchvision_side import import_torchvision

SAVE_AT = (0, 2)  # (epoch, batch) after which the first phase saves
EPOCHS = 2


def train_dataset(root: str):
    T = import_torchvision().transforms
    return import_torchvision().datasets.ImageFolder(root, T.Compose([T.RandomResizedCrop(16), T.ToTensor()]))


def val_dataset(root: str):
    T = import_torchvision().transforms
    return import_torchvision().datasets.ImageFolder(root, T.Compose([T.Resize(16), T.CenterCrop(16), T.ToTensor()]))


def train_loader(root: str) -> DaliLoader:
    """DataLoader's call, class name swapped; no sampler: Accelerate's prepare() would shard a DataLoader."""
    return DaliLoader(train_dataset(root), batch_size=4, shuffle=True, num_workers=1,
                      generator=torch.Generator().manual_seed(0))


def val_loader(root: str, **kwargs) -> DaliLoader:
    return DaliLoader(val_dataset(root), batch_size=4, num_workers=1, **kwargs)


def loaders(train: str, val: str) -> tuple[DaliLoader, DaliLoader, DaliLoader]:
    return train_loader(train), val_loader(val, val_padding="label"), val_loader(val)


def model_and_optimizer(classes: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, classes))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def step(accelerator: Accelerator, model, optimizer, images, labels) -> None:
    loss = torch.nn.functional.cross_entropy(model(images), labels)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()


def validate(accelerator: Accelerator, model, val: DaliLoader, repeat: DaliLoader) -> dict:
    """The recipe: gather predictions and labels, drop the padding (label -1); and the "repeat" count unmasked."""
    kept, gathered, repeated = [], 0, 0
    with torch.no_grad():
        for images, labels in val:
            predictions, labels = accelerator.gather_for_metrics((model(images).argmax(1), labels))
            gathered += len(labels)
            kept += labels[labels != PADDING_LABEL].tolist()
        for _, labels in repeat:
            repeated += len(accelerator.gather_for_metrics(labels))
    return {"masked": sorted(kept), "gathered": gathered, "repeat": repeated}


def first(train_list: str, val_list: str, out: str) -> dict:
    accelerator = Accelerator(cpu=True)
    train, val, repeat = loaders(train_list, val_list)
    model, optimizer = model_and_optimizer(train.num_samples)
    model, optimizer, prepared_train, prepared_val = accelerator.prepare(model, optimizer, train, val)
    accelerator.register_for_checkpointing(RankStates(train))
    result: dict = {"passed_through": prepared_train is train and prepared_val is val, "epochs": [], "val": [],
                    "rank": train.shard.rank, "world_size": train.shard.world_size, "backend":
                    torch.distributed.get_backend()}
    for epoch in range(EPOCHS):
        result["epochs"].append([])
        for batch, (images, labels) in enumerate(prepared_train):
            step(accelerator, model, optimizer, images, labels)
            result["epochs"][-1].append(labels.tolist())
            if (epoch, batch) == SAVE_AT:
                accelerator.save_state(os.path.join(out, "ckpt"))
        result["val"].append(validate(accelerator, model, prepared_val, repeat))
    return result


def resume(train_list: str, val_list: str, out: str) -> dict:
    accelerator = Accelerator(cpu=True)
    train, val, repeat = loaders(train_list, val_list)
    model, optimizer = model_and_optimizer(train.num_samples)
    model, optimizer, train = accelerator.prepare(model, optimizer, train)
    accelerator.register_for_checkpointing(RankStates(train))
    accelerator.load_state(os.path.join(out, "ckpt"))
    result: dict = {"rest": []}
    while train.epoch < EPOCHS:
        result["rest"].append([labels.tolist() for _, labels in train])
    result["registered_itself"] = load_with_the_loader_registered(train_list, out)
    return result


def load_with_the_loader_registered(train_list: str, out: str) -> str:
    """A DaliLoader registered by itself: rank 0's state alone is saved, and loaded into every rank."""
    accelerator = Accelerator(cpu=True)
    loader = train_loader(train_list)
    accelerator.register_for_checkpointing(loader)
    accelerator.save_state(os.path.join(out, "ckpt_itself"))
    accelerator.wait_for_everyone()  # rank 0 wrote the files the others read
    try:
        accelerator.load_state(os.path.join(out, "ckpt_itself"))
    except ValueError as error:
        return str(error)
    return "loaded"


class Net(torch.nn.Module):
    """An image classifier with the forward Trainer calls: model(pixel_values=..., labels=...) -> loss, logits.
    It keeps the train labels it saw: which samples this rank trained on."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3 * 16 * 16, classes)
        self.seen: list[int] = []

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        logits = self.linear(pixel_values.flatten(1))
        if labels is None:
            return {"logits": logits}
        if self.training:
            self.seen += labels.tolist()
        loss = torch.nn.functional.cross_entropy(logits, labels, ignore_index=PADDING_LABEL)  # val padding: -1
        return {"loss": loss, "logits": logits}


def trainer(train_root: str, val_root: str, out: str) -> dict:
    """Hugging Face Trainer with get_train_dataloader / get_eval_dataloader returning DaliLoaders: 2 epochs with an
    evaluation after each; then a mid-epoch resume (refused, naming the way out) and one with ignore_data_skip."""
    from transformers import Trainer, TrainingArguments

    from dali_pipes.frameworks import DictBatches

    class DaliTrainer(Trainer):
        def get_train_dataloader(self) -> DictBatches:
            return DictBatches(DaliLoader(self.train_dataset, batch_size=self.args.per_device_train_batch_size,
                                          shuffle=True, num_workers=1))

        def get_eval_dataloader(self, eval_dataset=None) -> DictBatches:
            return DictBatches(DaliLoader(self.eval_dataset, batch_size=self.args.per_device_eval_batch_size,
                                          num_workers=1, val_padding="label"))

    counted: list[list[int]] = []

    def metrics(prediction) -> dict:
        labels = prediction.label_ids
        real = labels != PADDING_LABEL
        counted.append(sorted(labels[real].tolist()))
        return {"count": int(real.sum()), "gathered": len(labels)}

    args = dict(output_dir=os.path.join(out, "trainer"), use_cpu=True, num_train_epochs=2, eval_strategy="epoch",
                per_device_train_batch_size=4, per_device_eval_batch_size=4, save_strategy="steps", save_steps=2,
                report_to=[], disable_tqdm=True, logging_strategy="no", ddp_backend="gloo", learning_rate=0.01)
    data = dict(train_dataset=train_dataset(train_root), eval_dataset=val_dataset(val_root))
    model = Net(40)
    first = DaliTrainer(model=model, args=TrainingArguments(**args), compute_metrics=metrics, **data)
    output = first.train()
    result: dict = {"global_step": output.global_step, "seen": model.seen, "counted": counted,
                    "evals": [e for e in first.state.log_history if "eval_count" in e]}
    checkpoint = os.path.join(out, "trainer", "checkpoint-2")  # mid-epoch: 5 steps an epoch
    try:
        DaliTrainer(model=Net(40), args=TrainingArguments(**args), **data).train(resume_from_checkpoint=checkpoint)
    except AttributeError as error:
        result["resume_refused"] = str(error)
    resumed = DaliTrainer(model=Net(40), args=TrainingArguments(**args, ignore_data_skip=True), **data)
    result["resumed_global_step"] = resumed.train(resume_from_checkpoint=checkpoint).global_step
    return result


def main(train_list: str, val_list: str, out: str, phases: list[str]) -> None:
    for phase in phases:
        result = {"first": first, "resume": resume, "trainer": trainer}[phase](train_list, val_list, out)
        with open(os.path.join(out, f"{phase}_rank{torch.distributed.get_rank()}.json"), "w") as f:
            json.dump(result, f)
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4], sys.argv[4:])
