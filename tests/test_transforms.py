"""transforms.py: a torchvision transform read as the DALI graph's AugmentConfig keywords, with the steps'
own arguments; anything the graph cannot do exactly is refused naming the step (torchvision's Python classes
from the side install in tests/torchvision_side.py)."""

import pytest
import torch

from dali_pipes import DaliLoader
from dali_pipes.graph.transforms import TransformError, augment_from_transform, is_random

from conftest import write_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("transforms") / "images"
    write_folder(str(root), counts=(2, 2, 2))
    return str(root)


@pytest.fixture
def tv(torchvision):
    from torchvision import datasets, transforms
    return datasets, transforms


def test_pytorch_examples_transforms(tv):
    _, T = tv
    normalize = T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), normalize])
    val = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), normalize])
    args, is_train = augment_from_transform(train)
    assert is_train and is_random(train) and args["image_size"] == 224 and args["flip_probability"] == 0.5
    assert args["random_area"] == (0.08, 1.0) and args["mean"] == (0.485, 0.456, 0.406)
    args, is_train = augment_from_transform(val)
    assert not is_train and not is_random(val) and (args["image_size"], args["crop_ratio"]) == (224, 0.875)


def test_v2_transforms_are_read_too(tv):
    from torchvision.transforms import v2
    args, is_train = augment_from_transform(v2.Compose([v2.RandomResizedCrop(32, scale=(0.3, 1.0)), v2.ToImage(),
                                                        v2.ToDtype(torch.float32, scale=True)]))
    assert is_train and args["image_size"] == 32 and args["random_area"] == (0.3, 1.0)
    with pytest.raises(TransformError, match="ToDtype"):
        augment_from_transform(v2.Compose([v2.RandomResizedCrop(32), v2.ToImage(), v2.ToDtype(torch.float32)]))


def test_transform_steps_outside_the_graph_are_refused_by_name(folder, tv):
    datasets, T = tv
    refused = [T.Compose([T.RandomResizedCrop(16), T.RandomRotation(10), T.ToTensor()]),
               T.Compose([T.Resize((20, 24)), T.CenterCrop(16), T.ToTensor()]),
               T.Compose([T.RandomResizedCrop(16), T.ColorJitter(0.2, 0.2, 0.2, 0.1), T.ToTensor()]),
               T.Compose([T.RandomResizedCrop(16, interpolation=T.InterpolationMode.NEAREST), T.ToTensor()]),
               T.Compose([T.Resize(20), T.CenterCrop(16), T.PILToTensor()]),
               T.Compose([T.Resize(20), T.ToTensor()])]
    names = ["RandomRotation", "Resize", "ColorJitter", "RandomResizedCrop", "PILToTensor", "Resize"]
    for transform, name in zip(refused, names):
        with pytest.raises(TransformError, match=name) as error:
            DaliLoader(datasets.ImageFolder(folder, transform), batch_size=2)
        assert "RandomResizedCrop, Resize, CenterCrop" in str(error.value)  # lists what it can read


def test_supported_transform_family(tv):
    _, T = tv
    for step, policy in ((T.AutoAugment(), "autoaugment"), (T.RandAugment(), "randaugment"),
                         (T.TrivialAugmentWide(), "trivialaugment")):
        args, train = augment_from_transform(T.Compose([T.RandomResizedCrop(24), step, T.ToTensor()]))
        assert train and args["auto_augment"] == policy and args["mean"] == (0, 0, 0) and args["std"] == (1, 1, 1)
    args, train = augment_from_transform(T.Compose([T.Resize(32), T.CenterCrop(28), T.PILToTensor(),
                                                    T.ConvertImageDtype(torch.float16)]))
    assert not train and args == {"image_size": 28, "crop_ratio": 0.875, "float16": True, "mean": (0, 0, 0),
                                  "std": (1, 1, 1)}
    with pytest.raises(TransformError, match="RandAugment"):
        augment_from_transform(T.Compose([T.RandomResizedCrop(24), T.RandAugment(num_ops=3), T.ToTensor()]))


def test_v2_recipe_with_to_image_first(tv):
    from torchvision.transforms import v2
    recipe = v2.Compose([v2.ToImage(), v2.RandomResizedCrop(32), v2.RandomHorizontalFlip(),
                         v2.ToDtype(torch.uint8, scale=True), v2.ToDtype(torch.float32, scale=True),
                         v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])
    args, is_train = augment_from_transform(recipe)
    assert is_train and args["image_size"] == 32 and args["mean"] == (0.485, 0.456, 0.406)
