"""The layout of the design card holds: one package, folders at the top, imports one way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import epochal

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("schemas", "log", "actors", "recovery", "analytics")
# what each layer may import of ours; the SHARED modules of the front door, any layer
ALLOWED = {
    "schemas": set(),
    "log": {"schemas", "jvm"},
    "actors": {"schemas", "log"},
    "recovery": {"schemas", "log", "actors", "jvm"},
    "analytics": {"schemas", "jvm"},
}
SHARED = {"errors", "config", "metrics", "interrupts"}
# third-party libraries and the only places that may import them
OWNERS = {"confluent_kafka": {"log"}, "pyspark": {"recovery", "analytics", "demo"},
          "deltalake": {"recovery", "analytics", "demo"}}  # fmt: skip


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _owner(path: Path) -> str:
    relative = path.relative_to(ROOT / "epochal")
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def test_layers_live_in_top_level_folders_of_one_package() -> None:
    package_dir = Path(epochal.__file__).parent
    for layer in LAYERS:
        assert (ROOT / layer / "__init__.py").is_file()
        assert (package_dir / layer).resolve() == (ROOT / layer).resolve()


@pytest.mark.parametrize("layer", LAYERS)
def test_imports_point_one_way(layer: str) -> None:
    for path in (ROOT / layer).rglob("*.py"):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "epochal" and len(parts) > 1 and parts[1] != layer:
                assert parts[1] in ALLOWED[layer] | SHARED, f"{path} imports {name}"


def test_libraries_are_imported_only_where_they_belong() -> None:
    for path in (ROOT / "epochal").rglob("*.py"):
        for name in _imports(path):
            library = name.split(".")[0]
            if library in OWNERS:
                assert _owner(path) in OWNERS[library], f"{path} imports {library}"
