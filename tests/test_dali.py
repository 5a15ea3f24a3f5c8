"""_dali.py: the private DALI calls, checked on the DALI version they name; a real pipeline is shut down."""

from nvidia.dali import fn, pipeline_def
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from dali_pipes.graph import _dali


def test_version_iterator_pipelines_and_shutdown():
    import nvidia.dali
    assert _dali.dali_version() == nvidia.dali.__version__

    @pipeline_def(batch_size=2, num_threads=1, device_id=None)
    def pipe():
        return fn.random.uniform(range=[0, 1], shape=[1])

    iterator = DALIGenericIterator(pipe(), ["x"], size=4)
    assert len(_dali.iterator_pipelines(iterator)) == 1
    next(iterator)
    for p in _dali.iterator_pipelines(iterator):
        _dali.shutdown_pipeline(p)  # frees its threads now; does not raise
    ops = _dali.registered_ops()  # the static GPU graph check's table: the mixed decoders are there on CPU too
    assert "ImageDecoder" in ops["mixed"] and "random__Uniform" in ops["cpu"] and "Resize" in ops["gpu"]
