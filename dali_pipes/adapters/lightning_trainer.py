"""How a DaliLoader learns that a Lightning Trainer is running, through Lightning's own API rather than the stack.

Lightning adds to every Trainer the callbacks that installed packages register under the entry-point groups
"lightning.pytorch.callbacks_factory" and "pytorch_lightning.callbacks_factory" (pyproject.toml registers
ours). Its callback notes the trainer in `setup`, which Lightning runs before any *_dataloader hook, and
forgets it in `teardown`; running_framework.lightning_shard reads the running trainer from there, so that a
DaliLoader built in a hook under a distributed strategy is sharded as Lightning would shard a DataLoader.

Each package checks its own Callback base, so the class is made for the package the trainer comes from, on
first use; the module's __getattr__ makes it again in a process that unpickles a trainer (ddp_spawn).
Nothing here imports Lightning until Lightning calls it.
"""

from __future__ import annotations

import importlib
from typing import Any

from dali_pipes import running_framework

PACKAGES = {"LightningTrainerSeen": "lightning.pytorch", "PytorchLightningTrainerSeen": "pytorch_lightning"}
_made: dict[str, type] = {}


def lightning_callbacks() -> list:
    """The "lightning.pytorch.callbacks_factory" entry point."""
    return [__getattr__("LightningTrainerSeen")()]


def pytorch_lightning_callbacks() -> list:
    """The "pytorch_lightning.callbacks_factory" entry point."""
    return [__getattr__("PytorchLightningTrainerSeen")()]


def __getattr__(name: str) -> type:
    if name not in PACKAGES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _made:
        base = importlib.import_module(f"{PACKAGES[name]}.callbacks").Callback
        _made[name] = type(name, (base,), {"__module__": __name__, "__doc__": "Notes the running trainer for "
                                           "DaliLoader (dali_pipes/adapters/lightning_trainer.py).",
                                           "setup": _setup, "teardown": _teardown})
    return _made[name]


def _setup(self: Any, trainer: Any, pl_module: Any, stage: str) -> None:
    running_framework.trainer_started(trainer)


def _teardown(self: Any, trainer: Any, pl_module: Any, stage: str) -> None:
    running_framework.trainer_ended(trainer)
