"""DALI's private calls, in one place.

Checked against nvidia-dali-cuda120 2.4.0 (the version requirements.txt pins). Every private name the
project uses is called here and nowhere else, so that a DALI upgrade that renames one breaks one file,
with a message that says which DALI version this was written for.
"""

from __future__ import annotations

CHECKED_DALI_VERSION = "2.4.0"


def dali_version() -> str:
    import nvidia.dali
    return nvidia.dali.__version__


def private_api_error(what: str, error: Exception) -> RuntimeError:
    return RuntimeError(f"DALI {dali_version()}: {what} is private DALI API checked on DALI {CHECKED_DALI_VERSION} "
                        f"and has changed ({error}); pin nvidia-dali-cuda120=={CHECKED_DALI_VERSION}")


def shutdown_pipeline(pipe) -> None:
    """Stop a pipeline's threads and free its buffers now (DALI frees them only at garbage collection,
    and a pipeline held by a traceback can live long after its iterator)."""
    try:
        shutdown = pipe._shutdown
    except AttributeError as e:
        raise private_api_error("Pipeline._shutdown", e) from e
    shutdown()


def iterator_pipelines(iterator) -> list:
    """The pipelines a DALI framework iterator drives (one per rank here)."""
    try:
        return list(iterator._pipes)
    except AttributeError as e:
        raise private_api_error("DALIGenericIterator._pipes", e) from e
