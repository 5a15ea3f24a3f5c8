"""The loader's resume state: its layout, nested by owner, its version, and the plan of an elastic resume.

    {"version": 3,
     "loader":      {"epoch", "position", "rank", "world_size", "batch_size", "train", "num_samples", "seed",
                     "written_by", "contract", "fingerprint", "image_size"},  # where the loader is, what it
                                                      # must match (LoaderIdentity), the release that wrote it
     "pipeline":    {"dali", "dali_sha256", "dali_epoch0", "tuned", "sampler"},  # DALI's checkpoint and its
                                                      # digest (dali_checkpoint.sealed), the epoch its pipeline
                                                      # began at; each named hook's state() under its name: the
                                                      # tuner's choice once made (tuning.py; absent before 0.3),
                                                      # a drawn sampler's draw (sampled.py)
     "bad_samples": {"bad_samples", "excluded"},      # recovery.BadSamplePolicy.state()
     "record":      {"delivered", "delivered_complete", "elastic_base"}}   # delivery.DeliveryRecord.state()

Each part comes from its owner and goes back to it whole, never merged flat: the "loader" part to the loader
(its position, and the facts a state must match), "pipeline" to the rank's pipeline (DALI's checkpoint; each
named hook its own key, as "tuned" and "sampler"), "bad_samples" to the bad-sample policy, "record" to the
delivery record. An elastic resume asks each owner to merge its parts of every old rank's state. This module
only lays the parts out, upgrades older layouts (`upgrade`, once, on the way in), checks versions and fit, and
plans an elastic resume.

Version 2 (dali_pipes 0.2.0) kept the same fields flat at the top; `upgrade` sorts them to their owners, and
such a state resumes exactly (its graph and cut are today's). Any other version is refused naming both
versions.

"fingerprint" (fingerprint.py: the data's file names and sizes, as opened) came after 0.2.0; a state that
has one resumes only on data with the same fingerprint (check_data), a state without one as before.

"image_size" is the sizes the loader yields, as --image-size writes them ("0:160,10:192" for a train
schedule, the one val size for val); states written before schedules existed have none, and fit.
"""

from __future__ import annotations

import dataclasses
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
from dali_pipes.run.delivery import DeliveryRecord, unpack
from dali_pipes.run.rank import merged_parts, rank_state, restore_rank

if TYPE_CHECKING:
    from dali_pipes.run.hooks import EpochOrder
    from dali_pipes.run.position import Position
    from dali_pipes.run.rank import RankPipeline

STATE_VERSION = 3
RELEASE = f"dali_pipes {__version__}"  # in each state: an error about an old state can name its release
OWNERS = ("loader", "pipeline", "bad_samples", "record")
_FLAT_VERSION = 2
# 0.2.0's flat fields, by owner (upgrade); the rest are the loader's
_OWNED = {"pipeline": ("dali", "dali_sha256", "dali_epoch0", "tuned", "sampler"),
          "bad_samples": ("bad_samples", "excluded"),
          "record": ("delivered", "delivered_complete", "elastic_base")}


@dataclass(frozen=True)
class LoaderIdentity:
    """What a loader's state records of the loader, and a state must match to resume on it (check_fits)."""
    rank: int
    world_size: int
    batch_size: int
    train: bool
    num_samples: int
    seed: int

    def fields(self) -> dict:
        return dataclasses.asdict(self)


def pack(*, loader: dict, pipeline: dict, bad_samples: dict, record: dict) -> dict:
    return {"version": STATE_VERSION, "loader": loader, "pipeline": pipeline, "bad_samples": bad_samples,
            "record": record}


def upgrade(state: dict) -> dict:
    """A state of any layout this release reads, in today's (version 3, nested by owner), each part a new dict:
    0.2.0's flat fields sorted to their owners; the release that wrote it in its loader part ("written_by",
    as far as the state tells); the record's completeness where older states leave it unsaid (complete at an
    epoch's start). Raises ValueError for a version it does not read."""
    version = state.get("version")
    if version == _FLAT_VERSION:
        owned = {field for fields in _OWNED.values() for field in fields}
        parts = {owner: {k: state[k] for k in fields if k in state} for owner, fields in _OWNED.items()}
        parts["loader"] = {k: v for k, v in state.items() if k not in owned and k != "version"}
        by = "dali_pipes 0.2.0"
    elif version == STATE_VERSION:
        parts = {owner: dict(state.get(owner, {})) for owner in OWNERS}
        by = "dali_pipes before 0.3.0"
    else:
        raise ValueError(f"loader state of version {version} was written by another dali_pipes (this one reads "
                         f"versions {_FLAT_VERSION} and {STATE_VERSION}); resume with the version that wrote it, "
                         f"or start the epoch afresh")
    loader, record = parts["loader"], parts["record"]
    loader["written_by"] = loader.get("written_by") or by
    record.setdefault("delivered_complete", loader.get("position") == 0)  # older states: unknown mid-epoch
    return pack(loader=loader, pipeline=parts["pipeline"], bad_samples=parts["bad_samples"], record=record)


def check_fits(loader: dict, identity: LoaderIdentity, contract: dict) -> None:
    """Raise ValueError unless a state's loader part was taken by a loader like this one (same rank too)."""
    differ = {k: (loader.get(k), v) for k, v in identity.fields().items() if loader.get(k) != v}
    if loader.get("contract", contract) != contract:  # 0.2.0 states have none: their batches cut as today's
        differ["contract"] = (loader["contract"], contract)
    if set(differ) == {"rank"}:  # one rank's state loaded into every rank: a checkpointer that keeps rank 0's
        raise ValueError(f"loader state of rank {loader.get('rank')} loaded into rank {identity.rank}: a loader "
                         f"state belongs to one rank. A checkpointer that saves rank 0's copy alone and loads it "
                         f"into every rank (Accelerate's register_for_checkpointing) needs every rank's: register "
                         f"dali_pipes.frameworks.RankStates(loader) instead of the loader")
    if differ:
        raise ValueError(f"loader state does not fit this loader: (saved, now) = {differ}; resume with "
                         f"the same data, rank, world size, batch size, seed, drop_last and val_padding")


def check_data(loader: dict, source: Any) -> None:
    """Raise DatasetError when the data differs from the data a state (its loader part) was taken on: same
    count or not, resuming mid-epoch on other files would deliver other samples than the interrupted epoch's."""
    saved, now = loader.get("fingerprint"), getattr(source, "fingerprint", None)
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


def check_image_sizes(loaders: list[dict], now: str) -> None:
    """Raise ValueError unless every state (its loader part) was taken under the image sizes `now` (or predates
    them)."""
    for loader in loaders:
        saved = loader.get("image_size", now)
        if saved != now:
            raise ValueError(f"loader state was taken with image_size {saved}, this loader has image_size {now}; "
                             f"resume with the schedule the run was started with (--image-size {saved})")


def elastic_plan(states: list[dict], identity: LoaderIdentity, contract: dict, *,
                 whole_batches: bool) -> tuple[int, np.ndarray, elastic.Remainder | None]:
    """(epoch to continue at, what the old ranks delivered, this rank's remainder or None) for the states of
    every old rank (today's layout). The epoch is the next one when nothing of the old epoch is left."""
    loaders, records = [s["loader"] for s in states], [s["record"] for s in states]
    epoch = elastic.check_states([{"version": s["version"], **s["loader"]} for s in states],
                                 {"version": STATE_VERSION, **identity.fields()}, records=records)
    for old_rank, loader in enumerate(loaders):
        if loader.get("contract", contract) != contract:  # 0.2.0 states have none
            raise ValueError(f"loader state of old rank {old_rank} does not fit this loader: (saved, now) = "
                             f"{loader['contract'], contract}; resume with the same drop_last and val_padding")
    base = DeliveryRecord.merged(records, identity.num_samples)
    plan = elastic.plan_remainder(base, epoch=epoch, rank=identity.rank, world_size=identity.world_size,
                                  batch_size=identity.batch_size, train=identity.train, seed=identity.seed,
                                  whole_batches=whole_batches) if base.any() else None
    return (epoch + 1 if base.any() and plan is None else epoch), base, plan


@dataclass(frozen=True)
class LoaderFacts:
    """What a loader's state records of it, and what a state must match to resume here (the loader gives it)."""
    identity: LoaderIdentity
    contract: dict       # contract.Contract as a dict
    image_size: str      # image_sizes(): the train schedule or the val size
    whole_batches: bool  # train in full batches only (DALI's DROP, or drop_last): an elastic remainder too


def state_of(rank: RankPipeline, next_batch: tuple[int, int], position: Position, facts: LoaderFacts,
             fingerprint: dict | None) -> dict:
    """A loader's state between batches, each part from its owner: the position (`next_batch`, what the
    loader yields next; DALI's epoch end already read), the loader's facts, the rank's parts (rank.rank_state)."""
    epoch, batch = next_batch
    parts = rank_state(rank, epoch_done=epoch != position.epoch)
    return pack(loader={"epoch": epoch, "position": batch, **facts.identity.fields(), "written_by": RELEASE,
                        "contract": facts.contract, "fingerprint": fingerprint, "image_size": facts.image_size},
                **parts)


def restore(rank: RankPipeline, position: Position, facts: LoaderFacts, state: dict | list[dict]) -> None:
    """Put a loader where `state` (one, or every old rank's in rank order) was taken. An empty state ({}, [])
    loads nothing, as torchdata's StatefulDataLoader takes it (`load_state_dict(ckpt.get("loader", {}))`)."""
    if isinstance(state, (dict, list, tuple)) and not state:
        return
    world, me = facts.identity.world_size, facts.identity.rank
    if isinstance(state, (list, tuple)):
        states = [upgrade(s) for s in state]
        check_image_sizes([s["loader"] for s in states], facts.image_size)
        if len(states) != world or any(s["loader"].get("world_size") != world for s in states):
            return restore_elastic(rank, position, facts, states)
        mine = states[me]
    else:
        mine = upgrade(state)
        check_image_sizes([mine["loader"]], facts.image_size)
    restore_parts(rank, position, facts, mine)


def restore_parts(rank: RankPipeline, position: Position, facts: LoaderFacts, mine: dict) -> None:
    """Put a loader where one state `mine` (today's layout), taken on this world size, was taken: each owner
    gets back its own part."""
    loader, identity = mine["loader"], facts.identity
    check_data(loader, rank.source)
    check_fits(loader, identity, facts.contract)
    by = loader["written_by"]
    checkpoint = unsealed(mine["pipeline"], by)  # damaged or missing: refused before anything is restored
    base = mine["record"].get("elastic_base")
    remainder = elastic.plan_remainder(unpack(base, identity.num_samples), epoch=loader["epoch"], rank=identity.rank,
                                       world_size=identity.world_size, batch_size=identity.batch_size,
                                       train=identity.train, seed=identity.seed,
                                       whole_batches=facts.whole_batches) if base else None
    # The position first: the iterator runs a batch while it is built, and a bad sample there is
    # searched for from this position (and this epoch's slice), not from the start.
    position.restore(loader["epoch"], loader["position"])
    restore_rank(rank, mine, remainder)  # taken in an elastic resume's remainder epoch: the same slice again
    rank.build(checkpoint=checkpoint, written_by=by)


def replayed_draw(order: EpochOrder, states: list[dict], identity: LoaderIdentity) -> dict:
    """The state a rank of a new world size resumes a drawn order's epoch from (restore_elastic)."""
    refusal = order.elastic_refusal()
    if refusal is not None:
        raise ValueError(f"elastic resume refused: {refusal}. Resume on {states[0]['loader'].get('world_size')} "
                         f"ranks (the world size the states were taken on), or start the next epoch without the "
                         f"loader state")
    mine = states[identity.rank % len(states)]
    return {**mine, "loader": {**mine["loader"], "rank": identity.rank, "world_size": identity.world_size}}


def restore_elastic(rank: RankPipeline, position: Position, facts: LoaderFacts, states: list[dict]) -> None:
    """Resume the old ranks' interrupted epoch on this world size (elastic.py): this rank's share of
    what they had not delivered, then this world's own pipeline from the next epoch; each owner merges its own
    parts of the old ranks' states (rank.merged_parts). A loader whose epochs follow a drawn order (a sampler's,
    sampled.py) instead continues old rank (rank mod old world size)'s draw, where the order does not depend on
    the world size; else the resume is refused, naming the sampler."""
    if rank.order is not None:
        return restore_parts(rank, position, facts, replayed_draw(rank.order, states, facts.identity))
    for state in states:
        check_data(state["loader"], rank.source)
    epoch, base, plan = elastic_plan(states, facts.identity, facts.contract, whole_batches=facts.whole_batches)
    position.restore(epoch)
    restore_rank(rank, merged_parts(rank, states, base if plan else None), plan)
    rank.build()
