"""Tiny random checkpoints for tests, the demo and benchmarks: a transformers model saved with
`save_pretrained` and a byte-level BPE tokenizer trained on a few sentences.

Needs the `dev` extra (transformers); the library itself never imports this module.
"""

from __future__ import annotations

from pathlib import Path

import torch

CORPUS = [
    "When Mary and John went to the store, John gave a drink to Mary.",
    "When Tom and Anna went to the park, Anna gave a ball to Tom.",
    "The capital of France is Paris. The capital of Italy is Rome.",
    "Then, Alice and Bob went to the school. Bob gave a book to Alice.",
    "The quick brown fox jumps over the lazy dog.",
] * 20
END_OF_TEXT = "<|endoftext|>"


def build_tokenizer(directory: Path, vocab_size: int = 320) -> tuple[int, int]:
    """Train a byte-level BPE tokenizer like GPT-2's on a tiny corpus: (<|endoftext|> id, vocab size)."""
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
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
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
    directory: Path, n_layer: int = 2, n_embd: int = 64, n_head: int = 4, n_positions: int = 64, **save_kwargs
) -> Path:
    """A random GPT2LMHeadModel with randomised norms, saved with its tokenizer into `directory`."""
    from transformers import GPT2Config, GPT2LMHeadModel

    directory.mkdir(parents=True, exist_ok=True)
    eos, vocab_size = build_tokenizer(directory)
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=n_positions,
        vocab_size=vocab_size, bos_token_id=eos, eos_token_id=eos,
    )
    model = GPT2LMHeadModel(config).eval()
    randomize_norms(model)
    model.save_pretrained(directory, **save_kwargs)
    return directory
