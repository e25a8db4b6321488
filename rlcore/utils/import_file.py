"""Importing a user's Python file by path (custom reward functions, custom algorithms, data samplers)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from types import ModuleType


def import_file(path: str, config_key: str) -> ModuleType:
    """The module at `path`, imported once per process; errors name `config_key` (the setting to fix).

    One module name per file (not per basename), so two `reward.py` files never shadow each other, and the same
    name in every process that loads the file, so pickling its functions by reference works across processes.
    A second call returns the already imported module: registering decorators in it must run only once.
    """
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{config_key}={path} does not exist")
    module_name = "rlcore_user_" + hashlib.sha1(path.encode()).hexdigest()[:16]
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{config_key}={path} is not a Python source file (.py)")
    module = importlib.util.module_from_spec(spec)
    # Registered before exec: dataclasses and pickling inside the user's file look the module up by name.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # SyntaxError, ImportError, or anything the file raises at import time
        sys.modules.pop(module_name, None)
        raise ImportError(f"{config_key}={path} failed to load: {type(e).__name__}: {e}") from e
    return module


def import_module_or_file(location: str, config_key: str) -> ModuleType:
    """verl's two ways of naming user code: `pkg://package.module` (importable from the Python path) or a file path."""
    if location.startswith("pkg://"):
        name = location.removeprefix("pkg://")
        try:
            return importlib.import_module(name)
        except ImportError as e:
            raise ImportError(f"{config_key}={location}: module {name} cannot be imported ({e}); put its package on "
                              f"PYTHONPATH or give the file's path instead") from e
    return import_file(location, config_key)
