"""TransformerLens-compatible helpers, so `from transformer_lens import utils` ports as `from hooked import utils`.

Each follows TransformerLens 3.9 (`transformer_lens/utilities/`: `lm_utils.py`, `tokenize_utils.py`,
`exploratory_utils.py`, `tensors.py`); tests/transformer_lens/test_transformer_lens.py compares their outputs.
"""

from __future__ import annotations

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from hooked.cache import Slice
from hooked.cache import act_name as get_act_name
from hooked.models.base import lm_cross_entropy_loss

__all__ = [
    "Slice",
    "get_act_name",
    "get_attention_mask",
    "get_corner",
    "get_device",
    "lm_accuracy",
    "lm_cross_entropy_loss",
    "test_prompt",
    "to_numpy",
]


def get_device() -> str:
    """The device to load a model on: `"cuda"` when a GPU is visible, else `"cpu"`, as TransformerLens' `get_device`
    (which picks `"mps"` only when TRANSFORMERLENS_ALLOW_MPS=1 is set; hooked is not tested on MPS and does not)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def get_corner(tensor: Tensor, n: int = 3) -> Tensor:
    """The first `n` entries along every axis (a view), to print a large tensor's top-left corner, as
    TransformerLens' `utils.get_corner`."""
    return tensor[tuple(slice(n) for _ in range(tensor.ndim))]


def to_numpy(tensor) -> np.ndarray:
    """A numpy array of a tensor (detached, on the CPU; bfloat16 read as float32), list, tuple or scalar."""
    if isinstance(tensor, np.ndarray):
        return tensor
    if isinstance(tensor, (list, tuple)):
        return np.array(tensor)
    if isinstance(tensor, Tensor):
        tensor = tensor.detach().cpu()
        return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()
    if isinstance(tensor, (int, float, bool, str)):
        return np.array(tensor)
    raise ValueError(f"to_numpy takes a tensor, array, list, tuple or scalar, not {type(tensor).__name__}")


def get_attention_mask(
    tokenizer, tokens: Int[Tensor, "batch pos"], prepend_bos: bool, padding_side: str | None = None
) -> Int[Tensor, "batch pos"]:
    """1 for real tokens, 0 for the leading pad ids of each left-padded row, or the trailing ones of each
    right-padded row (`padding_side`, default the tokenizer's; `HookedTokenizer.mask_for`).

    As TransformerLens: where BOS is the pad id and BOS is prepended, the leading run's last id is the BOS.
    Unlike TransformerLens' function, a batch that was not padded (one row, or rows whose pad runs are all
    as long) is all ones: GPT-2's `to_tokens("<|endoftext|>Hello")` begins with that id twice, and both
    are real; and a right-padded row that is nothing but a BOS keeps it. `tokenizer` is `model.tokenizer`.
    """
    mask = tokenizer.mask_for(tokens, prepend_bos, strict=False, padding_side=padding_side)
    return torch.ones_like(tokens) if mask is None else mask.to(tokens.dtype)


def lm_accuracy(
    logits: Float[Tensor, "batch pos d_vocab"], tokens: Int[Tensor, "batch pos"], per_token: bool = False
) -> Tensor:
    """Top-1 next-token accuracy: a fraction, or the [batch pos-1] booleans with `per_token`."""
    correct = logits.argmax(dim=-1)[:, :-1] == tokens[:, 1:]
    return correct if per_token else correct.sum() / correct.numel()


def test_prompt(
    prompt: str,
    answer: str | list[str],
    model,
    prepend_space_to_answer: bool = True,
    print_details: bool = True,
    prepend_bos: bool | None = None,
    top_k: int = 10,
) -> None:
    """Print how the model ranks `answer` after `prompt`, and its top-k next tokens (TransformerLens' report).

    Several answers: each one's first token is ranked at the next position. Prints; returns None.
    """
    answers = [answer] if isinstance(answer, str) else list(answer)
    several = len(answers) > 1
    if prepend_space_to_answer:
        answers = [a if a.startswith(" ") else " " + a for a in answers]
    prompt_tokens = model.to_tokens(prompt, prepend_bos=prepend_bos)  # [1 pos]
    # One row per answer, each tokenized alone: left padding would put pad ids before a short answer.
    answer_rows = [model.to_tokens(a, prepend_bos=False)[0] for a in answers]
    for answer, row in zip(answers, answer_rows, strict=True):
        model.tokenizer.check_known(answer, row.tolist())  # an unknown answer would rank the unknown token
    if several:
        answer_rows = [row[:1] for row in answer_rows]
    answer_tokens = torch.stack(answer_rows)  # [n_answers answer_pos]
    tokens = torch.cat([prompt_tokens.repeat(len(answers), 1), answer_tokens], dim=1)
    prompt_str_tokens = model.to_str_tokens(prompt, prepend_bos=prepend_bos)
    answer_str_tokens = [model.to_str_tokens(a, prepend_bos=False) for a in answers]
    prompt_length, answer_length = prompt_tokens.shape[1], answer_tokens.shape[1]
    if print_details:
        print("Tokenized prompt:", prompt_str_tokens)
        print(
            "Tokenized answers:" if several else "Tokenized answer:",
            answer_str_tokens if several else answer_str_tokens[0],
        )
    with torch.no_grad():  # every row is one prompt and one answer, unpadded: nothing to read from the ids
        logits = model(tokens, attention_mask=torch.ones_like(tokens))
    probs = logits.softmax(dim=-1)
    ranks = []
    for index in range(prompt_length, prompt_length + answer_length):
        targets = tokens[:, index]
        strings = [a[index - prompt_length] for a in answer_str_tokens]
        token_probs = probs[:, index - 1]  # the position before predicts this one
        sorted_probs, sorted_tokens = token_probs.sort(descending=True)
        answer_ranks = sorted_tokens.argsort(-1)[range(len(answers)), targets.cpu()].tolist()
        ranks.append(list(zip(strings, answer_ranks, strict=True)))
        if print_details:
            print(f"Performance on answer token{'s' if several else ''}:")
            for i in range(len(answers)):
                print(
                    f"Rank: {answer_ranks[i]: <8} Logit: {logits[i, index - 1, targets[i]].item():5.2f}"
                    f" Prob: {token_probs[i, targets[i]].item():6.2%} Token: |{strings[i]}|"
                )
            for i in range(top_k):
                print(
                    f"Top {i}th token. Logit: {logits[0, index - 1, sorted_tokens[0, i]].item():5.2f}"
                    f" Prob: {sorted_probs[0, i].item():6.2%} Token: |{model.to_string(sorted_tokens[0, i])}|"
                )
    print("Ranks of the answer tokens:", ranks if several else [r[0] for r in ranks])


test_prompt.__test__ = False  # its name starts with test_: keep pytest from collecting it
