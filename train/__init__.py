"""The training loop: `python -m train` (see train/train.py)."""
