"""No import circle inside the feature wings (hooked/sae and hooked/graphs): a module that imports a module that
(through others) imports it back reads half-initialised names at import time, or only works because one side
imports lazily, inside a function, which hides the circle rather than breaking it. So imports inside functions
count; imports under `if TYPE_CHECKING:` (annotations) do not.

The imports are parsed with `ast` (`imported_modules` of the layering test, tests/infrastructure/
test_architecture_declarations.py, which resolves `from hooked.sae import training` to the module
`hooked.sae.training`), the graph of the wings' modules built, and every circle named. Each rule is also run on
made-up modules that break it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.infrastructure.test_architecture_declarations import PACKAGE, imported_modules, module_name

WINGS = ("hooked.sae", "hooked.graphs")
# Circles known and not yet broken, each with its reason; the test fails on any other, and on one of these once it
# is gone (delete its line then). `Graph`'s methods (save_circuit_tracer, load_circuit_tracer, to_frontend) call
# the modules that write its files, and those build or read `Graph`: the fix moves the writers behind a function the
# result class does not import back (issue 40's result-class work on hooked/graphs).
KNOWN: dict[tuple[str, ...], str] = {}  # circles kept for a reason, each named; none today


def in_wings(module: str) -> bool:
    return any(module == wing or module.startswith(wing + ".") for wing in WINGS)


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """module -> the modules of `sources` it imports (module-level or in a function, not for annotations only)."""
    return {
        module: {imported for _, imported in imported_modules(ast.parse(source)) if imported in sources} - {module}
        for module, source in sources.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each circle of `graph` once, as the modules around it from its smallest name back to that name."""
    found, seen = [], set()

    def walk(module: str, path: list[str]) -> None:
        for imported in sorted(graph.get(module, ())):
            if imported == path[0]:
                circle = path + [imported]
                key = frozenset(zip(circle, circle[1:], strict=False))
                if key not in seen:
                    seen.add(key)
                    found.append(circle)
            elif imported not in path and imported > path[0]:  # each circle walked from its smallest module only
                walk(imported, path + [imported])

    for start in sorted(graph):
        walk(start, [start])
    return found


def wing_sources() -> dict[str, str]:
    paths = [path for wing in WINGS for path in sorted((PACKAGE / Path(*wing.split(".")[1:])).rglob("*.py"))]
    return {module_name(path): path.read_text() for path in paths}


def test_no_import_circle_in_the_feature_wings():
    sources = wing_sources()
    assert {"hooked.sae.dictionary", "hooked.sae.training.loop", "hooked.graphs.attribute"} <= set(sources)
    found = {tuple(circle) for circle in cycles(import_graph(sources))}
    new = sorted(found - set(KNOWN))
    assert not new, "import circles (break each: move what both need into a module of its own):\n" + "\n".join(
        " -> ".join(circle) for circle in new
    )
    gone = sorted(set(KNOWN) - found)
    assert not gone, f"these circles are broken now; delete them from KNOWN: {gone}"


@pytest.mark.parametrize(
    "sources, expected",
    [
        (  # the circle training.py and clt_training.py made: one side importing lazily still counts
            {
                "hooked.sae.training": "def f():\n    from hooked.sae.clt_training import CLTTrainer\n",
                "hooked.sae.clt_training": "from hooked.sae.training import DictionaryTrainer\n",
            },
            [["hooked.sae.clt_training", "hooked.sae.training", "hooked.sae.clt_training"]],
        ),
        (  # three modules round
            {
                "hooked.sae.a": "from hooked.sae.b import y\n",
                "hooked.sae.b": "import hooked.sae.c\n",
                "hooked.sae.c": "from hooked.sae.a import x\n",
            },
            [["hooked.sae.a", "hooked.sae.b", "hooked.sae.c", "hooked.sae.a"]],
        ),
        (  # annotations only: not a circle
            {
                "hooked.sae.a": "from hooked.sae.b import y\n",
                "hooked.sae.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hooked.sae.a import x\n",
            },
            [],
        ),
    ],
)
def test_the_cycle_checker_names_each_circle(sources, expected):
    assert cycles(import_graph(sources)) == expected
