"""A loader's life around its iterations: one iteration at a time (threads), an iteration interrupted inside
DALI (Ctrl-C), and closing at interpreter exit.

* One iteration at a time. A loader's DALI pipeline has one position, one queue of prefetched batches and one
  executor: two threads that iterate it at once take each other's batches, and DALI's executor, asked twice
  for the same run, stalls one thread and fails the other ("A task can be submitted only once"). The second
  thread's iteration is refused at its first batch, before it touches the pipeline (`OneIteration`); the
  first one goes on undisturbed. In one thread a new iteration replaces an unfinished one (DataLoader's
  habit: the rest of the abandoned epoch is read first), as before.
* An interruption inside DALI. A KeyboardInterrupt (Ctrl-C; or any exception) that lands inside DALI's
  iterator or while a pipeline is built leaves that pipeline in an unknown state: a batch released but none
  scheduled, or no pipeline at all. PipelineRun marks itself `interrupted`; before the loader is next used,
  `recover` counts the interrupted epoch as ended where it stopped (as a `break` does) and builds a fresh
  pipeline at the next epoch's start, as set_epoch's jump does: a whole epoch, with DataLoader's counts. One
  that lands after DALI gave a batch, before the loader counted it (a hook, a batch transform), leaves DALI
  whole and one batch ahead of the position: the next iteration finishes the epoch as after a `break`, and
  DALI's own end of the epoch stops it there, so the next epoch is DALI's next, as uninterrupted.
* Exit. At interpreter shutdown module globals become None one module at a time; a pipeline freed then (a loader
  kept in a module's global) would fail inside its own cleanup. Every rank pipeline is closed at exit instead
  (atexit runs before the modules go), and a loader's __del__ keeps quiet whatever is left.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import weakref
from typing import TYPE_CHECKING, Iterator, Protocol

if TYPE_CHECKING:
    from dali_pipes.errors import DatasetError
    from dali_pipes.run.delivery import DeliveryRecord
    from dali_pipes.run.elastic import Remainder
    from dali_pipes.run.pipeline_run import PipelineRun
    from dali_pipes.run.position import Position


class Rank(Protocol):
    """What this module needs of the rank's pipeline (rank.RankPipeline, which imports this module)."""
    run: PipelineRun
    remainder: Remainder | None
    record: DeliveryRecord

    @property
    def failure(self) -> DatasetError | None: ...
    def build(self, checkpoint: bytes | None = None, written_by: str = "this loader") -> None: ...


class OneIteration:
    """Which thread iterates a loader now: a second thread's iteration is refused while another thread's is
    unfinished (not exhausted, closed or garbage collected)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: tuple[threading.Thread, object] | None = None  # (thread, the iteration's token)

    @contextlib.contextmanager
    def begin(self, pipe: Rank, at: Position) -> Iterator[None]:
        """Held for one iteration (the body of the loader's epoch generator): this thread's, unless another
        thread's is unfinished (RuntimeError, at once, the other's untouched); a loader that failed raises its
        failure again, an interrupted one is recovered first (`recover`)."""
        me, token = threading.current_thread(), object()
        with self._lock:
            owner = self._owner
            if owner is not None and owner[0] is not me and owner[0].is_alive():
                raise RuntimeError(
                    f"this DaliLoader is being iterated by thread {owner[0].name!r} (at epoch {at.epoch}, batch "
                    f"{at.batch}); a loader gives one iteration at a time, so thread {me.name!r} may not iterate "
                    f"it too. Use one loader per thread, or let the other thread finish its epoch (or break out "
                    f"of it) first")
            self._owner = (me, token)
        try:
            if pipe.failure is not None:
                raise pipe.failure  # never continue silently after a pipeline error
            recover(pipe, at)
            yield
        finally:
            with self._lock:
                if self._owner is not None and self._owner[1] is token:
                    self._owner = None



def recover(pipe: Rank, at: Position, *, lazily: bool = False) -> None:
    """After an interruption inside DALI (pipe.run.interrupted; in a state_dict's drain too): the interrupted
    epoch ends where it stopped, as after a `break`, and a fresh pipeline starts the next epoch (the same epoch,
    if none of it was yielded). Nothing to do otherwise, or once the loader failed (it refuses to go on:
    pipe.failure). `lazily` (len(), state_dict()): only where the pipeline cannot answer without it, none being
    built or no checkpoint of the last delivered batch kept; where one is (s3:// data, skip_bad), a state taken
    after the error (a store's outage given up on) resumes exactly at its last batch, and no store is asked."""
    run = pipe.run
    if not run.interrupted or pipe.failure is not None or (lazily and run.iterator is not None
                                                                   and run.last_good is not None):
        return
    if at.batch:
        at.next_epoch()
        at.resumed = False
        pipe.remainder = None  # an elastic resume's rest of an epoch, interrupted: over, as the epoch is
    pipe.record.end_epoch()  # the delivery record of a whole epoch only (sharding check, states)
    pipe.build()  # fresh: DALI's slices rotate from this epoch (RankPipeline.first_epoch)


class Closeable(Protocol):
    def close(self) -> None: ...


_OPEN: weakref.WeakSet[Closeable] = weakref.WeakSet()


def close_at_exit(closeable: Closeable) -> None:
    """Close `closeable` at interpreter exit, before module globals go (held weakly: it may go first)."""
    _OPEN.add(closeable)


@atexit.register
def _close_open() -> None:
    for closeable in list(_OPEN):
        try:
            closeable.close()
        except Exception:  # at exit: a close that fails has no one to tell, and must not stop the others
            pass
