"""The module Lightning's entry points named before 0.4 (pyproject.toml names adapters/lightning_trainer.py now).
An install made earlier keeps the old name in its entry points until it is installed again (pip install re-reads
pyproject.toml), and Lightning loads every registered factory when it makes a Trainer: without this module each
Trainer would fail to start. It goes when 0.4's installs are the oldest ones."""

from dali_pipes.adapters.lightning_trainer import lightning_callbacks, pytorch_lightning_callbacks

__all__ = ["lightning_callbacks", "pytorch_lightning_callbacks"]
