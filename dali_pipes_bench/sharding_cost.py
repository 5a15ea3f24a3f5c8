"""What the sharding check (dali_pipes/run/sharding.py) costs on a large dataset: N samples (default
1.28 million, ImageNet's train set) split over W processes of a gloo group on 127.0.0.1, each with a
synthetic delivery bitmap of its own shard; the check is timed on every rank, repeated, and compared
with one all_gather_into_tensor of the same N/8 bytes per rank. Prints a table of the slowest rank's times,
median [min, max] over the repeats, and where the results went:
sharding.json at --out, default a folder of this run's own under $DALI_PIPES_CACHE/bench.
Run: dali-pipes bench sharding [flags] (or python -m dali_pipes_bench.sharding_cost)."""

from __future__ import annotations

import argparse
import socket
import sys
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dali_pipes.run.stats import Spread
from dali_pipes_bench.cli import command, markdown, median_range, out_help, report, run_main


@dataclass
class Delivered:  # the part of elastic.DeliveryRecord the check reads
    delivered: np.ndarray
    complete: bool = True

    def repeated(self) -> np.ndarray:  # every identity distinct, as in TFRecord shards
        return np.zeros(len(self.delivered), bool)


def rank_main(rank: int, world: int, port: int, samples: int, repeats: int, queue) -> None:
    import torch
    import torch.distributed as dist

    from dali_pipes.run.dist import Shard
    from dali_pipes.run.sharding import check_delivery
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    record = Delivered(np.arange(samples) % world == rank)  # a train epoch: each rank its own samples
    check, gather = [], []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        check_delivery(record, Shard(rank, world), train=True, every_sample=False, location="synthetic", excluded=0)
        check.append(time.perf_counter() - start)
        bits = torch.from_numpy(np.packbits(record.delivered))
        out = torch.empty(world * bits.numel(), dtype=torch.uint8)
        dist.barrier()
        start = time.perf_counter()
        getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(out, bits)  # renamed in torch 2.1x
        gather.append(time.perf_counter() - start)
    queue.put({"rank": rank, "check_s": check, "all_gather_s": gather})
    dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    import torch.multiprocessing as mp
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="dali-pipes bench sharding", description=__doc__)
    p.add_argument("--samples", type=int, default=1_281_167)
    p.add_argument("--world", type=int, default=2, help="processes (all on this machine)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="", help=out_help("sharding.json"))
    args = p.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, args.world, port, args.samples, args.repeats, queue))
             for r in range(args.world)]
    for proc in procs:
        proc.start()
    ranks = []
    while len(ranks) < len(procs):  # a rank that died says nothing: stop instead of waiting for it
        try:
            ranks.append(queue.get(timeout=1))
        except Exception:
            if any(proc.exitcode not in (None, 0) for proc in procs):
                for proc in procs:
                    proc.kill()
                raise RuntimeError(f"a rank failed: exit codes {[proc.exitcode for proc in procs]}") from None
    ranks.sort(key=lambda r: r["rank"])
    for proc in procs:
        proc.join()
    slowest = {key: Spread.of(max(r[key][i] for r in ranks) for i in range(args.repeats))
               for key in ("check_s", "all_gather_s")}  # each repeat: the slowest rank's time
    result = {"command": command("sharding", argv), "samples": args.samples, "world": args.world,
              "bytes_per_rank": (args.samples + 7) // 8, "check_s_median": slowest["check_s"].median,
              "all_gather_s_median": slowest["all_gather_s"].median, "ranks": ranks}
    table = markdown(["samples", "ranks", "bytes per rank", "check ms, slowest rank: median [min, max]",
                      "all_gather of the same bytes ms: median [min, max]", "repeats"],
                     [(f"{args.samples:,}", args.world, f"{result['bytes_per_rank']:,}",
                       median_range(slowest["check_s"].row(), 1e3, 1),
                       median_range(slowest["all_gather_s"].row(), 1e3, 1), args.repeats)])
    report(result, args.out, "sharding", f"The sharding check against one all_gather of its bytes:\n\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
