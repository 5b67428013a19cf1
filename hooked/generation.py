"""Generation with a KV cache, where hooks fire on the prompt and on every decode step.

    model.generate("When Mary and John went to the store, John gave a drink to", max_new_tokens=5)
    with model.hooks(fwd_hooks=ablate.hooks(model, "L9H9")):
        tokens = model.generate(tokens, max_new_tokens=20)   # the head stays ablated on every step

The prompt runs once (all columns), then each decode step runs one column against a preallocated
`KVCache`. Hooks see the columns of the call that is running: the prompt's [batch P ...] on the
first call, [batch 1 ...] on each decode step (`hook_pattern` / `hook_attn_scores`: [batch head 1 L],
the new query against every key so far). `hook.position_ids` gives each column's position in its own
prompt on every call, so `ablate.zero(positions=[3])` touches position 3 once, wherever it falls, and
is a no-op on decode steps that do not contain it. Negative positions count back from the end of the
*prompt*: `positions=[-1]` is the prompt's last token on every step, not each newly generated one.

Since keys and values are kept after their hooks ran, a position-wise intervention generates exactly
what a loop of full forwards with the same hook generates (tests/interventions/test_generation.py checks it with
hypothesis); an intervention that reads other positions (a mean over the sequence) can differ, since
a cached column is never recomputed.

Sampling (`do_sample=True`) applies temperature, then top-k, then top-p (the order of transformers'
logits processors) and draws with exponential races: the token is argmax(p / E), E ~ Exp(1) drawn per
(prompt, token). `seed=` makes the draws reproducible, and the draws depend only on the prompt's row,
so variants generated as one batch (`generate_variants`) get the same draws as each alone.

Right padding: text is always tokenized with left padding for generation (as TransformerLens 3.9
forces), and right-padded ids (read on a tokenizer whose `padding_side` is "right", or an
`attention_mask` with trailing padding) are moved to the left internally, so each prompt continues from
its own last token exactly as it would alone; the returned ids are right-padded again, each row's
prompt and continuation first, then its padding. `return_cache=True` takes left-padded ids or text.

Differences from TransformerLens' `generate`: `do_sample` defaults to False (greedy) and `verbose` to
False; finished rows are filled with the end-of-sequence token, as there; `return_type="str"` decodes
each row's real tokens up to (not including) its end-of-sequence token, without a prepended BOS.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from hooked.cache import ActivationCache
from hooked.hooks import HookFn, HookPoint, NameFilter
from hooked.interventions.row_blocks import OnRows, registered_hooks
from hooked.kv_cache import KVCache
from hooked.layers import position_ids_for
from hooked.names import pos_axis

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

GenerateReturn = Literal["input", "tokens", "str"]


@dataclass(frozen=True)
class Sampler:
    """How the next token is picked from the last column's logits."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    freq_penalty: float = 0.0

    def __post_init__(self):
        for name in ("temperature", "freq_penalty"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not value >= 0
                or value == float("inf")
            ):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.top_k is not None and (
            isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1
        ):
            raise ValueError(f"top_k must be an int >= 1 (or None), got {self.top_k!r}")
        if self.top_p is not None and (
            isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1
        ):
            raise ValueError(f"top_p must be in (0, 1] (or None), got {self.top_p!r}")

    def pick(self, logits: Tensor, counts: Tensor | None, noise: Tensor | None) -> Tensor:
        """Next token ids [rows] from logits [rows d_vocab] (float32)."""
        if counts is not None:
            logits = logits - self.freq_penalty * counts
        if not self.do_sample or self.temperature == 0:
            return logits.argmax(-1)
        logits = logits / self.temperature
        if self.top_k is not None and self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1:
            sorted_logits, order = torch.sort(logits, descending=False)
            cumulative = sorted_logits.softmax(-1).cumsum(-1)
            drop = cumulative <= 1 - self.top_p
            drop[:, -1] = False  # keep at least the most likely token
            logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        return (logits.softmax(-1) / noise).argmax(-1)


def _eos_ids(model: HookedTransformer, eos_token_id, stop_at_eos: bool) -> list[int]:
    if eos_token_id is None:
        if not stop_at_eos:
            return []
        tokenizer = model.tokenizer
        eos = None if tokenizer is None else tokenizer.eos_token_id
        return [] if eos is None else [int(eos)]
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < model.cfg.d_vocab for i in ids):
        raise ValueError(
            f"eos_token_id must be a token id (or a list of them) in 0..{model.cfg.d_vocab - 1}, got {eos_token_id!r}"
        )
    return ids


def generate(
    model: HookedTransformer,
    input="",
    max_new_tokens: int = 10,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    freq_penalty: float = 0.0,
    stop_at_eos: bool = True,
    eos_token_id: int | Sequence[int] | None = None,
    return_type: GenerateReturn = "input",
    verbose: bool = False,
    attention_mask: Tensor | None = None,
    prepend_bos: bool | None = None,
    padding_side: str | None = None,
    use_past_kv_cache: bool = True,
    fwd_hooks: Sequence[tuple[NameFilter, HookFn]] = (),
    return_cache: bool = False,
    names_filter: NameFilter | None = None,
    _copies: int | None = None,  # generate_variants: the number of variant blocks (the raw rows come back)
):
    """See `HookedTransformer.generate`."""
    from hooked.tokenizer import HookedTokenizer

    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if return_type not in ("input", "tokens", "str"):
        raise ValueError(f"return_type must be 'input', 'tokens' or 'str', not {return_type!r}")
    if not do_sample:
        asked = {
            "temperature": temperature != 1.0,
            "top_k": top_k is not None,
            "top_p": top_p is not None,
            "seed": seed is not None,
        }
        asked = [name for name, given in asked.items() if given]
        if asked:
            raise ValueError(
                f"{', '.join(asked)} only apply when sampling, and do_sample is False (hooked's default is greedy,"
                " TransformerLens' is to sample); pass do_sample=True"
            )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be an int, got {seed!r}")
    sampler = Sampler(do_sample, temperature, top_k, top_p, freq_penalty)
    if padding_side is not None:
        HookedTokenizer._check_padding_side(padding_side)
    eos_ids = _eos_ids(model, eos_token_id, stop_at_eos) if stop_at_eos else []
    text_input = _is_text(input)
    if text_input and input == "" and model.default_prepend_bos is False and not prepend_bos:
        raise ValueError("an empty prompt with no BOS token has nothing to continue from; give a prompt")
    tokens, key_valid, right_padded = _prompts_on_the_left(model, input, attention_mask, prepend_bos, padding_side)
    if right_padded and return_cache:
        raise ValueError(
            "return_cache=True needs left-padded ids (the cache's columns are the generated sequence's): pass the"
            " texts, or model.to_tokens(texts, padding_side='left')"
        )
    lengths = tokens.shape[1] - (0 if key_valid is None else (~key_valid).sum(-1))  # real tokens per row
    lengths = torch.as_tensor(lengths, device=tokens.device).expand(tokens.shape[0])
    if model.max_positions is not None and int(lengths.max()) + max_new_tokens > model.max_positions:
        raise ValueError(
            f"the longest prompt has {int(lengths.max())} tokens and max_new_tokens is {max_new_tokens}, but this model"
            f" has {model.max_positions} positions; ask for at most {model.max_positions - int(lengths.max())} new "
            "tokens"
        )
    recorder = _Recorder(model, names_filter) if return_cache else None
    hooks = list(fwd_hooks) + ([] if recorder is None else [(recorder.names, recorder)])
    # Inference mode skips autograd's bookkeeping on every op (about 2% of a CPU decode step). A cache
    # is recorded under no_grad instead: its tensors may then be used in a backward pass later.
    with torch.no_grad() if return_cache else torch.inference_mode(), model.hooks(fwd_hooks=hooks):
        run = _Run(model, tokens, key_valid, lengths, use_past_kv_cache, max_new_tokens + int(return_cache))
        out = run.loop(max_new_tokens, sampler, eos_ids, seed, _copies or 1, verbose, recorder is not None)
    out = out.clone()  # a normal tensor (not an inference one): the tokens may go into a forward with gradients
    if _copies is not None:  # generate_variants, even of one variant: each block keeps its own length
        return out, run.key_valid_full(out.shape[1]), lengths, eos_ids
    if right_padded and return_type != "str":  # ids in, ids out: padded on the right again
        return move_padding(out, run.key_valid_full(out.shape[1]), "right")[0]
    output = _format(model, out, tokens, key_valid, eos_ids, input, text_input, prepend_bos, return_type)
    if recorder is None:
        return output
    return output, recorder.cache(out, run.key_valid_full(out.shape[1]))


class _Run:
    """One generation: the sequence so far, the KV cache, and the calls that extend them."""

    def __init__(self, model, tokens: Tensor, key_valid: Tensor | None, lengths: Tensor, use_cache: bool, room: int):
        self.model, self.prompt, self.prompt_valid = model, tokens, key_valid
        self.lengths = lengths[:, None]
        self.cache = None
        if use_cache:
            self.cache = KVCache(model, tokens.shape[0], max_len=tokens.shape[1] + max(room, 1))
            self.cache.prompt_lengths = self.lengths

    def key_valid_full(self, length: int) -> Tensor | None:
        if self.prompt_valid is None:
            return None
        new = torch.ones(
            self.prompt.shape[0], length - self.prompt.shape[1], dtype=torch.bool, device=self.prompt.device
        )
        return torch.cat([self.prompt_valid, new], dim=1)

    def step(self, sequence: Tensor, new: int) -> Tensor:
        """Run the last `new` columns of `sequence`; the last column's logits [batch d_vocab]."""
        if self.cache is not None:
            valid = self.prompt_valid if len(self.cache) == 0 else None
            logits = self.model._forward_cached(sequence[:, -new:], valid, self.cache, last_only=True)
            return logits[:, -1]
        key_valid = self.key_valid_full(sequence.shape[1])
        return self.model._forward_whole(sequence, key_valid, self.lengths, last_only=True)[:, -1]

    def loop(
        self,
        max_new_tokens: int,
        sampler: Sampler,
        eos_ids: list[int],
        seed: int | None,
        copies: int,
        verbose: bool,
        final_step: bool,
    ) -> Tensor:
        prompt = self.prompt
        batch, prompt_len = prompt.shape
        out = torch.empty(batch, prompt_len + max_new_tokens, dtype=torch.long, device=prompt.device)
        out[:, :prompt_len] = prompt
        generator = None
        if sampler.do_sample and seed is not None:
            generator = torch.Generator(device=prompt.device).manual_seed(seed)
        eos = torch.tensor(eos_ids, device=prompt.device) if eos_ids else None
        finished = torch.zeros(batch, dtype=torch.bool, device=prompt.device)
        counts = self._counts(sampler)
        bar = _progress(max_new_tokens, verbose)
        n_new = 0
        try:
            logits = self._call(out[:, :prompt_len], prompt_len, "the prompt")
            for step in range(max_new_tokens):
                noise = None
                if sampler.do_sample and sampler.temperature > 0:
                    noise = torch.empty(batch // copies, logits.shape[-1], device=logits.device)
                    noise = noise.exponential_(generator=generator).repeat(copies, 1)
                token = sampler.pick(logits.float(), counts, noise)
                if eos is not None:
                    token = torch.where(finished, eos[0], token)
                    finished |= torch.isin(token, eos)
                out[:, prompt_len + step] = token
                n_new = step + 1
                if counts is not None:
                    counts[torch.arange(batch), token] += 1
                if bar is not None:
                    bar.update(1)
                done = eos is not None and bool(finished.all())
                if done or step == max_new_tokens - 1:
                    break
                logits = self._call(out[:, : prompt_len + n_new], 1, f"decode step {step + 1}")
            if final_step and n_new:  # the last token's activations, for the cache (its logits are not used)
                self._call(out[:, : prompt_len + n_new], 1, "the last token")
        finally:
            if bar is not None:
                bar.close()
        return out[:, : prompt_len + n_new]

    def _call(self, sequence: Tensor, new: int, what: str) -> Tensor:
        try:
            return self.step(sequence, new)
        except Exception as error:
            start = sequence.shape[1] - new
            error.add_note(f"while generating: {what} (columns {start}..{sequence.shape[1] - 1})")
            raise

    def _counts(self, sampler: Sampler) -> Tensor | None:
        """Token counts per row over real tokens, for freq_penalty."""
        if not sampler.freq_penalty:
            return None
        prompt = self.prompt
        counts = torch.zeros(prompt.shape[0], self.model.cfg.d_vocab, device=prompt.device)
        weights = (
            torch.ones_like(prompt, dtype=counts.dtype)
            if self.prompt_valid is None
            else self.prompt_valid.to(counts.dtype)
        )
        return counts.scatter_add_(1, prompt, weights)


def _progress(total: int, verbose: bool):
    if not verbose:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="generating", unit="tok")


def _format(
    model,
    out: Tensor,
    tokens: Tensor,
    key_valid: Tensor | None,
    eos_ids: list[int],
    input,
    text_input: bool,
    prepend_bos: bool | None,
    return_type: GenerateReturn,
):
    if return_type == "tokens" or (return_type == "input" and not text_input):
        return out
    prepend = model.default_prepend_bos if prepend_bos is None else prepend_bos
    texts = []
    for row in range(out.shape[0]):
        first = 0 if key_valid is None else int((~key_valid[row]).sum())  # skip the left padding
        if text_input and prepend:
            first += 1  # the BOS hooked put there
        ids = out[row, first:].tolist()
        generated_from = tokens.shape[1] - first
        for i in range(generated_from, len(ids)):
            if ids[i] in eos_ids:
                ids = ids[:i]
                break
        texts.append(model._require_tokenizer().decode(ids))
    return texts[0] if isinstance(input, str) or (isinstance(input, Tensor) and input.ndim == 1) else texts


class _Recorder:
    """A hook that keeps every call's activation, to assemble a cache of the whole sequence."""

    def __init__(self, model, names_filter: NameFilter | None):
        self.model = model
        self.names = model.default_cache_names() if names_filter is None else model.resolve_hook_names(names_filter)
        self.calls: dict[str, list[Tensor]] = {name: [] for name in self.names}

    def __call__(self, activation: Tensor, hook: HookPoint) -> None:
        self.calls[hook.name].append(activation.detach().clone())

    def cache(self, sequence: Tensor, key_valid: Tensor | None) -> ActivationCache:
        """Each point's calls joined along its position axis; key axes padded to the full length as a
        full forward holds them (scores: the dtype's minimum, as masked; pattern: 0)."""
        length = sequence.shape[1]
        store = {}
        for name, parts in self.calls.items():
            if not parts:
                continue
            point = self.model.hook_dict[name]
            if "key_pos" in point.axes:
                fill = torch.finfo(parts[0].dtype).min if name.endswith("hook_attn_scores") else 0.0
                parts = [torch.nn.functional.pad(p, (0, length - p.shape[-1]), value=fill) for p in parts]
            store[name] = torch.cat(parts, dim=pos_axis(point))
        return ActivationCache(
            store, self.model, position_ids=position_ids_for(sequence, key_valid), attention_mask=key_valid
        )


def generate_variants(
    model: HookedTransformer,
    input,
    variants: Mapping[str, Sequence[tuple[NameFilter, HookFn]]],
    max_new_tokens: int = 10,
    **kwargs,
) -> dict:
    """Generate from the same prompts under every variant's hooks, as one batch: {name: output}.

    Each variant gets its own block of rows and its callbacks see only that block (as in `hooked.sweep`),
    on the prompt and on every decode step. Each variant's output equals `model.generate` with its hooks
    alone: with `stop_at_eos`, a block is cut where all its own rows have finished, and sampling draws
    the same numbers for every block.
    """
    if getattr(model, "engine_name", None) is not None:  # a model served by an inference engine: its own requests
        return model.generate_variants(input, variants, max_new_tokens, **kwargs)
    if not isinstance(variants, Mapping) or not variants:
        raise ValueError("variants must be a non-empty dict: {name: [(hook_name, callback), ...]}")
    for refused in ("return_cache", "fwd_hooks", "use_past_kv_cache"):
        if refused in kwargs:
            raise ValueError(
                f"generate_variants does not take {refused}=; generate the variant alone with model.generate"
            )
    registered_hooks(model, "generate_variants")
    return_type = kwargs.pop("return_type", "input")
    text_input = _is_text(input)
    tokens, key_valid, right_padded = _prompts_on_the_left(
        model, input, kwargs.get("attention_mask"), kwargs.get("prepend_bos"), kwargs.pop("padding_side", None)
    )
    batch, copies = tokens.shape[0], len(variants)
    fwd_hooks = []
    for block, (name, pairs) in enumerate(variants.items()):
        rows = slice(block * batch, (block + 1) * batch)
        if isinstance(pairs, tuple) and len(pairs) == 2 and callable(pairs[1]):
            pairs = [pairs]
        fwd_hooks += [(hook_name, OnRows(fn, rows, str(name))) for hook_name, fn in pairs]
    repeated = tokens.repeat(copies, 1)
    mask = None if key_valid is None else key_valid.repeat(copies, 1)
    kwargs.pop("attention_mask", None)
    out, _, _, eos_ids = generate(
        model,
        repeated,
        max_new_tokens,
        attention_mask=mask,
        fwd_hooks=fwd_hooks,
        _copies=copies,
        **{**kwargs, "prepend_bos": False},
    )
    results = {}
    for block, name in enumerate(variants):
        part = out[block * batch : (block + 1) * batch]
        if eos_ids:
            is_eos = torch.isin(part[:, tokens.shape[1] :], torch.tensor(eos_ids, device=part.device))
            finished_at = torch.where(is_eos.any(1), is_eos.float().argmax(1), is_eos.shape[1] - 1)
            part = part[:, : tokens.shape[1] + int(finished_at.max()) + 1]
        if right_padded and return_type != "str":
            valid = torch.cat([key_valid, key_valid.new_ones(batch, part.shape[1] - tokens.shape[1])], dim=1)
            results[name] = move_padding(part, valid, "right")[0]
        else:
            results[name] = _format(
                model, part, tokens, key_valid, eos_ids, input, text_input, kwargs.get("prepend_bos"), return_type
            )
    return results


def _is_text(input) -> bool:
    return isinstance(input, str) or (
        isinstance(input, list) and bool(input) and all(isinstance(s, str) for s in input)
    )


def _prompts_on_the_left(model, input, attention_mask, prepend_bos, padding_side) -> tuple[Tensor, Tensor | None, bool]:
    """The prompts' ids and mask, padded on the left, and whether they came right-padded (to give them back so).

    Text is padded on the left, as TransformerLens does for generation; ids are read on their side and, if
    right-padded, rolled to the left, so each prompt continues from its own last token as it would alone."""
    tokens, key_valid = model.tokens_and_mask(
        input, attention_mask, prepend_bos, "left" if _is_text(input) else padding_side
    )
    right_padded = padded_side(key_valid) == "right"
    if right_padded:
        tokens, key_valid = move_padding(tokens, key_valid, "left")
    return tokens, key_valid, right_padded


def padded_side(key_valid: Tensor | None) -> str | None:
    """ "left" or "right" when every row's padding is one run on that side (left first), else None."""
    if key_valid is None:
        return None
    real = key_valid.sum(-1, keepdim=True)  # [batch 1]
    columns = torch.arange(key_valid.shape[1], device=key_valid.device)
    if torch.equal(key_valid, columns >= key_valid.shape[1] - real):
        return "left"
    return "right" if torch.equal(key_valid, columns < real) else None


def move_padding(tokens: Tensor, key_valid: Tensor, side: str) -> tuple[Tensor, Tensor]:
    """A batch padded on one side, its rows rolled so that the padding is on `side`; the tokens keep their order."""
    length = tokens.shape[1]
    padding = length - key_valid.sum(-1, keepdim=True)  # [batch 1]
    columns = torch.arange(length, device=tokens.device)
    source = (columns - padding) % length if side == "left" else (columns + padding) % length  # [batch pos]
    moved = tokens.gather(1, source)
    return moved, (columns >= padding) if side == "left" else (columns < length - padding)
