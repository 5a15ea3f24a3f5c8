"""dali_pipes: image datasets fed to PyTorch through NVIDIA DALI, GPU decoding, one shard per rank.

The library is grouped by the data flow, each floor using only those below it (docs/layout.md):
storage/ (where bytes live) -> data/ (what they mean: sources, formats, the reader) -> graph/ (DALI's
decode and augment graphs) -> run/ (one rank's pipeline, its hooks and state) -> the faces users import
here (loader.py, dataloader_args.py, baseline.py, config.py) -> adapters/ (Lightning, Accelerate, torchdata
nodes; imported as dali_pipes.lightning, dali_pipes.frameworks, dali_pipes.nodes) -> tools/ (commands). The
public names below load on first use, so that the `dali-pipes` command and the converters start without
importing torch; DALI itself is imported only when a pipeline is built.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING

from dali_pipes._version import __version__

_EXPORTS = {
    "AugmentConfig": "dali_pipes.graph.augment_config", "DaliLoader": "dali_pipes.loader",
    "DatasetError": "dali_pipes.errors", "LoaderConfig": "dali_pipes.config",
    "PADDING_LABEL": "dali_pipes.data.samples", "Sample": "dali_pipes.data.samples",
    "SampleRef": "dali_pipes.data.samples", "Shard": "dali_pipes.run.dist", "Source": "dali_pipes.data.source",
    "SourceConfig": "dali_pipes.config", "SampleKeys": "dali_pipes.data.samples",
    "open_source": "dali_pipes.data.source", "progressive": "dali_pipes.graph.resolution",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from dali_pipes.config import LoaderConfig, SourceConfig
    from dali_pipes.data.samples import PADDING_LABEL, Sample, SampleKeys, SampleRef
    from dali_pipes.data.source import Source, open_source
    from dali_pipes.errors import DatasetError
    from dali_pipes.graph.augment_config import AugmentConfig
    from dali_pipes.graph.resolution import progressive
    from dali_pipes.loader import DaliLoader
    from dali_pipes.run.dist import Shard


def __getattr__(name: str):
    if name == "TFRecordKeys":  # SampleKeys' name until 0.3: warned of at each use, for one more release
        samples = importlib.import_module("dali_pipes.data.samples")
        warnings.warn(samples.KEYS_RENAMED, DeprecationWarning, stacklevel=2)
        return samples.SampleKeys
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dali_pipes' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value
