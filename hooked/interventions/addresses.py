"""Component addresses: `"L9H9"` -> (hook name, selectors), and every address of a kind.

| address | point | selector |
|---|---|---|
| `L9H9` | `blocks.9.attn.hook_z` | `heads=9` |
| `L9H9.q`, `L9H9.k`, `L9H9.v` | `blocks.9.attn.hook_q`, `hook_k`, `hook_v` | `heads=9` (k, v: when not grouped) |
| `L3KV1.k`, `L3KV1.v` | `blocks.3.attn.hook_k`, `hook_v` | `heads=1`: key/value head 1 (grouped models) |
| `L9.attn`, `L8.mlp` | `blocks.9.hook_attn_out`, `blocks.8.hook_mlp_out` | whole |
| `L8.N1234` | `blocks.8.mlp.hook_post` | `neurons=1234` (dense layers) |
| `L3.E5` | `blocks.3.mlp.hook_router_logits` | `experts=5` |
| `L3.E5.N12` | `blocks.3.mlp.hook_expert_post` | `experts=5, neurons=12` |

Each optionally ends in `@pos` (`L9H9@-1`: `positions=-1`); layers may be negative, letters any case.
`hooked.interventions.ablate.hooks` and `hooked.interventions.patch.hooks` turn addresses into callbacks.

One name means one head. `H` is a query head; where key/value heads are grouped (fewer than the query
heads, Qwen3's grouped-query attention) a key/value head is `KV`: `L3KV1` is shared by query heads
`L3H2` and `L3H3` (of 4 heads, 2 key/value heads), so `L3H2.k` is refused (it would also act on
`L3H3`) and so is `L3KV1` without `.k` / `.v` (hook_z has a slot per query head, not per key/value
head). Where every head has its own key and value (GPT-2), key/value head h *is* head h and is named
`L9H9.k`, as TransformerLens' `head_index` axis does; `KV` names are refused there. Which kind of head
a point has is its axis (`head_index` or `kv_head_index`); `head_names` gives the names along one, as
sweeps and tables use them, and hooked.circuits names its key/value inputs the same way (`L3KV1.k`).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer


_ADDRESS = re.compile(
    r"^L(?P<layer>-?\d+)"
    r"(?:(?P<head_kind>H|KV)(?P<head>\d+)(?:\.(?P<part>[qkv]))?|\.(?P<whole>attn|mlp)|\.N(?P<neuron>\d+)|\.E(?P<expert>\d+)(?:\.N(?P<expert_neuron>\d+))?)"
    r"(?:@(?P<position>-?\d+))?$",
    re.IGNORECASE,  # "l9h9" is as clear as "L9H9"
)
ADDRESS_FORMS = "L{layer}H{head}, L{layer}H{head}.q|k|v, L{layer}KV{kv_head}.k|v, L{layer}.attn, L{layer}.mlp, L{layer}.N{neuron}, L{layer}.E{expert}, L{layer}.E{expert}.N{neuron}, each optionally @{position}"


@dataclass(frozen=True)
class Component:
    """A parsed address: the hook point it lives at and the selectors that pick it out."""

    address: str
    hook_name: str
    selectors: dict  # heads / neurons / experts / positions -> tuple


def parse_address(model: HookedTransformer, address: str) -> Component:
    """`"L9H9@-1"` -> Component(hook_name="blocks.9.attn.hook_z", selectors={"heads": (9,), "positions": (-1,)})."""
    if not isinstance(address, str):
        raise TypeError(f"a component address is a str such as 'L9H9', not {type(address).__name__}")
    match = _ADDRESS.match(address.strip())
    if match is None:
        raise ValueError(f"{address!r} is not a component address{_nearest(model, address)}; forms: {ADDRESS_FORMS}")
    cfg = model.cfg
    layer = int(match["layer"])
    if not -cfg.n_layers <= layer < cfg.n_layers:
        raise IndexError(
            f"{address!r}: layer {layer} is out of range; this model has {cfg.n_layers} layers (L0..L{cfg.n_layers - 1})"
        )
    layer %= cfg.n_layers
    block = f"blocks.{layer}."
    selectors: dict = {}
    if match["position"] is not None:
        selectors["positions"] = (int(match["position"]),)

    def check(kind: str, value: int, size: int) -> tuple[int, ...]:
        if value >= size:
            raise IndexError(
                f"{address!r}: {kind} {value} is out of range; layer {layer} has {size} ({kind}s 0..{size - 1})"
            )
        return (value,)

    sparse = cfg.is_sparse(layer)
    attention_only = model.blocks[layer].mlp is None  # cfg.attn_only: the block has no MLP
    if attention_only and (
        match["neuron"] is not None or match["expert"] is not None or (match["whole"] or "").lower() == "mlp"
    ):
        raise ValueError(
            f"{address!r}: layer {layer} is attention-only (no MLP); name its heads ('L{layer}H0')"
            f" or its attention output ('L{layer}.attn')"
        )
    if match["head"] is not None:
        name = model._check_name(f"{block}attn.hook_{(match['part'] or 'z').lower()}")
        key_value = match["head_kind"].upper() == "KV"
        selectors["heads"] = (_head_index(model, address, layer, name, key_value, int(match["head"])),)
    elif match["whole"] is not None:
        name = f"{block}hook_{match['whole'].lower()}_out"
    elif match["neuron"] is not None:
        if sparse:
            raise ValueError(
                f"{address!r}: layer {layer} is a mixture of experts; name a neuron of an expert, 'L{layer}.E{{expert}}.N{{neuron}}'"
            )
        name = f"{block}mlp.hook_post"
        selectors["neurons"] = check("neuron", int(match["neuron"]), cfg.d_mlp)
    else:
        if not sparse:
            raise ValueError(
                f"{address!r}: layer {layer} has no experts (a dense MLP); use 'L{layer}.mlp' or 'L{layer}.N{{neuron}}'"
            )
        selectors["experts"] = check("expert", int(match["expert"]), cfg.n_experts)
        if match["expert_neuron"] is None:
            name = f"{block}mlp.hook_router_logits"
        else:
            name = f"{block}mlp.hook_expert_post"
            selectors["neurons"] = check("neuron", int(match["expert_neuron"]), cfg.d_expert_mlp)
    return Component(address, model._check_name(name), selectors)


def _nearest(model: HookedTransformer, address: str) -> str:
    candidates = components(model, "heads") + components(model, "layers")
    sparse = [i for i in range(model.cfg.n_layers) if model.cfg.is_sparse(i)]
    candidates += [f"L{i}.E0" for i in sparse] + [f"L{i}.N0" for i in _mlp_layers(model) if i not in sparse]
    if _grouped(model):
        kv_heads = [kv for i in range(model.cfg.n_layers) for kv in head_names(model, i, "kv_head_index")]
        candidates += [f"{kv}.{part}" for kv in kv_heads for part in "kv"]
    nearest = difflib.get_close_matches(address, candidates, n=3, cutoff=0.6)
    return f"; did you mean {', '.join(repr(n) for n in nearest)}?" if nearest else ""


def kv_head_name(layer: int, kv_head: int, n_heads: int, n_kv_heads: int) -> str:
    """Key/value head `kv_head`'s name: `L{layer}KV{kv_head}` where key/value heads are grouped (fewer than
    the query heads), else `L{layer}H{kv_head}` (it is that head's own key and value)."""
    return f"L{layer}KV{kv_head}" if n_kv_heads != n_heads else f"L{layer}H{kv_head}"


def head_names(model: HookedTransformer, layer: int, axis: str = "head_index") -> list[str]:
    """The names of layer `layer`'s heads along a point's head axis, in axis order.

    `head_names(qwen3, 0, "kv_head_index")` -> `["L0KV0", "L0KV1"]` (4 query heads, 2 key/value heads);
    on GPT-2 it is `["L0H0", ...]` for either axis. `axis` is `head_index` (query heads) or `kv_head_index`.
    """
    sizes = model.axis_sizes()
    if axis == "head_index":
        return [f"L{layer}H{head}" for head in range(sizes["head_index"])]
    if axis != "kv_head_index":
        raise ValueError(f"axis is 'head_index' or 'kv_head_index', not {axis!r}")
    return [kv_head_name(layer, g, sizes["head_index"], sizes["kv_head_index"]) for g in range(sizes["kv_head_index"])]


def _grouped(model: HookedTransformer) -> bool:
    sizes = model.axis_sizes()
    return sizes["kv_head_index"] != sizes["head_index"]


def _head_index(model: HookedTransformer, address: str, layer: int, name: str, key_value: bool, index: int) -> int:
    """`index`, checked to be in range for its kind (`H` query head, `KV` key/value head) and to be the
    kind of head point `name` holds (its axis: `head_index` or `kv_head_index`)."""
    sizes = model.axis_sizes()
    n_heads, n_kv_heads = sizes["head_index"], sizes["kv_head_index"]
    point = name.rsplit(".", 1)[1]
    if key_value and not _grouped(model):
        raise ValueError(
            f"{address!r}: this model's key/value heads are not grouped ({n_heads} heads, each with its own key"
            f" and value), so they are named as their heads: 'L{layer}H{index}.k', 'L{layer}H{index}.v'"
        )
    kind, size = ("key/value head", n_kv_heads) if key_value else ("head", n_heads)
    if index >= size:
        raise IndexError(
            f"{address!r}: {kind} {index} is out of range; layer {layer} has {size} ({kind}s 0..{size - 1})"
        )
    group = n_heads // n_kv_heads
    holds_key_value = "kv_head_index" in model.hook_dict[name].axes and _grouped(model)
    if key_value and not holds_key_value:
        readers = ", ".join(repr(f"L{layer}H{h}") for h in range(index * group, (index + 1) * group))
        raise ValueError(
            f"{address!r} is key/value head {index}, shared by query heads {readers}, and {point} has one slot per"
            f" query head: name the query heads, or the key/value head's keys or values ('L{layer}KV{index}.k',"
            f" 'L{layer}KV{index}.v')"
        )
    if holds_key_value and not key_value:
        kv = index // group
        sharing = ", ".join(f"L{layer}H{h}" for h in range(kv * group, (kv + 1) * group))
        raise ValueError(
            f"{address!r}: query heads {sharing} share key/value head {kv} ({n_heads} heads, {n_kv_heads} key/value"
            f" heads), so {point} has no slot of head {index}'s own; name it 'L{layer}KV{kv}.{point[-1]}' (it acts on"
            " every head of the group)"
        )
    return index


def components(model: HookedTransformer, kind: str) -> list[str]:
    """Addresses of every component of a kind: "heads", "attn", "mlps", "layers" (attn and mlp),
    "neurons:L" (every neuron of layer L), "experts:L" (every expert of layer L)."""
    cfg = model.cfg
    kind, _, layer_text = kind.partition(":")
    if kind == "heads":
        return [f"L{layer}H{head}" for layer in range(cfg.n_layers) for head in range(cfg.n_heads)]
    if kind == "attn":
        return [f"L{layer}.attn" for layer in range(cfg.n_layers)]
    if kind == "mlps":  # none on an attention-only model (cfg.attn_only)
        return [f"L{layer}.mlp" for layer in _mlp_layers(model)]
    if kind == "layers":
        return [
            f"L{layer}.{part}"
            for layer in range(cfg.n_layers)
            for part in ("attn", "mlp")[: 2 if model.blocks[layer].mlp is not None else 1]
        ]
    if kind in ("neurons", "experts") and layer_text:
        layer = _kind_layer(model, kind, layer_text)
        if kind == "neurons":
            return [f"L{layer}.N{i}" for i in range(cfg.d_mlp)]
        return [f"L{layer}.E{i}" for i in range(cfg.n_experts)]
    raise ValueError(f"unknown component kind {kind!r}: heads, attn, mlps, layers, neurons:LAYER, experts:LAYER")


def _mlp_layers(model: HookedTransformer) -> list[int]:
    """The layers whose block has an MLP: all but attention-only blocks (`block.mlp is None`)."""
    return [layer for layer, block in enumerate(model.blocks) if block.mlp is not None]


def _kind_layer(model: HookedTransformer, kind: str, layer_text: str) -> int:
    """The layer of "neurons:L" / "experts:L", made non-negative, checked to exist and to have that kind."""
    n_layers = model.cfg.n_layers
    given = f"{kind}:{layer_text}"
    if re.fullmatch(r"-?\d+", layer_text.strip()) is None:
        raise ValueError(f"components(model, {given!r}): the layer must be an int, e.g. '{kind}:0'")
    layer = int(layer_text)
    if not -n_layers <= layer < n_layers:
        raise IndexError(
            f"components(model, {given!r}): layer {layer} is out of range; this model has {n_layers} layers"
            f" (0..{n_layers - 1})"
        )
    layer %= n_layers
    sparse = model.cfg.is_sparse(layer)
    if model.blocks[layer].mlp is None:
        raise ValueError(f"components(model, {given!r}): layer {layer} is attention-only (no MLP), so it has no {kind}")
    if kind == "experts" and not sparse:
        raise ValueError(
            f"components(model, {given!r}): layer {layer} has no experts (a dense MLP); use 'neurons:{layer}'"
        )
    if kind == "neurons" and sparse:
        raise ValueError(f"components(model, {given!r}): layer {layer} is a mixture of experts; use 'experts:{layer}'")
    return layer
