"""The version of rlsdk: the one place it is written (pyproject.toml reads it from here). A plain string, so
``import rlsdk`` reads it without importing :mod:`importlib.metadata`."""

__version__ = "0.2.0"
