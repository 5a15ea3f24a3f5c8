"""DaliDataModule's public path (docs/drop-in.md): `from dali_pipes.lightning import DaliDataModule`
(pip install '.[lightning]' from the checkout). It lives with the other frameworks' adapters, in
adapters/lightning.py."""

from dali_pipes.adapters.lightning import DaliDataModule

__all__ = ["DaliDataModule"]
