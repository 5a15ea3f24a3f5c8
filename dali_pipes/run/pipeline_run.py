"""One rank's DALI pipeline and its iterator over a run of rebuilds (PipelineRun): fresh or at a DALI
checkpoint, its batches, the last good checkpoint to recover to, shutdown."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable, Iterator

from dali_pipes.data.reader import READER_NAME
from dali_pipes.data.source import Source
from dali_pipes.graph._dali import iterator_pipelines, shutdown_pipeline
from dali_pipes.graph.wheel import require_dali
from dali_pipes.run.dali_checkpoint import restored_pipeline
from dali_pipes.run.pipeline import Feed, PipelineSpec, build_pipeline, reader_model
from dali_pipes.storage import remote
from dali_pipes.storage.remote import ClientOptions

# What a pipeline raises that a rebuild may get past: DALI's errors (RuntimeError), and the storage layer's
# ConnectionError raised in a Python-fed source's reads (Parquet), which DALI passes on as it is.
PIPELINE_ERRORS = (RuntimeError, ConnectionError)

if TYPE_CHECKING:
    from nvidia.dali.plugin.pytorch import DALIGenericIterator


class PipelineRun:
    """One rank's DALI pipeline and its iterator, over a run of rebuilds: build it fresh or at a DALI
    checkpoint, give its batches, keep the last good checkpoint to recover to, shut it down.

    `inputs(fresh)` gives what to build, (source, spec), each time (the source may have
    changed: bad samples excluded, a remote feed's cache paths); `cleanup()` runs after each attempt.
    `recover(error)` hears every pipeline error (PIPELINE_ERRORS): it raises, or excludes the culprits or
    waits out a network fault, after which the pipeline is built again at the last good checkpoint. The
    iterator runs the first batch while it is built, so a bad sample can surface there too.
    `keep_checkpoints`: take the checkpoint of every batch (only where an error may need a rebuild there:
    skip_bad, network faults of remote data). `options`: the loader's retries and timeouts, in force while a
    pipeline is defined (a Python-fed source's reads keep them).

    With a `feed` (hooks.EpochOrder's: a sampler's drawn order) the pipeline reads what the feed gives, not the
    source's reader: its epoch ends where the feed's does, and the feed's next epoch starts it again (reset,
    never a rebuild)."""

    def __init__(self, inputs: Callable[[bool], tuple[Source, PipelineSpec]], cleanup: Callable[[], None],
                 recover: Callable[[Exception], None], *, drop: bool, keep_checkpoints: bool,
                 feed: Feed | None = None, options: ClientOptions | None = None) -> None:
        self._inputs, self._cleanup, self._recover = inputs, cleanup, recover
        self.drop, self.keep_checkpoints, self.feed = drop, keep_checkpoints, feed  # DROP: DALI's full batches only
        self.options = options
        self.iterator: DALIGenericIterator | None = None  # None: not built, or closed
        self.last_good: bytes | None = None  # DALI checkpoint after the last delivered batch
        self.drain_due = False  # drain_later
        self.ended = False  # a fed pipeline read its feed's epoch end
        self.interrupted = False  # an exception (Ctrl-C) left DALI in an unknown state: rebuild (lifetime.py)
        self._length: int | None = None  # batches per epoch of a Python-fed source (no reader to ask)

    def build(self, checkpoint: bytes | None = None, written_by: str = "this loader") -> None:
        """Build fresh, or at `checkpoint` (taken by `written_by`: a saved state's may come from an older
        graph, which dali_checkpoint.py carries over, or refuses with CheckpointError: never a data error)."""
        with self._watched():
            self._build(checkpoint, written_by)
        self.interrupted = False  # a whole pipeline again

    def _build(self, checkpoint: bytes | None, written_by: str) -> None:
        require_dali()
        self.drain_due = self.ended = False
        while True:
            self.close()
            source, spec = self._inputs(checkpoint is None)
            if self.feed is not None:
                self.feed.bind(source)  # from the loader's position: DALI's checkpoint is the state there
            # source and spec bound now: restored_pipeline calls `define` within this turn only
            define = lambda at, source=source, spec=spec: build_pipeline(  # noqa: E731
                source, spec, at, sample_ids=True, feed=self.feed)
            pipe = None
            try:
                with remote.options_in_force(self.options):
                    pipe = restored_pipeline(define, checkpoint, written_by) if checkpoint else define(None)
                    iterator, self._length = dali_iterator(pipe, source, spec, self.drop, fed=self.feed is not None)
                self.iterator = iterator
            except PIPELINE_ERRORS as error:
                if pipe is not None:
                    shutdown_quietly(pipe)  # the iterator never took it: free its threads before the next try
                self._recover(error)  # raises, or excludes the culprits: then build again
                continue
            finally:
                self._cleanup()
            self.last_good = checkpoint or iterator.checkpoints()[0]
            return

    def next(self, before: Callable[[], None]) -> dict | None:
        """The next batch (`before()` first), recovering from bad samples; None at DALI's epoch end."""
        with self._watched():
            return self._next(before)

    @contextlib.contextmanager
    def _watched(self) -> Iterator[None]:
        """An exception out of a build or a batch (a KeyboardInterrupt inside DALI's iterator: a batch released
        and none scheduled, say) leaves the pipeline in an unknown state: marked, never read again."""
        try:
            yield
        except BaseException:
            self.interrupted, self.drain_due = True, False
            raise

    def _next(self, before: Callable[[], None]) -> dict | None:
        while True:
            before()
            self._restart()
            iterator = self._built()
            try:
                (batch,) = next(iterator)  # one pipeline per rank -> one dict per step
            except StopIteration:
                self.ended = True
                return None
            except PIPELINE_ERRORS as error:  # the iterator is unusable now
                self._recover(error)
                self.build(checkpoint=self.last_good)  # and back to the last good batch
                continue
            # Taken after every batch only when a recovery may need it; else read by checkpoint().
            self.last_good = iterator.checkpoints()[0] if self.keep_checkpoints else None
            return batch

    def _restart(self) -> None:
        """A fed pipeline that read its epoch's end starts the feed's next epoch."""
        if self.ended and self.feed is not None and self.feed.has_next():
            self.ended = False
            self._built().reset()

    def drain_later(self) -> None:
        """The epoch's last batch is out: DALI's rest of the epoch is read once the loop comes back for more
        or asks for a state (settle), not before the yield, while the training step runs on the last one."""
        self.drain_due = True

    def settle(self, before: Callable[[], None]) -> None:
        if self.drain_due:
            self.drain_due = False
            self.drain(before)

    def drain(self, before: Callable[[], None]) -> None:
        """Read DALI's epoch to its end: a checkpoint taken then starts the next epoch cleanly."""
        while self.next(before) is not None:
            pass
        if self.keep_checkpoints:
            self.last_good = self._built().checkpoints()[0]

    def skipped_to(self, checkpoint: bytes) -> None:
        """A batch was delivered without DALI (val_cache.py gives a val epoch again): a state taken now starts
        DALI at `checkpoint`, where the epoch that filled the cache stood after that batch."""
        self.last_good = checkpoint

    def checkpoint(self) -> bytes:
        """DALI's state after the last delivered batch (reader position, every random generator)."""
        return self.last_good or self._built().checkpoints()[0]

    def __len__(self) -> int:
        return len(self._built()) if self._length is None else self._length

    def _built(self) -> DALIGenericIterator:
        """The iterator; ValueError (not DALI's RuntimeError, which recovery hears) once closed."""
        if self.iterator is None:
            raise ValueError("the loader's pipeline is closed (close() was called): make a new loader")
        return self.iterator

    def close(self) -> None:
        """Free the pipeline (its threads and memory) now rather than at garbage collection."""
        if self.iterator is not None:
            pipes = iterator_pipelines(self.iterator)
            self.iterator = None
            for pipe in pipes:
                shutdown_pipeline(pipe)
            del pipes


def dali_iterator(pipe, source: Source, spec: PipelineSpec, drop: bool,
                 fed: bool = False) -> tuple[DALIGenericIterator, int | None]:
    """(DALI's iterator over `pipe`, its batches per epoch where its length cannot tell them). A DALI reader's
    metadata gives the iterator its epoch; a Python-fed source (PYTHON_FED: Parquet) ends each epoch itself
    with StopIteration after whole batches, as many as ReaderModel.batches counts for the policy. A pipeline
    `fed` a sampler's order (sampled.py) has neither: the feed ends its epochs and starts them (_restart)."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    names = ["images", "labels", "ids"]
    if fed:
        return DALIGenericIterator(pipe, names, last_batch_policy=LastBatchPolicy.FILL, auto_reset=False,
                                   prepare_first_batch=False), None
    if source.format.PYTHON_FED:
        length = reader_model(spec, source.num_samples, False).batches(drop)
        return DALIGenericIterator(pipe, names, last_batch_policy=LastBatchPolicy.FILL, auto_reset=True), length
    policy = LastBatchPolicy.DROP if drop else LastBatchPolicy.FILL
    return DALIGenericIterator(pipe, names, reader_name=READER_NAME, last_batch_policy=policy, auto_reset=True), None


def shutdown_quietly(pipe) -> None:
    try:
        shutdown_pipeline(pipe)
    except Exception:  # a pipeline that failed to build may hold nothing to free
        pass
