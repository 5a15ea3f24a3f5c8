"""The loader's resume state (resume.py): nested by owner, versioned, and a state written by the previous
release (0.2.0, flat, version 2; tests/data/loader_state_0.2.0.json, made by that release's code on the
dataset below) resumes to exactly the batches, images included, that release went on to yield."""

import base64
import hashlib
import json
import os

import pytest

from dali_pipes import DaliLoader

from conftest import write_numbered

SAVED = os.path.join(os.path.dirname(__file__), "data", "loader_state_0.2.0.json")




def decoded(value):
    return base64.b64decode(value["__bytes__"]) if isinstance(value, dict) and "__bytes__" in value else value


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_state_of_the_previous_release_resumes_exactly(numbered, split):
    saved = json.load(open(SAVED))[split]
    state = {k: decoded(v) for k, v in saved["state"].items()}
    assert state["version"] == 2 and "loader" not in state  # the flat layout of 0.2.0
    # 0.2.0's val contract is val_padding="label": full batches, padding labelled -1
    loader = DaliLoader(numbered, **saved["loader_args"], val_padding="label")
    loader.load_state_dict(state)
    after = [[labels.tolist(), hashlib.sha1(images.numpy().tobytes()).hexdigest()] for images, labels in loader]
    after += [[labels.tolist(), hashlib.sha1(images.numpy().tobytes()).hexdigest()] for images, labels in loader]
    assert after == saved["batches_after"]


def test_state_is_nested_by_owner_and_versioned(numbered):
    loader = DaliLoader(numbered, batch_size=3, train=True, device="cpu", image_size=16, num_threads=1)
    next(iter(loader))
    state = loader.state_dict()
    assert state["version"] == 3 and set(state) == {"version", "loader", "pipeline", "bad_samples", "record"}
    assert (state["loader"]["epoch"], state["loader"]["position"]) == (0, 1) and state["pipeline"]["dali"]
    with pytest.raises(ValueError, match="version 9 .* reads versions 2 and 3"):
        DaliLoader(numbered, batch_size=3, train=True, device="cpu", image_size=16).load_state_dict(
            {**state, "version": 9})


def test_old_layouts_are_upgraded_once_into_parts_by_owner(numbered):
    """resume.upgrade, the one reader of older layouts: 0.2.0's flat fields go to their owners (DALI's checkpoint
    to the rank's pipeline, the exclusions to the bad-sample policy, the delivered samples to the record, the
    rest to the loader, which also learns which release wrote it); a state of today's layout comes back as it was
    written (0.3.0's: the same layout); an older record that leaves its completeness unsaid is complete at an
    epoch's start only."""
    from dali_pipes.run import resume
    flat = {k: decoded(v) for k, v in json.load(open(SAVED))["train"]["state"].items()}
    parts = resume.upgrade(flat)
    assert set(parts) == {"version", *resume.OWNERS} and parts["version"] == 3
    assert parts["pipeline"] == {"dali": flat["dali"], "dali_epoch0": flat["dali_epoch0"]}
    assert parts["bad_samples"] == {"bad_samples": flat["bad_samples"], "excluded": flat["excluded"]}
    assert parts["record"] == {k: flat[k] for k in ("delivered", "delivered_complete", "elastic_base")}
    assert parts["loader"] == {**{k: flat[k] for k in ("epoch", "position", "rank", "world_size", "batch_size",
                                                       "train", "num_samples", "seed")},
                               "written_by": "dali_pipes 0.2.0"}
    unsaid = {k: v for k, v in flat.items() if k != "delivered_complete"}
    assert resume.upgrade({**unsaid, "position": 0})["record"]["delivered_complete"] is True
    assert resume.upgrade({**unsaid, "position": 2})["record"]["delivered_complete"] is False
    loader = DaliLoader(numbered, batch_size=3, train=True, device="cpu", image_size=16, num_threads=1)
    next(iter(loader))
    state = loader.state_dict()
    assert resume.upgrade(state) == state

# ---------------------------------------------------------------------------------------------
# Issue 19: a resume checks a fingerprint of the data (names and sizes, nothing read) and says what changed
# ---------------------------------------------------------------------------------------------

def _state_after_one_batch(location, **kw):
    loader = DaliLoader(location, batch_size=3, train=True, device="cpu", image_size=16, num_threads=1, **kw)
    next(iter(loader))
    state = loader.state_dict()
    loader.close()
    return state


def _resume(location, state, **kw):
    loader = DaliLoader(location, batch_size=3, train=True, device="cpu", image_size=16, num_threads=1, **kw)
    try:
        loader.load_state_dict(state)
        return [labels.tolist() for _, labels in loader]
    finally:
        loader.close()


def test_a_resume_on_changed_files_of_the_same_count_is_refused_naming_the_file(tmp_path):
    from dali_pipes import DatasetError

    from conftest import jpeg_bytes
    (tmp_path / "d").mkdir()
    data = write_numbered(tmp_path / "d", 23)
    state = _state_after_one_batch(data)
    assert state["loader"]["fingerprint"]["files"] == 23
    assert len(_resume(data, state)) == 6  # the same data: resumes (7 batches of 3, one taken)
    (tmp_path / "d" / "007.jpg").write_bytes(jpeg_bytes(99, 40, 40))  # same name, other bytes and size
    with pytest.raises(DatasetError, match=r"list.txt: the data differs from the data this loader state was taken "
                                           r"on: file 007.jpg changed \(\d+ bytes then, \d+ bytes now\)"):
        _resume(data, state)
    os.rename(tmp_path / "d" / "007.jpg", tmp_path / "d" / "007b.jpg")  # same count, another name
    with open(data) as f:
        text = f.read().replace("007.jpg", "007b.jpg")
    with open(data, "w") as f:
        f.write(text)
    with pytest.raises(DatasetError, match=r"file 007.jpg was removed \(23 files then, 23 now\)"):
        _resume(data, state)


def test_a_resume_in_another_folder_with_the_same_files_goes_on(tmp_path):
    import shutil
    (tmp_path / "d").mkdir()
    data = write_numbered(tmp_path / "d", 23)
    state = _state_after_one_batch(data)
    shutil.copytree(tmp_path / "d", tmp_path / "moved")  # names are relative to the data's folder
    assert _resume(str(tmp_path / "moved" / "list.txt"), state) == _resume(data, state)


def test_a_dataset_object_is_fingerprinted_too(tmp_path, torchvision):
    from torchvision import datasets
    from torchvision import transforms as T

    from dali_pipes import DatasetError

    from conftest import jpeg_bytes, write_folder
    write_folder(str(tmp_path / "images"), counts=(4, 3, 5))
    dataset = lambda: datasets.ImageFolder(str(tmp_path / "images"), T.Compose([T.RandomResizedCrop(16), T.ToTensor()]))
    state = _state_after_one_batch(dataset())
    (tmp_path / "images" / "dog" / "dog_000.jpg").write_bytes(jpeg_bytes(50, 50, 50))
    with pytest.raises(DatasetError, match=r"file dog/dog_000.jpg changed"):
        _resume(dataset(), state)


def test_a_state_without_a_fingerprint_still_loads(numbered):
    state = _state_after_one_batch(numbered)
    del state["loader"]["fingerprint"]  # as 0.2.0 and hand-made states have none
    assert len(_resume(numbered, state)) == 6


# ---------------------------------------------------------------------------------------------
# Issue 24: a DALI checkpoint survives operators added to the graph since; a failure to restore one is
# never a data error
# ---------------------------------------------------------------------------------------------

LEGACY = os.path.join(os.path.dirname(__file__), "data", "legacy_states_0.2.0.json")


def _batches(loader, epochs: int = 1) -> list:
    out = []
    for _ in range(epochs):
        out += [[labels.tolist(), hashlib.sha1(images.numpy().tobytes()).hexdigest()] for images, labels in loader]
    return out


@pytest.mark.parametrize("case", ["tfrecord/train", "tfrecord/val", "webdataset/train", "webdataset/val"])
def test_a_shard_state_of_the_previous_release_resumes_exactly(tmp_path, case):
    """States 0.2.0 took on TFRecord and WebDataset shards (tests/data/make_legacy_states.py, run on that
    release's code): their graph has fewer operators than today's, so DALI's generated names differ."""
    import shutil
    kind, split = case.split("/")
    saved = json.load(open(LEGACY))[case]
    shutil.copytree(os.path.join(os.path.dirname(__file__), "data", "legacy_0.2.0", kind), tmp_path / kind)
    state = {k: decoded(v) for k, v in saved["state"].items()}
    extra = {} if split == "train" else {"val_padding": "label"}  # 0.2.0's val contract
    loader = DaliLoader(str(tmp_path / kind), **saved["loader_args"], **extra)
    loader.load_state_dict(state)
    assert _batches(loader, 2) == saved["batches_after"]


def _state_and_rest(location, **kw):
    """A state after 2 batches, and what the same loader yields to the end of the next epoch."""
    loader = DaliLoader(location, batch_size=3, train=True, device="cpu", image_size=16, num_threads=1,
                        seed=3, **kw)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    rest = [[labels.tolist(), hashlib.sha1(images.numpy().tobytes()).hexdigest()] for images, labels in it]
    rest += _batches(loader)
    loader.close()
    return state, rest


def test_a_checkpoint_restores_into_a_graph_that_gained_operators(numbered):
    """A state taken without the pixel guard (max_pixels=None), resumed with it: the guard adds operators
    before the decoder, so DALI's generated names of every operator after them shift."""
    state, rest = _state_and_rest(numbered, max_pixels=None)
    _, guarded_rest = _state_and_rest(numbered)  # the guard changes no batch
    assert guarded_rest == rest
    loader = DaliLoader(numbered, batch_size=3, train=True, device="cpu", image_size=16, num_threads=1, seed=3)
    loader.load_state_dict(state)
    assert _batches(loader, 2) == rest


def test_new_random_operators_restart_their_draws_the_reader_resumes_exactly_and_a_warning_says_so(numbered,
                                                                                                   caplog):
    state, rest = _state_and_rest(numbered)
    loader = DaliLoader(numbered, batch_size=3, train=True, device="cpu", image_size=16, num_threads=1, seed=3,
                        color_jitter=0.3)
    with caplog.at_level("WARNING", logger="dali_pipes"):
        loader.load_state_dict(state)
    assert "the random draws of Brightness, Contrast, Saturation start afresh" in caplog.text
    assert [labels for labels, _ in _batches(loader, 2)] == [labels for labels, _ in rest]


def test_a_checkpoint_that_cannot_be_restored_is_refused_naming_its_release_never_as_a_data_error(numbered):
    from dali_pipes import DatasetError
    from dali_pipes.graph._dali import checkpoint_entries, checkpoint_with_entries
    from dali_pipes.run.dali_checkpoint import CheckpointError
    state, _ = _state_and_rest(numbered)
    dali = state["pipeline"]["dali"]
    without_reader = checkpoint_with_entries(dali, [e for e in checkpoint_entries(dali) if e[0] != "Reader"])
    broken_crop = checkpoint_with_entries(dali, [(n, b"Philox_XYZ" if n == "RandomCrop" else s)
                                                 for n, s in checkpoint_entries(dali)])
    for bad, why in ((b"not a checkpoint", "not a DALI checkpoint"), (without_reader, "no state of the reader"),
                     (broken_crop, "Philox")):
        loader = DaliLoader(numbered, batch_size=3, train=True, device="cpu", image_size=16, num_threads=1, seed=3)
        with pytest.raises(CheckpointError, match=rf"written by dali_pipes \S+\) cannot be restored .*{why}") as e:
            loader.load_state_dict({**state, "pipeline": {**state["pipeline"], "dali": bad, "dali_sha256": None}})
        assert not isinstance(e.value, DatasetError) and "bad sample" not in str(e.value)
        loader.close()


# ---------------------------------------------------------------------------------------------
# Issue 32: a damaged DALI checkpoint, or a state without one, is a CheckpointError naming the release and the fix
# ---------------------------------------------------------------------------------------------

def _flipped(dali: bytes, at: int) -> bytes:
    damaged = bytearray(dali)
    damaged[at] ^= 0xFF
    return bytes(damaged)


@pytest.mark.parametrize("where", ["in an operator's name", "past the reader's name", "the last byte"])
def test_a_checkpoint_with_a_flipped_byte_is_refused_and_the_loader_goes_on(numbered, where):
    """Each flip on its own: one in a name DALI failed to decode (UnicodeDecodeError), one DALI restored without
    a word, and the last. The digest saved beside the checkpoint finds each,
    before anything is restored: the loader goes on from where it was."""
    from dali_pipes.run.dali_checkpoint import CheckpointError
    state, _ = _state_and_rest(numbered)
    dali = state["pipeline"]["dali"]
    at = {"in an operator's name": dali.index(b"Reader"), "past the reader's name": dali.index(b"Reader") + 20,
          "the last byte": len(dali) - 1}[where]
    loader = DaliLoader(numbered, batch_size=3, train=True, device="cpu", image_size=16, num_threads=1, seed=3)
    damaged = {**state, "pipeline": {**state["pipeline"], "dali": _flipped(dali, at)}}
    with pytest.raises(CheckpointError, match=r"written by dali_pipes \S+\) is damaged: .* Load an undamaged copy "
                                              r"of the state .*, or start afresh"):
        loader.load_state_dict(damaged)
    assert loader.next_batch == (0, 0) and len(_batches(loader)) == len(loader)  # untouched


def test_a_damaged_checkpoint_of_a_state_without_a_digest_is_a_checkpoint_error(numbered):
    """States written before the digest: a flipped byte in a name made DALI raise UnicodeDecodeError."""
    from dali_pipes.run.dali_checkpoint import CheckpointError
    state, _ = _state_and_rest(numbered)
    dali = state["pipeline"]["dali"]
    pipeline = {k: v for k, v in state["pipeline"].items() if k != "dali_sha256"}
    loader = DaliLoader(numbered, batch_size=3, train=True, device="cpu", image_size=16, num_threads=1, seed=3)
    with pytest.raises(CheckpointError, match=r"written by dali_pipes \S+\) cannot be restored .*Resume with the "
                                              r"dali_pipes version that wrote it, or start afresh"):
        loader.load_state_dict({**state, "pipeline": {**pipeline, "dali": _flipped(dali, dali.index(b"Reader"))}})


def test_a_state_without_its_dali_checkpoint_is_a_checkpoint_error(numbered):
    from dali_pipes.run.dali_checkpoint import CheckpointError
    state, _ = _state_and_rest(numbered)
    pipeline = {k: v for k, v in state["pipeline"].items() if k != "dali"}
    loader = DaliLoader(numbered, batch_size=3, train=True, device="cpu", image_size=16, num_threads=1, seed=3)
    with pytest.raises(CheckpointError, match=r"loader state \(written by dali_pipes \S+\) has no DALI checkpoint "
                                              r"\('dali' of its 'pipeline' part\).* Load the whole state, or start "
                                              r"afresh"):
        loader.load_state_dict({**state, "pipeline": pipeline})
