"""The code hash: which application code wrote a command log (docs/concepts.md).

Every epoch record carries it, and replay under another hash is refused unless forced, because
other code may compute another state from the same log. It covers:

* the code of every module that defines the app's actor types, handlers or event types;
* the code of every module those import, directly or not (top-level or inside functions),
  that belongs to the application: not Python's standard library, not an installed
  distribution, not epochal itself;
* the name and version of every installed distribution the app's modules import.

"Code" is each module's syntax tree without its docstrings: a change to comments, docstrings,
blank lines or formatting is not a change of code, and needs no deploy check. It does not cover
epochal's own version, the Python version, data files or the environment.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
import site
import sys
import sysconfig
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import ModuleType

__all__ = ["app_modules", "code_hash"]


def _roots(key: str) -> list[Path]:
    return [Path(p).resolve() for p in {sysconfig.get_paths()[key]} if p]


_STDLIB = _roots("stdlib") + _roots("platstdlib")
_INSTALLED = [*_roots("purelib"), *_roots("platlib")] + [
    Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]
]


def _module(name: str) -> ModuleType | None:
    module = sys.modules.get(name)
    if module is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        module = importlib.util.module_from_spec(spec)  # its file and name; never executed
    return module


def _imported_names(module: ModuleType, source: str) -> Iterator[str]:
    """Every module name an import statement of ``source`` may refer to, with its parents."""
    package = module.__package__ or ""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            yield from (".".join(parts[:i]) for i in range(1, len(parts) + 1))


def _kind(name: str, module: ModuleType) -> str:
    """``app``, ``installed`` or ``other`` (standard library, built-in, epochal)."""
    if name == "epochal" or name.startswith("epochal."):
        return "other"
    file = getattr(module, "__file__", None)
    if not file:
        return "other"
    path = Path(file).resolve()
    if any(path.is_relative_to(root) for root in _INSTALLED):
        return "installed"
    if any(path.is_relative_to(root) for root in _STDLIB):
        return "other"
    return "app"


@functools.cache
def _distributions_by_package() -> Mapping[str, list[str]]:
    """Which installed distributions provide each top-level package: a scan of every
    distribution's metadata (about half a second), so once per process: what is installed does
    not change under a running app."""
    return importlib.metadata.packages_distributions()


def app_modules(objects: Iterable[object]) -> tuple[dict[str, str], set[str]]:
    """The app's modules (name → source) and the installed distributions they import."""
    pending = [m for m in map(inspect.getmodule, objects) if m is not None]
    sources: dict[str, str] = {}
    distributions: set[str] = set()
    by_package = _distributions_by_package()
    while pending:
        module = pending.pop()
        if module.__name__ in sources:
            continue
        try:
            source = inspect.getsource(module)
        except (OSError, TypeError):  # no source (frozen, interactive): the name must do
            sources[module.__name__] = ""
            continue
        sources[module.__name__] = source
        for name in _imported_names(module, source):
            if name in sources or not name:
                continue
            imported = _module(name)
            if imported is None:
                continue
            kind = _kind(name, imported)
            if kind == "app":
                pending.append(imported)
            elif kind == "installed":
                for dist in by_package.get(name.split(".")[0], []):
                    distributions.add(f"{dist}=={importlib.metadata.version(dist)}")
    return sources, distributions


def _is_docstring(statement: ast.stmt) -> bool:
    if not isinstance(statement, ast.Expr) or not isinstance(statement.value, ast.Constant):
        return False
    return isinstance(statement.value.value, str)


def _code(source: str) -> str:
    """What of a module's source runs: its syntax tree without docstrings, without positions
    (so neither comments nor formatting count). A source that does not parse counts as is."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    scopes = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    for node in ast.walk(tree):
        if isinstance(node, scopes) and node.body and _is_docstring(node.body[0]):
            node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


def code_hash(objects: Iterable[object]) -> str:
    """16 hex digits over the app's modules and imported distributions (see the docstring)."""
    sources, distributions = app_modules(objects)
    digest = hashlib.sha256()
    for name in sorted(sources):
        digest.update(f"{name}\0{_code(sources[name])}\0".encode())
    for dist in sorted(distributions):
        digest.update(f"{dist}\0".encode())
    return digest.hexdigest()[:16]
