"""dali_pipes: image datasets fed to PyTorch through NVIDIA DALI, GPU decoding, one shard per rank.

The data flow, one module per step: location -> source (formats/) -> reader -> graph -> pipeline ->
loader -> the training loop (train/). The public names below load on first use, so that the
`dali-pipes` command and the converters start without importing torch; DALI itself is imported only
when a pipeline is built.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.2.0"

_EXPORTS = {
    "AugmentConfig": "dali_pipes.graph", "DaliLoader": "dali_pipes.loader", "DatasetError": "dali_pipes.errors",
    "LoaderConfig": "dali_pipes.config", "PADDING_LABEL": "dali_pipes.samples", "Sample": "dali_pipes.samples",
    "SampleRef": "dali_pipes.samples", "Shard": "dali_pipes.dist", "Source": "dali_pipes.source",
    "SourceConfig": "dali_pipes.config", "TFRecordKeys": "dali_pipes.samples", "open_source": "dali_pipes.source",
    "progressive": "dali_pipes.resolution",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from dali_pipes.config import LoaderConfig, SourceConfig
    from dali_pipes.dist import Shard
    from dali_pipes.errors import DatasetError
    from dali_pipes.graph import AugmentConfig
    from dali_pipes.loader import DaliLoader
    from dali_pipes.resolution import progressive
    from dali_pipes.samples import PADDING_LABEL, Sample, SampleRef, TFRecordKeys
    from dali_pipes.source import Source, open_source


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dali_pipes' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value
