"""The DDP job's loader settings (tests/lightning_ddp_job.py), which tests/test_lightning.py's reference loaders
use too: a module of their own, so that collecting the tests imports no Lightning (~5 s in every xdist worker)."""

RANKS, BATCH_SIZE = 2, 4
LOADER_ARGS = dict(device="cpu", image_size=16, num_threads=1, seed=7, shuffle_buffer=8)
