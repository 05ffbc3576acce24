"""Errors raised by rlsdk, each naming the plugin, its distribution and (where known) the sample."""

from __future__ import annotations


class RlsdkError(Exception):
    """Base class of rlsdk's errors."""


class PluginError(RlsdkError):
    """A plugin could not be loaded, resolved or validated."""


class UnknownPluginError(PluginError, KeyError):
    """No installed plugin provides the requested name."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class PluginConflictError(PluginError):
    """Two distributions provide the same name for one kind."""


class PluginCallError(RlsdkError):
    """A plugin raised, hung or returned the wrong type while handling a sample."""


class DataError(RlsdkError):
    """A data file is missing, empty or holds a bad row; the message names the file and line."""


class CheckpointError(RlsdkError):
    """A checkpoint or run-state file that cannot be used (damaged, unreadable, not rlsdk's); the message
    names the file."""
