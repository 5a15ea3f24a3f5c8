"""The loader's resume state: its layout, nested by owner, its version, and the plan of an elastic resume.

    {"version": 3,
     "loader":      {"epoch", "position", "rank", "world_size", "batch_size", "train", "num_samples", "seed",
                     "contract", "fingerprint", "image_size"},  # where the loader is, what it must match
     "pipeline":    {"dali", "dali_sha256", "dali_epoch0", "tuned"},  # DALI's checkpoint and its digest
                                                      # (dali_checkpoint.sealed), the epoch its pipeline began at,
                                                      # the tuner's choice once made (tuning.py; absent before 0.3)
     "bad_samples": {"bad_samples", "excluded"},      # recovery.BadSamplePolicy.state()
     "record":      {"delivered", "delivered_complete", "elastic_base"}}   # delivery.DeliveryRecord.state()

Each part comes from its owner and goes back to it (RankPipeline.state / restore, Position.restore): this
module only lays the parts out, checks versions and fit, and plans an elastic resume.

Version 2 (dali_pipes 0.2.0) kept the same fields flat at the top; it is read as it is and resumes
exactly (its graph and cut are today's). Any other version is refused naming both versions.

"fingerprint" (fingerprint.py: the data's file names and sizes, as opened) came after 0.2.0; a state that
has one resumes only on data with the same fingerprint (check_data), a state without one as before.

"image_size" is the sizes the loader yields, as --image-size writes them ("0:160,10:192" for a train
schedule, the one val size for val); states written before schedules existed have none, and fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_pipes._version import __version__
from dali_pipes.data import fingerprint
from dali_pipes.errors import DatasetError
from dali_pipes.graph import resolution
from dali_pipes.graph.augment_config import AugmentConfig
from dali_pipes.run import elastic
from dali_pipes.run.dali_checkpoint import unsealed
from dali_pipes.run.delivery import pack as pack_bits
from dali_pipes.run.delivery import unpack

if TYPE_CHECKING:
    from dali_pipes.run.position import Position
    from dali_pipes.run.rank import RankPipeline
    from dali_pipes.run.sampled import SamplerRead

STATE_VERSION = 3
RELEASE = f"dali_pipes {__version__}"  # in each state: an error about an old state can name its release
OWNERS = ("loader", "pipeline", "bad_samples", "record")
_FLAT_VERSION = 2


def pack(*, loader: dict, pipeline: dict, bad_samples: dict, record: dict) -> dict:
    return {"version": STATE_VERSION, "loader": loader, "pipeline": pipeline, "bad_samples": bad_samples,
            "record": record}


def flat(state: dict) -> dict:
    """Every owner's fields in one dict, for a state of any version this release reads."""
    version = state.get("version")
    if version == _FLAT_VERSION:
        return {**state, "version": STATE_VERSION, "flat_version": _FLAT_VERSION}
    if version != STATE_VERSION:
        raise ValueError(f"loader state of version {version} was written by another dali_pipes (this one reads "
                         f"versions {_FLAT_VERSION} and {STATE_VERSION}); resume with the version that wrote it, "
                         f"or start the epoch afresh")
    out = {"version": STATE_VERSION}
    for owner in OWNERS:
        out.update(state.get(owner, {}))
    return out


def check_fits(state: dict, identity: dict, contract: dict) -> None:
    """Raise ValueError unless a flat `state` was taken by a loader like this one (same rank too)."""
    differ = {k: (state.get(k), v) for k, v in identity.items() if state.get(k) != v}
    if state.get("contract", contract) != contract:  # 0.2.0 states have none: their batches cut as today's
        differ["contract"] = (state["contract"], contract)
    if set(differ) == {"rank"}:  # one rank's state loaded into every rank: a checkpointer that keeps rank 0's
        raise ValueError(f"loader state of rank {state.get('rank')} loaded into rank {identity['rank']}: a loader "
                         f"state belongs to one rank. A checkpointer that saves rank 0's copy alone and loads it "
                         f"into every rank (Accelerate's register_for_checkpointing) needs every rank's: register "
                         f"dali_pipes.frameworks.RankStates(loader) instead of the loader")
    if differ:
        raise ValueError(f"loader state does not fit this loader: (saved, now) = {differ}; resume with "
                         f"the same data, rank, world size, batch size, seed, drop_last and val_padding")


def check_data(state: dict, source: Any) -> None:
    """Raise DatasetError when the data differs from the data `state` was taken on: same count or not,
    resuming mid-epoch on other files would deliver other samples than the interrupted epoch's rest."""
    saved, now = state.get("fingerprint"), getattr(source, "fingerprint", None)
    if not saved or not now:
        return  # a 0.2.0 state, or a Source made by hand: nothing to compare
    changed = fingerprint.changes(saved, now)
    if changed:
        raise DatasetError(source.location, f"the data differs from the data this loader state was taken on: "
                           f"{changed}", "Resume on the data the run was started with, or start afresh "
                           "(without the state; python -m train: a new --workdir)")


def image_sizes(augment: AugmentConfig, train: bool) -> str:
    """The sizes a loader yields: train, its image_size schedule; val, its one size."""
    return resolution.schedule_text(augment.image_size) if train else str(augment.val_size)


def check_image_sizes(states: list[dict], now: str) -> None:
    """Raise ValueError unless every flat state was taken under the image sizes `now` (or predates them)."""
    for state in states:
        saved = state.get("image_size", now)
        if saved != now:
            raise ValueError(f"loader state was taken with image_size {saved}, this loader has image_size {now}; "
                             f"resume with the schedule the run was started with (--image-size {saved})")


def merged_bad_samples(states: list[dict]) -> dict:
    """Every old rank's excluded samples, each once: what an elastic resume excludes."""
    bad = {str(b): b for s in states for b in s.get("bad_samples", [])}
    excluded = {str(refs): refs for s in states for refs in s.get("excluded", [])}
    return {"bad_samples": list(bad.values()), "excluded": list(excluded.values())}


def elastic_plan(states: list[dict], identity: dict, contract: dict, *, rank: int, world_size: int, batch_size: int,
                 train: bool, seed: int, whole_batches: bool) -> tuple[int, np.ndarray, elastic.Remainder | None]:
    """(epoch to continue at, what the old ranks delivered, this rank's remainder or None) for flat
    states of every old rank. The epoch is the next one when nothing of the old epoch is left."""
    epoch = elastic.check_states(states, identity)
    for old_rank, state in enumerate(states):
        if state.get("contract", contract) != contract:  # 0.2.0 states have none
            raise ValueError(f"loader state of old rank {old_rank} does not fit this loader: (saved, now) = "
                             f"{state['contract'], contract}; resume with the same drop_last and val_padding")
    base = elastic.delivered_union(states, identity["num_samples"])
    plan = elastic.plan_remainder(base, epoch=epoch, rank=rank, world_size=world_size, batch_size=batch_size,
                                  train=train, seed=seed, whole_batches=whole_batches) if base.any() else None
    return (epoch + 1 if base.any() and plan is None else epoch), base, plan


@dataclass(frozen=True)
class LoaderFacts:
    """What a loader's state records of it, and what a state must match to resume here (the loader gives it)."""
    identity: dict       # rank, world_size, batch_size, train, num_samples, seed: check_fits
    contract: dict       # contract.Contract as a dict
    image_size: str      # image_sizes(): the train schedule or the val size
    whole_batches: bool  # train in full batches only (DALI's DROP, or drop_last): an elastic remainder too


def state_of(rank: RankPipeline, next_batch: tuple[int, int], position: Position, facts: LoaderFacts,
             fingerprint: dict | None) -> dict:
    """A loader's state between batches, each part from its owner: the position (`next_batch`, what the
    loader yields next; DALI's epoch end already read), the loader's facts, the rank's parts (rank.state)."""
    epoch, batch = next_batch
    parts = rank.state(epoch_done=epoch != position.epoch)
    return pack(loader={"epoch": epoch, "position": batch, **facts.identity, "written_by": RELEASE,
                        "contract": facts.contract, "fingerprint": fingerprint, "image_size": facts.image_size},
                **parts)


def restore(rank: RankPipeline, position: Position, facts: LoaderFacts, state: dict | list[dict]) -> None:
    """Put a loader where `state` (one, or every old rank's in rank order) was taken. An empty state ({}, [])
    loads nothing, as torchdata's StatefulDataLoader takes it (`load_state_dict(ckpt.get("loader", {}))`)."""
    if isinstance(state, (dict, list, tuple)) and not state:
        return
    world, me = facts.identity["world_size"], facts.identity["rank"]
    if isinstance(state, (list, tuple)):
        states = [flat(s) for s in state]
        check_image_sizes(states, facts.image_size)
        if len(states) != world or any(s.get("world_size") != world for s in states):
            return restore_elastic(rank, position, facts, states)
        mine = states[me]
    else:
        mine = flat(state)
        check_image_sizes([mine], facts.image_size)
    restore_flat(rank, position, facts, mine)


def restore_flat(rank: RankPipeline, position: Position, facts: LoaderFacts, mine: dict) -> None:
    """Put a loader where one flat state `mine`, taken on this world size, was taken."""
    world, me = facts.identity["world_size"], facts.identity["rank"]
    check_data(mine, rank.source)
    check_fits(mine, facts.identity, facts.contract)
    checkpoint = unsealed(mine, written_by(mine))  # damaged or missing: refused before anything is restored
    base, n = mine.get("elastic_base"), facts.identity["num_samples"]
    remainder = elastic.plan_remainder(unpack(base, n), epoch=mine["epoch"], rank=me, world_size=world,
                                       batch_size=facts.identity["batch_size"], train=facts.identity["train"],
                                       seed=facts.identity["seed"], whole_batches=facts.whole_batches) if base else None
    # The position first: the iterator runs a batch while it is built, and a bad sample there is
    # searched for from this position (and this epoch's slice), not from the start.
    position.restore(mine["epoch"], mine["position"])
    rank.restore(mine, remainder)  # taken in an elastic resume's remainder epoch: the same slice again
    rank.build(checkpoint=checkpoint, written_by=written_by(mine))


def replayed_draw(read: SamplerRead, states: list[dict], identity: dict) -> dict:
    """The flat state a rank of a new world size resumes a drawn sampler's epoch from (restore_elastic)."""
    refusal = read.elastic_refusal()
    if refusal is not None:
        raise ValueError(f"elastic resume refused: {refusal}. Resume on {states[0].get('world_size')} ranks (the "
                         f"world size the states were taken on), or start the next epoch without the loader state")
    return {**states[identity["rank"] % len(states)], "rank": identity["rank"], "world_size": identity["world_size"]}


def written_by(state: dict) -> str:
    """The release that wrote a flat state, as far as the state tells."""
    if state.get("written_by"):
        return state["written_by"]
    return "dali_pipes 0.2.0" if state.get("flat_version") == _FLAT_VERSION else "dali_pipes before 0.3.0"


def restore_elastic(rank: RankPipeline, position: Position, facts: LoaderFacts, states: list[dict]) -> None:
    """Resume the old ranks' interrupted epoch on this world size (elastic.py): this rank's share of
    what they had not delivered, then this world's own pipeline from the next epoch. A loader whose sampler
    is drawn (sampled.py) instead continues old rank (rank mod old world size)'s draw, where the sampler's
    draw does not depend on the world size; else the resume is refused, naming the sampler."""
    if rank.sampled is not None:
        return restore_flat(rank, position, facts, replayed_draw(rank.sampled.read, states, facts.identity))
    for state in states:
        check_data(state, rank.source)
    identity = facts.identity
    epoch, base, plan = elastic_plan(states, {"version": STATE_VERSION, **identity}, facts.contract,
                                     rank=identity["rank"], world_size=identity["world_size"],
                                     batch_size=identity["batch_size"], train=identity["train"], seed=identity["seed"],
                                     whole_batches=facts.whole_batches)
    tuned = next((s["tuned"] for s in states if s.get("tuned")), None)
    merged = {**merged_bad_samples(states), "tuned": tuned, "delivered": pack_bits(base) if plan else None,
              "delivered_complete": True}
    position.restore(epoch)
    rank.restore(merged, plan)
    rank.build()
