"""The epoch contract (contract.py) against DataLoader + DistributedSampler themselves: for every
N, world size, batch size and drop_last, the batch count and the batch sizes of each rank are
DataLoader's; repeats, padding and cuts follow the documented modes."""

import itertools

import pytest
from torch.utils.data import DataLoader, DistributedSampler

from dali_pipes.run.contract import Contract, ceil_div


def dataloader_batches(n: int, world: int, rank: int, batch: int, drop_last: bool, sampler_drop_last: bool):
    """Batch sizes torch's own DataLoader yields on `rank` for a dataset of n samples."""
    data = list(range(n))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False, drop_last=sampler_drop_last)
    return [len(b) for b in DataLoader(data, batch_size=batch, sampler=sampler, drop_last=drop_last)], len(sampler)


def dali_real(n: int, world: int, rank: int) -> int:
    """Samples in DALI's shard `rank`: [floor(rank*N/S), floor((rank+1)*N/S))."""
    return (rank + 1) * n // world - rank * n // world


CASES = [(n, w, b) for n, w, b in itertools.product((1, 2, 5, 7, 23, 64, 65, 100), (1, 2, 3, 4, 8), (1, 3, 4, 32))
         if n >= w]


@pytest.mark.parametrize("drop_last,sampler_drop_last", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("train", [False, True])
def test_batches_are_dataloaders(train, drop_last, sampler_drop_last):
    for n, world, batch in CASES:
        contract = Contract(train, batch, drop_last, "repeat", sampler_drop_last)
        for rank in range(world):
            expected, sampler_len = dataloader_batches(n, world, rank, batch, drop_last, sampler_drop_last)
            cut = contract.cut(dali_real(n, world, rank), contract.per_rank(n, world))
            assert cut.batches == len(expected) and cut.per_rank == sampler_len, (n, world, batch, rank)
            sizes = [cut.size(i) for i in range(cut.batches)]
            real = [cut.real_in(i) for i in range(cut.batches)]
            assert min(sizes, default=1) >= 1  # never an empty batch
            if not train:
                assert sizes == expected, (n, world, batch, rank)  # repeats fill up to DataLoader's count
            elif not drop_last:  # train: real samples only, one repeat at most to keep the count
                assert sum(real) == min(dali_real(n, world, rank), sum(sizes))
                assert sum(sizes) - sum(real) <= 1
                assert sum(sizes) - sum(real) == 0 or sizes[-1] == 1
            else:
                assert sizes == expected


def test_val_label_and_none_modes():
    for n, world, batch in CASES:
        longest = ceil_div(n, world)
        label, none = Contract(False, batch, False, "label"), Contract(False, batch, False, "none")
        total = 0
        for rank in range(world):
            real = dali_real(n, world, rank)
            cut = label.cut(real, longest)
            assert cut.batches == ceil_div(longest, batch) and cut.pad_label
            assert all(cut.size(i) == batch for i in range(cut.batches))  # full batches, padding labelled
            assert sum(cut.real_in(i) for i in range(cut.batches)) == real
            cut = none.cut(real, longest)
            assert cut.batches == ceil_div(real, batch) and not cut.pad_label
            assert [cut.real_in(i) for i in range(cut.batches)] == [cut.size(i) for i in range(cut.batches)]
            total += sum(cut.size(i) for i in range(cut.batches))
        assert total == n  # each sample exactly once across ranks


def test_unknown_val_padding_is_refused():
    with pytest.raises(ValueError, match="val_padding must be one of"):
        Contract(False, 4, False, "drop")
