"""The one error type for bad datasets, so callers can catch data problems apart from bugs."""


class DatasetError(ValueError):
    """A dataset that cannot be read as asked. The message names the file, what was found and the fix."""
