"""TransformerLens' demo notebooks, run on `hooked` and on TransformerLens 3.9: every number must agree.

Each script in tests/transformer_lens/upstream_demos/ is a notebook's code cells with only the imports and the model
construction changed (each script's docstring lists every change and why). It runs twice, in a fresh
namespace each time: once with its `hooked` imports, once with the TransformerLens lines written next to
them (`# transformer_lens: ...`). `demo_model(name, **from_pretrained_kwargs)` builds the model in both
runs from the same random checkpoint with GPT-2 small's layout (12 layers x 12 heads, d_vocab 50257,
n_ctx 1024; `hooked.testing.build_gpt2_checkpoint`, its tokenizer trained on the notebooks' own text so
that names such as " Mary" are single tokens): `hooked.HookedTransformer.from_pretrained(dir, **kwargs)`
against TransformerLens' `load_and_process_state_dict` with `from_pretrained`'s processing (fold_ln,
center_writing_weights, center_unembed, fold_value_biases unless the notebook says otherwise).

The width is `WIDTH` (d_model; d_mlp = 4 * d_model, d_head = d_model / 12), not GPT-2's 768: the notebooks'
patching loops run a forward pass per layer x position x head, about 3,000 per library, and at width 768
one 8 x 16 forward takes about 0.8 s with hooked and 5 s with TransformerLens on this machine's two cores
(over an hour for the file). Set HOOKED_TL_DEMOS_WIDTH=768 for the real width.

What is compared, cell by cell: everything printed and every cell's displayed value (the last
expression), the numbers in them within 1e-4 absolute or relative plus one unit of the last decimal either
side shows (what rounding both to the same decimals can move two numbers apart); the text around the numbers
exactly. Every tensor and number passed to
the plotting functions, and at the end every top-level tensor, number, string and list of them, with
`torch.testing.assert_close(rtol=1e-4, atol=1e-4)` (|hooked - TL| <= 1e-4 + 1e-4 |TL|). A cell that raises
on hooked and not on TransformerLens fails the test, named with its error.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import math
import os
import re
import traceback
import warnings
from pathlib import Path

import pytest
import torch

from hooked.testing import CORPUS, build_gpt2_checkpoint

pytestmark = pytest.mark.slow  # make test-fast leaves this file out

DEMOS = Path(__file__).parent / "upstream_demos"
WIDTH = int(os.environ.get("HOOKED_TL_DEMOS_WIDTH", "96"))
GPT2_SMALL = dict(n_layer=12, n_head=12, n_positions=1024)
# Weights N(0, 0.2), as hooked.testing.random_model's: at transformers' 0.02 the logits barely depend on
# the prompt (a clean and a corrupted IOI prompt 4e-4 logits apart), and the notebooks' metrics, normalised
# by that gap, would magnify float32 rounding 2,500 times.
INIT = 0.2
SHAPES = {"gpt2-small": 12, "distilgpt2": 6}  # name -> n_layers; every other size is GPT-2 small's
# The activation patching demo runs a forward per layer x position and per layer x head for each of its
# sweeps: with 12 layers the two libraries take about 4 minutes here (TransformerLens 60% of it), so its
# "gpt2-small" has distilgpt2's 6 layers (the same loops, half the iterations). At width 96 the unembedding
# into 50257 tokens is 7/8 of each forward, so where a demo never reads the vocabulary's size its "gpt2-small"
# (and the activation patching demo's attn-only-2l) has the least vocabulary its random token ids need: ids in
# 100..9999 in the activation patching demo's induction cells, 100..19999 in the exploratory demo's. The same
# cells and loops run in about a third of the time. The Main Demo keeps 50257 (it sorts the unembedding's biases).
GPT2_SMALL_FOR = {"activation_patching_demo.py": (6, 10000), "exploratory_analysis_demo.py": (12, 20000)}
CELL = re.compile(r"^# %% cell (\d+)\n", re.MULTILINE)
TL_LINE = re.compile(r"^(\s*)(.*?)\s*# transformer_lens: (.*)$", re.MULTILINE)
NUMBER = re.compile(r"-?\d+(?:\.(\d+))?(?:e[-+]?\d+)?")
ADDRESS = re.compile(r" at 0x[0-9a-f]+|circuits-vis-[0-9a-f-]+")  # an object's address; circuitsvis' random ids


# ============================================================================= the models


def notebook_text() -> list[str]:
    """Every line of the demo scripts: the tokenizer's training text, so the notebooks' words are tokens."""
    return [line for path in sorted(DEMOS.glob("*.py")) for line in path.read_text().splitlines()] + CORPUS


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    built = {}
    for name, n_layer in SHAPES.items():
        built[name] = build_gpt2_checkpoint(
            tmp_path_factory.mktemp(name),
            n_layer=n_layer,
            n_embd=WIDTH,
            n_head=12,
            n_positions=1024,
            corpus=notebook_text(),
            vocab_size=4000,
            pad_vocab_to=50257,
            initializer_range=INIT,
        )
    for n_layer, vocab in GPT2_SMALL_FOR.values():  # (layers, vocabulary) of a demo's own "gpt2-small"
        built[n_layer, vocab] = build_gpt2_checkpoint(
            tmp_path_factory.mktemp(f"small{n_layer}x{vocab}"),
            n_layer=n_layer,
            n_embd=WIDTH,
            n_head=12,
            n_positions=1024,
            corpus=notebook_text(),
            vocab_size=4000,
            pad_vocab_to=vocab,
            initializer_range=INIT,
        )
    return built


def tl_from_pretrained(
    directory: Path,
    fold_ln=True,
    center_writing_weights=True,
    center_unembed=True,
    fold_value_biases=True,
    refactor_factored_attn_matrices=False,
    device=None,
):
    """TransformerLens 3.9's `HookedTransformer.from_pretrained` for a local GPT-2 checkpoint: its config
    mapping (tests/transformer_lens/tl_reference.py) and `load_and_process_state_dict` with from_pretrained's flags."""
    from transformers import GPT2LMHeadModel

    from tests.transformer_lens.tl_reference import tl_gpt2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

        model = tl_gpt2(directory)
        hf = GPT2LMHeadModel.from_pretrained(directory).eval()
        with torch.no_grad():
            model.load_and_process_state_dict(
                convert_gpt2_weights(hf, model.cfg),
                fold_ln=fold_ln,
                center_writing_weights=center_writing_weights,
                center_unembed=center_unembed,
                fold_value_biases=fold_value_biases,
                refactor_factored_attn_matrices=refactor_factored_attn_matrices,
            )
    return model.eval()


# TransformerLens' attn-only-2l (loading_from_pretrained.py), which the activation patching demo loads, but for
# its shortformer positions, which hooked refuses (hooked.tl_config): standard ones here; and act_fn: "solu_ln"
# there, unused without an MLP, but TransformerLens 3.9's fold_ln then replaces the norm of an MLP the block
# does not have and raises (HookedTransformer.load_and_process_state_dict, `layer.mlp.ln = LayerNormPre`).
ATTN_ONLY_2L = dict(
    n_layers=2,
    d_model=512,
    d_head=64,
    n_heads=8,
    n_ctx=2048,
    d_vocab=48262,
    act_fn="gelu_new",
    normalization_type="LN",
    attn_only=True,
    positional_embedding_type="standard",
    seed=0,
)


def attn_only_config(d_vocab: int) -> dict:
    """ATTN_ONLY_2L with the vocabulary of the tokenizer it is given (GPT2_SMALL_FOR)."""
    return dict(ATTN_ONLY_2L, d_vocab=d_vocab)


def attn_only_weights(d_vocab: int) -> dict[str, torch.Tensor]:
    """TransformerLens' random initialisation of ATTN_ONLY_2L (seed 0), its norms and biases randomised too:
    the unprocessed weights both libraries load."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens import HookedTransformer, HookedTransformerConfig

        model = HookedTransformer(HookedTransformerConfig(**attn_only_config(d_vocab)))
    generator = torch.Generator().manual_seed(1)
    weights = {}
    for name, value in model.state_dict().items():
        if (
            name.endswith((".w", ".b")) or ".b_" in name and not name.endswith("b_U")
        ):  # b_U: hooked's attn-only GPT-2 has none
            mean = 1.0 if name.endswith(".w") else 0.0
            value = mean + 0.1 * torch.randn(value.shape, generator=generator)
        weights[name] = value
    return weights


def hooked_attn_only(weights: dict[str, torch.Tensor], tokenizer_dir: Path, **processing):
    """ATTN_ONLY_2L in hooked with `weights` (TransformerLens' names and layout), processed as from_pretrained does."""
    import hooked
    from tests.transformer_lens.tl_reference import tl_tokenizer

    model = hooked.HookedTransformer(hooked.HookedTransformerConfig(**attn_only_config(weights["embed.W_E"].shape[0])))
    d_model = ATTN_ONLY_2L["d_model"]
    ours = {
        "wte.weight": weights["embed.W_E"],
        "wpe.weight": weights["pos_embed.W_pos"],
        "ln_final.weight": weights["ln_final.w"],
        "ln_final.bias": weights["ln_final.b"],
        "lm_head.weight": weights["unembed.W_U"].T,
    }
    for layer in range(ATTN_ONLY_2L["n_layers"]):

        def theirs(name, layer=layer):
            return weights[f"blocks.{layer}.{name}"]

        ours |= {
            f"blocks.{layer}.ln1.weight": theirs("ln1.w"),
            f"blocks.{layer}.ln1.bias": theirs("ln1.b"),
            # Conv1D [in, out]; out = (q | k | v) x (head, d_head)
            f"blocks.{layer}.attn.c_attn.weight": torch.cat(
                [theirs(f"attn.W_{x}").permute(1, 0, 2).reshape(d_model, -1) for x in "QKV"], dim=1
            ),
            f"blocks.{layer}.attn.c_attn.bias": torch.cat([theirs(f"attn.b_{x}").flatten() for x in "QKV"]),
            f"blocks.{layer}.attn.c_proj.weight": theirs("attn.W_O").reshape(-1, d_model),
            f"blocks.{layer}.attn.c_proj.bias": theirs("attn.b_O"),
        }
    model.load_state_dict(ours)
    model.set_tokenizer(tl_tokenizer(tokenizer_dir))  # the one TransformerLens gets (TransformerLens' set_tokenizer)
    model.process_weights_(**processing)
    return model.eval()


def tl_attn_only(weights: dict[str, torch.Tensor], tokenizer_dir: Path, **processing):
    from tests.transformer_lens.tl_reference import tl_tokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens import HookedTransformer, HookedTransformerConfig

        cfg = HookedTransformerConfig(
            **attn_only_config(weights["embed.W_E"].shape[0]), default_prepend_bos=True, tokenizer_prepends_bos=False
        )
        model = HookedTransformer(cfg, tokenizer=tl_tokenizer(tokenizer_dir), default_padding_side="left")
        model.load_and_process_state_dict(weights, **processing)
    return model.eval()


def model_builder(library: str, checkpoints: dict[str, Path]):
    """`demo_model(name, **kwargs)` for the scripts: the named checkpoint through `library`'s from_pretrained;
    "attn-only-2l" built from a config, the same random weights in both libraries."""
    import hooked

    def demo_model(
        name: str,
        fold_ln=True,
        center_writing_weights=True,
        center_unembed=True,
        fold_value_biases=True,
        refactor_factored_attn_matrices=False,
        **kwargs,
    ):
        processing = dict(
            fold_ln=fold_ln,
            center_writing_weights=center_writing_weights,
            center_unembed=center_unembed,
            fold_value_biases=fold_value_biases,
            refactor_factored_attn_matrices=refactor_factored_attn_matrices,
        )
        with torch.random.fork_rng():  # TransformerLens draws initial weights first: the notebook's draws stay the same
            if name == "attn-only-2l":
                build = hooked_attn_only if library == "hooked" else tl_attn_only
                vocab = json.loads((checkpoints["gpt2-small"] / "config.json").read_text())["vocab_size"]
                return build(attn_only_weights(vocab), checkpoints["gpt2-small"], **processing)
            if library == "hooked":
                return hooked.HookedTransformer.from_pretrained(checkpoints[name], **processing, **kwargs)
            return tl_from_pretrained(checkpoints[name], **processing, **kwargs)

    return demo_model


# ============================================================================= running a script


class Recorder:
    """Stands in for the notebooks' plotting functions and `display`: keeps what they were given."""

    def __init__(self, log: list, name: str):
        self.log, self.name = log, name

    def __call__(self, *args, **kwargs):
        self.log.append((self.name, args, kwargs))


def source_for(path: Path, library: str) -> str:
    """The script as `library` runs it: for TransformerLens each hooked import line becomes its original."""
    source = path.read_text()
    if library == "transformer_lens":
        source = TL_LINE.sub(lambda match: match.group(1) + match.group(3), source)
    return source


def run_script(path: Path, library: str, checkpoints: dict[str, Path]) -> dict:
    """Run the script's cells in order in a fresh namespace: per cell, what it printed, what it displayed,
    what it plotted and the error it raised (the next cells still run)."""
    source = source_for(path, library)
    pieces = CELL.split(source)  # [preamble, number, code, number, code, ...]
    plotted: list = []
    namespace = {
        "__name__": f"demo_on_{library}",
        "demo_model": model_builder(library, checkpoints),
        **{name: Recorder(plotted, name) for name in ("imshow", "line", "scatter", "display")},
    }
    exec(compile(pieces[0], f"{path.name} preamble", "exec"), namespace)  # the docstring and NOT_COMPARED
    cells = {}
    torch.manual_seed(0)
    for number, code in zip(pieces[1::2], pieces[2::2], strict=True):
        tree = ast.parse(code)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        printed, shown, error, start = io.StringIO(), None, None, len(plotted)
        with contextlib.redirect_stdout(printed), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                exec(compile(tree, f"{path.name} cell {number} on {library}", "exec"), namespace)
                if last is not None:
                    shown = eval(compile(ast.Expression(last.value), f"{path.name} cell {number}", "eval"), namespace)
            except Exception as exception:  # noqa: BLE001  (reported per cell)
                error = f"{type(exception).__name__}: {exception}\n" + "".join(
                    traceback.format_tb(exception.__traceback__)[-3:]
                )
        cells[int(number)] = dict(printed=printed.getvalue(), shown=shown, error=error, plotted=plotted[start:])
    torch.set_grad_enabled(True)  # the notebooks turn autograd off globally
    return dict(cells=cells, namespace=namespace)


# ============================================================================= comparing


def numbers_and_text(text: str) -> tuple[list[tuple[float, int]], str]:
    """The numbers in printed text (value, decimals shown without trailing zeros) and the text with each number
    replaced by #."""
    text = ADDRESS.sub("", text)
    text = re.sub(r"<class '([\w.]*\.)?(\w+)'>", r"<class \2>", text)  # module paths differ by library
    # decimals without trailing zeros: torch prints a tensor rounded to 3 decimals as -3.2900 (its own 4 places)
    found = [(float(match.group(0)), len((match.group(1) or "").rstrip("0"))) for match in NUMBER.finditer(text)]
    return found, NUMBER.sub("#", text)


def text_differences(where: str, ours: str, theirs: str) -> list[str]:
    our_numbers, our_text = numbers_and_text(ours)
    their_numbers, their_text = numbers_and_text(theirs)
    if "".join(our_text.split()) != "".join(their_text.split()):  # TransformerLens wraps some lines differently
        return [f"{where}: text differs\n  hooked: {ours[:400]!r}\n  TL:     {theirs[:400]!r}"]
    problems = []
    # Both sides print a number through the same code, rounded to the same k decimals (round(x, 3), .round(decimals=3)),
    # so two values within 1e-4 print up to one unit of the k-th decimal apart: -3.2905 on one CPU's kernels prints
    # -3.29 (or tensor -3.2900) and -3.2906 prints -3.291. k is at least the decimals either side shows once trailing
    # zeros are dropped (a printer pads: torch shows 4 places).
    for index, ((got, shown), (expected, shown_there)) in enumerate(zip(our_numbers, their_numbers, strict=True)):
        decimals = max(shown, shown_there)
        tolerance = max(1e-4, 1e-4 * abs(expected)) + (10.0**-decimals if decimals else 0.0)
        if not (math.isclose(got, expected, abs_tol=tolerance) or (math.isnan(got) and math.isnan(expected))):
            problems.append(f"{where}: number {index} is {got} on hooked, {expected} on TL")
    return problems


def value_differences(where: str, ours, theirs) -> list[str]:
    if isinstance(theirs, torch.Tensor):
        if not isinstance(ours, torch.Tensor):
            return [f"{where}: a {type(ours).__name__} on hooked, a tensor on TL"]
        try:
            torch.testing.assert_close(
                ours.detach().cpu(),
                theirs.detach().cpu(),
                rtol=1e-4,
                atol=1e-4,
                check_dtype=False,
                check_device=False,
                equal_nan=True,
            )
        except AssertionError as failure:
            return [f"{where}: {str(failure)[:300]}"]
        return []
    if isinstance(theirs, (list, tuple)) and all(
        isinstance(item, (torch.Tensor, int, float, str, bool, list, tuple)) for item in theirs
    ):
        if not isinstance(ours, (list, tuple)) or len(ours) != len(theirs):
            return [f"{where}: {ours!r:.200} on hooked, {theirs!r:.200} on TL"]
        return [
            problem
            for index, (a, b) in enumerate(zip(ours, theirs, strict=True))
            for problem in value_differences(f"{where}[{index}]", a, b)
        ]
    if isinstance(theirs, (int, float)) and not isinstance(theirs, bool):
        if not isinstance(ours, (int, float)) or not math.isclose(ours, theirs, rel_tol=1e-4, abs_tol=1e-4):
            return [f"{where}: {ours!r} on hooked, {theirs!r} on TL"]
        return []
    if isinstance(theirs, (str, bool)) or theirs is None:
        return (
            text_differences(where, str(ours), str(theirs))
            if isinstance(theirs, str)
            else ([] if ours == theirs else [f"{where}: {ours!r} on hooked, {theirs!r} on TL"])
        )
    return []  # models, caches, functions, HTML: what they hold is compared where it is printed or used


COMPARED_AT_THE_END = (torch.Tensor, int, float, str, list, tuple)


def differences(ours: dict, theirs: dict) -> list[str]:
    """Every way the hooked run differs from the TransformerLens one, but for the script's NOT_COMPARED
    (documented differences: the cell must still run, its output is not compared)."""
    problems = []
    not_compared = theirs["namespace"].get("NOT_COMPARED", {})
    for number, their_cell in theirs["cells"].items():
        our_cell = ours["cells"][number]
        where = f"cell {number}"
        if our_cell["error"] and not their_cell["error"]:
            problems.append(f"{where} raises on hooked only: {our_cell['error']}")
            continue
        if their_cell["error"]:  # random weights can make a notebook step degenerate: it must fail alike
            if not our_cell["error"] or our_cell["error"].split(":")[0] != their_cell["error"].split(":")[0]:
                problems.append(f"{where} raises on TransformerLens only: {their_cell['error']}")
            continue
        if where in not_compared:
            continue
        problems += text_differences(f"{where} printed", our_cell["printed"], their_cell["printed"])
        problems += value_differences(f"{where} displayed", our_cell["shown"], their_cell["shown"])
        if len(our_cell["plotted"]) != len(their_cell["plotted"]):
            problems.append(f"{where}: {len(our_cell['plotted'])} plots on hooked, {len(their_cell['plotted'])} on TL")
        for index, ((name, args, kwargs), (_, their_args, their_kwargs)) in enumerate(
            zip(our_cell["plotted"], their_cell["plotted"], strict=True)
        ):
            for key in set(kwargs) | {str(i) for i in range(len(args))}:
                a = args[int(key)] if key.isdigit() else kwargs.get(key)
                b = their_args[int(key)] if key.isdigit() else their_kwargs.get(key)
                problems += value_differences(f"{where} {name} #{index} argument {key}", tensorish(a), tensorish(b))
    for name, value in theirs["namespace"].items():
        if name.startswith("_") or not isinstance(value, COMPARED_AT_THE_END) or f"variable {name}" in not_compared:
            continue
        problems += value_differences(f"variable {name}", ours["namespace"].get(name), value)
    return problems


def tensorish(value):
    """numpy arrays (utils.to_numpy before a plot) as tensors, so they are compared as numbers."""
    import numpy as np

    return torch.from_numpy(value) if isinstance(value, np.ndarray) and value.dtype != object else value


# ============================================================================= the tests


@pytest.mark.parametrize("script", ["main_demo.py", "exploratory_analysis_demo.py", "activation_patching_demo.py"])
def test_a_transformer_lens_demo_gives_the_same_numbers_on_hooked(script, checkpoints, one_thread):
    if script in GPT2_SMALL_FOR:
        checkpoints = {**checkpoints, "gpt2-small": checkpoints[GPT2_SMALL_FOR[script]]}
    theirs = run_script(DEMOS / script, "transformer_lens", checkpoints)
    ours = run_script(DEMOS / script, "hooked", checkpoints)
    problems = differences(ours, theirs)
    assert not problems, f"{len(problems)} differences:\n" + "\n".join(problems)
    assert len(theirs["cells"]) > 10 and any(cell["plotted"] for cell in theirs["cells"].values())
