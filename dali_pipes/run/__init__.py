"""One rank's run: the typed spec and its DALI pipeline (pipeline.py), the run of rebuilds (pipeline_run.py),
the rank's pipeline (rank.py) with its hooks (hooks.py: tuning, the sharding check, the clock, the outage
handler, the size schedule), bad samples (recovery.py), the epoch contract, the delivery record, resume and
elastic resume. Uses graph/, data/ and storage/ below it."""
