"""One config path: the loader's typed settings (SourceConfig, LoaderConfig) with defaults and a one-line
reason per field (options.py turns each into a flag), and the commands' one-line error runner."""

from __future__ import annotations

import sys
from dataclasses import InitVar, dataclass
from typing import Callable, TypeVar

from dali_pipes.options import auto_or_count, count_or_fraction, option, take_renamed

_Args = TypeVar("_Args")  # a command's arguments: an argparse.Namespace, or argv where it parses its own
_Result = TypeVar("_Result")


@dataclass(frozen=True)
class SourceConfig:
    """How to read a dataset location (see open_source)."""
    image_key: str = option("image/encoded", "TFRecord feature holding the encoded image")
    label_key: str = option("image/class/label", "TFRecord feature holding the integer label")
    label_offset: int = option(0, "subtracted from the labels TFRecord and WebDataset shards store (image "
                               "folders and file lists refuse it): 1 for TensorFlow's 1-based ImageNet records")
    label_ext: str = option("cls", "WebDataset member extension holding the label as ASCII digits")
    image_column: str = option("image", "Parquet column holding the encoded images (binary, or the Hugging Face "
                               "Image struct of bytes and path)")
    label_column: str = option("label", "Parquet column holding the integer labels (Hugging Face ClassLabel)")
    index_cache_dir: str | None = option(None, "where indexes are built when the shard folder is read-only "
                                         "(default: $DALI_PIPES_CACHE/indexes or ~/.cache/dali_pipes/indexes)",
                                         type=str)
    allow_duplicates: bool = option(False, "a file list may name a sample more than once (each repeat is warned of "
                                    "and read as often as listed); else a repeat is refused naming both lines")

    def open_kwargs(self) -> dict:
        """Keywords for open_source."""
        from dali_pipes.data.samples import SampleKeys
        keys = SampleKeys(self.image_key, self.label_key, self.label_offset, self.image_column, self.label_column)
        return dict(keys=keys, label_ext=self.label_ext,
                    index_cache_dir=self.index_cache_dir, allow_duplicates=self.allow_duplicates)


@dataclass(frozen=True)
class LoaderConfig:
    """How DaliLoader runs one rank's pipeline; `DaliLoader(..., **asdict(cfg))` takes these as keywords."""
    device: str = option("auto", "gpu: DALI mixed decoder (nvJPEG / hardware JPEG) and GPU augmentation; "
                         "cpu: the same graph on CPU; auto: gpu when torch sees CUDA", choices=("auto", "gpu", "cpu"))
    decode_device: str | None = option(None, "cpu with --device gpu: decode on CPU, augment on GPU (frees busy GPU "
                                       "decoders); default: the --device", type=str, choices=("gpu", "cpu", None))
    num_threads: int | str = option("auto", "DALI CPU threads per rank; auto: tried while the first epoch runs "
                                    "(at most 8 trials in 10%% of its batches, batches unchanged) from this process's "
                                    "CPUs / ranks on the node, and remembered per machine (tuning.py)",
                                    type=auto_or_count, aliases=("--threads",))
    prefetch_queue_depth: int | str = option("auto", "batches DALI prepares ahead of the training step; auto: 2, "
                                             "or tuned with the threads", type=auto_or_count)
    shuffle_buffer: int = option(4096, "train: samples the reader shuffles through (more: better mixing, more memory)")
    skip_bad: bool = option(False, "exclude bad samples (each named in a warning) and go on, instead of "
                            "stopping with their names")
    max_bad: int | float | None = option(None, "with --skip-bad: stop once more samples than this are excluded; "
                                         "an int is a count, a float in (0, 1) a fraction of the dataset",
                                         type=count_or_fraction)
    max_pixels: int | None = option(100_000_000, "refuse (or with --skip-bad exclude) images whose header claims "
                                    "more pixels, before DALI allocates them; None: no limit", type=int)
    remote_feed: str = option("cache", "s3:// data: 'cache' fetches whole shards ahead into a bounded local folder; "
                              "'native' lets DALI read each record with a ranged GET (far slower at a store's "
                              "latency: docs/benchmarks.md)", choices=("cache", "native"))
    cache_dir: str | None = option(None, "s3:// shard cache folder (default: $DALI_PIPES_CACHE/shards or "
                                   "~/.cache/dali_pipes/shards); each run uses a private subfolder", type=str)
    cache_bytes: int = option(8 << 30, "s3:// shard cache bound in bytes per rank; a larger shard is refused")
    cache_prefetch: int = option(4, "s3:// shards fetched in parallel ahead of the reader")
    storage_attempts: int = option(8, "every scheme (s3://, gs://, az://, hf://, http(s)://): tries per request (and "
                                   "per rebuild of a --remote-feed native reader) on a connection error, timeout or "
                                   "5xx reply, waiting 1, 2, 4, 8, 16, 16 ... s (x0.5-1 jitter) between; 8 rides out "
                                   "at least 30 s of outage. A network fault never excludes a sample",
                                   renamed_from="s3_attempts")
    storage_timeout: float = option(20.0, "every scheme: seconds a request may wait to connect (at most 5) or for its "
                                    "next bytes before that try fails", renamed_from="s3_timeout")
    download_deadline: float = option(600.0, "every scheme: seconds one shard download (or one ranged read) may take "
                                      "in all, its retries included, before it fails naming the object; a download "
                                      "still running at a quarter of it is warned of with its progress")
    val_cache_bytes: int = option(0, "val: keep the val images (uint8, after the resize and centre crop) where the "
                                  "batches are (GPU or host memory), up to this many bytes per rank, and give later "
                                  "val epochs from them without decoding; over it, not kept (one log line). 0: off "
                                  "(it holds its memory all run: ImageNet's val at 224 px is 7.5 GB over all ranks)")
    sharding_check: bool = option(True, "when the loaders are built, the ranks compare the data they opened (count, "
                                  "names, sizes, versions); at the end of the first epoch, what they delivered "
                                  "(train: no sample on two ranks; val: each exactly once) and fail naming the "
                                  "mistake; needs an initialised process group")
    # storage_attempts' and storage_timeout's names until 0.3, taken for one more release (a DeprecationWarning)
    s3_attempts: InitVar[int | None] = None
    s3_timeout: InitVar[float | None] = None

    def __post_init__(self, s3_attempts: int | None, s3_timeout: float | None) -> None:
        given = {"s3_attempts": s3_attempts, "s3_timeout": s3_timeout}
        for name, value in take_renamed({k: v for k, v in given.items() if v is not None}, LoaderConfig, 3).items():
            object.__setattr__(self, name, value)  # frozen: set once, here


def run_cli(main: Callable[[_Args], _Result], args: _Args) -> _Result:
    """Run a command's main; bad data, missing credentials or access (PermissionError) and a store that stays
    unreachable after its retries end it with the one-line message, not a traceback."""
    from dali_pipes.errors import DatasetError
    from dali_pipes.storage.files import DiskFullError
    from dali_pipes.storage.remote import UnreachableError
    try:
        return main(args)
    except (DatasetError, FileNotFoundError, PermissionError, UnreachableError, DiskFullError) as e:
        sys.exit(f"error: {e}")

