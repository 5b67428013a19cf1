"""How a model comes to be, beyond `hooked.load`: from a checkpoint processed as TransformerLens does
(`from_pretrained`, `from_pretrained_no_processing`), from a config (`HookedTransformer(cfg)`), and its weights
processed in place afterwards (`process_weights_`). A mixin of `HookedTransformer` (hooked/models/base.py), with the
metaclass that routes `HookedTransformer(cfg)`.

`HookedTransformer(cfg)` asks the config to build its model: a family's own config (`ModelConfig`) builds through
`from_config`, and TransformerLens' `HookedTransformerConfig(...)` (hooked/transformer_lens/config.py) knows how to
build itself (`build_model`), so the model layer never imports the compatibility layer.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from hooked.layers import Conv1D
from hooked.models.config import ModelConfig
from hooked.processing import flags_of, process_weights
from hooked.tokenizer import HookedTokenizer

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

# TransformerLens 3.9's HookedTransformer.generate defaults, taken by a model built the TransformerLens way.
TRANSFORMER_LENS_GENERATE = {"do_sample": True, "verbose": True}


class BuildsFromConfig(abc.ABCMeta):
    """`HookedTransformer(cfg)` as in TransformerLens: the base class (no `config_class` of its own) asks `cfg` to
    build the model it describes; every family class constructs as usual. An `ABCMeta`, so a shared part's
    abstract step (`RotaryDecoder.make_block`) must be defined before a family can be built."""

    def __call__(cls, *args, **kwargs):
        if getattr(cls, "config_class", None) is not None:
            return super().__call__(*args, **kwargs)
        if not args and "cfg" not in kwargs:
            raise TypeError("HookedTransformer(cfg) needs a config: hooked.HookedTransformerConfig(...) or a family's")
        cfg, rest = (args[0], args[1:]) if args else (kwargs.pop("cfg"), ())
        if isinstance(cfg, ModelConfig):
            return cls.from_config(cfg, *rest, **kwargs)
        build = getattr(cfg, "build_model", None)  # TransformerLens' HookedTransformerConfig(...) builds itself
        if build is None:
            raise TypeError(
                f"HookedTransformer(cfg) takes hooked.HookedTransformerConfig(...) or a family's config, got"
                f" {type(cfg).__name__}"
            )
        return build(*rest, **kwargs)


class BuildingMethods:
    @classmethod
    def from_config(
        cls,
        cfg: ModelConfig,
        tokenizer=None,
        move_to_device: bool = True,
        default_padding_side: str = "right",
        *,
        initializer_range: float | None = None,
        init_weights: bool = True,
        tie_word_embeddings: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> HookedTransformer:
        """The family model `cfg` describes, with randomly initialised weights, as `HookedTransformer(cfg)` builds
        it in TransformerLens: its "gpt2" initialisation (`init_weights`: N(0, `initializer_range`), default
        0.8 / sqrt(d_model)), an unembedding of its own unless `tie_word_embeddings`, sampling `generate`."""
        from hooked.models import MODEL_CLASSES  # the registry imports every family, each of which imports this

        if tokenizer is not None:
            raise ValueError(
                "HookedTransformer(cfg, tokenizer=...) is not supported: hooked reads tokenizers from checkpoints"
            )
        family = dataclasses.replace(cfg)  # a config is bound to its one model: never share it
        family.set_use_hook_tokens(cfg.use_hook_tokens)  # not a dataclass field: replace() drops it
        model = next(model_class for model_class in MODEL_CLASSES if type(family) is model_class.config_class)(family)
        if not tie_word_embeddings and model.lm_head is None:
            model.untie_unembedding()  # TransformerLens' default: an unembedding of its own (a family may tie)
        if init_weights:
            initialize(model, 0.8 / math.sqrt(cfg.d_model) if initializer_range is None else initializer_range)
        model.generate_defaults = dict(TRANSFORMER_LENS_GENERATE)
        device = device if device is not None else "cpu"
        return model.to(device=device if move_to_device else "cpu", dtype=dtype).eval()

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        refactor_factored_attn_matrices: bool = False,
        checkpoint_index: int | None = None,
        checkpoint_value: int | None = None,
        hf_model=None,
        device: torch.device | str | None = None,
        n_devices: int = 1,
        tokenizer=None,
        move_to_device: bool = True,
        fold_value_biases: bool = True,
        default_prepend_bos: bool | None = None,
        default_padding_side: str = "left",
        dtype: torch.dtype | str = torch.float32,
        first_n_layers: int | None = None,
        use_hook_tokens: bool = False,
        **from_pretrained_kwargs,
    ) -> HookedTransformer:
        """Load from a local directory, a hub id or a TransformerLens model name, processed as TransformerLens does.

        Takes TransformerLens 3.9's keyword arguments with its defaults: the norms are folded into the
        next weights, the writing weights and the unembedding centred, the value biases folded
        (`hooked.processing`; `from_pretrained_no_processing` or `hooked.load` keep the checkpoint's
        own
        weights). `use_hook_tokens=True` (a config field TransformerLens takes here too) adds `hook_tokens`. Every
        other argument is either honoured or refused; none is ignored. On the base class
        the architecture is read from config.json, as `hooked.load`.

            model = hooked.HookedTransformer.from_pretrained("gpt2-small")   # hub id "gpt2"
        """
        from hooked.weights import load_model

        refused = {
            "checkpoint_index": checkpoint_index,
            "checkpoint_value": checkpoint_value,
            "hf_model": hf_model,
            "tokenizer": tokenizer,
            "first_n_layers": first_n_layers,
        }
        refused = [name for name, value in refused.items() if value is not None]
        if n_devices != 1:
            refused.append("n_devices")
        if not move_to_device:
            refused.append("move_to_device=False")
        refused += list(from_pretrained_kwargs)
        if refused:
            raise ValueError(
                f"hooked.HookedTransformer.from_pretrained does not support {', '.join(refused)}; it reads the"
                " checkpoint's own safetensors and tokenizer files onto one device (see docs/hooks.md)"
                + (
                    "; to split a model over several devices, run under torchrun and load it with hooked.load(path,"
                    " tp=N) (docs/scaling.md)"
                    if n_devices != 1
                    else ""
                )
            )
        HookedTokenizer._check_padding_side(default_padding_side)
        model_class = cls if getattr(cls, "config_class", None) is not None else None  # None: read config.json
        processing = flags_of(locals())
        model = load_model(
            name_or_path,
            dtype=dtype,
            device=device or "cpu",
            model_class=model_class,
            processing=processing,
            use_hook_tokens=use_hook_tokens,
        )
        if default_prepend_bos is not None:
            model.cfg.default_prepend_bos = default_prepend_bos
        if model.tokenizer is not None:
            model.tokenizer.padding_side = default_padding_side
        model.generate_defaults = dict(TRANSFORMER_LENS_GENERATE)
        return model

    @classmethod
    def from_pretrained_no_processing(cls, name_or_path: str | Path, **kwargs) -> HookedTransformer:
        """TransformerLens' unprocessed load: `from_pretrained` with every processing flag False (the
        checkpoint's own weights, as `hooked.load` gives them)."""
        for name in (
            "fold_ln",
            "center_writing_weights",
            "center_unembed",
            "fold_value_biases",
            "refactor_factored_attn_matrices",
        ):
            kwargs.setdefault(name, False)
        return cls.from_pretrained(name_or_path, **kwargs)

    def process_weights_(
        self,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        refactor_factored_attn_matrices: bool = False,
        fold_value_biases: bool = True,
    ) -> None:
        """Process this model's weights in place, as TransformerLens' `process_weights_` (its defaults; value
        biases are folded there too). See `hooked.processing.process_weights`; refused on a processed
        model."""
        process_weights(
            self,
            fold_ln=fold_ln,
            center_writing_weights=center_writing_weights,
            center_unembed=center_unembed,
            fold_value_biases=fold_value_biases,
            refactor_factored_attn_matrices=refactor_factored_attn_matrices,
        )


@torch.no_grad()
def initialize(model: nn.Module, initializer_range: float) -> None:
    """TransformerLens' "gpt2" initialisation: weights and embeddings N(0, initializer_range), biases 0,
    norm weights (anything 1-D not named bias) 1."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, Conv1D, nn.Embedding)):
            module.weight.normal_(0.0, initializer_range)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
        elif not any(True for _ in module.children()):
            for name, parameter in module.named_parameters(recurse=False):
                if parameter.ndim > 1:
                    parameter.normal_(0.0, initializer_range)
                else:
                    parameter.zero_() if name == "bias" else parameter.fill_(1.0)
