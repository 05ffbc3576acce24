"""The installed version of rlsdk."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rlsdk")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"
