"""The one error type for bad datasets, so callers can catch data problems apart from bugs."""

from __future__ import annotations


class DatasetError(ValueError):
    """A dataset that cannot be read as asked, as data: `where` (a file, shard#record or tar#key),
    `problem` (what was found) and `fix` (what to do). Code that needs the parts reads the fields;
    nothing parses the message back."""

    def __init__(self, where: str, problem: str = "", fix: str = "") -> None:
        if not problem:  # a whole message with no single place to name
            where, problem = "", where
        self.where, self.problem, self.fix = where, problem, fix
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.where}: {self.problem}" if self.where else self.problem
        return f"{text}. {self.fix}" if self.fix else text

    def __reduce__(self):  # picklable across worker processes with its fields
        return type(self), (self.where, self.problem, self.fix)


class LabelError(DatasetError):
    """A label out of range: negative after the label offset, or at or above the known number of classes.
    A wrong --label-offset or a bad conversion, not a damaged sample: skip_bad never excludes it."""


class IndexMismatchError(DatasetError):
    """A record not where its shard's index puts it: the index's fault, not the data's, so skip_bad never
    excludes the sample (the recovery names the index file instead)."""


def install_hint(extra: str) -> str:
    """The command that installs an optional extra, as every message says it: from the checkout, since
    dali_pipes is not on PyPI (once it is released, `pip install 'dali_pipes[EXTRA]'` does the same)."""
    return f"pip install '.[{extra}]' (from the dali_pipes checkout)"
