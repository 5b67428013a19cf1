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

The forms, their points, selectors, counts and checks are declared per kind in
hooked/interventions/kinds.py; this file reads them, so a kind declared there parses, is suggested and is
listed here with no change to this file.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hooked.interventions import kinds

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer


def __getattr__(name: str) -> str:
    if name == "ADDRESS_FORMS":  # the forms errors list, every declared kind's (kinds.address_forms())
        return kinds.address_forms()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Component:
    """A parsed address: the hook point it lives at and the selectors that pick it out."""

    address: str
    hook_name: str
    selectors: dict  # heads / neurons / experts / positions (or a declared kind's selector) -> tuple


def parse_address(model: HookedTransformer, address: str) -> Component:
    """`"L9H9@-1"` -> Component(hook_name="blocks.9.attn.hook_z", selectors={"heads": (9,), "positions": (-1,)})."""
    if not isinstance(address, str):
        raise TypeError(f"a component address is a str such as 'L9H9', not {type(address).__name__}")
    found = kinds.match(address.strip())
    if found is None:
        raise ValueError(
            f"{address!r} is not a component address{_nearest(model, address)}; forms: {kinds.address_forms()}"
        )
    kind, match = found
    n_layers = model.cfg.n_layers
    layer = int(match["layer"])
    if not -n_layers <= layer < n_layers:
        raise IndexError(
            f"{address!r}: layer {layer} is out of range; this model has {n_layers} layers (L0..L{n_layers - 1})"
        )
    layer %= n_layers
    selectors: dict = {}
    if match["position"] is not None:
        selectors["positions"] = (int(match["position"]),)
    lacking = kind.lacking(model, layer)
    if lacking is not None:
        raise ValueError(f"{address!r}: layer {layer} {lacking.lacking}; {lacking.hint.replace('{layer}', str(layer))}")
    name = kind.hook_name(layer, match["part"] if kind.parts else None)
    if kind.only_where_present and name not in model.hook_dict:
        present = sorted({n for n in model.hook_dict if kind.pattern_of_points.match(n)})
        raise ValueError(
            f"{address!r}: {name} is not on the model now; {kind.absent.format(name=name)}"
            + (f" (there now: {', '.join(present)})" if present else "")
        )
    name = model._check_name(name)
    values = {placeholder: int(match[placeholder]) for placeholder in kind.indices}
    if kind.check is not None:
        kind.check(model, address, layer, name, values)
    for placeholder, index in kind.indices.items():
        kinds.check_range(address, layer, index.noun, values[placeholder], kind.count(model, placeholder, name))
        selectors[index.selector.name] = (values[placeholder],)
    return Component(address, name, selectors)


def _nearest(model: HookedTransformer, address: str) -> str:
    """The hint "; did you mean ...?" with the closest names of the kinds that suggest theirs, or ""."""
    candidates = [
        name
        for kind in kinds.KINDS.values()
        if kind.suggest is not None
        and (kind.only_where_present or all(kind.count(model, placeholder) is not None for placeholder in kind.indices))
        for layer in range(model.cfg.n_layers)
        for name in kind.names(model, layer, first=kind.suggest == "first")
    ]
    nearest = difflib.get_close_matches(address, [name for name in candidates if _parses(model, name)], n=3, cutoff=0.6)
    return f"; did you mean {', '.join(repr(n) for n in nearest)}?" if nearest else ""


def _parses(model: HookedTransformer, address: str) -> bool:
    """Whether `address` names a component of this model (a kind's check may refuse it: `L0KV0.k` on GPT-2)."""
    try:
        parse_address(model, address)
    except (ValueError, IndexError, KeyError):
        return False
    return True


def kv_head_name(layer: int, kv_head: int, n_heads: int, n_kv_heads: int) -> str:
    """Key/value head `kv_head`'s name: `L{layer}KV{kv_head}` where key/value heads are grouped (fewer than
    the query heads), else `L{layer}H{kv_head}` (it is that head's own key and value)."""
    if n_kv_heads != n_heads:
        return kinds.KINDS["kv_heads"].address(layer, kv_head=kv_head)
    return kinds.KINDS["heads"].address(layer, head=kv_head)


def head_names(model: HookedTransformer, layer: int, axis: str = "head_index") -> list[str]:
    """The names of layer `layer`'s heads along a point's head axis, in axis order.

    `head_names(qwen3, 0, "kv_head_index")` -> `["L0KV0", "L0KV1"]` (4 query heads, 2 key/value heads);
    on GPT-2 it is `["L0H0", ...]` for either axis. `axis` is `head_index` (query heads) or `kv_head_index`.
    """
    sizes = model.axis_sizes()
    if axis == "head_index":
        return [kinds.KINDS["heads"].address(layer, head=head) for head in range(sizes["head_index"])]
    if axis != "kv_head_index":
        raise ValueError(f"axis is 'head_index' or 'kv_head_index', not {axis!r}")
    return [kv_head_name(layer, g, sizes["head_index"], sizes["kv_head_index"]) for g in range(sizes["kv_head_index"])]


def components(model: HookedTransformer, kind: str) -> list[str]:
    """Addresses of every component of a kind: "heads", "attn", "mlps", "layers" (attn and mlp),
    "neurons:L" (every neuron of layer L), "experts:L" (every expert of layer L), and any kind declared
    with a listing (hooked/interventions/kinds.py)."""
    name, _, layer_text = kind.partition(":")
    listed = kinds.listed(name)
    n_layers = model.cfg.n_layers
    if listed and (name in kinds.GROUPS or listed[0].listing == "model"):  # "heads:3" lists every head too
        return [address for layer in range(n_layers) for each in listed for address in each.names(model, layer)]
    if listed and layer_text:
        return listed[0].names(model, _kind_layer(model, listed[0], layer_text))
    whole, per_layer = kinds.listings()
    choices = ", ".join(whole + [f"{each}:LAYER" for each in per_layer])
    raise ValueError(f"unknown component kind {kind!r}: {choices}")


def _kind_layer(model: HookedTransformer, kind: kinds.Kind, layer_text: str) -> int:
    """The layer of "neurons:L" / "experts:L", made non-negative, checked to exist and to have that kind."""
    n_layers = model.cfg.n_layers
    given = f"{kind.name}:{layer_text}"
    if re.fullmatch(r"-?\d+", layer_text.strip()) is None:
        raise ValueError(f"components(model, {given!r}): the layer must be an int, e.g. '{kind.name}:0'")
    layer = int(layer_text)
    if not -n_layers <= layer < n_layers:
        raise IndexError(
            f"components(model, {given!r}): layer {layer} is out of range; this model has {n_layers} layers"
            f" (0..{n_layers - 1})"
        )
    layer %= n_layers
    lacking = kind.lacking(model, layer)
    if lacking is not None:
        fix = f"; use '{lacking.instead}:{layer}'" if lacking.instead else f", so it has no {kind.name}"
        raise ValueError(f"components(model, {given!r}): layer {layer} {lacking.lacking}{fix}")
    return layer
