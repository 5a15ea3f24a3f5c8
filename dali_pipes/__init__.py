"""dali_pipes: image datasets fed to PyTorch through NVIDIA DALI, GPU decoding, one shard per rank."""

from dali_pipes.errors import DatasetError
from dali_pipes.sources import Sample, Source, TFRecordKeys, open_source

__all__ = ["DatasetError", "Sample", "Source", "TFRecordKeys", "open_source"]
__version__ = "0.1.0"
