"""The public path of the Hugging Face Accelerate and Trainer adapters (docs/drop-in.md):
`from dali_pipes.frameworks import RankStates, DictBatches`. They live in adapters/frameworks.py."""

from dali_pipes.adapters.frameworks import DictBatches, RankStates

__all__ = ["DictBatches", "RankStates"]
