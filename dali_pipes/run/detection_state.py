"""The detection loader's resume state and bad-image budget (issue 35), beside the detection run (detection.py).

    {"version": 1, "task": "detection",
     "dataset":  {"num_images", "image_ids", "digest", "batch_size", "seed"},  # what a state must match (check_fits)
     "rank", "world_size",                # who took it: an elastic resume picks and checks by them (rank_state)
     "epoch", "position",                 # the epoch being read, and how many of its drawn batches are delivered
     "unfinished",                        # whether the next iteration gives the rest of that epoch (absent in
                                          # older states: position < len(batches)); an elastic resume's rank may
                                          # have an empty rest, yet run it in step with the others
     "batches",                           # that epoch's drawn order (lists of dataset indices), as drawn
     "generators",                        # the sampler's and DataLoader's own torch.Generators, after the draw
     "pipeline": {"dali", "dali_sha256"}, # DALI's checkpoint after the last delivered batch (the random draws)
     "bad_samples": {"bad_samples", "excluded"}}   # BadImages.state()

A resume midway through an epoch goes on with the saved order (no draw: what StatefulDataLoader keeps of its
sampler's iterator) from the saved position, DALI at its checkpoint, so random crops and flips draw what the
uninterrupted run draws; the sampler's own generators are set where the draw left them, so the next epoch draws
what it would have. torch's, numpy's and Python's global generators are the script's, as under DataLoader.

Bad images: DALI loses a whole batch when one image fails to decode (the message names no file), and a feed that
cannot read a file stops the batch too. BadImages finds the culprits among the batches the feed handed out (each
read and decoded alone, decode_probe.py) and raises a DatasetError naming file and image id, or (skip_bad)
excludes them, one warning each, within max_bad; the run then rebuilds its pipeline at the last delivered batch's
checkpoint and gives the batch without them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import warnings
from typing import Any, Callable, Sequence

import torch

from dali_pipes.data.detection import DetectionSample
from dali_pipes.errors import DatasetError
from dali_pipes.run.dali_checkpoint import sealed, unsealed
from dali_pipes.run.decode_probe import dali_decodes
from dali_pipes.run.recovery import BadSample, budget_of, listing
from dali_pipes.run.resume import RELEASE

ImageReader = Callable[[DetectionSample], bytes]  # a sample's encoded image: a file, an object, a shard's record
STATE_VERSION = 1
SHOWN_IDS = 8  # image ids shown where two datasets differ


def dataset_identity(samples: Sequence[DetectionSample], batch_size: int, seed: int) -> dict:
    """What a state records of the loader's dataset and pipeline, and must match to resume."""
    ids = [int(s.image_id) for s in samples]
    names = "\n".join(f"{s.image_id}\t{s.path.replace(chr(92), '/').rsplit('/', 1)[-1]}" for s in samples)
    return {"num_images": len(ids), "image_ids": ids[:SHOWN_IDS],
            "digest": hashlib.sha1(names.encode()).hexdigest()[:16], "batch_size": batch_size, "seed": seed}


def check_fits(saved: dict, here: dict, where: str) -> None:
    """Refuse a state taken on another dataset (its number of images, its image ids and files in the loader's
    order) or with another pipeline batch size or seed, naming what differs."""
    if saved["num_images"] != here["num_images"]:
        differs = f"number of images: {saved['num_images']} in the state, {here['num_images']} in this dataset"
    elif saved["digest"] != here["digest"]:
        differs = (f"image ids differ (or their files): the state's begin {saved['image_ids']}, this dataset's "
                   f"{here['image_ids']} (digests {saved['digest']}, {here['digest']})")
    else:
        differs = "; ".join(f"{key}: {saved[key]} in the state, {here[key]} here" for key in ("batch_size", "seed")
                            if saved[key] != here[key])
    if differs:
        raise ValueError(f"{where}: the loader state was taken on another detection dataset or loader ({differs}); "
                         f"resume with the dataset (the same Subset, in the same order), batch size and seed the run "
                         f"was started with, or start afresh")


def own_generators(batch_sampler: Any, generator: Any) -> list[torch.Generator | None]:
    """The torch.Generators a draw advances besides the global ones: the sampler's own (a BatchSampler's or
    GroupedBatchSampler's `.sampler`, or the batch sampler's) and DataLoader's generator= (None where none)."""
    sampler = getattr(batch_sampler, "sampler", batch_sampler)
    own = getattr(sampler, "generator", getattr(batch_sampler, "generator", None))
    return [g if isinstance(g, torch.Generator) else None for g in (own, generator)]


def generator_states(generators: list[torch.Generator | None]) -> list[bytes | None]:
    return [None if g is None else g.get_state().numpy().tobytes() for g in generators]


def set_generators(generators: list[torch.Generator | None], states: list[bytes | None]) -> None:
    for generator, state in zip(generators, states):
        if generator is not None and state is not None:
            generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))


def loader_state(*, identity: dict, epoch: int, position: int, batches: list[list[int]] | None,
                 generators: list[torch.Generator | None], checkpoint: bytes | None, bad: BadImages,
                 rank: int = 0, world_size: int = 1, unfinished: bool = False) -> dict:
    return {"version": STATE_VERSION, "task": "detection", "written_by": RELEASE, "dataset": identity,
            "rank": rank, "world_size": world_size, "epoch": epoch, "position": position, "unfinished": unfinished,
            "batches": batches, "generators": generator_states(generators),
            "pipeline": sealed(checkpoint), "bad_samples": bad.state()}


def rank_state(state: Any, *, rank: int, world_size: int, batch_sampler: Any) -> tuple[Any, int]:
    """(the state this rank resumes from, the rank that took it). `state`: this rank's, or every old rank's in
    rank order (a list). On the world size the states were taken on, this rank's; on another (elastic resume),
    old rank (rank mod the old world size)'s draw goes on exactly where the draw does not depend on the world size;
    a per-rank sampler (DistributedSampler: num_replicas) is refused naming it, as classification refuses its
    drawn orders (run/sampled.py). States written before ranks were recorded count as this world size's."""
    states = list(state) if isinstance(state, (list, tuple)) else [state]
    if not states or not all(isinstance(s, dict) for s in states):
        return state, rank  # not a state: opened_state says so
    if not elastic(state, world_size):
        return (states[rank], rank) if isinstance(state, (list, tuple)) else (state, rank)
    old = max(s.get("world_size", world_size) for s in states)
    refusal = per_rank_draw(batch_sampler)
    if refusal is not None:
        raise ValueError(f"elastic resume refused: {refusal}, so an epoch it drew for one world size cannot be "
                         f"replayed on another. Resume on {old} ranks (the world size the states were taken on), "
                         f"or start the next epoch without the loader state")
    mine = states[rank % len(states)]
    return mine, int(mine.get("rank", rank % len(states)))


def elastic(state: dict | list[dict], world_size: int) -> bool:
    """Whether `state` (states, all dicts) was taken on another world size than `world_size`."""
    states = list(state) if isinstance(state, (list, tuple)) else [state]
    worlds = {s.get("world_size", world_size) for s in states}
    return not (worlds == {world_size} and (len(states) == world_size or not isinstance(state, (list, tuple))))


def old_ranks(state: Any, world_size: int) -> list[dict] | None:
    """Every old rank's state, in rank order, where `state` resumes on another world size than `world_size` (an
    elastic resume; None otherwise), after checking that they are all of one run's ranks at one epoch."""
    states = list(state) if isinstance(state, (list, tuple)) else [state]
    if not states or not all(isinstance(s, dict) for s in states) or not elastic(state, world_size):
        return None
    worlds, ranks = sorted({s.get("world_size", world_size) for s in states}), [s.get("rank") for s in states]
    if worlds != [len(states)] or ranks != list(range(len(states))):
        raise ValueError(f"pass the state of every old rank, in rank order: got {len(states)} state(s) of ranks "
                         f"{ranks} with world sizes {worlds} to resume on {world_size} ranks")
    epochs = sorted({s.get("epoch") for s in states})
    if len(epochs) != 1:
        raise ValueError(f"the old ranks' states are in different epochs {epochs}: take them at the same step")
    return states


def epoch_rest(states: list[dict]) -> set[int]:
    """The images of the old ranks' interrupted epoch that none delivered: in some rank's batches after its
    position, in none's before it, and not excluded as bad."""
    delivered: set[int] = set()
    pending: set[int] = set()
    for state in states:
        batches, position = state.get("batches") or [], state["position"]
        delivered.update(int(i) for batch in batches[:position] for i in batch)
        pending.update(int(i) for batch in batches[position:] for i in batch)
    excluded = {int(i) for state in states for i in state["bad_samples"]["excluded"]}
    return pending - delivered - excluded


def per_rank_draw(batch_sampler: Any) -> str | None:
    """Why the batch sampler's draw depends on the world size (a sampler that draws its rank's share from its
    num_replicas), or None."""
    for sampler in (batch_sampler, getattr(batch_sampler, "sampler", None)):
        replicas = getattr(sampler, "num_replicas", None)
        if replicas is not None:
            return f"sampler {type(sampler).__name__} draws each rank's indices from its num_replicas ({replicas})"
    return None


def opened_state(state: Any, identity: dict, where: str,
                 generators: list[torch.Generator | None]) -> tuple[bytes | None, dict]:
    """(DALI's checkpoint, the state) of a detection loader state that fits this loader; the sampler's own
    generators set where the saved draw left them."""
    if not isinstance(state, dict) or state.get("task") != "detection":
        raise ValueError(f"{where}: not a detection loader's state (a DaliLoader over image folders or shards wrote "
                         f"it?); load a state saved by DaliLoader over this detection dataset")
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"{where}: detection loader state version {state.get('version')} (written by "
                         f"{state.get('written_by')}); this release reads version {STATE_VERSION}: start afresh")
    check_fits(state["dataset"], identity, where)
    set_generators(generators, state["generators"])
    return unsealed(state["pipeline"], str(state.get("written_by"))), state


class BadImages:
    """Bad images met mid-run: named (skip=False) or excluded within `max_bad` (skip=True); `excluded` holds the
    dataset indices left out of every batch from then on (and after a resume)."""

    def __init__(self, *, skip: bool = False, max_bad: int | float | None = None, num_images: int = 1,
                 device: str = "cpu", read: ImageReader | None = None) -> None:
        budget_of(max_bad, num_images)  # a malformed budget refused when the loader is built
        self.skip, self.max_bad, self.num_images, self.device = skip, max_bad, num_images, device
        self.read = read or read_file
        self.bad_samples: list[BadSample] = []
        self.excluded: set[int] = set()

    def handle(self, error: Exception, samples: Sequence[DetectionSample], reach: Sequence[int]) -> None:
        """After `error` stopped a batch: the culprits among `reach` (the indices the feed handed out) named in a
        DatasetError, or excluded (skip). Nothing found: the error goes on as it was."""
        if not self.skip and isinstance(error, DatasetError):
            raise error  # the feed's own error names the file and image id already
        found = bad_images(samples, [i for i in dict.fromkeys(reach) if i not in self.excluded], self.device,
                           self.read)
        if not found:
            raise error
        if not self.skip:
            raise DatasetError(f"decoding failed: {listing([b for _, b in found])}", "",
                               "Remove or replace the image (dali-pipes verify names every bad one), or exclude bad "
                               "images as they are met with skip_bad=True") from error
        for _, bad in found:
            warnings.warn(f"excluding a bad image and going on at the last good batch: {bad}", stacklevel=1)
        self.bad_samples += [b for _, b in found]
        self.excluded.update(i for i, _ in found)
        budget = budget_of(self.max_bad, self.num_images)
        if budget is not None and len(self.bad_samples) > budget:
            raise DatasetError(f"{len(self.bad_samples)} bad images excluded, over the budget of {budget} "
                               f"(max_bad={self.max_bad}); first: {listing(self.bad_samples)}", "",
                               "Check the images (dali-pipes verify lists every bad one), or raise max_bad") from error

    def state(self) -> dict:
        return {"bad_samples": [dataclasses.asdict(b) for b in self.bad_samples], "excluded": sorted(self.excluded)}

    @staticmethod
    def merge(states: list[dict]) -> dict:
        """One state() of every old rank's loader states (an elastic resume): their bad images, each once."""
        bad = {b["origin"]: b for s in states for b in s["bad_samples"]["bad_samples"]}
        return {"bad_samples": list(bad.values()),
                "excluded": sorted({int(i) for s in states for i in s["bad_samples"]["excluded"]})}

    def restore(self, state: dict) -> None:
        self.bad_samples = [BadSample(**b) for b in state["bad_samples"]]
        self.excluded = {int(i) for i in state["excluded"]}


def read_file(sample: DetectionSample) -> bytes:
    """A sample's image as a local file (torchvision's CocoDetection: root / file_name)."""
    with open(sample.path, "rb") as f:
        return f.read()


def bad_images(samples: Sequence[DetectionSample], indices: Sequence[int], device: str,
               read: ImageReader = read_file) -> list[tuple[int, BadSample]]:
    """(index, BadSample) of each of `indices` whose image cannot be read, is empty, or does not decode (an
    unreachable store is no bad image: its ConnectionError goes on)."""
    found, datas = [], {}
    for i in indices:
        sample = samples[i]
        origin = f"{sample.path} (image {sample.image_id})"
        try:
            data = read(sample)
        except ConnectionError:
            raise
        except (OSError, DatasetError) as e:
            found.append((i, BadSample(origin, f"cannot be read ({getattr(e, 'strerror', None) or e})")))
            continue
        if not data:
            found.append((i, BadSample(origin, "an empty file")))
        else:
            datas[i] = data
    decodes = dali_decodes(list(datas.values()), "gpu" if device == "gpu" else "cpu") if datas else []
    found += [(i, BadSample(f"{samples[i].path} (image {samples[i].image_id})", "does not decode (damaged, "
                            "truncated, or not an image)")) for i, ok in zip(datas, decodes) if not ok]
    return sorted(found, key=lambda pair: list(indices).index(pair[0]))


def positions(batches: list[list[int]], start: int, end: int) -> list[int]:
    """The dataset indices of batches[start:end] (at least the one at start), in order."""
    return [int(i) for batch in batches[start:max(end, start + 1)] for i in batch]

