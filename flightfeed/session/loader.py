"""Loading a session builder by import path, for `flightfeed worker --session-builder`."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from ..errors import InvalidArgument
from .builder import SessionBuilder, as_session_builder


def load_session_builder(path: str) -> SessionBuilder:
    """Import `package.module:attribute` (the attribute may be dotted).

    The attribute may be an async function, a SessionBuilder object, or a class whose no-arg
    instances are SessionBuilders. InvalidArgument, with the reason, for anything else.
    """
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise InvalidArgument(f"session builder {path!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise InvalidArgument(
                f"session builder {path!r}: module {module_name!r} not found (is it installed,"
                " or its directory on PYTHONPATH?)"
            ) from exc
        raise InvalidArgument(
            f"session builder {path!r}: importing {module_name!r} failed: {exc}"
        ) from exc
    except Exception as exc:
        raise InvalidArgument(
            f"session builder {path!r}: importing {module_name!r} failed: {exc!r}"
        ) from exc
    target: object = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise InvalidArgument(
                f"session builder {path!r}: {module_name!r} has no attribute {attribute!r}"
            ) from exc
    if isinstance(target, type):
        cls = target
        try:
            target = cls()
        except Exception as exc:
            raise InvalidArgument(
                f"session builder {path!r}: cannot instantiate {cls.__name__}: {exc}"
            ) from exc
    if not isinstance(target, SessionBuilder) and not callable(target):
        raise InvalidArgument(
            f"session builder {path!r} is a {type(target).__name__}, not a function or an"
            " object with an async build(ctx) method"
        )
    if not isinstance(target, SessionBuilder) and not _takes_one_argument(target):
        raise InvalidArgument(
            f"session builder {path!r} cannot be called with one argument, the request's"
            " WorkerQueryContext: it would fail every query"
        )
    return as_session_builder(target)


def _takes_one_argument(function: Callable[..., object]) -> bool:
    try:
        inspect.signature(function).bind(None)
    except TypeError:
        return False
    except ValueError:  # no signature to look at (some builtins): calling it will tell
        return True
    return True
