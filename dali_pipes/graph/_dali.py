"""DALI's private calls, in one place.

Checked against nvidia-dali-cuda120 2.4.0 (the version requirements.txt pins). Every private name the
project uses is called here and nowhere else, so that a DALI upgrade that renames one breaks one file,
with a message that says which DALI version this was written for.
"""

from __future__ import annotations

from dali_pipes.data.protobuf import as_bytes

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


# -- static graph checks (graph_check.py) ---------------------------------------------------------

class PrivateApiChanged(RuntimeError):
    """The private DALI API the static graph check relies on is not there: tests skip on it."""


def _changed(what: str, error: Exception) -> PrivateApiChanged:
    return PrivateApiChanged(str(private_api_error(what, error)))


def serialize_without_device(pipe) -> bytes:
    """DALI's serialized C++ graph of an unbuilt pipeline, assembled without CUDA.

    DALI 2.4.0 asserts CUDA in `serialize()` and `build()` as soon as a device id is set, but a
    pipeline with GPU and mixed operators can be *defined* with one. With the (private) device id
    set back to None, `serialize()` runs DALI's own graph assembly (`_build_graph`,
    `_init_pipeline_backend`, `SerializeToProtobuf`): every operator's spec is made and checked
    (required arguments, input devices), which is as far as DALI gets without a GPU. The pipeline
    is spent afterwards: it is for checking, never for building."""
    if not hasattr(pipe, "_device_id") or not hasattr(pipe, "_backend_prepared"):
        raise _changed("Pipeline._device_id", AttributeError("no _device_id / _backend_prepared"))
    if pipe._backend_prepared:
        raise ValueError("the pipeline was already built or serialized; pass a freshly defined one")
    pipe._device_id = None
    if pipe.device_id is not None:
        raise _changed("Pipeline._device_id", AttributeError("device_id does not read _device_id"))
    return pipe.serialize()


def registered_ops() -> dict[str, frozenset[str]]:
    """Operator schemas with an implementation, per device ("cpu", "gpu", "mixed"), internal
    operators (conditionals, transfers) included."""
    from nvidia.dali import backend
    try:
        # not in DALI 2.4's backend stub (backend.pyi); their absence is the AttributeError below
        return {"cpu": frozenset(backend.RegisteredCPUOps(True)),  # type: ignore[attr-defined]
                "gpu": frozenset(backend.RegisteredGPUOps(True)),  # type: ignore[attr-defined]
                "mixed": frozenset(backend.RegisteredMixedOps(True))}  # type: ignore[attr-defined]
    except (AttributeError, TypeError) as e:
        raise _changed("backend.Registered{CPU,GPU,Mixed}Ops", e) from e


# Field numbers of dali_proto (dali/pipeline/proto/dali.proto, DALI 2.4.0) that the check reads:
# PipelineDef: op = 5, pipe_outputs = 7; OpDef: name (schema) = 1, input = 2, output = 3, args = 4,
# inst_name = 5; InputOutput: name = 1, device = 2, is_argument_input = 3, arg_name = 4;
# Argument: name = 1, s = 5 (the string value; "device" is a string argument).
_PIPELINE_OP, _PIPELINE_OUTPUT = 5, 7
_OP_SCHEMA, _OP_INPUT, _OP_OUTPUT, _OP_ARG, _OP_NAME = 1, 2, 3, 4, 5
_IO_NAME, _IO_DEVICE, _IO_IS_ARGUMENT, _IO_ARG_NAME = 1, 2, 3, 4
_ARG_NAME, _ARG_STRING = 1, 5


def parse_serialized_graph(serialized: bytes) -> tuple[list[dict], list[dict]]:
    """(operators, pipeline outputs) of a serialized DALI pipeline, as plain dicts:
    operator {"schema", "name", "device", "inputs", "outputs"}, each input or output
    {"name", "device", "argument"} ("argument": the argument name of a named-argument input)."""
    try:
        fields = _proto_fields(serialized)
        ops = [_op(as_bytes(body)) for number, body in fields if number == _PIPELINE_OP]
        outputs = [_io(as_bytes(body)) for number, body in fields if number == _PIPELINE_OUTPUT]
    except (IndexError, ValueError, UnicodeDecodeError) as e:
        raise _changed("the serialized pipeline format (dali_proto.PipelineDef)", e) from e
    if not ops or any(not op["schema"] or not op["device"] for op in ops):
        raise _changed("the serialized pipeline format (dali_proto.PipelineDef)",
                       ValueError("operators without a schema name or a device argument"))
    return ops, outputs


def _op(body: bytes) -> dict:
    fields = _proto_fields(body)
    text = lambda number: next((as_bytes(v).decode() for n, v in fields if n == number), "")
    device = ""
    for number, arg in fields:
        if number == _OP_ARG:
            arg_fields = dict(_proto_fields(as_bytes(arg)))
            if arg_fields.get(_ARG_NAME) == b"device":
                device = as_bytes(arg_fields.get(_ARG_STRING, b"")).decode()
    return {"schema": text(_OP_SCHEMA), "name": text(_OP_NAME), "device": device,
            "inputs": [_io(as_bytes(v)) for n, v in fields if n == _OP_INPUT],
            "outputs": [_io(as_bytes(v)) for n, v in fields if n == _OP_OUTPUT]}


def _io(body: bytes) -> dict:
    fields = dict(_proto_fields(body))
    text = lambda number: as_bytes(fields.get(number, b"")).decode()
    argument = text(_IO_ARG_NAME) if fields.get(_IO_IS_ARGUMENT) else ""
    return {"name": text(_IO_NAME), "device": text(_IO_DEVICE), "argument": argument}


def _proto_fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) of one protobuf message: varints as int, length-delimited as bytes."""
    from dali_pipes.data.protobuf import fields
    return [(number, value) for number, _, value in fields(data)]


# -- checkpoints (dali_checkpoint.py) ---------------------------------------------------------------
# dali_proto.Checkpoint (dali/pipeline/proto/dali.proto, DALI 2.4.0): cpts = 1 (repeated OpCheckpoint:
# operator_name = 1, operator_state = 2), external_ctx_cpt = 2 (the framework iterator's own state).
_CHECKPOINT_OP, _OP_CHECKPOINT_NAME, _OP_CHECKPOINT_STATE = 1, 1, 2


def checkpoint_entries(checkpoint: bytes) -> list[tuple[str, bytes]]:
    """(operator name, its state) of each operator in a DALI checkpoint, in DALI's order; the state of
    an operator that keeps none is b"". Raises ValueError on bytes that are not a checkpoint."""
    try:
        entries = []
        for number, body in _proto_fields(checkpoint):
            if number == _CHECKPOINT_OP:
                fields = dict(_proto_fields(as_bytes(body)))
                entries.append((as_bytes(fields[_OP_CHECKPOINT_NAME]).decode(),
                                bytes(fields.get(_OP_CHECKPOINT_STATE, b""))))
    except (IndexError, KeyError, TypeError, ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"not a DALI checkpoint (checked on DALI {CHECKED_DALI_VERSION}): {e}") from e
    if not entries:
        raise ValueError(f"not a DALI checkpoint (checked on DALI {CHECKED_DALI_VERSION}): no operator in it")
    return entries


def checkpoint_with_entries(checkpoint: bytes, entries: list[tuple[str, bytes]]) -> bytes:
    """`checkpoint` with its operators replaced by `entries`; everything else (the iterator's state) kept."""
    from dali_pipes.data.protobuf import fields, length_delimited
    out = b"".join(length_delimited(_CHECKPOINT_OP, length_delimited(_OP_CHECKPOINT_NAME, name.encode())
                                    + length_delimited(_OP_CHECKPOINT_STATE, state)) for name, state in entries)
    for number, wire, value in fields(checkpoint):
        if number != _CHECKPOINT_OP:
            if wire != 2:
                raise ValueError(f"unexpected field {number} of wire type {wire} in a DALI checkpoint")
            out += length_delimited(number, as_bytes(value))
    return out


def operator_schemas(pipe) -> dict[str, str]:
    """{operator name: schema} of a built pipeline, schemas in the form DALI's generated names use
    ("decoders__ImageRandomCrop" -> "ImageRandomCrop"). MakeContiguous operators DALI adds are absent."""
    ops, _ = parse_serialized_graph(pipe.serialize())
    return {op["name"]: op["schema"].split("__")[-1] for op in ops}
