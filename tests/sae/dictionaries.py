"""Random dictionaries for the splice and feature tests, and their arithmetic written out in plain torch on the
weights (the reference the splice is compared with; SAELens 6.54 `saes/standard_sae.py`, `gated_sae.py`,
`topk_sae.py`, `jumprelu_sae.py`, `transcoder.py`)."""

from __future__ import annotations

import torch
from torch import Tensor

from hooked.sae import Dictionary, DictionaryConfig


def random_dictionary(
    d_in: int,
    hook_name: str,
    *,
    d_sae: int = 32,
    architecture: str = "standard",
    hook_name_out: str | None = None,
    skip: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    **config,
) -> Dictionary:
    """A dictionary of N(0, 0.3) weights, its encoder biases slightly negative so that most features are off."""
    if architecture == "topk":
        config.setdefault("k", 4)
    cfg = DictionaryConfig(
        d_in=d_in,
        d_sae=d_sae,
        hook_name=hook_name,
        architecture=architecture,
        hook_name_out=hook_name_out,
        dtype=str(dtype).removeprefix("torch."),
        **config,
    )
    dictionary = Dictionary(cfg, skip=skip)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in dictionary.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float64).to(dtype)
            if name in ("b_enc", "b_gate", "b_mag"):
                parameter.copy_(0.1 * noise - 0.2)
            elif name == "threshold":
                parameter.copy_(0.05 * noise.abs())
            elif name == "r_mag":
                parameter.copy_(0.1 * noise)
            else:
                parameter.copy_(0.3 * noise)
    return dictionary


def explicit_acts(d: Dictionary, x: Tensor) -> Tensor:
    """The features of input x [..., d_in], from the weights (no normalisation: none of these dictionaries has it)."""
    cfg = d.cfg
    if cfg.apply_b_dec_to_input and not cfg.is_transcoder:
        x = x - d.b_dec
    if cfg.architecture == "gated":
        gate = (x @ d.W_enc + d.b_gate) > 0
        magnitude = x @ (d.W_enc * torch.exp(d.r_mag)) + d.b_mag
        return gate * torch.relu(magnitude)
    pre = x @ d.W_enc + d.b_enc
    if cfg.architecture == "standard":
        return torch.relu(pre)
    if cfg.architecture == "jumprelu":
        return torch.where(pre > d.threshold, torch.relu(pre), torch.zeros_like(pre))
    values, indices = pre.topk(cfg.k, dim=-1)
    return torch.zeros_like(pre).scatter(-1, indices, torch.relu(values))


def explicit_output(d: Dictionary, x: Tensor, acts: Tensor | None = None) -> Tensor:
    """acts W_dec + b_dec, plus x W_skip^T for a skip transcoder (features `acts`, default those of x)."""
    acts = explicit_acts(d, x) if acts is None else acts
    out = acts @ d.W_dec + d.b_dec
    return out if d.W_skip is None else out + x @ d.W_skip.T


def replacing(d: Dictionary, edit=None, error_term: bool = False) -> list[tuple[str, object]]:
    """run_with_hooks pairs that replace d's output point by its explicit output (a transcoder: computed from what
    its input point held), `edit(acts)` applied to the features first, the error x_out - output(x) added back with
    `error_term`."""
    captured = {}

    def output(x: Tensor, x_out: Tensor) -> Tensor:
        clean_acts = explicit_acts(d, x)
        acts = clean_acts if edit is None else edit(clean_acts.clone())
        out = explicit_output(d, x, acts)
        return out + (x_out - explicit_output(d, x, clean_acts)).detach() if error_term else out

    if not d.cfg.is_transcoder:
        return [(d.hook_name, lambda x, hook: output(x, x))]

    def capture(x, hook):
        captured["x"] = x

    return [(d.hook_name, capture), (d.hook_name_out, lambda x_out, hook: output(captured.pop("x"), x_out))]


def spliced_names(model) -> list[str]:
    """The hook names a splice adds (none once it is over)."""
    return [name for name in model.hook_dict if ".hook_sae_" in name]
