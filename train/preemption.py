"""Preemption: SIGTERM / SIGUSR1 noted by a handler, the stop vote every rank takes at the same points, the lost
torchrun launcher, and WORKDIR/preempted.json, which tells a requeue script how the last run stopped."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from dataclasses import dataclass
from types import FrameType
from typing import Callable

import torch
import torch.distributed as dist

from dali_pipes.storage.files import atomic_write

STATUS_NAME = "preempted.json"  # WORKDIR/preempted.json: how the last run stopped, for a requeue script


@dataclass(frozen=True)
class Stop:
    """A stop vote's result, the same on every rank: the highest signal any rank noted (0: none), and whether
    any rank lost its torchrun launcher. True when the ranks stop."""
    signum: int = 0
    launcher_lost: bool = False

    def __bool__(self) -> bool:
        return bool(self.signum or self.launcher_lost)

    @property
    def exit_code(self) -> int:
        """128 + the signal, as a shell reports a process killed by it; 1 for a lost launcher alone."""
        return 128 + self.signum if self.signum else 1


class Preemption:
    """SIGTERM or SIGUSR1, which SLURM and Kubernetes send 30-90 s before SIGKILL: the handler only notes
    it (a second one during a save changes nothing), and the loop acts at the next step boundary.

    Every rank acts on a vote, never on its own flag, and all take each vote at the same point (after each
    step, and after each epoch's training): so all stop after the same step. A noted signal is never
    lowered: one that arrives while this rank waits in a vote (its own 0 already sent) counts at the next.
    Under torchrun, a rank whose launcher is gone (its parent changed) votes to stop as well."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.signum = 0        # the first signal this process received; only the handler writes it
        self.decision = Stop()  # the last vote's result
        # called as hook(phase) in each vote, "sent" then "decided" (the crash tests' hooks: crash_tests.py)
        self.vote_hooks: list[Callable[[str], None]] = []
        self._launcher = os.getppid() if os.environ.get("TORCHELASTIC_RUN_ID") else None  # set by torchrun
        self._launcher_lost = False
        self._group = None
        if dist.is_initialized() and dist.get_backend() != "gloo":  # a CPU group for a flag, beside NCCL
            self._group = dist.new_group(backend="gloo")
        for signum in self.SIGNALS:
            signal.signal(signum, self._note)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.signum = self.signum or signum

    def stop_now(self) -> Stop:
        """The vote: the signal any rank has received and whether any rank lost its launcher, by one tiny
        all-reduce (sync point); true when every rank is to stop here."""
        flag = torch.tensor([self.signum, self.launcher_lost()], dtype=torch.int64)  # read before it is sent
        if dist.is_initialized():
            work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
            for hook in self.vote_hooks:
                hook("sent")  # this rank's value is on its way; it waits for the others'
            work.wait()
        self.decision = Stop(int(flag[0]), bool(flag[1]))
        if self.decision.launcher_lost:
            # another rank saw it first (this rank read its parent before the launcher died): look again, so that
            # every rank whose launcher is gone says so, not only the first to notice
            self.launcher_lost()
        for hook in self.vote_hooks:
            hook("decided")
        return self.decision

    def launcher_lost(self) -> bool:
        """Under torchrun: this rank's parent, the launcher, is gone (the rank was re-parented). Nothing then
        forwards signals to the ranks or reports the job's end. Said once per rank, on stderr."""
        if self._launcher is None or self._launcher_lost or os.getppid() == self._launcher:
            return self._launcher_lost
        self._launcher_lost = True
        # one write of the whole line: print() writes the text and its newline apart, and the ranks share stderr
        rank = int(os.environ.get("RANK", 0))
        sys.stderr.write(f"rank {rank}: the torchrun launcher (pid {self._launcher}) is gone (killed, perhaps by a "
                         f"signal it does not handle, such as SIGUSR1): this job stops after this step, with a "
                         f"checkpoint if the ranks still answer. Send preemption signals to the ranks, or SIGTERM to "
                         f"torchrun, which forwards it (SIGUSR1 too with torchrun "
                         f"--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1)\n")
        sys.stderr.flush()
        return True


def write_status(workdir: str, stop: Stop, step: int, epoch: int, batch: int, pending_epoch: int | None) -> dict:
    """WORKDIR/preempted.json (rank 0), written atomically: the signal, the ranks' exit status, where the run
    stopped, its checkpoint, an epoch whose validation is pending, how to go on. Returns what it wrote."""
    status = {"signal": signal.Signals(stop.signum).name if stop.signum else None,
              "launcher_lost": stop.launcher_lost, "exit_code": stop.exit_code, "step": step,
              "epoch": epoch, "batch": batch, "checkpoint": os.path.join(workdir, "checkpoint.pt"),
              "pending_epoch": pending_epoch, "resume": "the same command with --resume"}
    with atomic_write(os.path.join(workdir, STATUS_NAME), "w") as f:
        json.dump(status, f, indent=1)
    return status


def clear_status(workdir: str) -> None:
    """A new run in `workdir` makes the last run's preempted.json stale (rank 0, once the workdir is held)."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(workdir, STATUS_NAME))
