"""transformers' run_image_classification_no_trainer.py in outline (its dataset building, transforms, dict
collate_fn, accelerator.prepare and gather_for_metrics), with a tiny model: run by tests/test_frameworks.py on 1
process and on 2 under torchrun with Accelerate's CPU environment, once with DataLoader and once with the class
renamed to DaliLoader. argv: data_dir, out, loader class names (the script runs once per name, one after the
other in the same processes: one job start, torch and Accelerate imported once). Writes each rank's counts as
JSON, per name."""

import json
import os
import sys

import torch
from accelerate import Accelerator
from datasets import load_dataset
from torch.utils.data import DataLoader

from dali_pipes import DaliLoader

from torchvision_side import import_torchvision

import_torchvision()  # the side folder's pure-Python torchvision (tests/torchvision_side.py)
from torchvision.transforms import (  # noqa: E402
    CenterCrop,
    Compose,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToTensor,
)


def main(data_dir: str, out: str, loader_name: str) -> None:
    loader_class = {"DataLoader": DataLoader, "DaliLoader": DaliLoader}[loader_name]
    accelerator = Accelerator()
    with accelerator.main_process_first():
        dataset = load_dataset("imagefolder", data_dir=data_dir, cache_dir=os.path.join(out, "hf_cache"))
    size = (16, 16)  # a ViT image processor's {"height", "width"}
    normalize = Normalize(mean=[0.5] * 3, std=[0.5] * 3)
    train_transforms = Compose([RandomResizedCrop(size), RandomHorizontalFlip(), ToTensor(), normalize])
    val_transforms = Compose([Resize(size), CenterCrop(size), ToTensor(), normalize])

    def preprocess_train(example_batch):
        example_batch["pixel_values"] = [train_transforms(image.convert("RGB")) for image in example_batch["image"]]
        return example_batch

    def preprocess_val(example_batch):
        example_batch["pixel_values"] = [val_transforms(image.convert("RGB")) for image in example_batch["image"]]
        return example_batch

    with accelerator.main_process_first():
        train_dataset = dataset["train"].with_transform(preprocess_train)
        eval_dataset = dataset["validation"].with_transform(preprocess_val)

    def collate_fn(examples):
        pixel_values = torch.stack([example["pixel_values"] for example in examples])
        labels = torch.tensor([example["label"] for example in examples])
        return {"pixel_values": pixel_values, "labels": labels}

    train_dataloader = loader_class(train_dataset, shuffle=True, collate_fn=collate_fn, batch_size=2)
    eval_dataloader = loader_class(eval_dataset, collate_fn=collate_fn, batch_size=2)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader)
    record: dict = {"len": len(train_dataloader), "steps": [], "gathered": [], "labels": []}
    for _ in range(2):
        model.train()
        steps = 0
        for batch in train_dataloader:
            loss = torch.nn.functional.cross_entropy(model(batch["pixel_values"]), batch["labels"])
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
        record["steps"].append(steps)
        model.eval()
        references_seen = []
        for batch in eval_dataloader:
            with torch.no_grad():
                predictions = model(batch["pixel_values"]).argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
            references_seen += references.tolist()
        record["gathered"].append(len(references_seen))
        record["labels"].append(sorted(references_seen))
    with open(os.path.join(out, f"{loader_name}_{accelerator.num_processes}_rank{accelerator.process_index}.json"),
              "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    for name in sys.argv[3:]:
        main(sys.argv[1], sys.argv[2], name)
