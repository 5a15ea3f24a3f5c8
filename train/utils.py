"""Distributed set-up, the data locations, reductions over ranks, and the learning-rate schedule of the
training loop."""

from __future__ import annotations

import datetime
import os
import signal
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from dali_pipes import Shard
from dali_pipes.loader import resolve_device
from dali_pipes.run.pipeline import cuda_device_id
from dali_pipes.storage.files import is_temp

DEFAULT_DATA = "data/sample/images"  # the built-in dataset, made on first use


def setup_distributed(args) -> tuple[Shard, torch.device]:
    shard = Shard.from_env()
    try:
        args.device = resolve_device(args.device)  # "auto" -> gpu or cpu, once, for both loaders
    except RuntimeError as e:
        raise SystemExit(str(e))
    if args.device == "gpu":
        # cuda_device_id: the local rank's GPU, or the one GPU a rank sees under a scheduler that
        # sets CUDA_VISIBLE_DEVICES per rank (where local_rank would name a device it cannot see).
        index = cuda_device_id(shard)
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    else:
        device = torch.device("cpu")
    if shard.world_size > 1 and not dist.is_initialized():
        # NCCL between GPUs; gloo on CPU. torchrun's env:// rendezvous gives rank and world size.
        # A finite timeout: a rank that dies outside torchrun must not leave the others waiting forever.
        dist.init_process_group("nccl" if args.device == "gpu" else "gloo", timeout=datetime.timedelta(
            seconds=args.dist_timeout), device_id=device if args.device == "gpu" else None)
    return shard, device


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
        self.vote_hooks: list = []  # called as hook(phase) in each vote, "sent" then "decided" (tests: crash)
        self._launcher = os.getppid() if os.environ.get("TORCHELASTIC_RUN_ID") else None  # set by torchrun
        self._launcher_lost = False
        self._group = None
        if dist.is_initialized() and dist.get_backend() != "gloo":  # a CPU group for a flag, beside NCCL
            self._group = dist.new_group(backend="gloo")
        for signum in self.SIGNALS:
            signal.signal(signum, self._note)

    def _note(self, signum, frame) -> None:
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
        for hook in self.vote_hooks:
            hook("decided")
        return self.decision

    def launcher_lost(self) -> bool:
        """Under torchrun: this rank's parent, the launcher, is gone (the rank was re-parented). Nothing then
        forwards signals to the ranks or reports the job's end. Said once per rank, on stderr."""
        if self._launcher is None or self._launcher_lost or os.getppid() == self._launcher:
            return self._launcher_lost
        self._launcher_lost = True
        print(f"rank {int(os.environ.get('RANK', 0))}: the torchrun launcher (pid {self._launcher}) is gone (killed, "
              f"perhaps by a signal it does not handle, such as SIGUSR1): this job stops after this step, with a "
              f"checkpoint if the ranks still answer. Send preemption signals to the ranks, or SIGTERM to torchrun, "
              f"which forwards it (SIGUSR1 too with torchrun --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,"
              f"SIGUSR1)", file=sys.stderr, flush=True)
        return True


def sum_over_ranks(value: float) -> float:
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return t.item()


def mean_over_ranks(value: float) -> float:
    return sum_over_ranks(value) / (dist.get_world_size() if dist.is_initialized() else 1)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """No weight decay on norm weights and biases (1-D parameters)."""
    decay, no_decay = [], []
    for p in model.parameters():
        (no_decay if p.ndim <= 1 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class WarmupCosine:
    """LambdaLR's factor by samples seen (all ranks), not by steps: linear warm-up over
    `warmup_samples`, then cosine decay to 0 at `total_samples`. LambdaLR calls it with its step
    count; samples seen = base_samples + (step - base_step) * global_batch. An object, not a function,
    so that LambdaLR's state_dict saves it: a run resumed on another world size (another global
    batch) calls `rebase` and goes on along the same schedule by samples."""

    def __init__(self, total_samples: int, warmup_samples: int, global_batch: int) -> None:
        self.total_samples, self.warmup_samples, self.global_batch = total_samples, warmup_samples, global_batch
        self.base_step = self.base_samples = 0

    def samples(self, step: int) -> int:
        return self.base_samples + (step - self.base_step) * self.global_batch

    def rebase(self, step: int, global_batch: int) -> None:
        """From `step` on, each step trains on `global_batch` samples."""
        self.base_samples, self.base_step, self.global_batch = self.samples(step), step, global_batch

    def __call__(self, step: int) -> float:
        samples = self.samples(step)
        if samples < self.warmup_samples:
            # steps: (step + 1) / warmup steps; capped, since after a rebase to another global batch
            # the samples need not land on the warm-up's end
            return min(1.0, (samples + self.global_batch) / self.warmup_samples)
        progress = (samples - self.warmup_samples) / max(1, self.total_samples - self.warmup_samples)
        return 0.5 * (1 + np.cos(np.pi * min(1.0, progress)))


def warmup_cosine(total_samples: int, warmup_samples: int, global_batch: int) -> WarmupCosine:
    return WarmupCosine(total_samples, warmup_samples, global_batch)


KILL_WHEN_ENV = "DALI_PIPES_TEST_KILL_WHEN"  # crash tests: when --kill-at-step signals (see kill_at_step)


def kill_at_step(step: int, rank: int, name: str = "KILL", again_during_save: bool = False, when: str = "step"):
    """A crash test's hook: signal rank `rank` right after step `step` (KILL: no cleanup, no goodbye).
    again_during_save: from then on, also signal the process that writes the checkpoint (rank 0) in the
    middle of writing it: when it opens the temporary file and again just before renaming it.
    when (from $DALI_PIPES_TEST_KILL_WHEN): "step", right after the step; "in-vote", inside the stop vote
    that follows it, after this rank's value was sent; "after-vote", right after that vote's result."""
    if when not in ("step", "in-vote", "after-vote"):
        raise SystemExit(f"${KILL_WHEN_ENV}={when}: expected step, in-vote or after-vote")
    phase = {"in-vote": "sent", "after-vote": "decided"}.get(when)

    def hook(run) -> None:
        if run.step == step and again_during_save:
            _signal_during_checkpoint_writes(name)
        if run.step == step and run.shard.rank == rank:
            if phase is None:
                os.kill(os.getpid(), getattr(signal, f"SIG{name}"))
            else:
                run.preemption.vote_hooks.append(_signal_in_next_vote(phase, name))
    return hook


def _signal_in_next_vote(phase: str, name: str):
    """A vote hook: SIG<name> to this process once, at `phase` of the next vote ("sent": while this rank
    waits for the others, its own value already on its way; "decided": right after the result)."""
    sent = []

    def hook(at: str) -> None:
        if at == phase and not sent:
            sent.append(at)
            print(f"crash test: SIG{name} sent in the stop vote ({phase})", file=sys.stderr, flush=True)
            os.kill(os.getpid(), getattr(signal, f"SIG{name}"))
    return hook


def _signal_during_checkpoint_writes(name: str) -> None:
    """Send SIG<name> to this process whenever it opens a checkpoint's temporary file for writing or renames
    one over the checkpoint (an audit hook: the save itself carries no test code). The handler runs right
    then, inside the save; a line on stderr says so."""
    def audit(event: str, args: tuple) -> None:
        opened = event == "open" and isinstance(args[1], str) and "w" in args[1]
        if (opened or event == "os.rename") and isinstance(args[0], str) and \
                os.path.basename(args[0]).startswith("checkpoint.pt.tmp-") and is_temp(args[0]):
            print(f"crash test: SIG{name} sent during the checkpoint write ({event} {args[0]})", file=sys.stderr,
                  flush=True)
            os.kill(os.getpid(), getattr(signal, f"SIG{name}"))
    sys.addaudithook(audit)


def resolve_data(args) -> tuple[str, str]:
    """(train data, val data or ""): the built-in dataset, made once, when --data is not given."""
    data = args.data
    if not data:
        data = os.path.join(DEFAULT_DATA, "train")
        if not os.path.isdir(data):
            from dali_pipes.tools.sample_data import make_sample_dataset
            if int(os.environ.get("RANK", 0)) == 0:
                print(f"making the built-in dataset in {DEFAULT_DATA} ...", flush=True)
                make_sample_dataset(DEFAULT_DATA)
            if dist.is_initialized():
                dist.barrier()
    val = args.val_data
    if not val:
        guess = os.path.join(os.path.dirname(os.path.abspath(data.rstrip("/"))), "val")
        val = guess if os.path.isdir(guess) and os.path.abspath(guess) != os.path.abspath(data) else ""
    return data, val


def num_classes_of(source) -> int:
    """Classes of the train source: its class list, or its largest label + 1."""
    if source.classes:
        return len(source.classes)
    if source.labels:
        return max(source.labels) + 1
    raise SystemExit(f"{source.location}: cannot tell the number of classes (no classes.json); pass --num-classes")
