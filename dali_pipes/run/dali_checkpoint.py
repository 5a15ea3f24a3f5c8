"""DALI checkpoints that outlive the graph they were taken on.

A DALI checkpoint holds one entry per operator of the graph, by the operator's name, and DALI restores it
only into a graph with exactly those names. Operators we name ourselves keep their names (graph.py names
every operator that draws random numbers); DALI names the rest by their place in the graph
(`__Resize_13`), so a graph that gains an operator renames those after it, and a loader state saved
before (0.2.0's, say) would no longer restore.

`restored_pipeline` builds at a checkpoint and, when DALI refuses it, carries the checkpoint over to
today's graph: operators that keep no state take none, and each stateful one takes the state of the
old operator of the same name or, failing that, of the same kind in the same order (one random crop,
one coin flip, ...). The reader's position always carries over exactly, or the restore is refused; an
augmentation operator without a counterpart starts its random draws afresh, and a warning says so.
A checkpoint that cannot be restored raises CheckpointError: never a data error, never a search for
bad samples.

A state keeps its checkpoint with a digest (`sealed`): a byte changed after the state was taken (a damaged
file, a bad copy), which DALI might restore without a word, is refused before anything is restored (`unsealed`),
as is a state that lacks its checkpoint. States written before the digest are checked as DALI parses them."""

from __future__ import annotations

import hashlib
import logging
import re
from typing import TYPE_CHECKING, Callable

from dali_pipes.data.reader import READER_NAME
from dali_pipes.graph._dali import checkpoint_entries, checkpoint_with_entries, operator_schemas, shutdown_pipeline

if TYPE_CHECKING:
    from nvidia.dali import Pipeline

log = logging.getLogger("dali_pipes")
_GENERATED_NAME = re.compile(r"^__(.+)_\d+$")  # DALI's name of an operator nobody named: __<schema>_<n>
# What DALI says when a checkpoint does not fit the graph or its states do not parse (DALI 2.4.0).
_REFUSALS = ("checkpoint", "Philox", "doesn't recognize")
_AFRESH = " (python -m train: a new --workdir)"


class CheckpointError(ValueError):
    """A loader state's DALI checkpoint that cannot be restored into this loader's graph."""


def sealed(checkpoint: bytes | None) -> dict:
    """A state's DALI checkpoint ("dali") with its digest ("dali_sha256"); None: the state starts afresh."""
    return {"dali": checkpoint, "dali_sha256": None if checkpoint is None else hashlib.sha256(checkpoint).hexdigest()}


def unsealed(state: dict, written_by: str) -> bytes | None:
    """The DALI checkpoint of a flat loader state (written by `written_by`), checked against its digest where the
    state has one. CheckpointError when it is missing, not bytes, or not the bytes that were saved."""
    if "dali" not in state:
        raise CheckpointError(f"the loader state (written by {written_by}) has no DALI checkpoint ('dali' of its "
                              f"'pipeline' part): it is not a whole state as state_dict() gives it. Load the whole "
                              f"state, or start afresh without it{_AFRESH}")
    checkpoint, digest = state["dali"], state.get("dali_sha256")
    if checkpoint is not None and not isinstance(checkpoint, (bytes, bytearray)):
        raise CheckpointError(f"the loader state's DALI checkpoint (written by {written_by}) is a "
                              f"{type(checkpoint).__name__}, not bytes. Load the state as state_dict() gave it "
                              f"(torch.save / torch.load keep bytes), or start afresh without it{_AFRESH}")
    if digest is not None and (checkpoint is None or hashlib.sha256(checkpoint).hexdigest() != digest):
        raise CheckpointError(f"the loader state's DALI checkpoint (written by {written_by}) is damaged: its bytes "
                              f"are not the bytes that were saved (sha256 {digest[:16]}... expected). Load an "
                              f"undamaged copy of the state (an earlier checkpoint of the run), or start afresh "
                              f"without the state{_AFRESH}")
    return None if checkpoint is None else bytes(checkpoint)


def restored_pipeline(define: Callable[[bytes | None], Pipeline], checkpoint: bytes, written_by: str) -> Pipeline:
    """A built pipeline at `checkpoint` (`define(checkpoint)` defines one, `define(None)` a fresh one).

    Raises CheckpointError when the checkpoint cannot be restored even carried over; an error of the
    fresh graph itself (a bad file at build) propagates as DALI raised it."""
    pipe = define(checkpoint)
    try:
        pipe.build()
        return pipe
    except (RuntimeError, ValueError) as error:  # DALI 2.4 raises ValueError for a state it cannot parse
        _shutdown_quietly(pipe)
        if not isinstance(error, UnicodeDecodeError) and not any(word in str(error) for word in _REFUSALS):
            raise  # not about the checkpoint (DALI decodes its names: a damaged one fails so): recovery hears it
        refusal = error
    carried = carried_over(define, checkpoint, written_by, refusal)
    pipe = define(carried)
    try:
        pipe.build()
    except (RuntimeError, ValueError) as error:
        _shutdown_quietly(pipe)
        raise CheckpointError(_refused(written_by, error)) from error
    return pipe


def carried_over(define: Callable[[bytes | None], Pipeline], checkpoint: bytes, written_by: str,
                 refusal: Exception) -> bytes:
    """`checkpoint` rewritten onto the operator names of the graph `define(None)` builds."""
    try:
        old = checkpoint_entries(checkpoint)
    except ValueError as error:
        raise CheckpointError(_refused(written_by, error)) from error
    fresh = define(None)
    try:
        fresh.build()
        new, schemas = checkpoint_entries(fresh.checkpoint()), operator_schemas(fresh)
    finally:
        _shutdown_quietly(fresh)
    if [name for name, _ in old] == [name for name, _ in new]:
        raise CheckpointError(_refused(written_by, refusal))  # the names fit: its states do not
    entries, restarted = match_states(old, new, schemas)
    if READER_NAME in restarted:
        raise CheckpointError(_refused(written_by, f"it has no state of the reader {READER_NAME!r}"))
    if restarted:
        log.warning("the loader state's DALI checkpoint (%s) was taken on another graph: the reader resumes at "
                    "its exact position, but the random draws of %s start afresh, so their augmentations differ "
                    "from an uninterrupted run's", written_by, ", ".join(restarted))
    else:
        log.info("the loader state's DALI checkpoint (%s) was carried over to this graph exactly", written_by)
    return checkpoint_with_entries(checkpoint, entries)


def match_states(old: list[tuple[str, bytes]], new: list[tuple[str, bytes]],
                 schemas: dict[str, str]) -> tuple[list[tuple[str, bytes]], list[str]]:
    """(the new graph's entries with the old states, the stateful new operators left with a fresh state).

    A stateful new operator takes the old state of its own name; the rest pair up by schema, in DALI's
    order, where old and new have as many of that schema (else they restart: a pairing by guess would
    give other draws than either graph's)."""
    new_names = {name for name, _ in new}
    old_by_name = {name: state for name, state in old if state}
    unnamed_old = [(name, state) for name, state in old if state and name not in new_names]
    unnamed_new = [name for name, state in new if state and name not in old_by_name]
    pairs: dict[str, bytes] = {}  # {new operator: the old state it takes}
    for schema in {_schema_of(name, schemas) for name in unnamed_new}:
        olds = [state for name, state in unnamed_old if _schema_of(name, {}) == schema]
        news = [name for name in unnamed_new if _schema_of(name, schemas) == schema]
        if len(olds) == len(news):
            pairs.update(zip(news, olds))
    entries, restarted = [], []
    for name, fresh_state in new:
        state = old_by_name.get(name) or pairs.get(name)
        if fresh_state and state is None:
            restarted.append(name)
        entries.append((name, state if fresh_state and state is not None else fresh_state))
    return entries, restarted


def _schema_of(name: str, schemas: dict[str, str]) -> str | None:
    """The operator's schema: from the graph when known, else from the name DALI generated."""
    if name in schemas:
        return schemas[name]
    generated = _GENERATED_NAME.match(name)
    return generated.group(1) if generated else None


def _refused(written_by: str, why: object) -> str:
    return (f"the loader state's DALI checkpoint (written by {written_by}) cannot be restored into this loader's "
            f"graph: {why}. Resume with the dali_pipes version that wrote it, or start afresh without the "
            f"state{_AFRESH}")


def _shutdown_quietly(pipe) -> None:
    try:
        shutdown_pipeline(pipe)
    except Exception:  # a pipeline that failed to build may hold nothing to free
        pass
