"""The package's front faces name every registered family (hooked.models.MODEL_CLASSES), so none drifts when a
family is added: the package docstring and `__all__`, `hooked.models.__all__`, pyproject's description, the
site's description, the README's and the docs home page's family sentence, and the TransformerLens guide."""

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
