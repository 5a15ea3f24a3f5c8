"""Does DALI's own decoder take these bytes? The bad-sample search (recovery.py) asks, one small pipeline
per question, on the device the loader decodes on."""

from __future__ import annotations

import numpy as np

from dali_pipes.graph._dali import shutdown_pipeline
from dali_pipes.run.machine import usable_cpus


def dali_decodes(datas: list[bytes], device: str = "cpu", device_id: int | None = None) -> list[bool]:
    """Whether DALI's decoder (mixed on gpu, cpu otherwise) decodes each encoded image. One
    pipeline per batch; a failed batch is split in halves until the failures are single samples.
    An empty buffer is undecodable without asking: DALI's decoder (2.4, CPU) crashes the process on a
    batch holding several dozen of them (a segmentation fault, no message)."""
    ok = [False] * len(datas)
    given = [i for i, data in enumerate(datas) if data]
    for i, good in zip(given, _decodes([datas[i] for i in given], device, device_id)):
        ok[i] = good
    return ok


def _decodes(datas: list[bytes], device: str, device_id: int | None) -> list[bool]:
    if not datas:
        return []
    if _decode_batch(datas, device, device_id):
        return [True] * len(datas)
    if len(datas) == 1:
        return [False]
    mid = len(datas) // 2
    return _decodes(datas[:mid], device, device_id) + _decodes(datas[mid:], device, device_id)


def decode_pipeline(datas: list[bytes], device: str = "cpu", device_id: int | None = None):
    """An unbuilt pipeline that decodes `datas` as one batch with the loader's decoder: mixed
    (nvJPEG / hardware decoder) on `device_id` (the rank's own GPU) for gpu, cpu otherwise."""
    from nvidia.dali import fn, pipeline_def, types
    batch = [np.frombuffer(d, np.uint8) for d in datas]  # never empty (dali_decodes)

    # ignore: DALI's stub (2.4) types device_id as int; None is DALI's documented "no GPU" (CPU pipelines)
    @pipeline_def(batch_size=len(batch), num_threads=min(4, usable_cpus()),
                  device_id=device_id if device == "gpu" else None,  # type: ignore[arg-type]
                  exec_pipelined=False, exec_async=False)
    def decode():
        return fn.decoders.image(fn.external_source(source=lambda: batch, batch=True, dtype=types.UINT8),
                                 device="mixed" if device == "gpu" else "cpu", output_type=types.RGB)

    return decode()


def _decode_batch(datas: list[bytes], device: str, device_id: int | None) -> bool:
    pipe = decode_pipeline(datas, device, device_id)
    try:
        pipe.build()
        pipe.run()
        return True
    except RuntimeError:
        return False
    finally:
        shutdown_pipeline(pipe)
