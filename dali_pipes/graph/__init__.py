"""DALI graphs: decode and augment (augment.py), their settings (augment_config.py), the decoders and their
arguments (decoders.py), torchvision transforms read into them (transforms.py), image size schedules
(resolution.py), and the private DALI calls in one place (_dali.py). Uses data/ below it."""

from dali_pipes.graph.augment_config import AugmentConfig

__all__ = ["AugmentConfig"]
