"""transforms.py: a torchvision transform read as the DALI graph's AugmentConfig keywords, with the steps'
own arguments; anything the graph cannot do exactly is refused naming the step (torchvision's Python classes
from the side install in tests/torchvision_side.py)."""

import pytest
import torch

from dali_pipes import DaliLoader
from dali_pipes.graph.transforms import TransformError, augment_from_transform, is_random

from conftest import EvalPreset, TrainPreset

COUNTS = (2, 2, 2)  # the `folder` fixture's images per class (conftest.py)


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


def test_a_vit_resize_h_w_is_read_as_a_stretch_and_a_non_square_one_is_refused(tv):
    """A ViT image processor's size {"height": 224, "width": 224} gives Resize((224, 224)): torchvision stretches
    the image to 224 x 224 (no shorter-side resize, no crop), read as val_stretch."""
    _, T = tv
    for val in (T.Compose([T.Resize((224, 224)), T.CenterCrop((224, 224)), T.ToTensor()]),
                T.Compose([T.Resize((224, 224)), T.ToTensor()])):
        args, is_train = augment_from_transform(val)
        assert not is_train and (args["image_size"], args["crop_ratio"], args["val_stretch"]) == (224, 1.0, True)
    assert "val_stretch" not in augment_from_transform(T.Compose([T.Resize(256), T.CenterCrop(224),
                                                                  T.ToTensor()]))[0]
    with pytest.raises(TransformError, match=r"size \(224, 200\): only square outputs"):
        augment_from_transform(T.Compose([T.Resize((224, 200)), T.CenterCrop(200), T.ToTensor()]))


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


# ---------------------------------------------------------------------------------------------
# Issue 26: the recipes' presets and steps (torchvision's references, timm, DeiT) read, not refused
# ---------------------------------------------------------------------------------------------

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def test_a_preset_object_is_read_through_its_compose(folder, tv):
    datasets, _ = tv
    from torchvision.transforms import InterpolationMode, v2
    bicubic = InterpolationMode.BICUBIC
    train = TrainPreset(v2, 16, bicubic, v2.TrivialAugmentWide(interpolation=InterpolationMode.BILINEAR), 0.25)
    loader = DaliLoader(datasets.ImageFolder(folder, train), batch_size=2, shuffle=True)
    cfg = loader.augment
    assert loader.train and (cfg.image_size, cfg.interpolation, cfg.auto_augment) == (16, "bicubic", "trivialaugment")
    assert (cfg.random_erasing, cfg.random_erasing_mode, cfg.random_erasing_area) == (0.25, "const", (0.02, 0.33))
    assert sum(len(labels) for _, labels in loader) == 6
    val = DaliLoader(datasets.ImageFolder(folder, EvalPreset(v2, 16, 18, bicubic)), batch_size=2)
    assert not val.train and (val.augment.image_size, val.augment.interpolation) == (16, "bicubic")
    assert val.augment.crop_ratio == pytest.approx(16 / 18)


def test_a_wrapper_that_holds_no_compose_is_refused_saying_what_is_read(folder, tv):
    datasets, T = tv

    class Wrapper:
        def __init__(self) -> None:
            self.transforms = [T.Resize(20), T.CenterCrop(16), T.ToTensor()]

        def __call__(self, img):
            return img

    with pytest.raises(TransformError, match=r"Wrapper is not supported: .* \.transforms is a list"):
        DaliLoader(datasets.ImageFolder(folder, Wrapper()), batch_size=2)


def test_random_erasing_is_read_from_torchvision_and_timm(tv, timm):
    _, T = tv
    from timm.data.random_erasing import RandomErasing as TimmErasing
    from torchvision.transforms import v2
    head = [T.RandomResizedCrop(24), T.ToTensor()]
    cases = [(T.RandomErasing(p=0.3, scale=(0.1, 0.2), ratio=(0.5, 2.0), value="random"), True,
              dict(random_erasing=0.3, random_erasing_area=(0.1, 0.2), random_erasing_ratio=(0.5, 2.0),
                   random_erasing_mode="pixel")),
             (v2.RandomErasing(p=0.5, value=(0.1, 0.2, 0.3)), True,
              dict(random_erasing_mode="const", random_erasing_value=(0.1, 0.2, 0.3))),
             (TimmErasing(0.25, mode="pixel", device="cpu"), True,
              dict(random_erasing=0.25, random_erasing_mode="pixel", random_erasing_area=(0.02, 1 / 3))),
             (v2.RandomErasing(p=1.0, value=0.5), False,  # before Normalize: the fill is normalised with the image
              dict(random_erasing_value=tuple((0.5 - m) / s for m, s in zip(MEAN, STD))))]
    for step, after_normalize, expected in cases:
        steps = [*head, T.Normalize(MEAN, STD), step] if after_normalize else [*head, step, T.Normalize(MEAN, STD)]
        args, train = augment_from_transform(T.Compose(steps))
        assert train and all(args[k] == (v if isinstance(v, str) else pytest.approx(v)) for k, v in expected.items())
    assert augment_from_transform(T.Compose([*head, TimmErasing(mode="pixel", device="cpu")]))[0][
        "random_erasing_ratio"] == pytest.approx((0.3, 1 / 0.3))
    refused = {"before Normalize": [*head, T.RandomErasing(value="random"), T.Normalize(MEAN, STD)],
               "max_count=2": [*head, TimmErasing(max_count=2, device="cpu")],
               "float tensors": [T.RandomResizedCrop(24), T.PILToTensor(), T.RandomErasing()],
               "RandomResizedCrop": [T.Resize(20), T.CenterCrop(16), T.ToTensor(), T.RandomErasing()]}
    for match, steps in refused.items():
        with pytest.raises(TransformError, match=match):
            augment_from_transform(T.Compose(steps))


def test_augmix_bicubic_and_to_pure_tensor_are_read(tv):
    _, T = tv
    from torchvision.transforms import v2
    args, train = augment_from_transform(v2.Compose([
        v2.RandomResizedCrop(24, interpolation=T.InterpolationMode.BICUBIC), v2.AugMix(severity=5, chain_depth=2),
        v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True), v2.ToPureTensor()]))
    assert train and args["interpolation"] == "bicubic" and args["auto_augment"] == "augmix"
    assert (args["augmix_severity"], args["augmix_width"], args["augmix_depth"], args["augmix_alpha"]) == (5, 3, 2, 1)
    args, _ = augment_from_transform(T.Compose([T.RandomResizedCrop(24), T.AugMix(), T.ToTensor()]))
    assert (args["augmix_severity"], args["augmix_depth"]) == (3, -1)
    for step, match in ((T.AugMix(all_ops=False), "all_ops"), (T.RandomRotation(5), "RandomRotation")):
        with pytest.raises(TransformError, match=match):
            augment_from_transform(T.Compose([T.RandomResizedCrop(24), step, T.ToTensor()]))
    with pytest.raises(TransformError, match="interpolation InterpolationMode.NEAREST_EXACT"):
        augment_from_transform(T.Compose([T.RandomResizedCrop(24, interpolation=T.InterpolationMode.NEAREST_EXACT),
                                          T.ToTensor()]))


@pytest.fixture(scope="module")
def squares(tmp_path_factory):
    """12 square 32 x 32 JPEGs: RandomResizedCrop(32, scale=(1, 1), ratio=(1, 1)) is then the whole image in DALI
    and in torchvision alike, so what a random step changes can be measured against the plain image."""
    from conftest import jpeg_bytes
    root = tmp_path_factory.mktemp("squares") / "images"
    for i in range(12):
        (root / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"c{i % 3}" / f"{i:02d}.jpg").write_bytes(jpeg_bytes(i, 32, 32))
    return str(root)


def _epochs(dataset, epochs: int) -> list[torch.Tensor]:
    loader = DaliLoader(dataset, batch_size=12, shuffle=False)
    return [images for _ in range(epochs) for images, _ in loader]


def _whole(T):
    return T.RandomResizedCrop(32, scale=(1.0, 1.0), ratio=(1.0, 1.0))


def test_erased_rectangles_follow_torchvisions_draws(squares, tv):
    """The rectangles DALI erases (value 9: found exactly) against torchvision's own RandomErasing draws (v2
    make_params): the erased share p, and the area, height / width and top-left corner distributions."""
    import numpy as np
    from scipy import stats
    datasets, T = tv
    from torchvision.transforms import v2
    erase = v2.RandomErasing(p=0.6, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=9.0)
    batches = _epochs(datasets.ImageFolder(squares, T.Compose([_whole(T), T.ToTensor(), erase])), 50)
    ours = []
    for image in torch.cat(batches):
        mask = (image == 9.0).all(0)
        if mask.any():
            rows, cols = mask.any(1).nonzero().flatten(), mask.any(0).nonzero().flatten()
            top, left, h, w = int(rows[0]), int(cols[0]), len(rows), len(cols)
            assert mask.sum() == h * w and mask[top:top + h, left:left + w].all()  # one whole rectangle
            ours.append((h * w, h / w, top, left))
    assert abs(len(ours) / 600 - 0.6) < 4 * np.sqrt(0.6 * 0.4 / 600)
    torch.manual_seed(0)
    params = [erase.make_params([torch.zeros(3, 32, 32)]) for _ in range(2000)]
    theirs = [(p["h"] * p["w"], p["h"] / p["w"], p["i"], p["j"]) for p in params if p["v"] is not None]
    for k, what in enumerate(("area", "height / width", "top", "left")):
        assert stats.ks_2samp([o[k] for o in ours], [t[k] for t in theirs]).pvalue > 1e-3, what


def test_random_erasing_noise_is_standard_normal_in_the_rectangle_only(squares, tv):
    import numpy as np
    from scipy import stats
    datasets, T = tv
    plain = _epochs(datasets.ImageFolder(squares, T.Compose([_whole(T), T.ToTensor(), T.Normalize(MEAN, STD)])), 1)
    noisy = _epochs(datasets.ImageFolder(squares, T.Compose([_whole(T), T.ToTensor(), T.Normalize(MEAN, STD),
                                                             T.RandomErasing(p=1.0, value="random")])), 4)
    changed = [(image - plain[0][i % 12]).abs().amax(0) > 0 for i, image in enumerate(torch.cat(noisy))]
    values = torch.cat([image[:, mask].flatten() for image, mask in zip(torch.cat(noisy), changed)]).numpy()
    assert all(mask.any() for mask in changed) and len(values) > 1000
    assert stats.kstest(values, "norm").pvalue > 1e-3 and abs(np.mean(values)) < 0.1


def test_augmix_changes_images_as_much_as_torchvisions(squares, tv):
    """AugMix is random: the graph's is checked by its statistic against torchvision's, the mean absolute change
    it makes to the plain image (0-255 levels) over 30 epochs. (The graph composes 9 selections among 14 DALI
    operations: it takes ~20 s to define on a 2-core machine, so one severity is checked.)"""
    datasets, T = tv
    augmix = T.Compose([_whole(T), T.AugMix(), T.ToTensor()])
    plain = T.Compose([_whole(T), T.ToTensor()])
    ours = torch.stack(_epochs(datasets.ImageFolder(squares, augmix), 30)) - _epochs(
        datasets.ImageFolder(squares, plain), 1)[0]
    torch.manual_seed(0)
    tv_plain, tv_augmix = datasets.ImageFolder(squares, plain), datasets.ImageFolder(squares, augmix)
    reference = torch.stack([tv_plain[i][0] for i in range(12)])
    theirs = torch.stack([torch.stack([tv_augmix[i][0] for i in range(12)]) - reference for _ in range(30)])
    assert ours.shape == theirs.shape == (30, 12, 3, 32, 32)
    change = float(ours.abs().mean()) * 255, float(theirs.abs().mean()) * 255  # ~9.0 and ~10.8 levels
    assert 0.6 < change[0] / change[1] < 1.5, change
    unchanged = float((ours.abs().amax((2, 3, 4)) == 0).float().mean()), float(
        (theirs.abs().amax((2, 3, 4)) == 0).float().mean())
    assert unchanged[0] < 0.1 and unchanged[1] < 0.1, unchanged  # nearly every draw changes the image


def test_erasing_and_bicubic_graphs_resume_exactly_mid_epoch(folder):
    """The new random operators are in DALI's checkpoint: a loader resumed after one batch yields the images the
    uninterrupted one did (AugMix's too, checked by hand: its graph takes ~20 s to define here)."""
    make = lambda: DaliLoader(folder, batch_size=2, train=True, device="cpu", image_size=16, num_threads=1, seed=3,
                              random_erasing=0.5, random_erasing_mode="pixel", interpolation="bicubic")
    whole = [images for images, _ in make()]
    interrupted = make()
    head = [next(iter(interrupted))[0]]
    resumed = make()
    resumed.load_state_dict(interrupted.state_dict())
    rest = [images for images, _ in resumed]
    assert len(head + rest) == len(whole) == 3
    assert all(torch.equal(a, b) for a, b in zip(head + rest, whole))
