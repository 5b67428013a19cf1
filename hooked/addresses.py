"""Component addresses: `"L9H9"` -> (hook name, selectors), and every address of a kind.

| address | point | selector |
|---|---|---|
| `L9H9` | `blocks.9.attn.hook_z` | `heads=9` |
| `L9.attn`, `L8.mlp` | `blocks.9.hook_attn_out`, `blocks.8.hook_mlp_out` | whole |
| `L8.N1234` | `blocks.8.mlp.hook_post` | `neurons=1234` (dense layers) |
| `L3.E5` | `blocks.3.mlp.hook_router_logits` | `experts=5` |
| `L3.E5.N12` | `blocks.3.mlp.hook_expert_post` | `experts=5, neurons=12` |

Each optionally ends in `@pos` (`L9H9@-1`: `positions=-1`); layers may be negative, letters any case.
`hooked.ablate.hooks` and `hooked.patch.hooks` turn addresses into callbacks.
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
    r"(?:H(?P<head>\d+)|\.(?P<whole>attn|mlp)|\.N(?P<neuron>\d+)|\.E(?P<expert>\d+)(?:\.N(?P<expert_neuron>\d+))?)"
    r"(?:@(?P<position>-?\d+))?$",
    re.IGNORECASE,  # "l9h9" is as clear as "L9H9"
)
ADDRESS_FORMS = "L{layer}H{head}, L{layer}.attn, L{layer}.mlp, L{layer}.N{neuron}, L{layer}.E{expert}, L{layer}.E{expert}.N{neuron}, each optionally @{position}"


@dataclass(frozen=True)
class Component:
    """A parsed address: the hook point it lives at and the selectors that pick it out."""

    address: str
    hook_name: str
    selectors: dict  # heads / neurons / experts / positions -> tuple


def parse_address(model: "HookedTransformer", address: str) -> Component:
    """`"L9H9@-1"` -> Component(hook_name="blocks.9.attn.hook_z", selectors={"heads": (9,), "positions": (-1,)})."""
    if not isinstance(address, str):
        raise TypeError(f"a component address is a str such as 'L9H9', not {type(address).__name__}")
    match = _ADDRESS.match(address.strip())
    if match is None:
        raise ValueError(f"{address!r} is not a component address{_nearest(model, address)}; forms: {ADDRESS_FORMS}")
    cfg = model.cfg
    layer = int(match["layer"])
    if not -cfg.n_layers <= layer < cfg.n_layers:
        raise IndexError(f"{address!r}: layer {layer} is out of range; this model has {cfg.n_layers} layers (L0..L{cfg.n_layers - 1})")
    layer %= cfg.n_layers
    block = f"blocks.{layer}."
    selectors: dict = {}
    if match["position"] is not None:
        selectors["positions"] = (int(match["position"]),)

    def check(kind: str, value: int, size: int) -> tuple[int, ...]:
        if value >= size:
            raise IndexError(f"{address!r}: {kind} {value} is out of range; layer {layer} has {size} ({kind}s 0..{size - 1})")
        return (value,)

    sparse = f"{block}mlp.hook_router_logits" in model.hook_dict
    if match["head"] is not None:
        name = f"{block}attn.hook_z"
        selectors["heads"] = check("head", int(match["head"]), cfg.n_heads)
    elif match["whole"] is not None:
        name = f"{block}hook_{match['whole'].lower()}_out"
    elif match["neuron"] is not None:
        if sparse:
            raise ValueError(f"{address!r}: layer {layer} is a mixture of experts; name a neuron of an expert, 'L{layer}.E{{expert}}.N{{neuron}}'")
        name = f"{block}mlp.hook_post"
        selectors["neurons"] = check("neuron", int(match["neuron"]), cfg.d_mlp)
    else:
        if not sparse:
            raise ValueError(f"{address!r}: layer {layer} has no experts (a dense MLP); use 'L{layer}.mlp' or 'L{layer}.N{{neuron}}'")
        selectors["experts"] = check("expert", int(match["expert"]), cfg.n_experts)
        if match["expert_neuron"] is None:
            name = f"{block}mlp.hook_router_logits"
        else:
            name = f"{block}mlp.hook_expert_post"
            selectors["neurons"] = check("neuron", int(match["expert_neuron"]), cfg.d_expert_mlp)
    return Component(address, model._check_name(name), selectors)


def _nearest(model: "HookedTransformer", address: str) -> str:
    candidates = components(model, "heads") + components(model, "layers")
    sparse = [i for i in range(model.cfg.n_layers) if f"blocks.{i}.mlp.hook_router_logits" in model.hook_dict]
    candidates += [f"L{i}.E0" for i in sparse] + [f"L{i}.N0" for i in range(model.cfg.n_layers) if i not in sparse]
    nearest = difflib.get_close_matches(address, candidates, n=3, cutoff=0.6)
    return f"; did you mean {', '.join(repr(n) for n in nearest)}?" if nearest else ""


def components(model: "HookedTransformer", kind: str) -> list[str]:
    """Addresses of every component of a kind: "heads", "attn", "mlps", "layers" (attn and mlp),
    "neurons:L" (every neuron of layer L), "experts:L" (every expert of layer L)."""
    cfg = model.cfg
    kind, _, layer_text = kind.partition(":")
    if kind == "heads":
        return [f"L{layer}H{head}" for layer in range(cfg.n_layers) for head in range(cfg.n_heads)]
    if kind == "attn":
        return [f"L{layer}.attn" for layer in range(cfg.n_layers)]
    if kind == "mlps":
        return [f"L{layer}.mlp" for layer in range(cfg.n_layers)]
    if kind == "layers":
        return [f"L{layer}.{part}" for layer in range(cfg.n_layers) for part in ("attn", "mlp")]
    if kind in ("neurons", "experts") and layer_text:
        layer = int(layer_text) % cfg.n_layers
        if kind == "neurons":
            return [f"L{layer}.N{i}" for i in range(cfg.d_mlp)]
        return [f"L{layer}.E{i}" for i in range(cfg.n_experts)]
    raise ValueError(f"unknown component kind {kind!r}: heads, attn, mlps, layers, neurons:LAYER, experts:LAYER")
