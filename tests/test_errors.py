"""errors.py: a DatasetError carries where, problem and fix as fields, and crosses process boundaries."""

import pickle

from dali_pipes.errors import DatasetError


def test_fields_message_and_pickling():
    error = DatasetError("a.tfrecord#3", "no feature 'image/encoded'", "Pass the right key")
    assert str(error) == "a.tfrecord#3: no feature 'image/encoded'. Pass the right key"
    again = pickle.loads(pickle.dumps(error))
    assert (again.where, again.problem, again.fix) == (error.where, error.problem, error.fix)
    assert str(DatasetError("an empty list of shards was given")) == "an empty list of shards was given"
    assert isinstance(error, ValueError)
