"""dali_pipes: image datasets fed to PyTorch through NVIDIA DALI, GPU decoding, one shard per rank."""

from dali_pipes.graph import AugmentConfig
from dali_pipes.dist import Shard
from dali_pipes.errors import DatasetError
from dali_pipes.loader import DaliLoader
from dali_pipes.sources import Sample, Source, TFRecordKeys, open_source

__all__ = ["AugmentConfig", "DaliLoader", "DatasetError", "Sample", "Shard", "Source", "TFRecordKeys", "open_source"]
__version__ = "0.1.0"
