"""One config path: typed dataclasses with defaults and a one-line reason per field, turned into
argparse flags for the training loop, the benchmarks and the `dali-pipes` command alike.

A field declared with `option(default, "why")` becomes `--field-name` with that default and help;
`from_args(cls, args)` builds the dataclass back from the parsed flags, and `asdict` of it is what a
run saves. This module imports nothing of the project's, so any module can declare options here.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence


def option(default: Any, help: str, *, type: Callable | None = None, choices: Sequence | None = None,
           aliases: Sequence[str] = ()) -> Any:
    """A dataclass field that is also a command-line flag. `type` is needed only when the default is
    None (the flag's type cannot be read from it); `aliases` are extra flag spellings."""
    return dataclasses.field(default=default, metadata={"help": help, "type": type, "choices": choices,
                                                        "aliases": tuple(aliases)})


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _none_or(kind: Callable) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return None if text.lower() in ("none", "") else kind(text)
    parse.__name__ = getattr(kind, "__name__", "value")  # argparse names the type in its errors
    return parse


def count_or_fraction(text: str) -> int | float:
    """"12" -> 12 (a count), "0.01" -> 0.01 (a fraction)."""
    try:
        return int(text)
    except ValueError:
        value = float(text)
        if not 0 < value < 1:
            raise argparse.ArgumentTypeError(f"{text}: expected a count (int) or a fraction in (0, 1)")
        return value


def auto_or_count(text: str) -> int | str:
    """"auto" (the loader tunes it: tuning.py) or a count of at least 1."""
    if str(text).lower() == "auto":
        return "auto"
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: expected 'auto' or a count of at least 1")
    return value


def add_arguments(parser: argparse.ArgumentParser, cls: type, title: str, skip: Sequence[str] = (),
                  defaults: dict | None = None) -> None:
    """One flag per option field of `cls`, in an argument group; `defaults` overrides a field's default."""
    group = parser.add_argument_group(title)
    for f in dataclasses.fields(cls):
        if f.name in skip or "help" not in f.metadata:
            continue
        default = (defaults or {}).get(f.name, f.default)
        meta = f.metadata
        kind: dict[str, Any] = {}
        if isinstance(f.default, bool) or meta["type"] is bool:  # bool | None: --x, --no-x, or neither (None)
            kind["action"] = argparse.BooleanOptionalAction
        elif isinstance(f.default, tuple):
            kind.update(nargs=len(f.default), type=type(f.default[0]))
        else:
            base = meta["type"] or type(f.default)
            kind["type"] = _none_or(base) if f.default is None else base
        if meta["choices"]:
            kind["choices"] = list(meta["choices"])
        shown = "" if "default:" in meta["help"] else f" (default: {_show(default)})"  # some explain theirs
        group.add_argument(flag_name(f.name), *meta["aliases"], dest=f.name, default=default,
                           help=meta["help"] + shown, **kind)


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return " ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in value)
    return str(value)


def from_args(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """The dataclass `cls` from parsed flags (fields without a flag keep their defaults)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return cls(**{**values, **overrides})


@dataclass(frozen=True)
class SourceConfig:
    """How to read a dataset location (see open_source)."""
    image_key: str = option("image/encoded", "TFRecord feature holding the encoded image")
    label_key: str = option("image/class/label", "TFRecord feature holding the integer label")
    label_offset: int = option(0, "subtracted from the labels TFRecord and WebDataset shards store (image "
                               "folders and file lists refuse it): 1 for TensorFlow's 1-based ImageNet records")
    label_ext: str = option("cls", "WebDataset member extension holding the label as ASCII digits")
    index_cache_dir: str | None = option(None, "where indexes are built when the shard folder is read-only "
                                         "(default: $DALI_PIPES_CACHE/indexes or ~/.cache/dali_pipes/indexes)", type=str)
    allow_duplicates: bool = option(False, "a file list may name a sample more than once (each repeat is warned of "
                                    "and read as often as listed); else a repeat is refused naming both lines")

    def open_kwargs(self) -> dict:
        """Keywords for open_source."""
        from dali_pipes.samples import TFRecordKeys
        return dict(keys=TFRecordKeys(self.image_key, self.label_key, self.label_offset), label_ext=self.label_ext,
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
    remote_feed: str = option("cache", "s3:// data: 'cache' fetches whole shards ahead into a bounded local folder "
                              "(0.84-1.21x local disk at 20 ms per request); 'native' lets DALI read each record "
                              "with a ranged GET (0.10-0.13x)", choices=("cache", "native"))
    cache_dir: str | None = option(None, "s3:// shard cache folder (default: $DALI_PIPES_CACHE/shards or "
                                   "~/.cache/dali_pipes/shards); each run uses a private subfolder", type=str)
    cache_bytes: int = option(8 << 30, "s3:// shard cache bound in bytes per rank; a larger shard is refused")
    cache_prefetch: int = option(4, "s3:// shards fetched in parallel ahead of the reader")
    s3_attempts: int = option(8, "s3://: tries per request (and per rebuild of a --remote-feed native reader) on a "
                              "connection error, timeout or 5xx reply, waiting 1, 2, 4, 8, 16, 16 ... s (x0.5-1 "
                              "jitter) between; 8 rides out at least 30 s of outage. A network fault never "
                              "excludes a sample")
    s3_timeout: float = option(20.0, "s3://: seconds a request may wait to connect (at most 5) or for its next bytes "
                               "before that try fails")
    sharding_check: bool = option(True, "at the end of the first epoch, the ranks compare what they delivered "
                                  "(train: no sample on two ranks; val: each exactly once) and fail naming the "
                                  "mistake; needs an initialised process group")


def run_cli(main: Callable[[argparse.Namespace], Any], args: argparse.Namespace) -> Any:
    """Run a command's main; bad data ends it with the one-line message, not a traceback."""
    from dali_pipes.errors import DatasetError
    from dali_pipes.files import DiskFullError
    try:
        return main(args)
    except (DatasetError, FileNotFoundError, DiskFullError) as e:
        sys.exit(f"error: {e}")
