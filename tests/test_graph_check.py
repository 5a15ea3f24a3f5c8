"""Every graph the library builds with device="gpu", proven on a CPU machine (graph_check.py): DALI
assembles and serializes each without CUDA, and the checks DALI makes only on a GPU (an
implementation per device, no GPU-to-CPU edge, outputs on the GPU) are made by hand. Planted
mistakes are caught (the argument values DALI never checks: tests/test_graph.py). On a GPU
(`-m gpu`), the hybrid, full-GPU and CPU graphs run and agree."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from dali_pipes import open_source
from dali_pipes.graph import _dali
from dali_pipes.graph.augment_config import AugmentConfig
from dali_pipes.run.contract import Contract
from dali_pipes.run.dist import Shard
from dali_pipes.run.pipeline import PipelineSpec, TunedKnobs, build_pipeline, cuda_device_id
from dali_pipes.tools.convert import write_tfrecords, write_webdataset
from dali_pipes.tools.graph_check import (
    GraphError,
    GraphVariant,
    PrivateApiChanged,
    check_defined,
    check_gpu_graph,
    check_variant,
    placement_problems,
    project_graphs,
)

from conftest import assert_placed, write_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_KINDS = ("folder", "tfrecord", "webdataset", "parquet")
VARIANTS = [v.name for v in project_graphs(dict.fromkeys(SOURCE_KINDS))]  # names only: nothing is defined yet


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The same 12 JPEGs as an image folder, 2 TFRecord shards, 2 WebDataset shards and 2 Parquet files (fed
    through fn.external_source: its graph is checked as the others')."""
    from dali_pipes_bench.parquet_feed import write_parquet_copy
    root = tmp_path_factory.mktemp("graphs")
    write_folder(str(root / "folder"))
    folder = open_source(str(root / "folder"))
    write_tfrecords(folder, str(root / "tfrecord"), shards=2, workers=1, progress=False)
    write_webdataset(folder, str(root / "webdataset"), shards=2, workers=1, progress=False)
    write_parquet_copy(folder, str(root / "parquet"), files=2, rows_per_group=4)
    return {"folder": folder, "tfrecord": open_source(str(root / "tfrecord"), progress=False),
            "webdataset": open_source(str(root / "webdataset"), progress=False),
            "parquet": open_source(str(root / "parquet"), progress=False)}


def checked(check, *args, **kwargs):
    """Run a static check; skip, naming the DALI version, if DALI's private API has changed."""
    try:
        return check(*args, **kwargs)
    except PrivateApiChanged as e:
        pytest.skip(str(e))


def external_jpegs():
    from nvidia.dali import fn, types

    from dali_pipes.run.recovery import placeholder_jpeg
    data = [np.frombuffer(placeholder_jpeg(), np.uint8)] * 2
    return fn.external_source(source=lambda: data, batch=True, dtype=types.UINT8)


def gpu_pipeline(body):
    """A pipeline for GPU 0 whose graph is body(encoded jpegs)."""
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=2, num_threads=1, device_id=0)
    def pipe():
        return body(external_jpegs())

    return pipe


# -- every project graph passes --------------------------------------------------------------------

@pytest.mark.parametrize("name", VARIANTS)
def test_project_gpu_graph_passes(sources, name):
    variant = next(v for v in project_graphs(sources) if v.name == name)
    report = checked(check_variant, variant)
    assert report.ok and report.ops
    assert report.outputs and all(e.device == "gpu" for i, e in enumerate(report.outputs)  # labels too
                                  if i not in variant.host_outputs)  # sample ids: on the CPU, for Python
    if variant.host_outputs:  # the loader's graph: the pixel guard parses headers before the decoder
        assert report.devices_of("PeekImageShape") == ["cpu"]
    if variant.decoder == "cpu" and "decode stage" not in variant.name:  # hybrid: decode on the CPU threads,
        # everything after it on the GPU (profile's decode stage has nothing after it)
        assert report.devices_of("Resize") == ["gpu"] and report.devices_of("CropMirrorNormalize") == ["gpu"]


@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
def test_benchmark_preloaded_graph_passes(sources, train):
    from dali_pipes.data.formats import read_sample
    from dali_pipes_bench.harness import preloaded_pipeline
    samples = [read_sample(ref) for ref in sources["folder"].refs()]
    data, labels = [np.frombuffer(s.data, np.uint8) for s in samples], [np.int64(s.label) for s in samples]
    report = checked(check_defined, "preloaded", lambda: preloaded_pipeline(
        data, labels, batch_size=4, train=train, device="gpu", num_threads=1, device_id=0))
    assert report.devices_of("decoders__Image") == ["mixed"] and {e.device for e in report.outputs} == {"gpu"}


def test_report_lists_operators_and_devices(sources):
    spec = PipelineSpec(contract=Contract(False, 2, False), device="gpu", knobs=TunedKnobs(num_threads=1))
    pipe = build_pipeline(sources["folder"], spec)
    report = checked(check_gpu_graph, pipe, "val")
    assert report.devices_of("readers__File") == ["cpu"] and report.devices_of("decoders__Image") == ["mixed"]
    assert report.summary()["outputs"] == ["gpu", "gpu"] and report.summary()["ok"]
    with pytest.raises(ValueError, match="already built or serialized"):
        check_gpu_graph(pipe)  # a spent pipeline is refused, not checked twice


# -- planted mistakes are caught ---------------------------------------------------------------------

def test_cpu_only_operator_fed_gpu_data_is_caught():
    # DALI 2.4 silently places peek_image_shape (CPU-only) on "gpu" and serializes the graph.
    from nvidia.dali import fn
    pipe = gpu_pipeline(lambda jpegs: (fn.decoders.image(jpegs, device="mixed"), fn.peek_image_shape(jpegs.gpu())))
    with pytest.raises(GraphError, match="PeekImageShape.*no gpu implementation .*it has: cpu"):
        checked(check_defined, "planted", pipe)


def test_gpu_to_cpu_edge_is_caught():
    from nvidia.dali import fn
    pipe = gpu_pipeline(lambda jpegs: fn.resize(fn.decoders.image(jpegs, device="mixed").cpu(), resize_x=8).gpu())
    with pytest.raises(GraphError, match="GPU-to-CPU edge: .*Resize.*reads .*Image"):
        checked(check_defined, "planted", pipe)


def test_cpu_output_of_a_gpu_pipeline_is_caught():
    from nvidia.dali import fn, types
    labels = lambda: fn.cast(fn.random.coin_flip(), dtype=types.INT64)
    pipe = gpu_pipeline(lambda jpegs: (fn.decoders.image(jpegs, device="mixed"), labels()))
    with pytest.raises(GraphError, match=r"pipeline output 1 .*on the CPU.*\.gpu\(\)"):
        checked(check_defined, "planted", pipe)


@pytest.mark.parametrize("mistake, match", [
    ("unknown argument", "refused the definition: KeyError.*bogus"),
    ("wrong type", "refused the definition: ValueError"),
    ("gpu data into a cpu operator", "refused the definition.*incompatible device"),
    ("gpu named argument", "refused the definition.*Named arguments must be on CPU"),
    ("missing required argument", "cannot assemble the graph.*dtype"),
])
def test_mistakes_dali_finds_without_a_gpu_become_graph_errors(mistake, match):
    from nvidia.dali import fn
    decode = lambda jpegs: fn.decoders.image(jpegs, device="mixed")
    body = {
        "unknown argument": lambda j: fn.resize(decode(j), resize_x=8, bogus=1),
        "wrong type": lambda j: fn.resize(decode(j), resize_x="eight"),
        "gpu data into a cpu operator": lambda j: fn.resize(decode(j), resize_x=8, device="cpu"),
        "gpu named argument": lambda j: fn.crop_mirror_normalize(decode(j), mirror=fn.random.coin_flip().gpu()),
        "missing required argument": lambda j: fn.cast(decode(j)),
    }[mistake]
    with pytest.raises(GraphError, match=match):
        checked(check_defined, mistake, gpu_pipeline(body))


def test_a_regression_in_the_library_graph_is_caught(sources, monkeypatch):
    import dali_pipes.graph.augment as graph
    real = graph._normalize
    monkeypatch.setattr(graph, "_normalize", lambda images, cfg, **crop: real(images.cpu(), cfg, **crop))
    variant = next(v for v in project_graphs(sources) if v.name == "folder (val)")
    with pytest.raises(GraphError, match="GPU-to-CPU edge") as info:
        checked(check_variant, variant)
    assert any("output 0" in p for p in info.value.problems)


# -- the GPU tests fail on deliberately wrong graphs (mutations), shown on a CPU ------------------------------

def _loader_graph(sources, train=False) -> GraphVariant:
    """The folder graph as DaliLoader builds it on a GPU: images and labels on the GPU, sample ids (output 2) on
    the CPU for the loader to read."""
    return next(v for v in project_graphs(sources) if v.name == f"folder as DaliLoader builds it "
                                                                  f"({'train' if train else 'val'})")


def _labels_left_on_the_cpu(sources) -> GraphVariant:
    from nvidia.dali import pipeline_def

    from dali_pipes.graph.augment import eval_augment

    @pipeline_def(batch_size=2, num_threads=1, device_id=0)
    def pipe():
        jpegs, labels = sources["folder"].dali_reader(name="Reader")
        return eval_augment(jpegs, AugmentConfig(image_size=16), "gpu"), labels  # the mutation: no labels.gpu()

    return GraphVariant("labels left on the CPU", pipe)


def _cpu_decode_where_the_gpu_decodes(sources) -> GraphVariant:
    spec = PipelineSpec(contract=Contract(False, 2, False), device="gpu", decode_device="cpu",
                        knobs=TunedKnobs(num_threads=1), device_id=0, shuffle_buffer=4)  # hybrid, named mixed
    return replace(_loader_graph(sources), define=lambda: build_pipeline(sources["folder"], spec, sample_ids=True))


MUTATIONS = {
    "decoder on the CPU where the GPU's is expected": (_cpu_decode_where_the_gpu_decodes,
                                                       r"decoder devices \['cpu'\], expected \['mixed'\]"),
    "labels left on the CPU": (_labels_left_on_the_cpu, r"pipeline output 1 .*is on the CPU"),
    "sample ids moved to the GPU": (_loader_graph, r"pipeline output 2 .*read in Python .*on the GPU"),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_each_mutated_gpu_graph_fails_the_static_check(sources, monkeypatch, mutation):
    """A deliberately wrong graph of each kind fails check_variant, which every GPU graph test runs first
    (test_project_gpu_graph_passes on CPU, test_project_gpu_graph_runs on a GPU); normalisation moved back to the
    CPU: test_a_regression_in_the_library_graph_is_caught."""
    import dali_pipes.data.reader as reader
    if mutation == "sample ids moved to the GPU":
        real_ids = reader.identity_rows
        monkeypatch.setattr(reader, "identity_rows", lambda jpegs: real_ids(jpegs).gpu())
    make, match = MUTATIONS[mutation]
    with pytest.raises(GraphError, match=match):
        checked(check_variant, make(sources))


def test_placement_check_rejects_cpu_lists_where_gpu_lists_are_expected(sources):
    """A CPU pipeline's real outputs are TensorListCPU: the GPU tests' placement check names each one where it
    expects a GPU list. The check it replaces, hasattr(out, "as_cpu"), passed them all."""
    spec = PipelineSpec(contract=Contract(False, 2, False), device="cpu", knobs=TunedKnobs(num_threads=1))
    pipe = build_pipeline(sources["folder"], spec, sample_ids=True)
    pipe.build()
    outputs = pipe.run()
    assert all(hasattr(out, "as_cpu") for out in outputs)  # the old assertion: true of CPU lists in DALI 2.4
    assert placement_problems(outputs, host_outputs=(2,)) == [
        "output 0 is a TensorListCPU, expected on the GPU", "output 1 is a TensorListCPU, expected on the GPU"]
    with pytest.raises(AssertionError, match="TensorListCPU, expected on the GPU"):
        assert_placed(outputs, host_outputs=(2,))
    assert placement_problems(outputs, host_outputs=(0, 1, 2)) == []  # a host output on the CPU is right
    assert placement_problems(outputs[:2], host_outputs=(0, 1, 2)) == ["host output 2 is missing: there are 2 outputs"]
    del pipe


def test_placement_check_rejects_a_cpu_loaders_batch(numbered_source):
    from dali_pipes import DaliLoader
    loader = DaliLoader(numbered_source, batch_size=4, train=False, device="cpu", image_size=16, num_threads=1)
    batch = next(iter(loader))
    assert placement_problems(batch) == ["output 0 is a Tensor on cpu, expected on the GPU",
                                         "output 1 is a Tensor on cpu, expected on the GPU"]
    assert placement_problems(batch, host_outputs=(0, 1)) == [] and placement_problems([np.zeros(2)]) == [
        "output 0 is a ndarray: neither a DALI TensorList nor a torch tensor"]
    loader.close()


@pytest.mark.gpu
@pytest.mark.parametrize("mutation", ["labels left on the CPU", "sample ids moved to the GPU"])
def test_placement_check_fails_on_mutated_graphs_run_on_a_gpu(sources, monkeypatch, mutation):
    """On a GPU the mutated graphs build and run; their outputs fail the placement check by type."""
    import dali_pipes.data.reader as reader
    if mutation == "sample ids moved to the GPU":
        real_ids = reader.identity_rows
        monkeypatch.setattr(reader, "identity_rows", lambda jpegs: real_ids(jpegs).gpu())
    variant = MUTATIONS[mutation][0](sources)
    pipe = variant.define()
    pipe.build()
    problems = placement_problems(pipe.run(), _loader_graph(sources).host_outputs)
    assert problems and all("expected on the" in p for p in problems), problems


def test_changed_private_api_is_named_with_the_dali_version():
    with pytest.raises(PrivateApiChanged, match="checked on DALI 2.4.0.*pin nvidia-dali-cuda120==2.4.0"):
        check_gpu_graph(object())
    with pytest.raises(PrivateApiChanged, match="dali_proto.PipelineDef"):
        _dali.parse_serialized_graph(b"\x0f\xff")
    # an operator (field 5) as a varint where its message belongs: named too, never a TypeError
    with pytest.raises(PrivateApiChanged, match="dali_proto.PipelineDef.*a varint where a length-delimited field"):
        _dali.parse_serialized_graph(b"\x28\x05")
    with pytest.raises(ValueError, match="not a DALI checkpoint.*a varint where a length-delimited field"):
        _dali.checkpoint_entries(b"\x08\x05")


# -- DALI_PIPES_REQUIRE_GPU ----------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without CUDA")
def test_require_gpu_turns_gpu_skips_into_failures():
    run = lambda env: subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
         "tests/test_graph_check.py::test_gpu_and_cpu_val_outputs_agree"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    required = run({"DALI_PIPES_REQUIRE_GPU": "1"})
    assert required.returncode == 1 and "1 failed" in required.stdout
    assert "DALI_PIPES_REQUIRE_GPU=1 but this test needs a CUDA GPU" in required.stdout
    relaxed = run({"DALI_PIPES_REQUIRE_GPU": "0"})
    assert relaxed.returncode == 0 and "1 skipped" in relaxed.stdout


# -- on a GPU: the graphs run, and the devices agree ------------------------------------------------------

def _run_once(pipe, host_outputs=()) -> tuple[np.ndarray, np.ndarray]:
    """(images, labels) of one batch of a built pipeline, its outputs' placement checked first."""
    from nvidia.dali.tensors import TensorListGPU
    pipe.build()
    images, labels = outputs = pipe.run()
    assert_placed(outputs, host_outputs)
    host = lambda out: np.stack([np.array(t) for t in (out.as_cpu() if isinstance(out, TensorListGPU) else out)])
    return host(images).astype(np.float32), host(labels)


@pytest.mark.gpu
def test_gpu_and_cpu_val_outputs_agree(sources):
    """Val is deterministic: the full-GPU and hybrid graphs give the CPU graph's images, up to the
    decoders' rounding (fancy upsampling on both), and the same labels, which stay on the GPU."""
    outputs = {}
    for name, device, decode in (("cpu", "cpu", None), ("gpu", "gpu", None), ("hybrid", "gpu", "cpu")):
        pipe = build_pipeline(sources["folder"], PipelineSpec(contract=Contract(False, 12, False), device=device,
                                                              decode_device=decode, knobs=TunedKnobs(num_threads=2),
                                                              augment=AugmentConfig(image_size=16),
                                                              device_id=cuda_device_id(Shard())))
        outputs[name] = _run_once(pipe, host_outputs=(0, 1) if device == "cpu" else ())  # labels too on the GPU
    images, labels = outputs["cpu"]
    assert images.shape == (12, 3, 16, 16)
    for name in ("gpu", "hybrid"):
        other, other_labels = outputs[name]
        np.testing.assert_array_equal(other_labels, labels)
        difference = np.abs(other - images)  # normalised units: one 8-bit level is about 0.017
        assert difference.mean() < 0.03 and np.percentile(difference, 99) < 0.3, (name, difference.mean())


@pytest.mark.gpu
@pytest.mark.parametrize("name", [n for n in VARIANTS if "rank 1" not in n])
def test_project_gpu_graph_runs(sources, name):
    """Each graph builds and runs on a GPU, its decoder where the variant says (the static check: a GPU
    cannot tell by the outputs) and every output on the GPU by DALI's types, sample ids alone on the CPU."""
    variant = next(v for v in project_graphs(sources) if v.name == name)
    check_variant(variant)
    pipe = variant.define()  # a fresh one: the static check spent its own
    pipe.build()
    assert_placed(pipe.run(), variant.host_outputs)


def test_the_recipes_steps_run_on_the_gpu(sources):
    """RandomErasing's erase and noise, AugMix's operations and mixing, the bicubic resize: GPU operators in the
    GPU graph (their per-sample draws on the CPU, as arguments); graph_check checks each variant's edges."""
    graphs = {v.name: v for v in project_graphs(sources)}
    pixel = checked(check_variant, graphs["random_erasing_mode=pixel float16 channels_last (train)"])
    assert set(pixel.devices_of("Erase")) == {"gpu"} and pixel.devices_of("random__Normal") == ["gpu"]
    assert set(pixel.devices_of("random__Uniform")) == {"cpu"}  # the rectangles: drawn on the CPU
    augmix = checked(check_variant, graphs["auto_augment=augmix (train)"])
    assert set(augmix.devices_of("WarpAffine")) == {"gpu"} and set(augmix.devices_of("random__Beta")) == {"cpu"}
    assert "gpu" in augmix.devices_of("_ArithmeticGenericOp") and "gpu" in augmix.devices_of("Cast")
