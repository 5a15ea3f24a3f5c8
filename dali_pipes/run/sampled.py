"""Sampler-driven epochs: a sampler other than DistributedSampler, read exactly as DataLoader reads it.

DataLoader asks its sampler for indices at the start of every epoch (iter(sampler), after the script's
set_epoch) and reads those dataset indices in that order: WeightedRandomSampler's draw with replacement,
SubsetRandomSampler's subset, a repeated-augmentation sampler (each image 3 times across the ranks, then
trimmed), a script's own sampler. DALI's reader cannot be told such an order (it reads its slice of a list,
shuffled through a buffer), so the loader draws the order in Python and feeds it to DALI:

  * at an epoch's first batch the order is drawn as DataLoader's iterator draws it: first the one int64 its
    iterator takes from DataLoader's generator (its workers' base seed; torch's global generator when none
    was given; with persistent workers only at the first epoch), then list(iter(sampler)). A script's random
    state moves as under DataLoader, and a sampler on torch's global generator draws what it would there;
  * OrderFeed hands DALI the order batch by batch (an external source of file paths and labels); DALI reads
    the files (fn.io.file.read) on its own threads and decodes and augments them with the loader's graph.
    One pipeline serves every epoch: the feed ends DALI's epoch after the order's last batch, so nothing is
    read past it and nothing is dropped, and the next epoch's order resets it (no rebuild, no reader list);
  * the batches are cut from the order's length (contract.py): len(loader) is DataLoader's (from
    len(sampler) until the epoch is drawn), samples the sampler repeats are yielded repeated, and the
    sharding check stays off (the sampler decides what each rank reads, as it does for DataLoader);
  * the loader state keeps what draws the same order again: the sampler's epoch, the states before the draw
    of every generator it can use (torch's, numpy's and Python's global ones, the sampler's and DataLoader's
    own), and the order's length and digest. A resume draws it again from those states (the caller's global
    generators are left as they were) and refuses an order that differs, naming the sampler; DALI's
    checkpoint carries the position in the order and the augmentations' random state;
  * ranks: a per-rank sampler (num_replicas and rank, as DeiT's) draws its rank's indices itself; a sampler
    that knows no ranks is read whole by a loader of one rank (DataLoader's way: every process reads it) and
    dealt out over the ranks by a loader of several (rank=/world_size=, or a Lightning Trainer's distributed
    strategy), as Lightning's DistributedSamplerWrapper deals it;
  * elastic resume (another world size) is refused, naming the sampler, where the draw depends on the world
    size (a per-rank sampler, a dealt-out draw): it cannot be replayed. A loader of one rank reads the whole
    draw, and continues the draw of old rank (its rank mod the old world size), exactly.

Image files only (dataset objects, folders, file lists): a sampler over TFRecord or WebDataset shards or
s3:// data is refused when the loader is built (shards need a reader's index; use DistributedSampler or
shuffle=True there).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence, cast

import numpy as np

from dali_pipes.run.contract import Contract, EpochCut
from dali_pipes.run.dist import Shard
from dali_pipes.run.hooks import BatchHook, RankView
from dali_pipes.run.position import Position

if TYPE_CHECKING:
    from dali_pipes.data.source import Source


@dataclass(frozen=True)
class SamplerRead:
    """A sampler the loader reads by drawing it (DaliLoader's call): the sampler, what DataLoader's own iterator
    draws before it, and the rank. A sampler that knows no ranks (no num_replicas) is read whole by a loader of
    one rank; on a rank of several (rank=/world_size=, or a Lightning Trainer's distributed strategy) each rank
    reads its share of the draw, as Lightning's DistributedSamplerWrapper deals a sampler's indices out."""
    sampler: Any
    generator: Any = None         # DataLoader's generator=: its iterator's base seed comes from it
    base_seed_once: bool = False  # num_workers > 0 and persistent_workers: DataLoader draws it at the first epoch only
    shard: Shard = Shard()

    @property
    def name(self) -> str:
        return type(self.sampler).__name__

    @property
    def split(self) -> bool:
        """The draw is dealt out over the ranks (share)."""
        return self.shard.world_size > 1 and not hasattr(self.sampler, "num_replicas")

    def count(self, drawn: int) -> int:
        """This rank's samples of a draw of `drawn` indices."""
        return -(-drawn // self.shard.world_size) if self.split else drawn

    def share(self, order: np.ndarray) -> np.ndarray:
        """This rank's indices of a draw: DistributedSamplerWrapper's (shuffle=False, as Lightning makes it for a
        sampler other than Random- and SequentialSampler): padded from its start to a multiple of the world
        size, every world_size-th from this rank's place."""
        if not self.split or not len(order):
            return order
        world = self.shard.world_size
        return np.resize(order, self.count(len(order)) * world)[self.shard.rank::world]

    def elastic_refusal(self) -> str | None:
        """Why an interrupted epoch cannot be resumed on another world size, or None when it can."""
        if hasattr(self.sampler, "num_replicas"):
            return (f"sampler {self.name} draws each rank's indices from its num_replicas "
                    f"({self.sampler.num_replicas}), so an epoch it drew for one world size cannot be replayed on "
                    f"another")
        if self.split:
            return (f"sampler {self.name}'s draw is dealt out over {self.shard.world_size} ranks, so the rest of an "
                    f"epoch dealt out on one world size cannot be replayed on another")
        return None


class OrderFeed:
    """DALI's external source for a sampler-driven epoch: batch after batch, the paths (as bytes), labels and
    identities (delivery.py: a file's source_info is its path) of the drawn order's samples, the last batch
    filled with repeats of its last sample (the contract cuts them); then StopIteration, DALI's epoch end.
    `next` is the batch the next call gives: the loader's position at every build (a checkpoint's DALI
    state is the state after the last delivered batch), then one more per call as DALI reads ahead. `contract`:
    the loader's (its batch size, read there)."""

    def __init__(self, contract: Contract, position: Position) -> None:
        self.contract, self.position = contract, position
        self.files: Sequence[str] = []
        self.labels: Sequence[int] = []
        self.order = np.zeros(0, np.int64)
        self.batches = 0  # batches of the epoch being fed
        self.next = 0

    def bind(self, source: Source) -> None:
        """Before each build: what the pipeline reads (bad samples excluded so far), from the loader's position."""
        self.files, self.labels, self.next = source.files, source.labels or [], self.position.batch

    def start(self, order: np.ndarray, batches: int) -> None:
        self.order, self.batches, self.next = order, batches, 0

    def has_next(self) -> bool:
        return self.next < self.batches

    def __call__(self, info: Any) -> tuple[list, list, list]:
        if self.next >= self.batches:
            raise StopIteration  # the epoch ends here: DALI reads nothing past the order
        size = self.contract.batch_size
        chunk = self.order[self.next * size:(self.next + 1) * size].tolist()
        self.next += 1
        chunk += chunk[-1:] * (size - len(chunk))
        paths = [np.frombuffer(self.files[i].encode(), np.uint8) for i in chunk]
        return paths, [np.array(self.labels[i], np.int64) for i in chunk], paths

    def dali_nodes(self, max_pixels: int | None) -> tuple:
        """Inside a pipeline definition: (encoded images, int64 labels, identity rows), as the reader gives."""
        from nvidia.dali import fn

        from dali_pipes.data.reader import guard_pixels
        # batch_info: DALI's checkpoints then need nothing of this source (the position is the loader's)
        paths, labels, ids = fn.external_source(source=self, num_outputs=3, batch=True, batch_info=True)
        jpegs = fn.io.file.read(paths)  # type: ignore[attr-defined]  # DALI 2.4's type stubs lack fn.io.file
        if max_pixels is not None:
            jpegs = guard_pixels(jpegs, max_pixels)
        return jpegs, labels, fn.pad(ids, axes=(0,), fill_value=0)


class SampledEpochs(BatchHook):
    """The sampler's epochs (a hook, and the rank's hooks.EpochOrder: its state goes into the loader's, under
    "sampler"): the order drawn for the current epoch, fed to DALI by `feed`, and what drew it."""
    name = "sampler"

    def __init__(self, read: SamplerRead, source: Source, contract: Contract, position: Position) -> None:
        if source.format.SHARDED or source.remote is not None:
            what = "s3:// data" if source.remote is not None else f"{source.kind} shards"
            raise ValueError(f"{source.location}: sampler {read.name} is read by drawing its indices and handing DALI "
                             f"the image files they name, which needs image files on this machine (a dataset object, "
                             f"an image folder or a file list), not {what}; use a DistributedSampler or shuffle=True "
                             f"there (DALI's reader reads them), or read image files")
        self.read, self.num_samples, self.contract, self.position = read, source.num_samples, contract, position
        self.feed = OrderFeed(contract, position)
        self.order: np.ndarray | None = None
        self.drawn: dict | None = None  # the draw of the current order: its epoch, the generators' states, digest
        self._draws = 0

    def count(self, epoch: int) -> int:
        """Samples of the loader's epoch `epoch`: the drawn order's, or len(sampler) before the draw (DataLoader's
        len(loader) and len(loader.sampler) count the same)."""
        if self.order is not None and self.drawn is not None and self.drawn["epoch"] == epoch:
            return len(self.order)
        return self.read.count(len(self.read.sampler))

    def cut(self, epoch: int) -> EpochCut:
        n = self.count(epoch)
        return self.contract.cut(n, n)  # every entry real: a sample the sampler repeats is yielded repeated

    def begin_epoch(self, rank: RankView, batches: int) -> None:
        """An epoch's first batch is asked for: draw its order, as DataLoader's iterator does at iter(), and
        feed it (an epoch resumed or finished midway goes on with the order it has)."""
        at = self.position
        if at.batch:
            return
        base_seed = not (self.read.base_seed_once and self._draws)
        record = {"epoch": at.epoch, "sampler_epoch": getattr(self.read.sampler, "epoch", None), "base_seed": base_seed,
                  "generators": generator_states(self.read)}
        self.order = self._draw(base_seed)
        self.drawn = {**record, "count": len(self.order), "digest": digest(self.order)}
        self.feed.start(self.order, self.cut(at.epoch).batches)

    def _draw(self, base_seed: bool) -> np.ndarray:
        import torch
        if base_seed:  # DataLoader's iterator takes its workers' base seed first, from its generator
            torch.empty((), dtype=torch.int64).random_(generator=self.read.generator)
        self._draws += 1
        try:
            order = np.fromiter((int(i) for i in self.read.sampler), np.int64)
        except (TypeError, ValueError) as error:
            raise ValueError(f"sampler {self.read.name} yielded something that is not one dataset index ({error}); "
                             f"DaliLoader reads a sampler's indices one by one, as DataLoader does") from None
        bad = np.flatnonzero((order < 0) | (order >= self.num_samples))
        if bad.size:
            raise ValueError(f"sampler {self.read.name} drew index {int(order[bad[0]])}, but the dataset has "
                             f"{self.num_samples} samples (0 to {self.num_samples - 1}); build the sampler over "
                             f"the dataset the loader reads")
        return self.read.share(order)

    def reach(self, position: int, epoch: int) -> list[Sequence[int]]:
        """What DALI can have read after `position` delivered batches: the order up to the feed's frontier
        (the bad-sample search looks there, recovery.py)."""
        order, size = self.order if self.order is not None else np.zeros(0, np.int64), self.contract.batch_size
        return [list(dict.fromkeys(order[position * size:self.feed.next * size].tolist()))]  # each sample once

    def window(self) -> int:
        return max(1, self.feed.next - self.position.batch) * self.contract.batch_size

    def state(self) -> dict | None:
        """Midway through an epoch: its draw (drawn again on resume). Between epochs: where the next draw starts,
        the sampler's and DataLoader's own generators as they are now (the global ones are the script's)."""
        at = self.position
        between = not at.batch or at.batch >= self.cut(at.epoch).batches
        return {"draws": self._draws, "drawn": None if between else self.drawn,
                "next": own_generator_states(self.read) if between else None}

    def restore(self, rank: RankView, state: dict | None) -> None:
        """Between epochs: the sampler's and DataLoader's own generators where they were. Midway through a drawn
        epoch: the same order drawn again, from the saved generator states, and checked to be the same."""
        at = self.position
        if not at.batch:
            if state and state.get("next"):
                set_own_generators(self.read, state["next"])
                self._draws = state["draws"]
            return
        drawn = (state or {}).get("drawn")
        if not drawn or drawn["epoch"] != at.epoch:
            raise ValueError(f"the loader state was taken midway through epoch {at.epoch} without a draw of sampler "
                             f"{self.read.name} (by a loader without this sampler?); resume with the sampler the run "
                             f"was started with, or at an epoch boundary")
        self._draws = state["draws"] - 1 if state else 0
        self.order, self.drawn = self._redraw(drawn), dict(drawn)
        self.feed.start(self.order, self.cut(at.epoch).batches)

    def _redraw(self, drawn: dict) -> np.ndarray:
        sampler = self.read.sampler
        if drawn["sampler_epoch"] is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(drawn["sampler_epoch"])
        with generators_at(self.read, drawn["generators"]):
            order = self._draw(drawn["base_seed"])
        if len(order) != drawn["count"] or digest(order) != drawn["digest"]:
            raise ValueError(f"sampler {self.read.name} drew another order on resume than the interrupted epoch's "
                             f"({len(order)} indices, digest {digest(order)}; saved: {drawn['count']}, "
                             f"{drawn['digest']}): its draw depends on more than its epoch and the random generators "
                             f"DaliLoader saves (torch's, numpy's, Python's, its own generator); make it draw from "
                             f"those, or resume at an epoch boundary")
        return order

    def describe(self) -> dict | None:
        return {"sampler": self.read.name, "drawn": None if self.drawn is None else self.drawn["count"]}

    def elastic_refusal(self) -> str | None:
        return self.read.elastic_refusal()


def digest(order: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(order, np.int64).tobytes()).hexdigest()[:16]


def _torch_generator(value: Any) -> Any:
    import torch
    return value if isinstance(value, torch.Generator) else None


def own_generator_states(read: SamplerRead) -> dict:
    """The states of the sampler's own torch.Generator and DataLoader's (bytes; None where there is none)."""
    own = _torch_generator(getattr(read.sampler, "generator", None))
    loader = _torch_generator(read.generator)
    return {"sampler": None if own is None else own.get_state().numpy().tobytes(),
            "loader": None if loader is None else loader.get_state().numpy().tobytes()}


def set_own_generators(read: SamplerRead, states: dict) -> None:
    for owner, key in ((getattr(read.sampler, "generator", None), "sampler"), (read.generator, "loader")):
        generator = _torch_generator(owner)
        if generator is not None and states.get(key) is not None:
            generator.set_state(_byte_tensor(states[key]))


def generator_states(read: SamplerRead) -> dict:
    """The states of every generator a draw can use, before it (bytes and ints: a loader state is saved as is)."""
    import torch
    np_state = cast(tuple, np.random.get_state())
    python = random.getstate()
    return {"torch": torch.get_rng_state().numpy().tobytes(), "numpy": [np_state[0], np_state[1].tobytes(),
                                                                          *np_state[2:]],
            "python": [python[0], list(python[1]), python[2]], **own_generator_states(read)}


class generators_at:  # noqa: N801 - used as a context manager, like torch.random.fork_rng
    """Within: every generator at the saved `states`. After: the global ones (torch's, numpy's, Python's) back
    where the caller had them; the sampler's and DataLoader's own generators stay where the draw left them,
    as the interrupted run left them."""

    def __init__(self, read: SamplerRead, states: dict) -> None:
        self.read, self.states = read, states

    def __enter__(self) -> None:
        import torch
        self._saved = (torch.get_rng_state(), np.random.get_state(), random.getstate())
        states = self.states
        torch.set_rng_state(_byte_tensor(states["torch"]))
        kind, keys, *rest = states["numpy"]
        np.random.set_state((kind, np.frombuffer(keys, np.uint32), *rest))
        version, internal, gauss = states["python"]
        random.setstate((version, tuple(internal), gauss))
        set_own_generators(self.read, states)

    def __exit__(self, *exc: Any) -> None:
        import torch
        torch_state, np_state, py_state = self._saved
        torch.set_rng_state(torch_state)
        np.random.set_state(np_state)
        random.setstate(py_state)


def _byte_tensor(data: bytes) -> Any:
    import torch
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)
