"""Exceptions raised by compatgrad.

Every error subclasses ``CompatgradError`` and one of ``ValueError`` / ``TypeError``, so
callers can catch either the compatgrad family or the builtin they already handle.
"""

from typing import Any


class CompatgradError(Exception):
    """Base class of every compatgrad error."""


class _ArgumentError(CompatgradError):
    """The message names the argument, what was expected and what came."""

    def __init__(self, argument: str, expected: str, got: Any):
        self.argument = argument
        self.expected = expected
        self.got = got
        super().__init__(f"{argument}: expected {expected}, got {got}")


class InvalidArgumentError(_ArgumentError, ValueError):
    """An argument has the wrong value."""


class InvalidTypeError(_ArgumentError, TypeError):
    """An argument has the wrong type."""


class NotCompiledError(CompatgradError, ValueError):
    """The model has no optimizer or no loss: there is no training step to match."""


class UnconnectedGradientError(InvalidArgumentError):
    """The loss does not depend on some requested params (their gradient is None)."""


class UnsupportedModelError(CompatgradError, TypeError):
    """The object is not a model compatgrad knows, or its Keras / backend is not supported."""


class ModeError(CompatgradError, ValueError):
    """The model, its optimizer and the current execution mode (eager / graph) do not fit together."""
