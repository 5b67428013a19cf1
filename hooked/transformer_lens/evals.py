"""TransformerLens 3.9's `evals` module under its names: quick checks that a model works.

    from hooked import evals                     # was: from transformer_lens import evals
    evals.sanity_check(model)                    # loss on one paragraph: < 5 fine, > 7 broken
    evals.induction_loss(model)                  # loss on the repeated half of random token sequences
    evals.ioi_eval(model)["Logit Difference"]    # indirect object identification, TransformerLens' templates

Same arguments, defaults and numbers as TransformerLens (tests/transformer_lens/test_evals.py runs both on the same
weights), with two differences. `device` defaults to the model's device rather than "cuda". And the
evaluations TransformerLens builds from hub data sets (`evaluate` over wikitext / OpenWebText / the
Pile / code, `mmlu_eval`) are not fetched here: `evaluate` takes your own data loaders
(`data_loaders={"wiki": loader}`, batches of `{"tokens": [batch pos]}`) and raises without them;
`mmlu_eval` takes the examples (`data=[{"question", "choices", "answer", "subject"}, ...]`, the list
TransformerLens' `make_mmlu_data_loader` returns) and raises without them. Source:
transformer_lens/evals.py (3.9).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hooked.models.base import lm_cross_entropy_loss

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer

# The first paragraph of "Zoom In: An Introduction to Circuits" (Olah et al. 2020), as TransformerLens uses it.
SANITY_TEXT = (
    "Many important transition points in the history of science have been moments when science 'zoomed in.' At"
    " these points, we develop a visualization or tool that allows us to see the world in a new level of detail,"
    " and a new field of science develops to study the world through this lens."
)
DATASET_NAMES = ["wiki", "owt", "pile", "code"]
MMLU_ANSWER_LETTERS = ["A", "B", "C", "D"]
IOI_NAMES = ["John", "Mary"]
IOI_TEMPLATES = [
    "[A] and [B] went to the [LOCATION] to buy [OBJECT]. [B] handed the [OBJECT] to [A]",
    "Then, [B] and [A] went to the [LOCATION]. [B] gave the [OBJECT] to [A]",
]
IOI_NOUNS = {"LOCATION": ["store", "market"], "OBJECT": ["milk", "eggs", "bread"]}


def sanity_check(model: HookedTransformer) -> Tensor:
    """The model's mean next-token loss on `SANITY_TEXT`: below 5 the model is probably fine, above 7 broken."""
    return model(SANITY_TEXT, return_type="loss")


@torch.inference_mode()
def induction_loss(
    model: HookedTransformer,
    tokenizer=None,
    batch_size: int = 4,
    subseq_len: int = 384,
    prepend_bos: bool | None = None,
    device=None,
) -> Tensor:
    """Mean loss on the second half of `batch_size` random sequences of `subseq_len` tokens repeated twice
    (low when the model has induction heads). Tokens are drawn from torch's global generator in
    [100, 20000) as TransformerLens does (capped at the vocabulary size); with `prepend_bos` (default
    `model.cfg.default_prepend_bos`) the first token becomes BOS."""
    device = model.cfg.device if device is None else device
    low, high = (100, 20000) if model.cfg.d_vocab > 100 else (0, model.cfg.d_vocab)
    first_half = torch.randint(low, min(high, model.cfg.d_vocab), (batch_size, subseq_len)).to(device)
    repeated = first_half.repeat(1, 2)  # [batch 2*subseq_len]
    if model.cfg.default_prepend_bos if prepend_bos is None else prepend_bos:
        bos = (tokenizer if tokenizer is not None else model.tokenizer).bos_token_id
        if bos is None:
            raise ValueError("induction_loss with prepend_bos: the tokenizer has no BOS token; pass prepend_bos=False")
        repeated[:, 0] = bos
    logits = model(repeated, return_type="logits")
    per_token = lm_cross_entropy_loss(logits, repeated, per_token=True)  # [batch 2*subseq_len-1]
    return per_token[:, subseq_len + 1 :].mean()


@torch.inference_mode()
def evaluate_on_dataset(model: HookedTransformer, data_loader: Iterable, truncate: int = 100, device=None) -> float:
    """Mean loss over the batches of `data_loader` (`{"tokens": [batch pos]}` each), stopping after
    `truncate` + 1 batches as TransformerLens does."""
    device = model.cfg.device if device is None else device
    running_loss, total = 0.0, 0
    for batch in data_loader:
        running_loss += model(batch["tokens"].to(device), return_type="loss").mean().item()
        total += 1
        if total > truncate:
            break
    if total == 0:
        raise ValueError("evaluate_on_dataset: the data loader yielded no batch")
    return running_loss / total


@torch.inference_mode()
def evaluate(
    model: HookedTransformer,
    truncate: int = 100,
    batch_size: int = 8,
    tokenizer=None,
    data_loaders: Mapping[str, Iterable] | None = None,
) -> dict[str, float]:
    """`{"<name>_loss": mean loss}` for each data loader. TransformerLens downloads wikitext, OpenWebText,
    the Pile and a code set here; hooked does not: pass `data_loaders={"wiki": loader, ...}`."""
    if not data_loaders:
        raise ValueError(
            "hooked.transformer_lens.evals.evaluate does not download TransformerLens' evaluation sets (wikitext, "
            "OpenWebText,"
            " the Pile, code); pass data_loaders={'wiki': loader, ...}, each yielding {'tokens': [batch pos]}"
        )
    losses = {}
    for name, data_loader in data_loaders.items():
        losses[f"{name}_loss"] = evaluate_on_dataset(model, data_loader, truncate=truncate)
        print(f"{name}: {losses[f'{name}_loss']}")
    return losses


class IOIDataset(torch.utils.data.Dataset):
    """Indirect object identification prompts (Wang et al. 2022), TransformerLens' templates and sampling:
    the same `seed` gives TransformerLens' samples. Each item is `{"prompt", "IO", "S"}` token tensors;
    the prompt ends with the indirect object."""

    def __init__(
        self,
        tokenizer,
        templates: list[str] | None = None,
        names: list[str] | None = None,
        nouns: dict[str, list[str]] | None = None,
        num_samples: int = 1000,
        symmetric: bool = False,
        prepend_bos: bool = True,
        seed: int | None = None,
    ):
        self.tokenizer, self.prepend_bos = tokenizer, prepend_bos
        if seed is not None:
            random.seed(seed)  # TransformerLens seeds the global generator; so do we, for the same samples
        self.templates = templates if templates is not None else self.get_default_templates()
        self.names = names if names is not None else self.get_default_names()
        self.nouns = nouns if nouns is not None else self.get_default_nouns()
        self.samples: list[dict[str, str]] = []
        for _ in range(num_samples // 2 if symmetric else num_samples):
            self.samples.extend(self.get_sample(symmetric=symmetric))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, idx: int) -> dict[str, Tensor]:
        sample = self.samples[idx]
        prompt = list(self.tokenizer.encode(sample["text"]))
        if self.prepend_bos:
            prompt = [self.tokenizer.bos_token_id] + prompt
        return {
            "prompt": torch.LongTensor(prompt),
            "IO": torch.LongTensor(list(self.tokenizer.encode(sample["IO"]))),
            "S": torch.LongTensor(list(self.tokenizer.encode(sample["S"]))),
        }

    def get_sample(self, symmetric: bool = False) -> list[dict[str, str]]:
        template = random.choice(self.templates)
        for noun_type, noun_list in self.nouns.items():
            template = template.replace(f"[{noun_type}]", random.choice(noun_list))
        a, b = random.sample(self.names, 2)
        samples = [{"text": template.replace("[A]", a).replace("[B]", b), "IO": " " + a, "S": " " + b}]
        if symmetric:
            samples.append({"text": template.replace("[A]", b).replace("[B]", a), "IO": " " + b, "S": " " + a})
        return samples

    @staticmethod
    def get_default_names() -> list[str]:
        return list(IOI_NAMES)

    @staticmethod
    def get_default_templates() -> list[str]:
        return list(IOI_TEMPLATES)

    @staticmethod
    def get_default_nouns() -> dict[str, list[str]]:
        return {k: list(v) for k, v in IOI_NOUNS.items()}


@torch.inference_mode()
def ioi_eval(
    model: HookedTransformer,
    dataset=None,
    batch_size: int = 8,
    num_samples: int = 1000,
    tokenizer=None,
    symmetric: bool = False,
) -> dict[str, float]:
    """`{"Logit Difference", "Accuracy"}`: the mean logit of the indirect object minus the subject's at the
    token before the answer (at the first token where the two names differ), and how often it is > 0.

    Prompts are run in batches of equal length, so no padding enters (TransformerLens pads on the right,
    which a causal model's earlier positions never see: the same numbers)."""
    tokenizer = model.tokenizer if tokenizer is None else tokenizer
    dataset = IOIDataset(tokenizer, num_samples=num_samples, symmetric=symmetric) if dataset is None else dataset
    samples = [dataset[i] for i in range(len(dataset))]
    by_length: dict[int, list[dict[str, Tensor]]] = {}
    for sample in samples:
        by_length.setdefault(sample["prompt"].shape[0], []).append(sample)
    total_correct, total_logit_diff = 0, 0.0
    for length, group in by_length.items():
        for start in range(0, len(group), batch_size):
            batch = group[start : start + batch_size]
            logits = model(torch.stack([s["prompt"] for s in batch]).to(model.cfg.device), return_type="logits")
            for row, sample in enumerate(batch):
                io, s = sample["IO"], sample["S"]
                n = min(io.shape[0], s.shape[0])
                first_difference = int(torch.where(io[:n] != s[:n])[0][0])  # names that share a first token
                position = length - io.shape[0] + first_difference - 1
                logit_diff = logits[row, position, io[first_difference]] - logits[row, position, s[first_difference]]
                total_correct += int(logit_diff.item() > 0)
                total_logit_diff += logit_diff.item()
    return {"Logit Difference": total_logit_diff / len(dataset), "Accuracy": total_correct / len(dataset)}


@torch.inference_mode()
def mmlu_eval(
    model: HookedTransformer,
    tokenizer=None,
    subjects: str | list[str] | None = None,
    split: str = "test",
    num_samples: int | None = None,
    *,
    data: list[dict] | None = None,
) -> dict:
    """Zero-shot MMLU as TransformerLens scores it: each question with its four choices, then "Answer:", and
    the answer letter (" A" .. " D") with the highest log-probability. TransformerLens downloads cais/mmlu;
    here pass `data` (dicts with "question", "choices", "answer" (0-3), "subject"); `subjects` and
    `num_samples` then select from it (`split` is the caller's, when they built `data`)."""
    if data is None:
        raise ValueError(
            "hooked.transformer_lens.evals.mmlu_eval does not download cais/mmlu; pass data=[{'question', 'choices',"
            " 'answer', 'subject'}, ...] (what TransformerLens' make_mmlu_data_loader returns)"
        )
    tokenizer = model.tokenizer if tokenizer is None else tokenizer
    wanted = None if subjects is None else {subjects} if isinstance(subjects, str) else set(subjects)
    examples, taken = [], {}
    for example in data:
        subject = example["subject"]
        if (wanted is None or subject in wanted) and (num_samples is None or taken.get(subject, 0) < num_samples):
            taken[subject] = taken.get(subject, 0) + 1
            examples.append(example)
    if not examples:
        raise ValueError("mmlu_eval: no example left; check subjects= against the data's subjects")
    letter_ids = []
    for letter in MMLU_ANSWER_LETTERS:  # " A" when it is one token (as it follows "Answer:"), else "A"
        ids = tokenizer.encode(" " + letter, add_special_tokens=False)
        letter_ids.append(ids[0] if len(ids) == 1 else tokenizer.encode(letter, add_special_tokens=False)[0])
    correct: dict[str, int] = {}
    total: dict[str, int] = {}
    for example in examples:
        choices = "".join(f"{chr(65 + i)}. {choice}\n" for i, choice in enumerate(example["choices"]))
        prompt = f"Question: {example['question']}\nChoices:\n{choices}Answer:"
        tokens = torch.tensor([list(tokenizer.encode(prompt))], device=model.cfg.device)
        log_probs = torch.log_softmax(model(tokens, return_type="logits")[0, -1], dim=-1)
        scores = [log_probs[letter_ids[i]].item() for i in range(len(example["choices"]))]
        subject = example["subject"]
        correct[subject] = correct.get(subject, 0) + int(scores.index(max(scores)) == example["answer"])
        total[subject] = total.get(subject, 0) + 1
    num_correct, num_total = sum(correct.values()), sum(total.values())
    return {
        "accuracy": num_correct / num_total,
        "num_correct": num_correct,
        "num_total": num_total,
        "subject_scores": {subject: correct[subject] / total[subject] for subject in total},
    }
