"""The epoch contract: how many batches a rank yields per epoch and which entries of each are real.

DALI's reader, with pad_last_batch=True and LastBatchPolicy.FILL, gives every rank the same stream
shape: ceil(longest shard / batch) full batches, this rank's `real` samples first, then repeats of
its last sample (checked against DALI 2.4.0 over 1-4 ranks, train and val). The loader cuts its
batches from that stream as DataLoader + DistributedSampler would deliver them:

  * per rank, `per_rank` samples: ceil(N / world_size), or floor(N / world_size) when the sampler
    drops the last (DistributedSampler's num_samples); `batches` = ceil(per_rank / batch_size), or
    floor with the loader's drop_last. The same on every rank, so DDP never waits on one;
  * val_padding="repeat" (val's default, DistributedSampler's way): the few entries past `real` are
    repeats of real samples with their real labels; the last batch is short, never empty;
  * val_padding="label": full batches, the entries past `real` labelled PADDING_LABEL (-1) for loops
    that mask, each real sample counted once;
  * val_padding="none": this rank's real samples only, each once; batch counts may differ by one
    across ranks (for loops that reduce once at the end);
  * train, drop_last=False (real samples, no repeats): the entries past `real` are cut. Only where
    that would empty the last batch of a rank holding one sample fewer than the others does one
    repeat stay, so that batch counts stay equal. drop_last=True: full batches (at most one repeat,
    as DistributedSampler's padding);
  * train with DALI's DROP policy (the keyword form's default, `drop_last` unset): DALI's own full
    batches, the tail dropped, each sample at most once.

The DALI batches past `batches` are read and dropped before the last batch is yielded, so that a
state taken after it starts the next epoch cleanly.
"""

from __future__ import annotations

from dataclasses import dataclass

from dali_pipes.errors import DatasetError

VAL_PADDINGS = ("repeat", "label", "none")


def _fewer(num_samples: int, world_size: int) -> str:
    most = max(1, num_samples // world_size)
    return f"Lower batch_size (--batch-size) to at most {most}, or give more data"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class EpochCut:
    """One rank's epoch: `batches` batches of `size(i)` entries, the first `real_in(i)` real."""
    batches: int
    batch_size: int
    count: int         # entries yielded over the epoch, repeats included (label: full batches)
    real: int          # real samples of this rank's stream this epoch
    pad_label: bool    # entries past `real` carry PADDING_LABEL (val_padding="label")
    per_rank: int      # DataLoader's count for this rank (len of its DistributedSampler)

    @property
    def real_count(self) -> int:
        """Real samples yielded this epoch (repeats and padding not counted)."""
        return min(self.real, self.count)

    def size(self, i: int) -> int:
        """Entries of batch i."""
        return max(0, min(self.batch_size, self.count - i * self.batch_size))

    def real_in(self, i: int) -> int:
        """Real (not repeated) entries of batch i: the first ones."""
        return max(0, min(self.size(i), self.real - i * self.batch_size))


@dataclass(frozen=True)
class Contract:
    """The batches a rank yields, from the DataLoader arguments it was built with."""
    train: bool
    batch_size: int
    drop_last: bool         # the loader's: drop the last short batch
    val_padding: str = "repeat"
    sampler_drop_last: bool = False  # DistributedSampler(drop_last=True): floor(N / world) per rank
    dali_drop: bool = False  # train through DALI's DROP policy: its full batches, the tail dropped

    def __post_init__(self) -> None:
        if self.val_padding not in VAL_PADDINGS:
            raise ValueError(f"val_padding must be one of {VAL_PADDINGS}, got {self.val_padding!r}")

    def check_one_batch(self, num_samples: int, world_size: int, where: str) -> None:
        """Refuse, before DALI builds, a loader that would yield no batch."""
        b = self.batch_size
        if num_samples < world_size:  # a rank with an empty slice: DALI's reader cannot read it
            raise ValueError(f"{where}: {num_samples} samples over {world_size} ranks leave a rank with none; "
                             f"use at most {num_samples} ranks for this data")
        if self.dali_drop and num_samples // world_size < b:
            raise DatasetError(where, f"{num_samples} samples over {world_size} ranks give less than one batch of "
                               f"{b} per rank in train mode (the tail is dropped)", _fewer(num_samples, world_size))
        if self.drop_last and self.per_rank(num_samples, world_size) < b:
            raise DatasetError(where, f"{num_samples} samples over {world_size} ranks give less than one batch of "
                               f"{b} per rank with drop_last=True", _fewer(num_samples, world_size))

    def per_rank(self, num_samples: int, world_size: int) -> int:
        """DistributedSampler's num_samples: what one rank yields per epoch, repeats included."""
        if self.sampler_drop_last:
            return num_samples // world_size
        return ceil_div(num_samples, world_size)

    def cut(self, real: int, per_rank: int) -> EpochCut:
        """This rank's epoch from its `real` samples and the DataLoader count `per_rank`."""
        b = self.batch_size
        whole = (lambda n: n // b) if self.drop_last else (lambda n: ceil_div(n, b))
        if not self.train and self.val_padding == "none":
            batches = whole(real)
            return EpochCut(batches, b, min(real, batches * b), real, False, per_rank)
        batches = whole(per_rank)
        if not self.train and self.val_padding == "label":
            return EpochCut(batches, b, batches * b, real, True, per_rank)
        count = min(per_rank, batches * b)
        if self.train and not self.drop_last:  # real samples only; one repeat where the last batch would be empty
            count = min(count, max(real, (batches - 1) * b + 1)) if batches else 0
        return EpochCut(batches, b, count, real, False, per_rank)

    def epoch_cut(self, reader, pipeline_epoch: int, remainder, dali_batches: int, num_samples: int) -> EpochCut:
        """This rank's epoch: DALI's own batches (DROP), an elastic resume's remainder plan, or the slice
        `reader` (reader.ReaderModel) says DALI reads in the pipeline's epoch `pipeline_epoch`."""
        if self.dali_drop:
            return self.dali_cut(dali_batches)
        if remainder is not None:
            return self.cut(remainder.real, len(remainder.indices))
        real = reader.slice_size(reader.shard_of(pipeline_epoch))
        return self.cut(real, self.per_rank(num_samples, reader.world_size))

    def dali_cut(self, dali_batches: int) -> EpochCut:
        """DALI's DROP policy: its own full batches, all real."""
        count = dali_batches * self.batch_size
        return EpochCut(dali_batches, self.batch_size, count, count, False, count)
