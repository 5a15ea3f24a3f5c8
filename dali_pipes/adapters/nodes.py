"""torchdata.nodes: a DaliLoader as the source node of a torchdata.nodes graph (needs torchdata).

    from torchdata.nodes import Loader, Mapper
    from dali_pipes.nodes import DaliNode
    node = DaliNode(DaliLoader("/data/train", batch_size=256, train=True))
    loader = Loader(Mapper(node, to_device))        # any nodes after it; Loader gives state_dict / load_state_dict
    for epoch in range(epochs):
        for images, labels in loader: ...

Each reset() without a state starts the loader's next epoch; next() yields its (images, labels) batches and
raises StopIteration at the epoch's end. get_state() is the DaliLoader's own state (loader.py), so a state
taken after k batches resumes at batch k, and one taken after an epoch's last batch at the next epoch's
start (torchdata's Loader restarts an iterator found exhausted). The loader is not copied into worker
processes: DALI runs its own threads; put no ParallelMapper with process workers in front of it.

DALI's own torchdata.nodes adapter (nvidia.dali.experimental.dynamic.pytorch.nodes, DALI 2.4) wraps DALI's
dynamic-mode readers, not a pipeline, and keeps no state (its reset(initial_state) raises); this node carries
the project's graph and its exact resume instead.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

try:
    from torchdata.nodes import BaseNode
except ImportError as error:
    raise ImportError("dali_pipes.nodes needs torchdata (pip install torchdata): it is a torchdata.nodes BaseNode"
                      ) from error

from dali_pipes.loader import DaliLoader

STATE_KEY = "dali_loader"  # the DaliLoader's state inside the node's


class DaliNode(BaseNode[tuple[torch.Tensor, torch.Tensor]]):
    """One DaliLoader's batches as a torchdata.nodes source: an epoch per reset()."""

    def __init__(self, loader: DaliLoader) -> None:
        super().__init__()
        self.loader = loader
        self._epoch: Iterator[tuple[torch.Tensor, torch.Tensor]] | None = None

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        if initial_state is not None:
            self.loader.load_state_dict(initial_state[STATE_KEY])
        # Lazy (DaliLoader's iter() acts on its first batch): a reset only to take a state moves nothing.
        self._epoch = iter(self.loader)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._epoch is None:
            raise RuntimeError("DaliNode.next() before reset(): iterate it through torchdata.nodes.Loader, or call "
                               "reset() first")
        return next(self._epoch)

    def get_state(self) -> dict[str, Any]:
        return {STATE_KEY: self.loader.state_dict()}

    def __len__(self) -> int:  # batches per epoch, for progress bars and schedules
        return len(self.loader)
