"""Resolve `trainer.custom.function` (module:function) to a callable, with one-line errors.

The driver calls `resolve` before any worker starts (preflight), so a typo in the module or
function name, a module that fails to import, or a function that cannot take the one context
argument fails the job in seconds with a message naming the reference; workers resolve it again
the same way, with `path` first on the module search path.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from llmtrain.api.trainer_spec import CustomTrainerSpec


class CustomFunctionError(ValueError):
    """The custom function cannot be used; the message names trainer.custom.function."""


def add_search_path(spec: CustomTrainerSpec) -> None:
    if spec.path is None:
        return
    path = Path(spec.path)
    if not path.is_dir():
        raise CustomFunctionError(f"trainer.custom.path {spec.path} is not a directory")
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def resolve(spec: CustomTrainerSpec) -> Callable[[Any], Any]:
    """The function, imported; raises CustomFunctionError naming what is wrong."""
    ref = spec.function
    where = f"in {spec.path} or the trainer image" if spec.path else "in the trainer image"
    module_name, _, function_name = ref.partition(":")
    add_search_path(spec)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise CustomFunctionError(
                f"trainer.custom.function {ref!r}: no module named {exc.name!r} {where}"
            ) from exc
        raise CustomFunctionError(
            f"trainer.custom.function {ref!r}: importing {module_name} failed: {exc}"
        ) from exc
    except Exception as exc:
        raise CustomFunctionError(
            f"trainer.custom.function {ref!r}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from exc
    function = getattr(module, function_name, None)
    if function is None:
        raise CustomFunctionError(
            f"trainer.custom.function {ref!r}: module {module_name} has no {function_name!r}"
        )
    if not callable(function):
        raise CustomFunctionError(f"trainer.custom.function {ref!r}: {function_name} is not callable")
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return cast(Callable[[Any], Any], function)  # no signature (a builtin): trust the call
    try:
        signature.bind(object())
    except TypeError as exc:
        raise CustomFunctionError(
            f"trainer.custom.function {ref!r} must accept exactly one argument (the TrainContext); "
            f"its signature is {function_name}{signature}"
        ) from exc
    return cast(Callable[[Any], Any], function)
