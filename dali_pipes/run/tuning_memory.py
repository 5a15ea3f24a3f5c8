"""The tuning memory: the knobs chosen on this machine for this graph, remembered for the next run.

The memory, a JSON file under the cache root ($DALI_PIPES_CACHE/tuning.json, default
~/.cache/dali_pipes/tuning.json), is keyed by machine (CPU model, usable cores, GPU, DALI version),
graph (mode, device, augmentation but hw_decoder_load, format; not the batch size) and ranks per node. A
remembered choice of every knob searched is the next run's start, and is only confirmed (one trial) unless
the loop then waits. It is a file a person may edit: an entry is used only if the tuner could have chosen
it here (entry_problem: threads in 1..usable CPUs, a depth of DEPTHS, a load in [0, 1]); anything else (a
file that is not a memory, a bad entry) is treated as absent, with one warning naming the file. Writers
hold a lock beside it (tuning.json.lock).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import os
from typing import TYPE_CHECKING

import filelock

from dali_pipes.run.machine import usable_cpus
from dali_pipes.run.trials import DEPTHS
from dali_pipes.storage.files import atomic_write

if TYPE_CHECKING:
    from dali_pipes.run.pipeline import PipelineSpec

LOCK_TIMEOUT_S = 10.0  # a writer holds the memory's lock for one read and one write: milliseconds
log = logging.getLogger("dali_pipes")


def machine() -> dict:
    """What makes one machine's best settings differ from another's."""
    import nvidia.dali
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu": cpu, "usable_cpus": usable_cpus(), "gpu": gpu_model(), "dali": nvidia.dali.__version__}


def gpu_model() -> str:
    """The GPU's model, without initialising CUDA in this process (that would pin torch's current device
    to 0 before the training script chose one): the driver's /proc entry, else torch once initialised."""
    import glob

    import torch
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        try:
            with open(info) as f:
                return next((line.split(":", 1)[1].strip() for line in f if line.startswith("Model")), "")
        except OSError:
            continue
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.get_device_name()
    return "cuda" if torch.cuda.is_available() else ""


def graph_key(spec: PipelineSpec, kind: str) -> dict:
    """The pipeline's graph as far as the threads it needs go (not the rank, seed, batch size or
    hw_decoder_load: a profile at batch 64 seeds a run at 256)."""
    augment = dataclasses.asdict(spec.augment)
    augment.pop("hw_decoder_load", None)  # a decoder knob that profile recommends: the same graph for the threads
    # DALI's own reads (None, or said explicitly, as DaliLoader resolves them for a location) keep the key they had
    # before these fields existed: remembered settings and `dali-pipes profile`'s (None) stay found
    if augment.get("exif_orientation", True) in (None, True):
        augment.pop("exif_orientation", None)
    if augment.get("png16") in (None, "scale"):
        augment.pop("png16", None)
    # The spec resolves decode_device (never None); the key keeps None for "the device's", as before it did
    decode_device = None if spec.decode_device == spec.device else spec.decode_device
    return {"train": spec.train, "device": spec.device, "decode_device": decode_device, "format": kind,
            "augment": augment}


def memory_key(spec: PipelineSpec, kind: str) -> str:
    ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    text = json.dumps({"machine": machine(), "graph": graph_key(spec, kind), "ranks_per_node": ranks_per_node},
                      sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def memory_path() -> str:
    from dali_pipes.storage.files import cache_root
    return os.path.join(cache_root(), "tuning.json")


def recall(key: str) -> dict | None:
    """The remembered entry for `key`, or None: no memory, or one that is not valid here (entry_problem),
    which is treated as absent, with one warning naming the file."""
    path = memory_path()
    entry = read_entries(path).get(key)
    problem = None if entry is None else entry_problem(entry)
    if problem:
        warn_once(path, f"entry {key}: {problem}")
        return None
    return entry


def remember(key: str, entry: dict) -> None:
    """Add or update one entry. The read-modify-write holds a lock beside the file (filelock's flock), so
    concurrent writers lose no entry; the write is an atomic rename, so no reader sees a torn file. An
    old entry for `key` that is not valid is replaced, never merged."""
    path = memory_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with filelock.FileLock(path + ".lock", timeout=LOCK_TIMEOUT_S):  # its Timeout is a TimeoutError
            entries = read_entries(path)
            found = entries.get(key)
            old = found if isinstance(found, dict) and entry_problem(found) is None else {}
            merged = {**old, **entry, "date": datetime.datetime.now().isoformat(timespec="seconds")}
            problem = entry_problem(merged)
            if problem:  # the tuner and profile choose within the checked ranges: a bug, never a start
                log.warning("tuning: not remembering %s in %s: %s", merged, path, problem)
                return
            with atomic_write(path, "w") as f:
                json.dump({"version": 1, "entries": {**entries, key: merged}}, f, indent=1)
    except TimeoutError as error:  # a writer stuck with the lock must not stop training either
        log.warning("tuning: could not remember the choice in %s (%s); the next run tunes again", path, error)
    except OSError as error:  # a read-only home must not stop training: the next run tunes again
        log.warning("tuning: could not remember the choice in %s (%s); set DALI_PIPES_CACHE to a writable "
                    "folder", path, error)


def read_entries(path: str) -> dict:
    """The memory's entries by key (not checked one by one: an entry may belong to another machine);
    {} when there is no memory, or when the file is not one (warned once, naming it)."""
    try:
        with open(path) as f:
            memory = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        warn_once(path, f"unreadable ({error})")
        return {}
    entries = memory.get("entries", {}) if isinstance(memory, dict) else memory
    if not isinstance(entries, dict):
        what = '"entries"' if isinstance(memory, dict) else "the file"
        warn_once(path, f'not a tuning memory: {what} is a {type(entries).__name__}, not an object '
                        f'(expected {{"version": 1, "entries": {{...}}}})')
        return {}
    return entries


def entry_problem(entry) -> str | None:
    """What makes a remembered entry unusable on this machine, or None. The knobs must be what the tuner
    could have chosen here: threads an int in 1..usable CPUs, a depth it searches (DEPTHS)."""
    if not isinstance(entry, dict):
        return f"not an object but {type(entry).__name__} {entry!r}"
    cores = usable_cpus()
    checks = {"num_threads": (lambda v: _is_int(v) and 1 <= v <= cores, f"an int in 1..{cores} (usable CPUs)"),
              "prefetch_queue_depth": (lambda v: _is_int(v) and v in DEPTHS, f"one of the depths searched {DEPTHS}"),
              "hw_decoder_load": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
              **{name: (lambda v: isinstance(v, str), "a string") for name in ("source", "date", "binding_stage")},
              "stage_images_per_s": (lambda v: isinstance(v, dict) and all(isinstance(k, str) and _is_number(r)
                                                                            for k, r in v.items()),
                                     "an object of stage names and images/s")}
    for name, (ok, expected) in checks.items():
        if name in entry and not ok(entry[name]):
            return f"{name} {entry[name]!r} is not {expected}"
    return None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is no thread count


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_warned: set[tuple[str, str]] = set()


def warn_once(path: str, problem: str) -> None:
    """One warning per file and problem in a process (every rank's plan and every write read the file)."""
    if (path, problem) not in _warned:
        _warned.add((path, problem))
        log.warning("tuning: %s: %s; treated as absent (tuned again and rewritten; remove the file to start "
                    "afresh)", path, problem)
