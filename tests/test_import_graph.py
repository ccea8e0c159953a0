"""
The package's import graph: no circle, and every import points down the layers below, so that a module can be read
(and tested) with only what sits under it. Every import counts: at the top of a module, inside a function, or for
type checking only.
"""

from __future__ import annotations

import ast
import collections
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "rlcaption"
# Bottom to top: a unit (a top-level module or subpackage) imports only from units of lower layers. Models stand
# alone; decoding sits on them; the trainer sits on the objectives, which sit on decoding and rewards; recipes and the
# command line on top. The shapes benchmark is a world of its own whose modules sit at different heights (its dataset
# under the loaders, its demo on the trainer), so each of its modules is a unit.
LAYERS = [
    {"models", "shapes.dataset"},
    {"generation", "hub"},
    {"data"},
    {"metrics"},
    {"processing", "shapes.grounding"},
    {"shapes", "shapes.evaluate_modules", "shapes.demo_report"},
    {"rewards", "shapes.scene_pretraining"},
    {"rl_config", "evaluation", "inference", "shapes.clip_model_card", "shapes.gallery", "auto"},
    {"objectives"},
    {"trainer"},
    {"recipe_arguments"},
    {"recipes"},
    {"shapes.demo"},
    {"api"},
    {"cli", "__init__"},
    {"__main__"},
]
# packages whose modules are units each
SPLIT_PACKAGES = {"shapes"}
# what a model's files may import besides the standard library (within rlcaption: only rlcaption.models); the Hub
# client comes with transformers
MODEL_DEPENDENCIES = ("torch", "transformers", "huggingface_hub", "rlcaption")


def module_files() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["rlcaption", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The rlcaption modules `module` imports, wherever the import statement is."""
    found = set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("rlcaption"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            if base.startswith("rlcaption"):
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    found.add(submodule if submodule in modules else base)
    found.discard(module)
    return found


def unit_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 2 and parts[1] in SPLIT_PACKAGES:
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else "__init__"


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = module_files()
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_is_read_from_every_kind_of_import():
    modules = module_files()
    # decoding imports at the top, the trainer package re-exports, the command line imports inside functions
    decoding = "rlcaption.generation.decoding"
    assert "rlcaption.generation.captioners" in imports_of(decoding, modules[decoding], modules)
    assert "rlcaption.recipes" in imports_of("rlcaption.cli", modules["rlcaption.cli"], modules)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_itself_back(graph):
    assert cycles(graph) == []


def test_no_package_imports_itself_back(graph):
    units = collections.defaultdict(set)
    for module, targets in graph.items():
        units[unit_of(module)].update(unit_of(target) for target in targets if unit_of(target) != unit_of(module))
    assert cycles(units) == []


def test_every_import_points_down_the_layers(graph):
    layer = {unit: number for number, units in enumerate(LAYERS) for unit in units}
    assert set(layer) >= {unit_of(module) for module in graph}, "a new module needs a layer in LAYERS"
    upward = [
        f"{module} -> {target}"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if layer[unit_of(target)] > layer[unit_of(module)]
    ]
    assert upward == []


def test_models_import_only_torch_transformers_and_models(graph):
    # within the package: nothing but other models (a speaker-listener holds a ShowTellRL) and their building blocks
    assert [
        f"{module} -> {target}"
        for module, targets in sorted(graph.items())
        if module.startswith("rlcaption.models")
        for target in sorted(targets)
        if not target.startswith("rlcaption.models")
    ] == []
    # outside it: the standard library, torch, transformers and its Hub client
    for path in (PACKAGE / "models").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            third_party = [name for name in names if name.split(".")[0] not in sys.stdlib_module_names]
            assert all(name.split(".")[0] in MODEL_DEPENDENCIES for name in third_party), (path.name, third_party)
