"""The release, in one leaf module: the package, the loader state (resume.py) and the docs read it."""

__version__ = "0.3.0"
