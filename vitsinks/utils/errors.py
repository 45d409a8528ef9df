"""The error types that mean "the input is wrong", not "vitsinks is broken": a command prints a `UserError` as one
line and exits with its `exit_code` (`vitsinks.configs.cli`). Each also derives from the built-in type it refines
(`InputNotFound` is a `FileNotFoundError`), so Python callers can catch either."""

from __future__ import annotations


class UserError(Exception):
    """Bad input: a wrong name, value, file or checkpoint. The message names the problem and the fix."""

    exit_code = 1


class InputNotFound(UserError, FileNotFoundError):
    """A file or folder the command needs does not exist (or is empty)."""


class BadValue(UserError, ValueError):
    """A value, file content or combination of settings that cannot be used."""


class BadFile(BadValue):
    """A file vitsinks reads is torn (truncated by a kill or a full disk) or is not the file vitsinks writes."""


class ConfigError(BadValue):
    """A configuration that composes but cannot run (a number out of range, settings that exclude each other)."""


class NonFinite(UserError, RuntimeError):
    """NaN or infinite numbers where results are computed (a diverged run, a checkpoint with NaN weights)."""


class CheckFailed(Exception):
    """A built-in check of a result failed (a recomputation disagrees with the model): nothing is written; exit 3."""

    exit_code = 3
