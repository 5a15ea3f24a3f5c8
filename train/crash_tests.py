"""For the tests only: crash tests' hooks, set by environment variables, never by a flag of `python -m train`.

    DALI_PIPES_TEST_KILL_AT_STEP=9         signal a rank right after step 9 (unset or 0: no crash test)
    DALI_PIPES_TEST_KILL_RANK=1            which rank (default 0)
    DALI_PIPES_TEST_KILL_SIGNAL=TERM       KILL (default: no cleanup, no goodbye), TERM or USR1
    DALI_PIPES_TEST_KILL_AGAIN_DURING_SAVE=1  and signal the process that writes the checkpoint (rank 0)
                                           in the middle of writing it: as it opens the temporary file, and
                                           again just before renaming it
    DALI_PIPES_TEST_KILL_WHEN=step         step: right after the step; in-vote: inside the stop vote that
                                           follows it, after this rank's value was sent; after-vote: right
                                           after that vote's result

The loop knows nothing of them: main() adds `step_hooks()` to the run's step hooks (called as hook(run) after
every step), and a hook adds what it needs to the stop vote's hooks or as an audit hook of the checkpoint write.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from typing import Callable, Mapping

from dali_pipes.storage.files import is_temp
from train.run import Run

PREFIX = "DALI_PIPES_TEST_KILL_"
SIGNALS = ("KILL", "TERM", "USR1")
WHEN = {"step": None, "in-vote": "sent", "after-vote": "decided"}  # when -> the vote's phase (None: no vote)


@dataclass(frozen=True)
class KillAtStep:
    """A crash test's step hook: SIG<signal_name> to rank `rank` right after step `step` (see the module's text)."""
    step: int
    rank: int = 0
    signal_name: str = "KILL"
    again_during_save: bool = False
    when: str = "step"

    def __call__(self, run: Run) -> None:
        if run.step != self.step:
            return
        if self.again_during_save:
            _signal_during_checkpoint_writes(self.signal_name)
        if run.shard.rank == self.rank:
            phase = WHEN[self.when]
            if phase is None:
                os.kill(os.getpid(), getattr(signal, f"SIG{self.signal_name}"))
            else:
                run.preemption.vote_hooks.append(_signal_in_next_vote(phase, self.signal_name))


def step_hooks(environ: Mapping[str, str] = os.environ) -> list[Callable[[Run], None]]:
    """The crash test the environment asks for, as step hooks: none unless DALI_PIPES_TEST_KILL_AT_STEP is set."""
    step = _number(environ, "AT_STEP", "0")
    if not step:
        return []
    name, when = environ.get(PREFIX + "SIGNAL", "KILL"), environ.get(PREFIX + "WHEN", "step")
    if name not in SIGNALS:
        raise SystemExit(f"${PREFIX}SIGNAL={name}: expected one of {', '.join(SIGNALS)}")
    if when not in WHEN:
        raise SystemExit(f"${PREFIX}WHEN={when}: expected step, in-vote or after-vote")
    again = environ.get(PREFIX + "AGAIN_DURING_SAVE", "") not in ("", "0")
    return [KillAtStep(step, _number(environ, "RANK", "0"), name, again, when)]


def _number(environ: Mapping[str, str], name: str, default: str) -> int:
    value = environ.get(PREFIX + name) or default  # set but empty: as unset
    if not value.isdigit():
        raise SystemExit(f"${PREFIX}{name}={value}: expected a whole number (crash tests only: unset it)")
    return int(value)


def _signal_in_next_vote(phase: str, name: str) -> Callable[[str], None]:
    """A vote hook: SIG<name> to this process once, at `phase` of the next vote ("sent": while this rank
    waits for the others, its own value already on its way; "decided": right after the result)."""
    sent: list[str] = []

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

