"""The hook reference page, generated from the models themselves so it cannot drift.

Two uses:

- an mkdocs hook (`hooks: [docs/hooks_reference.py]` in mkdocs.yml): `on_files` adds the generated
  page `hooks-reference.md` to the site at build time;
- `python docs/hooks_reference.py` prints the page's Markdown.

Every hook name of a tiny random model of each family (`hooked.testing.random_model`; the Qwen3-MoE
one has a dense layer and a sparse layer, so both MLP kinds appear) is listed with its block index
generalised (`blocks.{i}.attn.hook_z`), its axes (`HookPoint.axes`) and a meaning: the family's own `hook_docs`
(declared on its model class), else the shared `MEANINGS` below. A hook neither describes, an axis the legend does not
name, or a table entry no model
uses raises `UndocumentedHookError`, so a new hook point cannot go undocumented and a removed one
cannot stay documented.
"""

from __future__ import annotations

import re

from hooked.models import MODEL_CLASSES

PAGE = "hooks-reference.md"

# Each family as its model class declares it (hooked.models.MODEL_CLASSES): the reference model is
# random_model(family, **docs_sizes) (Qwen3-MoE's has a dense and a sparse layer, so both MLP kinds appear).
FAMILIES = {model_class.family: model_class for model_class in MODEL_CLASSES}
MODELS: dict[str, dict] = {family: dict(model_class.docs_sizes) for family, model_class in FAMILIES.items()}
TITLES = {
    family: (
        model_class.title or model_class.__name__,
        f"hooked.models.{model_class.__name__}",
        model_class.__module__.replace(".", "/") + ".py",
    )
    for family, model_class in FAMILIES.items()
}

# Axis names HookPoint declarations may use, and what sets their size.
AXES: dict[str, str] = {
    "batch": "prompts in the batch (rows)",
    "pos": "token positions (columns) of the call that is running",
    "query_pos": "query positions (attention scores and pattern)",
    "key_pos": "key positions (attention scores and pattern); on a decode step, every key so far",
    "d_model": "residual stream width, `cfg.d_model`",
    "head_index": "attention (query) heads, `cfg.n_heads`",
    "kv_head_index": "key/value heads, `cfg.n_kv_heads` (GPT-2: `n_heads`)",
    "d_head": "width of one head, `cfg.d_head`",
    "d_mlp": "dense MLP neurons, `cfg.d_mlp`",
    "n_experts": "routed experts of a sparse layer, `cfg.n_experts`",
    "top_k": "expert slots per token, `cfg.top_k`",
    "d_expert_mlp": "one expert's neurons, `cfg.d_expert_mlp`",
    "d_vocab": "vocabulary, `cfg.d_vocab`",
    "1": "a kept singleton axis (a norm's scale)",
}

# What each hook point holds, keyed by generalised name, where every family means the same; a family's own
# text (its model class's `hook_docs`, next to the model) wins.
MEANINGS: dict[str, str] = {
    "hook_embed": "token embeddings",
    "blocks.{i}.ln1.hook_scale": (
        "the norm's scale before attention (LayerNorm `sqrt(var(x) + eps)`, RMSNorm `sqrt(mean(x^2) + eps)`)"
    ),
    "blocks.{i}.ln1.hook_normalized": "the normalised input, before the norm's weight (and bias)",
    "blocks.{i}.attn.hook_q": "queries, split by head",
    "blocks.{i}.attn.hook_k": "keys, split by key/value head",
    "blocks.{i}.attn.hook_v": "values, split by key/value head",
    "blocks.{i}.attn.hook_attn_scores": (
        "scaled `q @ k^T`, masked entries set to the dtype's minimum; listening switches the layer to the eager "
        "attention path"
    ),
    "blocks.{i}.attn.hook_pattern": "softmax of the scores",
    "blocks.{i}.attn.hook_z": (
        "per-head attention output; a view of the output projection's input, so an in-place edit changes what the "
        "projection reads"
    ),
    "blocks.{i}.mlp.hook_pre": "the MLP's pre-activation",
    "blocks.{i}.mlp.hook_post": "the neurons: the down projection's input",
    "blocks.{i}.hook_mlp_out": "MLP output",
    "blocks.{i}.hook_resid_pre": "residual stream entering block i",
    "blocks.{i}.hook_q_input": (
        "one copy of `resid_pre` per query head, each normalised by `ln1` on its own before the head's query projection"
        " (TransformerLens' split inputs); computed only when a hook listens; the receiver of circuit edges into "
        "`L{i}H{h}.q`"
    ),
    "blocks.{i}.hook_k_input": "as `hook_q_input`, one copy per key/value head, read by its key projection",
    "blocks.{i}.hook_v_input": "as `hook_q_input`, one copy per key/value head, read by its value projection",
    "blocks.{i}.attn.hook_rot_q": (
        "q after RoPE: `x * cos + rotate_half(x) * sin` (cos/sin include YaRN's attention factor)"
    ),
    "blocks.{i}.attn.hook_rot_k": "k after RoPE, as for q",
    "blocks.{i}.attn.hook_result": (
        "each head's write `z[..., h, :] @ W_O[h]`, before the output projection's bias; computed only when something "
        "listens"
    ),
    "blocks.{i}.hook_attn_out": "attention output, as added to the residual stream",
    "blocks.{i}.hook_resid_mid": "`resid_pre + attn_out`",
    "blocks.{i}.hook_mlp_in": (
        "what the MLP half reads before `ln2` (`resid_mid`; a copy when hooked, so an edit changes the MLP's input "
        "only); the receiver of circuit edges into `L{i}.mlp`"
    ),
    "blocks.{i}.ln2.hook_scale": "as `ln1.hook_scale`, for the norm before the MLP",
    "blocks.{i}.ln2.hook_normalized": "as `ln1.hook_normalized`, for the norm before the MLP",
    "blocks.{i}.mlp.hook_pre_linear": "the up projection `up_proj(x)`",
    "blocks.{i}.mlp.hook_router_logits": (
        "raw router logits `x @ gate.weight^T`, in the model dtype, before softmax and top-k"
    ),
    "blocks.{i}.mlp.hook_expert_weights": (
        "the slots' weights: top-k of the softmax over all experts (float32), divided by their sum if `norm_topk_prob`,"
        " cast to the model dtype; slot j is the j-th largest"
    ),
    "blocks.{i}.mlp.hook_expert_indices": "the expert each slot holds (int64); a returned tensor re-routes the token",
    "blocks.{i}.mlp.hook_expert_pre": "for each token and slot, the gate pre-activation of the expert in that slot",
    "blocks.{i}.mlp.hook_expert_post": (
        "for each token and slot, that expert's neurons, `silu(pre) * up` = its `down_proj` input"
    ),
    "blocks.{i}.mlp.hook_expert_result": (
        "each expert's routed write, `weight * down_proj(post)` (0 where the router did not pick it); the MLP's"
        " output is its sum over experts. Computed only while hooked (the expert nodes of `hooked.circuits`)"
    ),
    "blocks.{i}.hook_resid_post": "`resid_mid + mlp_out`",
    "ln_final.hook_scale": "the final norm's scale, as `ln1.hook_scale`",
    "ln_final.hook_normalized": (
        "the final norm's normalised input, as `ln1.hook_normalized`; the unembedding reads the norm's output"
    ),
}


class UndocumentedHookError(ValueError):
    """A model has a hook point (or an axis) the reference does not describe, or the reference describes one no
    model has."""


_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def generalise(name: str) -> tuple[str, int | None]:
    """`blocks.3.attn.hook_z` -> (`blocks.{i}.attn.hook_z`, 3); names outside a block keep None."""
    match = _BLOCK.match(name)
    if match is None:
        return name, None
    return "blocks.{i}." + name[match.end() :], int(match.group(1))


def meaning(generalised: str, architecture: str) -> str:
    """What hook `generalised` holds in `architecture`: the family's own `hook_docs`, else the shared
    MEANINGS; raises UndocumentedHookError when neither has text."""
    entry = FAMILIES[architecture].hook_docs.get(generalised, MEANINGS.get(generalised))
    if entry is None:
        raise UndocumentedHookError(
            f"hook {generalised!r} of {architecture} has no meaning: describe it in the family's `hook_docs`"
            f" ({TITLES[architecture][2]}) or, if every family means the same, in docs/hooks_reference.py's MEANINGS"
            " (the hook reference lists every hook point of every model)"
        )
    return entry


def rows(model, architecture: str) -> list[dict]:
    """One row per generalised hook name of `model`, in firing order: name, axes, layers note, meaning."""
    per_layer: dict[int | None, list[str]] = {}
    layers_of: dict[str, set[int]] = {}
    axes_of: dict[str, tuple[str, ...]] = {}
    for name, point in model.hook_dict.items():
        general, layer = generalise(name)
        per_layer.setdefault(layer, []).append(general)
        if layer is not None:
            layers_of.setdefault(general, set()).add(layer)
        previous = axes_of.setdefault(general, tuple(point.axes))
        if previous != tuple(point.axes):
            raise UndocumentedHookError(
                f"{general} has axes {previous} in one block and {tuple(point.axes)} in another"
            )
        unknown = [axis for axis in point.axes if axis not in AXES]
        if unknown:
            raise UndocumentedHookError(
                f"hook {name!r} declares axes {unknown} that docs/hooks_reference.py's AXES does not name"
            )
    order = _merge_orders(model.hook_dict, per_layer)
    n_layers = model.cfg.n_layers
    result = []
    for general in order:
        layers = layers_of.get(general)
        if layers is None:
            note = ""  # outside the blocks
        elif len(layers) == n_layers:
            note = "every"
        else:
            note = _layer_kind(model, layers)
        result.append(
            {
                "name": general,
                "axes": " ".join(axes_of[general]),
                "layers": note,
                "meaning": meaning(general, architecture),
            }
        )
    return result


def _merge_orders(hook_dict: dict, per_layer: dict[int | None, list[str]]) -> list[str]:
    """Generalised names in firing order: a name only some blocks have (a dense or a sparse MLP's hooks)
    goes right after the name that precedes it in its own block."""
    order: list[str] = []
    for name in hook_dict:
        general, layer = generalise(name)
        if general in order:
            continue
        sequence = per_layer[layer]
        index = sequence.index(general)
        anchor = next((sequence[j] for j in range(index - 1, -1, -1) if sequence[j] in order), None)
        if anchor is None or layer is None:
            order.append(general)
        else:
            position = order.index(anchor) + 1
            while (
                position < len(order) and order[position] not in sequence and order[position].startswith("blocks.{i}.")
            ):
                position += 1  # keep names of other block kinds that were already placed there
            order.insert(position, general)
    return order


def _layer_kind(model, layers: set[int]) -> str:
    kinds = {model.cfg.is_sparse(layer) for layer in layers}
    if kinds == {True}:
        return "sparse layers"
    if kinds == {False} and any(model.cfg.is_sparse(layer) for layer in range(model.cfg.n_layers)):
        return "dense layers"
    return "layers " + ", ".join(str(layer) for layer in sorted(layers))


def build_models() -> dict:
    """One model per architecture of MODELS, built from its config dataclass: no files, no network."""
    from hooked.testing import random_model

    return {architecture: random_model(architecture, **sizes) for architecture, sizes in MODELS.items()}


def markdown(models: dict | None = None) -> str:
    """The page. `models` maps architecture -> model (default: `build_models()`); every one of their hook
    names is listed, and every entry of MEANINGS must be used by one of them."""
    models = build_models() if models is None else models
    tables = {architecture: rows(model, architecture) for architecture, model in models.items()}
    if set(models) == set(MODELS):
        used = {row["name"] for table in tables.values() for row in table}
        stale = sorted(set(MEANINGS) - used)
        if stale:
            raise UndocumentedHookError(
                f"MEANINGS describes hooks no model has: {stale}; remove them from docs/hooks_reference.py"
            )
        for architecture, table in tables.items():
            own = {row["name"] for row in table}
            stale = sorted(set(FAMILIES[architecture].hook_docs) - own)
            if stale:
                raise UndocumentedHookError(
                    f"{TITLES[architecture][1]}.hook_docs describes hooks it does not have: {stale}"
                )
    used_axes = {axis for table in tables.values() for row in table for axis in row["axes"].split()}
    lines = [
        "# Hook reference",
        "",
        "Every hook point of each architecture, generated when the site is built from the models themselves"
        " (`docs/hooks_reference.py` enumerates `model.hook_dict` of tiny `hooked.testing.random_model`s; the"
        " build fails on a hook point it has no description for). `{i}` stands for any block index, and the"
        " names are listed in the order they fire. Axes are the ones each `HookPoint` declares"
        " (`HookPoint.axes`); `model.hook_shapes(batch, pos)` turns them into sizes for a given model, and"
        " `hooked hooks MODEL --pos N` prints them from a checkpoint's config.json.",
        "",
        "What each point holds in detail, which points switch a layer to another computation path, and how"
        " hooked differs from TransformerLens: [Hook points and the hook API](hooks.md) and"
        " [Qwen3 and Qwen3-MoE](qwen3.md).",
        "",
        "## Axes",
        "",
        "| axis | size |",
        "|---|---|",
    ]
    lines += [f"| `{axis}` | {text} |" for axis, text in AXES.items() if axis in used_axes]
    for architecture, table in tables.items():
        title, class_path, source = TITLES[architecture]
        lines += ["", f"## {title}", ""]
        with_layers = any(row["layers"] not in ("", "every") for row in table)
        in_blocks = sum(1 for row in table if row["layers"])
        summary = f"{len(table)} hook names, {in_blocks} of them in blocks"
        if with_layers:
            summary += "; the `layers` column says which blocks have a point (a dense or a sparse MLP's)"
        lines += [f"`{class_path}` (`{source}`): {summary}.", ""]
        header = "| name | axes | layers | holds |" if with_layers else "| name | axes | holds |"
        lines += [header, "|---|---|---|---|" if with_layers else "|---|---|---|"]
        for row in table:
            cells = (
                [f"`{row['name']}`", row["axes"]]
                + ([row["layers"] or "-"] if with_layers else [])
                + [_cell(row["meaning"])]
            )
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def listed_names(page: str) -> dict[str, list[str]]:
    """The hook names each `## section` of a generated page lists (for tests)."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in page.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = []
        elif current is not None and line.startswith("| `") and current != "Axes":
            sections[current].append(line.split("`")[1])
    return sections


# ----------------------------------------------------------------------------- the mkdocs hook
def on_files(files, config):
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=markdown()))
    return files


if __name__ == "__main__":
    print(markdown(), end="")
