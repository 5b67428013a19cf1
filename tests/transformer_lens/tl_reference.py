"""A TransformerLens 3.9 `HookedTransformer` on the same weights as a `hooked` checkpoint, built offline.

The reference for the TransformerLens-parity tests: transformers loads the tiny random GPT-2 that
`hooked.testing.build_gpt2_checkpoint` saved, TransformerLens' own converter maps it, and the weights
are loaded *unfolded* (no LayerNorm folding, no centring, no value-bias folding), which is how `hooked`
loads them, so the two models compute the same function and their activations can be compared.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import torch

END_OF_TEXT = "<|endoftext|>"


def tl_tokenizer(checkpoint_dir: Path):
    """The checkpoint's tokenizer as TransformerLens expects a GPT-2 one: BOS = EOS = PAD, left padding.

    Saved to a directory of its own and loaded back, because TransformerLens reloads a tokenizer by
    its `name_or_path` (to turn `add_bos_token` on) and a tokenizer built from a file has none.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(Path(checkpoint_dir) / "tokenizer.json"),
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        unk_token=END_OF_TEXT,
        padding_side="left",
    )
    directory = Path(tempfile.mkdtemp(prefix="tl_tokenizer_"))
    tokenizer.save_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.padding_side = "left"
    return tokenizer


def tl_gpt2(checkpoint_dir: Path, with_tokenizer: bool = True, fold_ln: bool = False):
    """TransformerLens' HookedTransformer with the GPT-2 checkpoint's weights, unfolded, in float32 on CPU.

    `fold_ln=True` folds the norms' weights into the next weights, as TransformerLens' `from_pretrained`
    does by default (the residual stream is unchanged; `W_U` then carries `ln_final`'s weight).
    """
    from transformers import GPT2LMHeadModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens import HookedTransformer, HookedTransformerConfig
        from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    hf = GPT2LMHeadModel.from_pretrained(checkpoint_dir).eval()
    hf_cfg = hf.config
    cfg = HookedTransformerConfig(
        n_layers=hf_cfg.n_layer,
        d_model=hf_cfg.n_embd,
        n_heads=hf_cfg.n_head,
        d_head=hf_cfg.n_embd // hf_cfg.n_head,
        d_mlp=hf_cfg.n_inner or 4 * hf_cfg.n_embd,
        d_vocab=hf_cfg.vocab_size,
        n_ctx=hf_cfg.n_positions,
        act_fn="gelu_new",
        normalization_type="LN",
        positional_embedding_type="standard",
        eps=hf_cfg.layer_norm_epsilon,
        default_prepend_bos=True,
        device="cpu",
        dtype=torch.float32,
        original_architecture="GPT2LMHeadModel",
        tokenizer_prepends_bos=False,
    )
    tokenizer = tl_tokenizer(checkpoint_dir) if with_tokenizer else None
    model = HookedTransformer(cfg, tokenizer=tokenizer, default_padding_side="left")
    with torch.no_grad():
        model.load_and_process_state_dict(
            convert_gpt2_weights(hf, cfg),
            fold_ln=fold_ln,
            center_writing_weights=False,
            center_unembed=False,
            fold_value_biases=False,
        )
    return model.eval()


def tl_qwen3(checkpoint_dir: Path, hf_model=None):
    """TransformerLens' HookedTransformer for a saved Qwen3ForCausalLM checkpoint, unfolded, float32 on CPU.

    TransformerLens' own config mapping (`convert_hf_model_config`, which reads a local directory) and
    weight converter, so grouped-query key/value heads are stored and expanded as TransformerLens does.
    """
    import dataclasses

    from transformers import Qwen3ForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens import HookedTransformer, HookedTransformerConfig
        from transformer_lens.loading_from_pretrained import convert_hf_model_config
        from transformer_lens.pretrained.weight_conversions import convert_qwen3_weights

    hf = (
        hf_model
        if hf_model is not None
        else Qwen3ForCausalLM.from_pretrained(checkpoint_dir, dtype=torch.float32).eval()
    )
    fields = {field.name for field in dataclasses.fields(HookedTransformerConfig)}
    mapped = convert_hf_model_config(str(checkpoint_dir))
    cfg = HookedTransformerConfig(**{k: v for k, v in mapped.items() if k in fields}, device="cpu", dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # HookedTransformer's deprecation notice
        model = HookedTransformer(cfg)
    with torch.no_grad():
        model.load_and_process_state_dict(
            convert_qwen3_weights(hf, cfg),
            fold_ln=False,
            center_writing_weights=False,
            center_unembed=False,
            fold_value_biases=False,
        )
    return model.eval()


def save_grouped_qwen3(directory: Path, n_layers: int = 2):
    """A tiny grouped-query Qwen3ForCausalLM (4 query heads over 2 key/value heads, norms randomised, seed 0)
    saved to `directory`; returns the transformers model."""
    import transformers

    from hooked.testing import randomize_norms

    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        num_hidden_layers=n_layers,
    )
    hf = transformers.Qwen3ForCausalLM(config).eval()
    randomize_norms(hf)
    hf.save_pretrained(directory)
    return hf


def grouped_qwen3_pair(directory: Path):
    """`save_grouped_qwen3(directory)` loaded by `hooked` and by TransformerLens on the same weights:
    (hooked, TransformerLens)."""
    import hooked

    hf = save_grouped_qwen3(directory)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hooked.load(directory), tl_qwen3(directory, hf)
