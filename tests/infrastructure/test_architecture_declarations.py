"""Generic code learns an architecture only from what its model file declares (docs/adding-a-model.md).

The generic modules (everything in `hooked/` but the model files, the shared layers they are built from and
the package's re-exports; plus the docs' hook reference generator) are parsed, and each must not:

1. import a family's model module or name a class defined in one (no `isinstance(module, GPT2Attention)`);
2. probe a hook name to learn what a model is (`"...hook_router_logits" in model.hook_dict`), or compare
   against a family name;
3. reach for a submodule or parameter by a leaf name only some families have (`getattr(attn, "c_proj")`).

The forbidden names are computed from the registered families themselves (hooked.models.MODEL_CLASSES), so
a new family is covered the moment it is registered.

The package's wings also import in one direction only (`import_violations`; imports under `if TYPE_CHECKING:`
are annotations and do not count, imports inside functions do):

4. no model file (hooked/models/) imports an intervention (hooked/interventions/), a circuit
   (hooked/circuits/) or a compatibility module (hooked/transformer_lens/): what a model needs lives below
   (`HookedTransformer(cfg)` asks the config to build its model, so TransformerLens' config is never imported);
5. no low-floor module (the hook core and the layers models are built from) imports anything but another
   low-floor module or a kernel;
6. no intervention imports a circuit: circuits are built on the interventions, not the reverse;
8. the sparse dictionary and its splice (`hooked.sae.dictionary`, `hooked.sae.clt`, `hooked.sae.splice`, the fit
   checks `hooked.sae.fits`, the transcoder set `hooked.sae.transcoders`, and `hooked.sae`'s `__init__`, which
   any import of them runs) import only the low floor and each other, so a
   model may import the splice lazily (`model.run_with_saes`); the rest of hooked.sae (attribution, formats,
   training) may import the interventions; nothing below imports hooked.sae (no intervention, no model file
   but the lazy import of `hooked.sae.splice`).

And a family's model file reads on its own plus the shared parts (`family_import_violations`):

7. no family's model file imports another family's model file, or the registry `hooked.models` (which imports
   every family): what two families share lives in a module named for it (hooked/models/rotary_decoder.py,
   grouped_query_attention.py, moe.py, sandwich_decoder.py), which is not a family module.

9. no attribution-graph module (hooked/graphs/) imports a `_`-prefixed name from hooked.sae
   (`private_import_violations`): what the graphs use of the dictionaries is public there (the fit checks,
   hooked/sae/fits.py; the transcoders' per-layer interface, hooked/sae/transcoders.py).

Each rule is also run on a snippet that breaks it, so the checker is seen to catch what it claims to.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hooked
from hooked.models import MODEL_CLASSES
from hooked.testing import ARCHITECTURES, random_model

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hooked"
# Not generic: the model files, the layers they are assembled from, and the package namespace re-exporting them.
BUILDING = {PACKAGE / "__init__.py"}
BUILDING_FOLDERS = {"models", "layers"}  # the model files and the layers they are assembled from
# Leaf names every reader may use whatever the family (generic attributes, ablation selectors).
VOCABULARY = {"bias", "lm_head", "experts"}


def family_modules() -> set[str]:
    """The model files of the registered families: where each model class and its config are defined. The shared
    parts they are built from (base.py, rotary_decoder.py, ...) define no registered class, so they are not here."""
    return {klass.__module__ for model_class in MODEL_CLASSES for klass in (model_class, model_class.config_class)}


def family_class_names() -> set[str]:
    names = set()
    for module in family_modules():
        tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
        names |= {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    return names


def family_leaf_names() -> set[str]:
    """Submodule and parameter names some families have and others lack (`c_proj`, `q_norm`, ...)."""
    per_family = []
    for architecture in ARCHITECTURES:
        model = random_model(architecture)
        names = {part for name, _ in [*model.named_modules(), *model.named_parameters()] for part in name.split(".")}
        per_family.append({name for name in names if name and not name.isdigit()})
    return set.union(*per_family) - set.intersection(*per_family) - VOCABULARY


def generic_files() -> list[Path]:
    files = [
        path
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts[0] not in BUILDING_FOLDERS and path not in BUILDING
    ]
    return sorted(files) + [ROOT / "docs" / "hooks_reference.py"]


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):  # an f-string: its literal parts
        return ["".join(str(part.value) for part in node.values if isinstance(part, ast.Constant))]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [text for element in node.elts for text in _strings(element)]
    return []


def violations(
    source: str, where: str, classes: set[str], modules: set[str], leaves: set[str], families: set[str]
) -> list[str]:
    tree = ast.parse(source)
    # A name this file imports from outside hooked (transformers' GPT2Config) is not ours.
    foreign = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and not (node.module or "").startswith("hooked")
        for alias in node.names
    }
    found = []
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.ImportFrom) and node.module in modules:
            found.append(f"{line} imports the model module {node.module}")
        elif isinstance(node, ast.ImportFrom) and node.module == "hooked.models":
            found += [f"{line} imports the model class {alias.name}" for alias in node.names if alias.name in classes]
        elif isinstance(node, ast.Name) and node.id in classes and node.id not in foreign:
            found.append(f"{line} names the model class {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in classes:
            found.append(f"{line} names the model class {node.attr}")
        elif isinstance(node, ast.Attribute) and node.attr in leaves:
            found.append(f"{line} reaches for .{node.attr}, which only some families have")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) > 1
            and any(text in leaves for text in _strings(node.args[1]))
        ):
            found.append(
                f"{line} {node.func.id}(..., {_strings(node.args[1])[0]!r}): a leaf name only some families have"
            )
        elif isinstance(node, ast.Compare):
            for operator, right in zip(node.ops, node.comparators, strict=True):
                left_texts = _strings(node.left)
                if isinstance(operator, (ast.In, ast.NotIn)) and any("hook_" in text for text in left_texts):
                    found.append(f"{line} probes for the hook {left_texts[0]!r}")
                if isinstance(operator, (ast.Eq, ast.NotEq)) and any(
                    text in families for text in left_texts + _strings(right)
                ):
                    found.append(f"{line} compares against a family name")
    return found


@pytest.fixture(scope="module")
def rules():
    return dict(
        classes=family_class_names(),
        modules=family_modules(),
        leaves=family_leaf_names(),
        families={model_class.family for model_class in MODEL_CLASSES},
    )


def test_generic_modules_learn_architectures_only_from_declarations(rules):
    found = [
        problem
        for path in generic_files()
        for problem in violations(path.read_text(), str(path.relative_to(ROOT)), **rules)
    ]
    assert not found, "generic code recognises architectures by hand; read a declaration instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "snippet, expected",
    [
        ("from hooked.models.gpt2 import GPT2Attention", "imports the model module"),
        ("from hooked.models import Olmo2Attention", "imports the model class"),
        ("ok = isinstance(module, GPT2Attention)", "names the model class GPT2Attention"),
        ("sparse = f'blocks.{i}.mlp.hook_router_logits' in model.hook_dict", "probes for the hook"),
        ("bias = getattr(block.attn, 'c_proj').bias", "a leaf name only some families have"),
        ("bias = block.attn.o_proj.bias", "reaches for .o_proj"),
        ("if architecture == 'qwen3_moe': pass", "compares against a family name"),
    ],
)
def test_the_checker_catches_each_kind_of_violation(rules, snippet, expected):
    found = violations(snippet, "snippet", **rules)
    assert any(expected in problem for problem in found), found


# ----------------------------------------------------------------------------- which wing imports which
# The low floor: hook points, rows, names, the result-table base and the layers every model is built from
# (hooked/layers/ and each module in it). They import each other and the kernels, nothing higher.
LOW_FLOOR = {
    "hooked.hooks",
    "hooked.rows",
    "hooked.names",
    "hooked.layers",
    "hooked.rotary",
    "hooked.kv_cache",
    "hooked.factored",
    "hooked.tokenizer",
    "hooked.version",
    "hooked.tables",  # the result-table base every analysis wing imports
}


def low_floor(module: str) -> bool:
    return module in LOW_FLOOR or module.startswith("hooked.layers.")


# (importing module's prefix, the imported modules' prefixes it may not import, why)
WING_RULES = [
    (
        "hooked.models.",
        ("hooked.interventions", "hooked.circuits", "hooked.transformer_lens"),
        "a model file imports an intervention, circuit or compatibility module",
    ),
    ("hooked.interventions.", ("hooked.circuits",), "an intervention imports a circuit module"),
    ("hooked.interventions.", ("hooked.sae",), "an intervention imports hooked.sae, which is built on them"),
    # Attribution graphs stand on the dictionaries, the interventions and the circuits' machinery; none of those (nor a
    # model) may reach up into them.
    (
        ("hooked.sae", "hooked.interventions.", "hooked.circuits.", "hooked.models."),
        ("hooked.graphs",),
        "a module below the graphs imports hooked.graphs, which is built on it",
    ),
    # Inference engines run the models and answer the analyses' calls; the library below them knows an engine only
    # by the `engine_name` a served model carries, never by importing it (the package namespace re-exports it).
    (
        (
            "hooked.models.",
            "hooked.interventions.",
            "hooked.circuits.",
            "hooked.sae",
            "hooked.graphs.",
            "hooked.weights.",
        ),
        ("hooked.engines",),
        "a module below the engines imports hooked.engines, which is built on it",
    ),
]
# What the dictionary, its splice and the package that holds them may import: the low floor and each other.
SAE_CORE = {
    "hooked.sae",
    "hooked.sae.architectures",
    "hooked.sae.dictionary",
    "hooked.sae.clt",
    "hooked.sae.splice",
    "hooked.sae.fits",
    "hooked.sae.transcoders",
}
# (importing module's prefix, the imported modules' prefix whose `_`-prefixed names it may not import)
PRIVATE_RULES = [("hooked.graphs", "hooked.sae")]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) for every hooked module the code imports, outside `if TYPE_CHECKING:` blocks;
    `from hooked import ablate` names the module `hooked.ablate` stands for (hooked.MODULE_PATHS)."""
    annotation_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for statement in block.body
        for node in ast.walk(statement)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in annotation_only:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                short = candidate.removeprefix("hooked.")
                if node.module == "hooked" and short in hooked.MODULE_PATHS:
                    candidate = hooked.MODULE_PATHS[short]
                file = ROOT / candidate.replace(".", "/")
                is_module = file.with_suffix(".py").is_file() or (file / "__init__.py").is_file()
                found.append((node.lineno, candidate if is_module else node.module))
    return [(line, name) for line, name in found if name == "hooked" or name.startswith("hooked.")]


def import_violations(source: str, importer: str) -> list[str]:
    found = []
    for line, imported in imported_modules(ast.parse(source)):
        where = f"{importer}:{line}"
        if low_floor(importer) and not low_floor(imported) and not imported.startswith("hooked.kernels"):
            found.append(f"{where} the low-floor module {importer} imports {imported}, a higher one")
        for prefix, forbidden, what in WING_RULES:
            if importer.startswith(prefix) and imported.startswith(forbidden):  # str.startswith takes a tuple too
                found.append(f"{where} {what}: {imported}")
        if importer in SAE_CORE and not (low_floor(imported) or imported in SAE_CORE):
            found.append(
                f"{where} {importer} imports {imported}: the dictionary and its splice stand on the low floor alone"
                " (models import the splice lazily)"
            )
        if (
            importer.startswith("hooked.models.")
            and imported.startswith("hooked.sae")
            and imported != "hooked.sae.splice"
        ):
            found.append(f"{where} a model file imports {imported}; it may import hooked.sae.splice (lazily) alone")
    return found


def private_import_violations(source: str, importer: str) -> list[str]:
    """`from hooked.sae.x import _name` in a module PRIVATE_RULES keeps out of hooked.sae's private names (also
    inside functions and `if TYPE_CHECKING:`: a leading underscore means only its own file uses it)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or node.level != 0 or not node.module:
            continue
        private = [alias.name for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
        for prefix, wing in PRIVATE_RULES:
            if private and importer.startswith(prefix) and node.module.startswith(wing):
                found.append(
                    f"{importer}:{node.lineno} imports {', '.join(private)} from {node.module}, private to that"
                    f" file; make what {prefix} needs public in {wing}"
                )
    return found


def test_no_graph_module_imports_a_private_name_of_the_dictionaries():
    found = [
        problem
        for path in sorted(PACKAGE.rglob("*.py"))
        for problem in private_import_violations(path.read_text(), module_name(path))
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "importer, snippet, caught",
    [
        ("hooked.graphs.transcoders", "from hooked.sae.splice import _point", True),
        ("hooked.graphs", "def f():\n    from hooked.sae.fits import check_fits, _hidden", True),
        ("hooked.graphs.nodes", "from hooked.sae.fits import check_fits", False),
        ("hooked.graphs.nodes", "from hooked.graphs.graph import _private_here", False),  # within the wing
        ("hooked.sae.attribution", "from hooked.sae.splice import _named", False),  # within the wing
    ],
)
def test_the_private_import_checker_catches_what_it_claims(importer, snippet, caught):
    assert bool(private_import_violations(snippet, importer)) == caught


def test_wings_import_in_one_direction():
    found = [
        problem
        for path in sorted(PACKAGE.rglob("*.py"))
        for problem in import_violations(path.read_text(), module_name(path))
    ]
    assert not found, "an import against the package's layering (docs/adding-a-model.md):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "importer, snippet, expected",
    [
        (
            "hooked.models.qwen3_moe",
            "from hooked.interventions.ablate import all_experts_removed",
            "a model file imports",
        ),
        ("hooked.models.gpt2", "def f():\n    from hooked.circuits import graph", "a model file imports"),
        ("hooked.models.llama", "from hooked import utils", "compatibility module: hooked.transformer_lens.utils"),
        ("hooked.models.base", "from hooked.transformer_lens.config import build_model", "a model file imports"),
        (
            "hooked.hooks",
            "def f():\n    from hooked.cache import ActivationCache",
            "the low-floor module hooked.hooks imports",
        ),
        (
            "hooked.layers",
            "from hooked.processing import Projection",
            "the low-floor module hooked.layers",
        ),
        ("hooked.interventions.sweeps", "import hooked.circuits.engine", "an intervention imports a circuit"),
        ("hooked.interventions.ablate", "def f():\n    import hooked.sae.splice", "an intervention imports hooked.sae"),
        ("hooked.sae.splice", "from hooked.cache import ActivationCache", "stand on the low floor alone"),
        ("hooked.sae.dictionary", "def f():\n    from hooked.interventions import kinds", "stand on the low floor"),
        ("hooked.sae", "from hooked.sae.attribution import attribute", "stand on the low floor alone"),
        ("hooked.models.base", "def f():\n    from hooked.sae.attribution import attribute", "a model file imports"),
        ("hooked.sae.training", "from hooked.graphs.attribute import attribute", "below the graphs imports"),
        ("hooked.sae.transcoders", "from hooked.graphs.nodes import Nodes", "below the graphs imports"),
        ("hooked.sae.fits", "from hooked.interventions import kinds", "stand on the low floor alone"),
        ("hooked.graphs.schedule", "def f():\n    import hooked.engines.vllm", "below the engines imports"),
        ("hooked.interventions.sweeps", "def f():\n    import hooked.graphs", "below the graphs imports"),
        ("hooked.circuits.engine", "from hooked.graphs import Graph", "below the graphs imports"),
        ("hooked.interventions.sweeps", "from hooked.engines.vllm import hooked_model", "below the engines imports"),
        ("hooked.graphs.attribute", "def f():\n    import hooked.engines.vllm.engine", "below the engines imports"),
        ("hooked.weights.loading", "from hooked.engines.vllm.hooked_model import VllmModel", "below the engines"),
    ],
)
def test_the_import_checker_catches_each_kind_of_violation(importer, snippet, expected):
    assert any(expected in problem for problem in import_violations(snippet, importer)), import_violations(
        snippet, importer
    )


@pytest.mark.parametrize(
    "importer, snippet",
    [
        ("hooked.models.base", "def f():\n    from hooked.sae.splice import saes"),
        ("hooked.sae.splice", "from hooked.hooks import HookPoint\nfrom hooked.sae.dictionary import Dictionary"),
        ("hooked.sae.attribution", "from hooked.interventions import kinds\nfrom hooked.sae.splice import saes"),
    ],
)
def test_the_import_checker_lets_the_sae_wing_import_what_it_may(importer, snippet):
    assert import_violations(snippet, importer) == []


def test_annotation_only_imports_pass():
    snippet = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hooked.interventions.ablate import Ablation\n"
    )
    assert import_violations(snippet, "hooked.models.gpt2") == []


def test_every_family_declares_what_generic_code_reads():
    for model_class in MODEL_CLASSES:
        model = random_model(model_class.family)
        assert model_class.random_sizes and model_class.config_class and model_class.architectures
        for block in model.blocks:
            assert isinstance(type(block).mlp_stage, tuple), type(block).__name__
        stages = {point.stage for point in model.hook_dict.values()}
        assert stages <= set(range(-1, 2 * model.cfg.n_layers + 1)), (model_class.family, stages)
        assert all(
            model.hook_dict[name].stage == 2 * model.cfg.n_layers
            for name in model.hook_dict
            if name.startswith("ln_final.")
        )
        planned = [module for module in model.modules() if hasattr(module, "tp_plan")]
        assert planned, f"{model_class.__name__} declares no tensor-parallel plan on any module"
        for module in planned:
            for path, how in module.tp_plan().items():
                assert how.axis in ("heads", "kv_heads", "d_mlp", "experts"), (model_class.__name__, path, how)
                module.get_parameter(path)  # names a real parameter


# ----------------------------------------------------------------------------- no family imports another
def family_import_violations(source: str, importer: str, families: set[str]) -> list[str]:
    found = []
    for line, imported in imported_modules(ast.parse(source)):
        where = f"{importer}:{line}"
        if imported in families and imported != importer:
            found.append(f"{where} the family module {importer} imports the family module {imported}")
        elif imported == "hooked.models":
            found.append(f"{where} the family module {importer} imports the registry hooked.models (every family)")
    return found


def test_no_family_imports_another():
    families = family_modules()
    found = [
        problem
        for module in sorted(families)
        for problem in family_import_violations(
            (ROOT / (module.replace(".", "/") + ".py")).read_text(), module, families
        )
    ]
    assert not found, (
        "a family's model file reads another family's; move what they share into a module named for it"
        " (docs/adding-a-model.md):\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "importer, snippet, expected",
    [
        (
            "hooked.models.mixtral",
            "from hooked.models.llama import Mistral, MistralConfig",
            "imports the family module",
        ),
        ("hooked.models.gemma3", "def f():\n    from hooked.models import gemma2", "imports the family module"),
        ("hooked.models.qwen3_moe", "import hooked.models.qwen3", "imports the family module hooked.models.qwen3"),
        ("hooked.models.llama", "from hooked.models import Qwen3", "imports the registry"),
        ("hooked.models.llama", "from hooked.models.rotary_decoder import PreNormBlock", None),
        ("hooked.models.llama", "from hooked.models.llama import LlamaConfig", None),
    ],
)
def test_the_family_import_checker_catches_a_family_importing_another(importer, snippet, expected):
    families = family_modules()
    assert "hooked.models.rotary_decoder" not in families and "hooked.models.llama" in families
    found = family_import_violations(snippet, importer, families)
    if expected is None:
        assert found == []
    else:
        assert any(expected in problem for problem in found), found
