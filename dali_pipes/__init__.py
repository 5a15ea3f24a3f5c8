"""dali_pipes: image datasets fed to PyTorch through NVIDIA DALI, GPU decoding, one shard per rank.

The data flow, one module per step: location -> source (formats/) -> reader -> graph -> pipeline ->
loader -> the training loop (train/). Importing this package does not import DALI; building a
pipeline does.
"""

from dali_pipes.config import LoaderConfig, SourceConfig
from dali_pipes.dist import Shard
from dali_pipes.errors import DatasetError
from dali_pipes.graph import AugmentConfig
from dali_pipes.loader import DaliLoader
from dali_pipes.samples import PADDING_LABEL, Sample, SampleRef, TFRecordKeys
from dali_pipes.source import Source, open_source

__all__ = ["AugmentConfig", "DaliLoader", "DatasetError", "LoaderConfig", "PADDING_LABEL", "Sample", "SampleRef",
           "Shard", "Source", "SourceConfig", "TFRecordKeys", "open_source"]
__version__ = "0.2.0"
