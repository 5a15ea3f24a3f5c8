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


@pytest.fixture(scope="module")
def numbered(tmp_path_factory):
    """The dataset the saved states were taken on: 23 JPEGs whose label is their index."""
    return write_numbered(tmp_path_factory.mktemp("numbered"), 23)


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
