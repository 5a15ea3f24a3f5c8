"""Modules moved in 0.3.0 (the library grouped by the data flow: storage/, data/, graph/, run/, tools/) stay
importable by their earlier names for this release, each with a DeprecationWarning naming the new one.
(`dali_pipes.graph` is now the graph/ package: its AugmentConfig is there; `python -m dali_pipes.doctor` stays.)"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings

MOVED = {
    "dali_pipes._dali": "dali_pipes.graph._dali",
    "dali_pipes.cli": "dali_pipes.tools.cli",
    "dali_pipes.contract": "dali_pipes.run.contract",
    "dali_pipes.convert": "dali_pipes.tools.convert",
    "dali_pipes.dist": "dali_pipes.run.dist",
    "dali_pipes.elastic": "dali_pipes.run.elastic",
    "dali_pipes.files": "dali_pipes.storage.files",
    "dali_pipes.fingerprint": "dali_pipes.data.fingerprint",
    "dali_pipes.formats": "dali_pipes.data.formats",
    "dali_pipes.formats.image_files": "dali_pipes.data.formats.image_files",
    "dali_pipes.formats.tfrecord": "dali_pipes.data.formats.tfrecord",
    "dali_pipes.formats.webdataset": "dali_pipes.data.formats.webdataset",
    "dali_pipes.graph_check": "dali_pipes.tools.graph_check",
    "dali_pipes.indexes": "dali_pipes.data.indexes",
    "dali_pipes.labels": "dali_pipes.data.labels",
    "dali_pipes.location": "dali_pipes.data.location",
    "dali_pipes.manifest": "dali_pipes.data.manifest",
    "dali_pipes.object_store": "dali_pipes.storage.object_store",
    "dali_pipes.pipeline": "dali_pipes.run.pipeline",
    "dali_pipes.procfs": "dali_pipes.run.procfs",
    "dali_pipes.protobuf": "dali_pipes.data.protobuf",
    "dali_pipes.reader": "dali_pipes.data.reader",
    "dali_pipes.recovery": "dali_pipes.run.recovery",
    "dali_pipes.remote_feed": "dali_pipes.run.remote_feed",
    "dali_pipes.resolution": "dali_pipes.graph.resolution",
    "dali_pipes.resume": "dali_pipes.run.resume",
    "dali_pipes.sample_data": "dali_pipes.tools.sample_data",
    "dali_pipes.samples": "dali_pipes.data.samples",
    "dali_pipes.shard_cache": "dali_pipes.storage.shard_cache",
    "dali_pipes.sharding": "dali_pipes.run.sharding",
    "dali_pipes.source": "dali_pipes.data.source",
    "dali_pipes.stats": "dali_pipes.run.stats",
    "dali_pipes.transforms": "dali_pipes.graph.transforms",
    "dali_pipes.tuning": "dali_pipes.run.tuning",
    "dali_pipes.verify": "dali_pipes.tools.verify",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a 0.2.0 module name and gives the module at its new name (one module object under both)."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001 (importlib's protocol)
        return importlib.machinery.ModuleSpec(name, self, origin=MOVED[name]) if name in MOVED else None

    def create_module(self, spec):  # noqa: ANN001
        warnings.warn(f"{spec.name} moved to {MOVED[spec.name]} in dali_pipes 0.3.0; import it from there",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module) -> None:  # noqa: ANN001 (already executed under its new name)
        pass

    def get_code(self, name: str):  # python -m OLD_NAME runs the new module
        target = importlib.util.find_spec(MOVED[name])
        if target is None or not isinstance(target.loader, importlib.abc.InspectLoader):  # never: ours are files
            raise ImportError(f"{name} moved to {MOVED[name]}, which has no code to run", name=name)
        return target.loader.get_code(MOVED[name])


def install() -> None:
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.append(MovedModules())
