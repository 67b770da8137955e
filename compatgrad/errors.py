"""Exceptions raised by compatgrad.

Every error subclasses ``CompatgradError`` and one of ``ValueError`` / ``TypeError``, so
callers can catch either the compatgrad family or the builtin they already handle.
"""

from typing import Any, Dict, Optional


class CompatgradError(Exception):
    """Base class of every compatgrad error."""

    # Autograph re-raises an exception with this attribute as it is: raised inside a tf.function
    # (a step compatgrad traces, or symbolic_gradients in the caller's), it stays this error.
    ag_pass_through = True


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
    """The loss does not depend on some requested params (their gradient is None).

    ``missing``: those params by name (the names ``as_dict=True`` gives them), in params order.
    """

    def __init__(self, argument: str, expected: str, got: Any, missing: Optional[Dict[str, Any]] = None):
        super().__init__(argument, expected, got)
        self.missing: Dict[str, Any] = dict(missing or {})


class UnsupportedModelError(CompatgradError, TypeError):
    """The object is not a model compatgrad knows, or its Keras / backend is not supported."""


class ModeError(CompatgradError, ValueError):
    """The model, its optimizer and the current execution mode (eager / graph) do not fit together."""
