"""DaliNode's public path (docs/drop-in.md): `from dali_pipes.nodes import DaliNode` (needs torchdata). It lives
with the other frameworks' adapters, in adapters/nodes.py."""

from dali_pipes.adapters.nodes import DaliNode

__all__ = ["DaliNode"]
