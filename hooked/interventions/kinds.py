"""Component kinds: one declaration per kind says how its address reads, the hook point it lives at, what
it selects there, and how many a layer has.

| kind | address | point, in `blocks.{layer}.` | selects (counted along) | layers |
|---|---|---|---|---|
| `heads` | `L9H9`; `L9H9.q`, `.k`, `.v` | `attn.hook_z`; `hook_q`, `_k`, `_v` | `heads=` (`head_index`) | every |
| `kv_heads` | `L3KV1.k`, `L3KV1.v` | `attn.hook_k`, `attn.hook_v` | `heads=` (`kv_head_index`) | where grouped |
| `attn` | `L9.attn` | `hook_attn_out` | the whole point | every |
| `mlps` | `L8.mlp` | `hook_mlp_out` | the whole point | with an MLP |
| `neurons` | `L8.N1234` | `mlp.hook_post` | `neurons=` (`d_mlp`) | dense MLP |
| `experts` | `L3.E5` | `mlp.hook_router_logits` | `experts=` (`n_experts`) | sparse MLP |
| `expert_neurons` | `L3.E5.N12` | `mlp.hook_expert_post` | `experts=`, `neurons=` (`d_expert_mlp`) | sparse MLP |
| (every kind) | `...@-1` | | `positions=` (`pos` / `query_pos`) | |

`layers` lists `attn` and `mlps` of every layer. A kind counts its components along an axis of
`model.axis_sizes()`, whose sizes each model's config declares (`ModelConfig.axis_fields`).

What reads this registry: addresses (hooked/interventions/addresses.py: parsing, the suggestions for a
misspelled address, `components(model, kind)`), ablations (each selector's keyword and the axes it selects
on), sweep tables and heatmaps (which names form a layer x index grid), `hooked sweep --components` and the
names hooked.circuits gives its nodes. So a new kind is one `declare(Kind(...))`, plus the model's size of
the axis it counts along (docs/ablation.md, "A new kind of component"):

    FEATURES = Selector("features", axes=("d_sae",), where="put it on a dictionary's feature point")
    declare(Kind("features", "L{layer}.F{feature}", hook="sae.hook_feature_acts",
                 indices={"feature": Index(FEATURES, "d_sae", "feature")}, listing="layer"))
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer


# ----------------------------------------------------------------------------- what a kind is made of
@dataclass(frozen=True)
class Selector:
    """A keyword of every ablation (`zero(heads=9)`) and the axes of a hook point it selects along."""

    name: str  # the keyword: zero(heads=9), and the ablation's field
    axes: tuple[str, ...]  # the axes it may select on, in order of preference: the first one a point has
    where: str  # where it applies: the fix an error names when a point has none of its axes
    counted_by: Mapping[str, str] = field(default_factory=dict)  # axis -> the axis whose size bounds a value
    # (experts= at a top_k axis picks the slots holding those experts: values are 0..n_experts-1)

    def size_axis(self, axis: str) -> str:
        """The axis of `model.axis_sizes()` that bounds this selector's values at a point's `axis`."""
        return self.counted_by.get(axis, axis)


@dataclass(frozen=True)
class Index:
    """A number in an address and what it selects: `{neuron}` in `L{layer}.N{neuron}` is `neurons=`,
    one of `d_mlp` per layer."""

    selector: Selector
    axis: str  # the axis of model.axis_sizes() that counts it: values 0..size-1 in a layer
    noun: str  # one of them, as errors name it: "neuron 999 is out of range"


@dataclass(frozen=True)
class LayerCondition:
    """What a layer needs for a kind to be there, and how an error names a layer without it."""

    holds: Callable[[HookedTransformer, int], bool]
    lacking: str  # what a layer without it is: "is attention-only (no MLP)"
    hint: str  # the fix for an address, "{layer}" filled in: "name its heads ('L{layer}H0') or ..."
    instead: str | None = None  # the kind a listing of such a layer should ask for ("experts" for "neurons:3")


HAS_MLP = LayerCondition(
    lambda model, layer: model.blocks[layer].mlp is not None,  # cfg.attn_only: the block has no MLP
    "is attention-only (no MLP)",
    "name its heads ('L{layer}H0') or its attention output ('L{layer}.attn')",
)
DENSE_MLP = LayerCondition(
    lambda model, layer: not model.cfg.is_sparse(layer),
    "is a mixture of experts",
    "name a neuron of an expert, 'L{layer}.E{expert}.N{neuron}'",
    instead="experts",
)
SPARSE_MLP = LayerCondition(
    lambda model, layer: model.cfg.is_sparse(layer),
    "has no experts (a dense MLP)",
    "use 'L{layer}.mlp' or 'L{layer}.N{neuron}'",
    instead="neurons",
)

# The checks a kind may add after its layer conditions: check(model, address, layer, hook_name, values),
# values {placeholder: int}; it raises naming the fix.
Check = Callable[["HookedTransformer", str, int, str, dict], None]


@dataclass(frozen=True)
class Kind:
    """One kind of component: how its address reads, where it lives, what it selects, which layers have it."""

    name: str  # "neurons": components(model, "neurons:5"), hooked sweep --components neurons:5
    form: str  # "L{layer}.N{neuron}": how an address reads and a name is written (`{part}`: one of `parts`)
    hook: str  # "mlp.hook_post": its point under blocks.{layer} ("attn.hook_{part}": per part)
    indices: Mapping[str, Index] = field(default_factory=dict)  # each {placeholder} of the form but layer, part
    parts: Mapping[str, str] = field(default_factory=dict)  # {part}: address suffix -> the hook's {part}
    listed_parts: tuple[str, ...] | None = None  # the parts its listed names carry (default: every part)
    layers: tuple[LayerCondition, ...] = ()  # what a layer needs to have it (default: every layer has it)
    listing: Literal["model", "layer"] | None = None  # components(model, name): every layer's; "name:L": one's
    suggest: Literal["all", "first"] | None = "first"  # names a misspelled address is compared with: every
    # one, or index 0 of each (a layer's 16,384 features are not worth comparing one by one); None: none
    shown: str | None = None  # the forms errors list, where not `form`
    check: Check | None = None  # checks beyond the layer conditions and index ranges (heads: grouping)
    only_where_present: bool = False  # its points exist only at times (a spliced dictionary's): list those there
    absent: str = ""  # for such a kind, the fix an address names when its point is not there ("{name}": the point)
    pattern: re.Pattern = field(init=False, repr=False, compare=False)  # the form as a regex, made from it

    def __post_init__(self):
        placeholders = re.findall(r"\{(\w+)\}", self.form)
        if not self.form.startswith("L{layer}") or "@" in self.form:
            raise ValueError(f"kind {self.name!r}: a form starts with 'L{{layer}}' and has no '@', not {self.form!r}")
        named = set(placeholders) - {"layer", "part"}
        if named != set(self.indices):
            raise ValueError(
                f"kind {self.name!r}: the form {self.form!r} names {sorted(named)}, the indices {sorted(self.indices)}"
            )
        if ("part" in placeholders) != bool(self.parts):
            raise ValueError(f"kind {self.name!r}: give parts= exactly when the form has {{part}}")
        for placeholder, index in self.indices.items():
            if index.axis not in index.selector.axes:
                raise ValueError(
                    f"kind {self.name!r}: {{{placeholder}}} counts along {index.axis}, which {index.selector.name}="
                    f" does not select on ({', '.join(index.selector.axes)})"
                )
        selectors = [index.selector.name for index in self.indices.values()]
        if len(set(selectors)) != len(selectors):
            raise ValueError(f"kind {self.name!r}: two indices fill one selector ({selectors})")
        object.__setattr__(self, "pattern", re.compile(_regex(self, "address"), re.IGNORECASE))  # "l9h9" is as clear

    @property
    def pattern_of_points(self) -> re.Pattern:
        """The hook names this kind's components live at, in any layer and part."""
        hooks = [self.hook.format(part=p) for p in self.parts.values()] if self.parts else [self.hook]
        return re.compile(rf"^blocks\.\d+\.(?:{'|'.join(map(re.escape, hooks))})$")

    # ----------------------------------------------------------------- names
    def address(self, layer: int, part: str = "", **values: int) -> str:
        """The name of one component: `KINDS["neurons"].address(3, neuron=5)` -> "L3.N5"."""
        return self.form.format(layer=layer, part=part, **values)

    def example(self) -> str:
        """Its first name: layer 0, its first part, every index 0 ("L0H0", "L0.E0.N0")."""
        return self.address(0, next(iter(self.parts), ""), **dict.fromkeys(self.indices, 0))

    def hook_name(self, layer: int, part: str | None = None) -> str:
        """The hook point of this kind in block `layer` (of the address part `part`, e.g. ".q")."""
        hook = self.hook.format(part=self.parts[(part or "").lower()]) if self.parts else self.hook
        return f"blocks.{layer}.{hook}"

    def forms(self) -> str:
        """The forms errors list: "L{layer}.N{neuron}"."""
        return self.shown or self.form.replace("{part}", "|".join(self.parts))

    def grid_pattern(self) -> re.Pattern | None:
        """The names that put one number against a layer (`L9H9`: layer x head), as a sweep heatmap reads
        them: `row` the layer, `col` the index; None for a kind of no index, or of two."""
        if len(self.indices) != 1 or (self.parts and "" not in self.parts):
            return None
        return re.compile(_regex(self, "grid"))

    # ----------------------------------------------------------------- on a model
    def lacking(self, model: HookedTransformer, layer: int) -> LayerCondition | None:
        """The first condition layer `layer` fails for this kind (None: the layer has it)."""
        return next((condition for condition in self.layers if not condition.holds(model, layer)), None)

    def count(self, model: HookedTransformer, placeholder: str, point: str | None = None) -> int | None:
        """How many values `{placeholder}` takes in a layer (None: the model declares no size for its axis), at
        hook point `point` where the size is the point's own (a spliced dictionary's d_sae)."""
        return model.axis_sizes(point).get(self.indices[placeholder].axis)

    def names(self, model: HookedTransformer, layer: int, first: bool = False) -> list[str]:
        """Every component of this kind in layer `layer`, in index order (`first`: only index 0 of each)."""
        if self.lacking(model, layer) is not None:
            return []
        names = []
        for part in self.named_parts():
            point = self.hook_name(layer, part)
            if self.only_where_present and point not in model.hook_dict:
                continue  # a feature point of a dictionary not spliced here
            counts = []
            for placeholder, index in self.indices.items():
                count = self.count(model, placeholder, point)
                if count is None:
                    raise KeyError(
                        f"kind {self.name!r} counts along {index.axis}, which model.axis_sizes() does not give;"
                        " the model declares the sizes of its axes (ModelConfig.axis_fields)"
                    )
                counts.append(range(min(count, 1) if first else count))
            names += [
                self.address(layer, part, **dict(zip(self.indices, values, strict=True)))
                for values in itertools.product(*counts)
            ]
        return names

    def named_parts(self) -> tuple[str, ...]:
        """The parts its listed names carry: `listed_parts`, or every part ("" for a kind of no part)."""
        return self.listed_parts if self.listed_parts is not None else tuple(self.parts) or ("",)


def _regex(kind: Kind, use: Literal["address", "grid"]) -> str:
    """The form as a regex: for an address, ^...(@position)?$ with a named group per placeholder; for a
    grid, the form without its part, the layer as `row` and the one index as `col`."""
    pieces = []
    for literal, placeholder in re.findall(r"([^{]*)(?:\{(\w+)\})?", kind.form):
        pieces.append(re.escape(literal))
        if placeholder == "layer":
            pieces.append(r"(?P<row>-?\d+)" if use == "grid" else r"(?P<layer>-?\d+)")
        elif placeholder == "part":
            longest_first = sorted(kind.parts, key=len, reverse=True)
            pieces.append("" if use == "grid" else f"(?P<part>{'|'.join(map(re.escape, longest_first))})")
        elif placeholder:
            pieces.append(rf"(?P<{'col' if use == 'grid' else placeholder}>\d+)")
    body = "".join(pieces)
    return f"^{body}$" if use == "grid" else rf"^{body}(?:@(?P<position>-?\d+))?$"


# ----------------------------------------------------------------------------- the head kinds' checks
def check_range(address: str, layer: int, noun: str, value: int, size: int | None) -> None:
    """Refuse `value` past `size` (None: the size is not declared, nothing to check)."""
    if size is not None and value >= size:
        raise IndexError(
            f"{address!r}: {noun} {value} is out of range; layer {layer} has {size} ({noun}s 0..{size - 1})"
        )


def _check_head(model: HookedTransformer, address: str, layer: int, name: str, values: dict, key_value: bool):
    """A head index, checked to be in range for its kind (`H` query head, `KV` key/value head) and to be the
    kind of head point `name` holds (its axis: `head_index` or `kv_head_index`); see addresses.py."""
    (index,) = values.values()
    sizes = model.axis_sizes()
    n_heads, n_kv_heads = sizes["head_index"], sizes["kv_head_index"]
    grouped = n_kv_heads != n_heads
    point = name.rsplit(".", 1)[1]
    if key_value and not grouped:
        raise ValueError(
            f"{address!r}: this model's key/value heads are not grouped ({n_heads} heads, each with its own key"
            f" and value), so they are named as their heads: 'L{layer}H{index}.k', 'L{layer}H{index}.v'"
        )
    check_range(address, layer, *(("key/value head", index, n_kv_heads) if key_value else ("head", index, n_heads)))
    group = n_heads // n_kv_heads
    holds_key_value = "kv_head_index" in model.hook_dict[name].axes and grouped
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


# ----------------------------------------------------------------------------- the built-in kinds
HEADS = Selector(
    "heads",
    axes=("head_index", "kv_head_index"),
    where="put it on a per-head point such as blocks.L.attn.hook_z (or use the address 'L{layer}H{head}')",
)
NEURONS = Selector(
    "neurons",
    axes=("d_mlp", "d_expert_mlp"),
    where="put it on blocks.L.mlp.hook_post (or use the address 'L{layer}.N{neuron}')",
)
EXPERTS = Selector(
    "experts",
    axes=("n_experts", "top_k"),  # top_k: the slots that hold the expert (needs hook.slot_experts)
    where="put it on blocks.L.mlp.hook_router_logits (or use the address 'L{layer}.E{expert}')",
    counted_by={"top_k": "n_experts"},
)
POSITION_AXES = ("pos", "query_pos")  # positions= (every kind's `@pos`) selects on these, by position in the prompt

# A head's address names its z, or its q, k or v: one part per point. Every part parses under both head kinds,
# so that a name of the wrong kind (`L0H1.v` where key/value heads are grouped, `L0KV1` for a z) is refused
# by _check_head naming the right one, not reported as no address at all.
_HEAD_PARTS = {"": "z", ".q": "q", ".k": "k", ".v": "v"}

# The features of a dictionary spliced into the model (hooked.sae): its activations `hook_sae_acts_post`, under
# the point it writes (an SAE's own point; a transcoder's output point). The part names the point.
FEATURES = Selector(
    "features",
    axes=("d_sae",),
    where="put it on a spliced dictionary's blocks.L.<point>.hook_sae_acts_post (or 'L{layer}.resid_post.F{feature}')",
)
FEATURE_POINTS = {
    ".resid_pre": "hook_resid_pre",
    ".resid_mid": "hook_resid_mid",
    ".resid_post": "hook_resid_post",
    ".attn_out": "hook_attn_out",
    ".mlp_out": "hook_mlp_out",
    ".z": "attn.hook_z",
    ".mlp_in": "hook_mlp_in",
}

SELECTORS: dict[str, Selector] = {selector.name: selector for selector in (HEADS, NEURONS, EXPERTS, FEATURES)}
KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind(
            "heads",
            "L{layer}H{head}{part}",
            hook="attn.hook_{part}",
            indices={"head": Index(HEADS, "head_index", "head")},
            parts=_HEAD_PARTS,
            listed_parts=("",),
            listing="model",
            suggest="all",
            shown="L{layer}H{head}, L{layer}H{head}.q|k|v",
            check=partial(_check_head, key_value=False),
        ),
        Kind(
            "kv_heads",
            "L{layer}KV{kv_head}{part}",
            hook="attn.hook_{part}",
            indices={"kv_head": Index(HEADS, "kv_head_index", "key/value head")},
            parts=_HEAD_PARTS,
            listed_parts=(".k", ".v"),
            suggest="all",
            shown="L{layer}KV{kv_head}.k|v",
            check=partial(_check_head, key_value=True),
        ),
        Kind("attn", "L{layer}.attn", hook="hook_attn_out", listing="model"),
        Kind("mlps", "L{layer}.mlp", hook="hook_mlp_out", layers=(HAS_MLP,), listing="model"),
        Kind(
            "neurons",
            "L{layer}.N{neuron}",
            hook="mlp.hook_post",
            indices={"neuron": Index(NEURONS, "d_mlp", "neuron")},
            layers=(HAS_MLP, DENSE_MLP),
            listing="layer",
        ),
        Kind(
            "experts",
            "L{layer}.E{expert}",
            hook="mlp.hook_router_logits",
            indices={"expert": Index(EXPERTS, "n_experts", "expert")},
            layers=(HAS_MLP, SPARSE_MLP),
            listing="layer",
        ),
        Kind(
            "expert_neurons",
            "L{layer}.E{expert}.N{neuron}",
            hook="mlp.hook_expert_post",
            indices={
                "expert": Index(EXPERTS, "n_experts", "expert"),
                "neuron": Index(NEURONS, "d_expert_mlp", "neuron"),
            },
            layers=(HAS_MLP, SPARSE_MLP),
            suggest=None,
        ),
        Kind(
            "features",
            "L{layer}{part}.F{feature}",
            hook="{part}.hook_sae_acts_post",
            indices={"feature": Index(FEATURES, "d_sae", "feature")},
            parts=FEATURE_POINTS,
            listing="layer",
            shown="L{layer}.resid_pre|resid_mid|resid_post|attn_out|mlp_out|z|mlp_in.F{feature}",
            only_where_present=True,
            absent="splice a dictionary there first (`with model.saes([sae]):`, hooked.sae)",
        ),
    )
}
GROUPS: dict[str, tuple[str, ...]] = {"layers": ("attn", "mlps")}  # listings of several kinds, layer by layer
BUILT_IN_KINDS, _BUILT_IN_SELECTORS = frozenset(KINDS), frozenset(SELECTORS)


# ----------------------------------------------------------------------------- the registry
def declare(kind: Kind) -> Kind:
    """Add a kind of component, and any selector its indices introduce; returns it.

    Its addresses then parse (`ablate.hooks(model, "L3.F12")`), are suggested when misspelled, are listed
    by `components(model, kind.name)` (with `listing=`) and by `hooked sweep --components`, and its selector
    is a keyword of every ablation (`zero(features=12)`). `remove(kind.name)` takes it out again.
    """
    if kind.name in KINDS or kind.name in GROUPS:
        raise ValueError(f"a kind named {kind.name!r} is already declared; remove({kind.name!r}) first")
    for index in kind.indices.values():
        known = SELECTORS.get(index.selector.name)
        if known is not None and known != index.selector:
            raise ValueError(f"kind {kind.name!r}: a different selector {known.name}= is declared already: {known}")
        if known is None and index.selector.name in _ABLATION_KEYWORDS:
            raise ValueError(f"kind {kind.name!r}: {index.selector.name}= is an ablation's keyword, not a selector")
    for other in KINDS.values():
        if other.pattern.match(kind.example()) or kind.pattern.match(other.example()):
            raise ValueError(f"kind {kind.name!r}: its form {kind.form!r} reads like {other.name}'s {other.form!r}")
    for index in kind.indices.values():
        SELECTORS.setdefault(index.selector.name, index.selector)
    KINDS[kind.name] = kind
    return kind


def remove(name: str) -> None:
    """Take out a declared kind (not a built-in one), and the selectors only it used."""
    if name in BUILT_IN_KINDS or name not in KINDS:
        raise ValueError(f"{name!r} is not a declared kind; declared: {sorted(set(KINDS) - BUILT_IN_KINDS)}")
    KINDS.pop(name)
    used = {index.selector.name for kind in KINDS.values() for index in kind.indices.values()}
    for selector in list(SELECTORS):
        if selector not in _BUILT_IN_SELECTORS and selector not in used:
            del SELECTORS[selector]


# Keywords an ablation takes besides its selectors (hooked/interventions/ablate.py): never a selector's name.
_ABLATION_KEYWORDS = frozenset({"positions", "reference", "source", "model", "seed", "per_position", "more", "value"})


def match(address: str) -> tuple[Kind, re.Match] | None:
    """The kind whose form `address` has, with the match (groups: layer, each index, part, position)."""
    for kind in KINDS.values():
        found = kind.pattern.match(address)
        if found is not None:
            return kind, found
    return None


def address_forms() -> str:
    """Every declared address form, as errors list them."""
    return ", ".join(kind.forms() for kind in KINDS.values()) + ", each optionally @{position}"


def listed(name: str) -> tuple[Kind, ...]:
    """The kinds `components(model, name)` lists: one kind, or a group's ("layers": attn and mlps); () if none."""
    if name in GROUPS:
        return tuple(KINDS[member] for member in GROUPS[name])
    kind = KINDS.get(name)
    return (kind,) if kind is not None and kind.listing is not None else ()


def listings() -> tuple[list[str], list[str]]:
    """The names `components` takes: (whole-model listings, per-layer kinds), e.g. (["heads", "attn", "mlps",
    "layers"], ["neurons", "experts"]); a per-layer one is asked for as "neurons:5"."""
    whole = [kind.name for kind in KINDS.values() if kind.listing == "model"] + list(GROUPS)
    return whole, [kind.name for kind in KINDS.values() if kind.listing == "layer"]
