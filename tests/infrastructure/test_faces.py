"""The package's front faces name every registered family (hooked.models.MODEL_CLASSES), so none drifts when a
family is added: the package docstring and `__all__`, `hooked.models.__all__`, pyproject's description, the
site's description, the README's and the docs home page's family sentence, and the TransformerLens guide.
And the README's "What is where" table (and the docs home page's copy) names every module of the package, so a
newcomer finds any public function from it in one step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

import hooked
import hooked.models
from hooked.models import MODEL_CLASSES

ROOT = Path(__file__).resolve().parents[2]


def family_names() -> list[str]:
    """How the faces name each family: its docs title, without an alias after a slash ("GPT-NeoX / Pythia")."""
    return [model_class.title.split(" / ")[0] for model_class in MODEL_CLASSES]


def paragraph(path: Path, opening: str) -> str:
    """The paragraph of a page that begins with `opening` (where the page says what hooked is), on one line."""
    found = [block for block in re.split(r"\n\s*\n", path.read_text()) if block.lstrip().startswith(opening)]
    assert found, f"{path.name} has no paragraph beginning {opening!r}"
    return " ".join(found[0].split())


FACES = {
    "the package docstring": lambda: hooked.__doc__.split("\n\n")[0],
    "pyproject.toml's description": lambda: tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "description"
    ],
    "mkdocs.yml's site_description": lambda: re.search(
        r"^site_description: (.*)$", (ROOT / "mkdocs.yml").read_text(), re.M
    )[1],
    "the README's family paragraph": lambda: paragraph(ROOT / "README.md", "`hooked` reimplements"),
    "the docs home page's family paragraph": lambda: paragraph(ROOT / "docs" / "index.md", "`hooked` reimplements"),
    "the TransformerLens guide's family paragraph": lambda: paragraph(
        ROOT / "docs" / "transformer-lens.md", "`hooked` implements"
    ),
}


@pytest.mark.parametrize("face", FACES)
def test_every_face_names_every_registered_family(face):
    text = FACES[face]()
    missing = [name for name in family_names() if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)]
    assert not missing, f"{face} does not name {missing}: {text!r}"


def test_the_checker_sees_a_missing_family():
    assert re.search(r"(?<![\w-])Qwen3(?![\w-])", "GPT-2 and Qwen3-MoE") is None  # Qwen3-MoE is not Qwen3


def test_the_package_docstring_names_every_wing():
    """Each folder of the package (but the bundled models' data) is a wing the docstring's list names."""
    wings = [path.name for path in sorted((ROOT / "hooked").iterdir()) if (path / "__init__.py").is_file()]
    missing = [wing for wing in wings if f"`{wing}/`" not in hooked.__doc__ and f"`{wing}`" not in hooked.__doc__]
    assert len(wings) >= 10 and not missing, f"the package docstring's list of wings omits {missing}"


def test_every_family_and_its_config_is_exported():
    classes = {model_class.__name__ for model_class in MODEL_CLASSES}
    configs = {model_class.config_class.__name__ for model_class in MODEL_CLASSES}
    assert classes <= set(hooked.__all__), classes - set(hooked.__all__)
    assert classes | configs <= set(hooked.models.__all__), (classes | configs) - set(hooked.models.__all__)
    assert all(getattr(hooked, name) is getattr(hooked.models, name) for name in classes)
    assert all(hasattr(hooked, name) for name in hooked.__all__)


@pytest.mark.parametrize("short, module", sorted(hooked.MODULE_PATHS.items()))
def test_every_short_module_path_is_the_module_itself(short, module):
    import importlib

    assert importlib.import_module(f"hooked.{short}") is importlib.import_module(module)


def what_is_where() -> dict[str, str]:
    """The README's "What is where" table: first cell (the paths, as written) -> the whole row."""
    section = (ROOT / "README.md").read_text().split("## What is where", 1)[1].split("\n## ", 1)[0]
    return {row.split("|")[1].strip(): row for row in section.splitlines() if row.startswith("| `")}


def unlisted_modules(table: dict[str, str]) -> list[str]:
    """The modules under hooked/ the table does not name: by path in the first cell, or by their path inside a
    folder whose row is theirs (`hooked/weights/` names `sources.py`; `hooked/kernels/` names
    `attention/forward.py`)."""
    missing = []
    for path in sorted((ROOT / "hooked").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if path.name == "__init__.py" and relative != "hooked/__init__.py":
            continue  # a folder's namespace: its row names the folder
        if any(f"`{relative}`" in first for first in table):
            continue
        folders = [f"hooked/{'/'.join(path.relative_to(ROOT / 'hooked').parts[:depth])}/" for depth in (1, 2)]
        inside = [
            (row, relative.removeprefix(folder))
            for folder in folders
            for first, row in table.items()
            if first == f"`{folder}`"
        ]
        if not any(f"`{name}`" in row or f"`{name.rsplit('/', 1)[-1]}`" in row for row, name in inside):
            missing.append(relative)
    return missing


def test_the_readme_names_every_module():
    missing = unlisted_modules(what_is_where())
    assert not missing, f"README.md's 'What is where' table does not name {missing}"


def test_the_module_checker_sees_an_unlisted_module():
    table = what_is_where()
    del table["`hooked/distributed.py`"]
    assert unlisted_modules(table) == ["hooked/distributed.py"]


def test_the_docs_home_page_has_the_readmes_rows():
    """docs/index.md repeats the README's rows for the package and the tests (the site cannot link to the README)."""
    section = (ROOT / "docs" / "index.md").read_text().split("## What is where", 1)[1].split("\n## ", 1)[0]
    rows = {row.split("|")[1].strip(): row for row in section.splitlines() if row.startswith("| `")}
    readme = {first: row for first, row in what_is_where().items() if first.startswith(("`hooked/", "`tests/"))}
    assert set(rows) >= set(readme), set(readme) - set(rows)
    assert unlisted_modules(rows) == []
