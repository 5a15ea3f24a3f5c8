"""DALI graphs: decode and augment (augment.py), torchvision transforms read into them (transforms.py), image
size schedules (resolution.py), and the private DALI calls in one place (_dali.py). Uses data/ below it."""

from dali_pipes.graph.augment import AugmentConfig

__all__ = ["AugmentConfig"]
