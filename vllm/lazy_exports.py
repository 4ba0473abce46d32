"""Lazy public names for a package: `__getattr__ = lazy_exports(__name__, {name: module})` imports
a name's module (relative to the package) on first access, so importing the package itself stays
light and free of side effects."""
import importlib
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
    return __getattr__
