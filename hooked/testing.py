"""Test helpers: tiny random models, and hypothesis strategies for equivalence tests of interventions.

- `build_gpt2_checkpoint`: a random transformers GPT-2 saved with `save_pretrained`, with a byte-level
  BPE tokenizer trained on a few sentences (for tests of loading, the demo and benchmarks).
- `random_model("gpt2" | "qwen3" | "qwen3_moe", seed, **sizes)`: a tiny `hooked` model built straight
  from its config dataclass, every weight drawn from a seeded generator; no files, no transformers.
- Strategies (hypothesis): `models()`, `tokens(model)`, `hook_names(model, axes)`, `addresses(model)`,
  `selectors(model, hook_name)`, `interventions(model, cache)`, for properties such as "a sweep equals
  running each variant alone":

      @given(st.data())
      def test_zeroing_every_head_equals_zeroing_z(data):
          model = data.draw(models())
          tokens = data.draw(hooked.testing.tokens(model))
          name, fn = data.draw(interventions(model, methods=["zero"]))
          ...

Needs the `dev` extra (transformers for the checkpoints, hypothesis for the strategies, each imported
where it is used); the library itself never imports this module.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from pathlib import Path

import torch

from hooked.models import MODEL_CLASSES

CORPUS = [
    "When Mary and John went to the store, John gave a drink to Mary.",
    "When Tom and Anna went to the park, Anna gave a ball to Tom.",
    "The capital of France is Paris. The capital of Italy is Rome.",
    "Then, Alice and Bob went to the school. Bob gave a book to Alice.",
    "The quick brown fox jumps over the lazy dog.",
] * 20
END_OF_TEXT = "<|endoftext|>"


def build_tokenizer(
    directory: Path, vocab_size: int = 320, corpus: Sequence[str] = CORPUS, pad_to: int | None = None
) -> tuple[int, int]:
    """Train a byte-level BPE tokenizer like GPT-2's on `corpus`: (<|endoftext|> id, vocab size).

    `pad_to` fills the vocabulary up to that size with tokens no text encodes to (`[filler1234]`, no
    merge leads there) but that decode, so a model of GPT-2's real d_vocab (50257) can take random ids.
    """
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    if pad_to is not None and pad_to > tokenizer.get_vocab_size():
        saved = json.loads((directory / "tokenizer.json").read_text())
        vocab = saved["model"]["vocab"]
        for index in range(len(vocab), pad_to):
            vocab[f"[filler{index}]"] = index
        (directory / "tokenizer.json").write_text(json.dumps(saved))
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    return tokenizer.token_to_id(END_OF_TEXT), tokenizer.get_vocab_size()


def randomize_norms(model: torch.nn.Module, seed: int = 0) -> None:
    """Give every norm weight and every bias random values (HF initialises them to 1 and 0)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "ln" in name or "norm" in name:
                mean = 1.0 if name.endswith("weight") else 0.0
                parameter.copy_(mean + 0.2 * torch.randn(parameter.shape, generator=generator))
            elif name.endswith("bias"):
                parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator))


def build_gpt2_checkpoint(
    directory: Path,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_positions: int = 64,
    corpus: Sequence[str] = CORPUS,
    vocab_size: int = 320,
    pad_vocab_to: int | None = None,
    initializer_range: float = 0.02,
    **save_kwargs,
) -> Path:
    """A random GPT2LMHeadModel with randomised norms, saved with its tokenizer into `directory`.

    The tokenizer is trained on `corpus` up to `vocab_size` tokens, then padded to `pad_vocab_to`
    (see `build_tokenizer`): `pad_vocab_to=50257` gives GPT-2's real vocabulary size. Weights are
    drawn from N(0, initializer_range) (transformers' GPT-2 initialisation).
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    directory.mkdir(parents=True, exist_ok=True)
    eos, vocab_size = build_tokenizer(directory, vocab_size, corpus, pad_vocab_to)
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_positions=n_positions,
        vocab_size=vocab_size,
        bos_token_id=eos,
        eos_token_id=eos,
        initializer_range=initializer_range,
    )
    model = GPT2LMHeadModel(config).eval()
    randomize_norms(model)
    model.save_pretrained(directory, **save_kwargs)
    return directory


# ============================================================================= random models, no files
# Property tests need many small, different models fast: built straight from hooked's config
# dataclasses, weights from a seeded generator. Nothing here imports transformers.

FAMILIES = {model_class.family: model_class for model_class in MODEL_CLASSES}  # each declares its own sizes
ARCHITECTURES = tuple(FAMILIES)
WEIGHT_STD = 0.2  # every matrix and embedding
NORM_STD = 0.1  # norm weights are 1 + this much noise, so a dropped norm weight shows
BIAS_STD = 0.05


def random_model(architecture: str, seed: int = 0, **sizes):
    """A tiny `hooked` model with random weights, built from its config dataclass (no files, no tokenizer).

    `sizes` are config fields that override small defaults (`n_layers=1, d_model=16, n_experts=6, ...`).
    Every parameter is drawn from a generator seeded `seed`: matrices N(0, 0.2), the MoE router wider
    (N(0, 0.6)) so routing is decisive, norm weights 1 + N(0, 0.1), biases N(0, 0.05). Eval mode,
    float32, on the CPU. A fresh model on each call: edit it freely.

        model = random_model("qwen3_moe", seed=3, n_layers=2, n_experts=6, top_k=2, decoder_sparse_step=2)
        logits = model(torch.randint(0, model.cfg.d_vocab, (2, 5)))
    """
    if architecture not in FAMILIES:
        raise ValueError(f"architecture must be one of {ARCHITECTURES}, not {architecture!r}")
    model_class = FAMILIES[architecture]
    fields = {**model_class.random_sizes, **sizes}
    if "mlp_only_layers" in fields:
        fields["mlp_only_layers"] = tuple(fields["mlp_only_layers"])
    model = model_class(model_class.config_class(**fields))
    wider = model_class.random_std  # parameters the family draws wider (a router), by name suffix
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():  # a fixed order: the same seed, the same model
            noise = torch.randn(parameter.shape, generator=generator)
            if name.endswith("bias"):  # GPT-2's linear and LayerNorm biases, Qwen3's attention_bias
                parameter.copy_(BIAS_STD * noise)
            elif parameter.ndim == 1:  # norm weights (LayerNorm, RMSNorm, q_norm, k_norm)
                parameter.copy_(1.0 + NORM_STD * noise)
            elif name.endswith(tuple(wider)):
                parameter.copy_(wider[next(suffix for suffix in wider if name.endswith(suffix))] * noise)
            else:
                parameter.copy_(WEIGHT_STD * noise)
    model.name_or_path = _spec_repr(architecture, seed, sizes)  # what provenance and failures name it by
    return model.eval()


def _spec_repr(architecture: str, seed: int, sizes: dict) -> str:
    arguments = "".join(f", {key}={value!r}" for key, value in sizes.items())
    return f"random_model({architecture!r}, seed={seed}{arguments})"


@functools.lru_cache(maxsize=64)
def _shared_model(architecture: str, seed: int, sizes: tuple):
    model = random_model(architecture, seed, **dict(sizes))
    # hypothesis prints a drawn value with `_repr_pretty_` when it has one: a failing example then shows
    # the call that rebuilds the model instead of its module tree.
    model._repr_pretty_ = lambda printer, cycle: printer.text(model.name_or_path)
    return model


# ============================================================================= hypothesis strategies
# hypothesis is imported inside each strategy: this module also serves code that does not have it.


def models(architectures: Sequence[str] = ARCHITECTURES):
    """Strategy: a tiny random model of one of `architectures` (see `random_model`).

    1-3 layers, d_model 16-48, 2-4 heads (grouped-query for Qwen3), Qwen3-MoE with 4-6 experts, top-k
    1-3, sometimes a dense layer (decoder_sparse_step 2 or mlp_only_layers), always at least one sparse
    one. Drawn models are cached and shared between examples: do not edit their weights or leave
    hooks on them (`copy.deepcopy` first). A failing example prints the model as the `random_model` call
    that rebuilds it.

        @given(st.data())
        def test_something(data):
            model = data.draw(models())
            tokens = data.draw(hooked.testing.tokens(model))
    """
    from hypothesis import strategies as st

    for architecture in architectures:
        if architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {ARCHITECTURES}, not {architecture!r}")

    @st.composite
    def draw_model(draw):
        architecture = draw(st.sampled_from(tuple(architectures)))
        n_layers = draw(st.integers(1, 3))
        n_heads = draw(st.integers(2, 4))
        sizes = dict(n_layers=n_layers, n_heads=n_heads, d_vocab=draw(st.sampled_from([32, 64])))
        sizes.update(FAMILIES[architecture].draw_sizes(draw, st, n_layers, n_heads))
        seed = draw(st.integers(0, 2**16))
        return _shared_model(architecture, seed, tuple(sorted(sizes.items())))

    return draw_model()


def tokens(model, max_batch: int = 4, max_pos: int = 8, *, min_batch: int = 1, min_pos: int = 1):
    """Strategy: token ids for `model`, int64 [batch pos], batch in min_batch..max_batch, pos in min_pos..max_pos.

    The tokenizer's pad id is never drawn (where the model has a tokenizer): these are unpadded prompts, and rows
    ending in pad runs of different lengths would read as right-padded ids, which the model refuses without a mask
    (docs/hooks.md, "Inputs, padding and BOS")."""
    from hypothesis import strategies as st

    limit = model.max_positions
    max_pos = max_pos if limit is None else min(max_pos, limit)
    tokenizer = getattr(model, "tokenizer", None)
    pad = None if tokenizer is None else tokenizer.pad_token_id
    ids_drawn = st.integers(0, model.cfg.d_vocab - 1 - (pad is not None))
    if pad is not None:
        ids_drawn = ids_drawn.map(lambda i: i + (i >= pad))

    @st.composite
    def draw_tokens(draw):
        batch = draw(st.integers(min_batch, max_batch))
        pos = draw(st.integers(min_pos, max_pos))
        ids = draw(st.lists(ids_drawn, min_size=batch * pos, max_size=batch * pos))
        return torch.tensor(ids, dtype=torch.long).view(batch, pos)

    return draw_tokens()


def hook_names(model, axes: str | Sequence[str] | None = None):
    """Strategy: a hook name of `model` whose axes include every one of `axes` ("head_index", or ["pos", "d_mlp"])."""
    from hypothesis import strategies as st

    wanted = set(axes.split() if isinstance(axes, str) else (axes or ()))
    names = [name for name, point in model.hook_dict.items() if wanted <= set(point.axes)]
    if not names:
        raise ValueError(f"{type(model).__name__} has no hook point with axes {sorted(wanted)}")
    return st.sampled_from(names)


def _sparse_layers(model) -> list[int]:
    return [i for i in range(model.cfg.n_layers) if model.cfg.is_sparse(i)]


def addresses(
    model,
    kinds: Sequence[str] = ("heads", "attn", "mlps", "neurons", "experts"),
    positions: bool = True,
    max_pos: int = 8,
):
    """Strategy: a component address of `model` (`ablate.parse_address` accepts it).

    Kinds: "heads" (`L1H2`, `L1H2.q`, `.k`, `.v`, or a grouped key/value head's `L1KV0.k`, `.v`), "attn"
    (`L0.attn`), "mlps" (`L1.mlp`), "neurons" (`L0.N7` on a dense layer, `L1.E3.N5` on a sparse one),
    "experts" (`L1.E3`, sparse layers only), or the name of a kind declared in hooked.interventions.kinds
    (any layer that has it, any index); kinds the model lacks are skipped. Layers are sometimes
    counted from the end (`L-1H0`); with `positions`, sometimes `@pos` with pos in -max_pos..max_pos-1.
    A position a prompt does not have raises when the hook runs, so pass the shortest prompt's length
    as `max_pos`.
    """
    from hypothesis import strategies as st

    from hooked.interventions import kinds as registry
    from hooked.interventions.addresses import head_names

    cfg = model.cfg
    sparse = _sparse_layers(model)
    mlp_layers = [i for i, block in enumerate(model.blocks) if block.mlp is not None]  # none when cfg.attn_only
    dense = [i for i in mlp_layers if i not in sparse]
    built_in = {"heads", "attn", "mlps", "neurons", "experts"}
    declared = {  # a declared kind -> the layers that have it
        kind: [layer for layer in range(cfg.n_layers) if registry.KINDS[kind].lacking(model, layer) is None]
        for kind in registry.KINDS
        if kind not in registry.BUILT_IN_KINDS  # drawn as above: heads (with kv_heads), neurons (with expert_neurons)
    }
    available = [
        kind
        for kind in kinds
        if (kind != "experts" or sparse)
        and (kind not in ("mlps", "neurons") or mlp_layers)
        and (kind in built_in or declared.get(kind))
    ]
    unknown = set(kinds) - built_in - set(declared)
    if unknown or not available:
        raise ValueError(
            f"kinds {list(kinds)}: this model offers heads, attn"
            + (", mlps, neurons" if mlp_layers else "")
            + (", experts" if sparse else "")
            + "".join(f", {kind}" for kind, layers in declared.items() if layers)
            + (f"; unknown {sorted(unknown)}" if unknown else "")
        )

    layers_of = {"experts": sparse, "mlps": mlp_layers, "neurons": mlp_layers, **declared}  # else every layer

    @st.composite
    def draw_address(draw):
        kind = draw(st.sampled_from(available))
        layer = draw(st.sampled_from(layers_of.get(kind, range(cfg.n_layers))))
        shown = layer - cfg.n_layers if draw(st.booleans()) and draw(st.booleans()) else layer  # now and then L-1
        if kind in declared:
            other = registry.KINDS[kind]
            values = {
                placeholder: draw(st.integers(0, other.count(model, placeholder) - 1)) for placeholder in other.indices
            }
            address = other.address(shown, draw(st.sampled_from(other.named_parts())), **values)
        elif kind == "heads":
            part = draw(st.sampled_from(["", ".q", ".k", ".v"]))
            axes = model.hook_dict[f"blocks.{layer}.attn.hook_{part[1:] or 'z'}"].axes
            head = draw(
                st.sampled_from(head_names(model, layer, "kv_head_index" if "kv_head_index" in axes else "head_index"))
            )
            address = f"L{shown}{head.removeprefix(f'L{layer}')}{part}"  # L1KV0.v for a grouped key/value head
        elif kind in ("attn", "mlps"):
            address = f"L{shown}.{kind.removesuffix('s')}"
        elif kind == "experts" or layer in sparse:  # a neuron of a sparse layer belongs to an expert
            address = f"L{shown}.E{draw(st.integers(0, cfg.n_experts - 1))}"
            if kind == "neurons":
                address += f".N{draw(st.integers(0, cfg.d_expert_mlp - 1))}"
        else:
            assert layer in dense
            address = f"L{shown}.N{draw(st.integers(0, cfg.d_mlp - 1))}"
        if positions and draw(st.booleans()):
            address += f"@{draw(st.integers(-max_pos, max_pos - 1))}"
        return address

    return draw_address()


# Points an ablation may not sensibly write: a norm's scale (zero divides by zero) and the routing
# decision itself (integer expert ids), and the token ids (`hook_tokens`, with cfg.use_hook_tokens).
_UNABLATABLE = ("hook_scale", "hook_expert_indices", "hook_tokens")


def ablatable_hook_names(model) -> list[str]:
    """The hook names `interventions` draws from: every point but norm scales and the integer ids (experts, tokens)."""
    return [name for name in model.hook_dict if not name.endswith(_UNABLATABLE)]


def selectors(model, hook_name: str, positions: bool = True, max_pos: int = 8):
    """Strategy: selector keywords valid at `hook_name` (`{"heads": (1,), "positions": (-1,)}`, or `{}`).

    heads on head_index / kv_head_index points, neurons on d_mlp and (with experts, as the address
    `L.E.N`) on d_expert_mlp, experts on router logits and the per-slot expert neurons, positions
    (-max_pos..max_pos-1, so `max_pos` at most the shortest prompt's length: a position a prompt does
    not have raises) on every point with a pos axis. Indices may be negative. At most
    n_experts - 1 experts are selected, so zeroing them at the router still leaves one to route to.
    """
    from hypothesis import strategies as st

    point = model.hook_dict[hook_name]
    sizes = model.axis_sizes()
    axes = point.axes

    def some(size: int, most: int = 2):
        most = max(1, min(most, size))
        return st.lists(st.integers(-size, size - 1), min_size=1, max_size=most, unique_by=lambda i: i % size).map(
            tuple
        )

    @st.composite
    def draw_selectors(draw):
        chosen = {}
        head_axis = next((a for a in ("head_index", "kv_head_index") if a in axes), None)
        if head_axis and draw(st.booleans()):
            chosen["heads"] = draw(some(sizes[head_axis]))
        per_expert = "d_expert_mlp" in axes  # the slots' experts are known here (hook.slot_experts)
        if ("n_experts" in axes or per_expert) and draw(st.booleans()):
            chosen["experts"] = tuple(
                e % sizes["n_experts"] for e in draw(some(sizes["n_experts"], sizes["n_experts"] - 1))
            )
        neuron_axis = "d_mlp" if "d_mlp" in axes else "d_expert_mlp" if per_expert and "experts" in chosen else None
        if neuron_axis and draw(st.booleans()):
            chosen["neurons"] = draw(some(sizes[neuron_axis], 3))
        if positions and any(a in axes for a in ("pos", "query_pos")) and draw(st.booleans()):
            chosen["positions"] = draw(
                st.lists(st.integers(-max_pos, max_pos - 1), min_size=1, max_size=2, unique=True).map(tuple)
            )
        return chosen

    return draw_selectors()


def empties_a_router(model, fwd_hooks) -> bool:
    """Whether zero ablations at one layer's router logits together select every expert: each is valid alone,
    but together they leave no expert to route to, which the model refuses (hooked.layers.all_experts_removed).
    A drawn list of interventions is filtered with it: `hypothesis.assume(not empties_a_router(model, hooks))`."""
    from hooked.interventions import ablate

    picked: dict[str, set[int]] = {}
    for name, fn in fwd_hooks:
        if isinstance(fn, ablate.Zero) and fn.experts is not None and "n_experts" in model.hook_dict[name].axes:
            picked.setdefault(name, set()).update(e % model.axis_sizes()["n_experts"] for e in fn.experts)
    return any(len(experts) == model.axis_sizes()["n_experts"] for experts in picked.values())


def interventions(
    model,
    cache=None,
    *,
    methods: Sequence[str] = ("zero", "mean", "resample"),
    within_batch: bool = True,
    names: Sequence[str] | None = None,
    positions: bool = True,
    max_pos: int = 8,
):
    """Strategy: a `(hook_name, callback)` pair, an `ablate` zero / mean / resample with random selectors.

    `cache` is an ActivationCache of prompts with the same shape and padding as the input the hook
    will run on (`_, cache = model.run_with_cache(other_tokens, attention_mask=mask)`, no
    names_filter, or one that keeps every point in `names`): mean averages it (pooled or per
    position), resample reads it as the paired source. Without a cache only zero and, with
    `within_batch` (the input is at least 2 unpadded prompts), `resample(seed=)` are drawn. A mean
    attention pattern needs an unpadded cache, so with a padded one those points get no mean.
    `names` restricts the hook points (default `ablatable_hook_names(model)`); the kind of point is
    drawn first, then its layer. Positions lie in -max_pos..max_pos-1: pass the shortest prompt's
    length (a position a prompt does not have raises).

        @given(st.data())
        def test_hooks_commute_with_something(data):
            model = data.draw(models())
            clean = data.draw(tokens(model, min_batch=2))
            other = data.draw(tokens(model, min_batch=len(clean), max_batch=len(clean),
                                     min_pos=clean.shape[1], max_pos=clean.shape[1]))
            _, cache = model.run_with_cache(other)
            fwd_hooks = data.draw(st.lists(interventions(model, cache, max_pos=clean.shape[1]), min_size=1, max_size=3))
            model.run_with_hooks(clean, fwd_hooks=fwd_hooks)
    """
    from hypothesis import strategies as st

    from hooked.interventions import ablate

    unknown = set(methods) - {"zero", "mean", "resample"}
    if unknown or not methods:
        raise ValueError(f"methods are 'zero', 'mean', 'resample'; got {list(methods)}")
    padded_reference = cache is not None and cache.attention_mask is not None

    def usable(name: str) -> list[str]:
        if cache is not None and name not in cache.cache_dict:
            possible = ["zero", "resample"] if within_batch else ["zero"]
        else:
            possible = (
                ["zero", "mean", "resample"]
                if cache is not None
                else ["zero", "resample"]
                if within_batch
                else ["zero"]
            )
        if padded_reference and "key_pos" in model.hook_dict[name].axes:
            possible.remove("mean")
        return [method for method in methods if method in possible]

    candidates = [name for name in (names if names is not None else ablatable_hook_names(model)) if usable(name)]
    if not candidates:
        raise ValueError(
            f"no hook point can take {list(methods)} here (cache={'given' if cache is not None else None},"
            f" within_batch={within_batch})"
        )
    # The kind of point first (hook_z, ln2.hook_normalized, ...), then its layer: every kind is drawn
    # as often, however many layers have it.
    kinds: dict[str, list[str]] = {}
    for name in candidates:
        kinds.setdefault(re.sub(r"^blocks\.\d+\.", "blocks.*.", name), []).append(name)

    @st.composite
    def draw_intervention(draw):
        name = draw(st.sampled_from(kinds[draw(st.sampled_from(sorted(kinds)))]))
        method = draw(st.sampled_from(usable(name)))
        chosen = draw(selectors(model, name, positions, max_pos))
        if method == "zero":
            return name, ablate.zero(**chosen)
        if method == "mean":
            return name, ablate.mean(cache, **chosen, per_position=draw(st.booleans()))
        from_cache = cache is not None and name in cache.cache_dict
        if not from_cache or (within_batch and draw(st.booleans())):
            return name, ablate.resample(**chosen, seed=draw(st.integers(0, 2**16)))
        return name, ablate.resample(cache, **chosen)

    return draw_intervention()
