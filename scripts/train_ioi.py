#!/usr/bin/env python
"""Train the two small IOI models bundled with hooked: `hooked/ioi-gpt2` and `hooked/ioi-qwen3moe`.

    .venv/bin/python scripts/train_ioi.py --model gpt2        # writes hooked/bundled/ioi-gpt2/
    .venv/bin/python scripts/train_ioi.py --model qwen3moe    # writes hooked/bundled/ioi-qwen3moe/

Both are trained from scratch with plain PyTorch on hooked's own model classes (`GPT2`, `Qwen3Moe`),
on sentences made from the indirect-object-identification templates, names, places and objects of
`hooked.tasks` (Wang et al. 2022). Everything is seeded: the data stream (`random.Random(seed)`),
the initial weights (a `torch.Generator`), and torch runs with deterministic algorithms on
`--threads` threads, so a rerun on the same machine reproduces the same files.

Data split (see docs/ioi-models.md):
- HELDOUT_NAMES (every fifth name of `tasks.NAMES`) are never the IO or S of a training IOI sentence.
  They do appear in training, in single-name filler sentences (FILLER_TEMPLATES, any name), so that
  their embeddings are trained; a filler sentence never holds two names, so it never poses IOI.
- HELDOUT_TEMPLATES (BABA ids 5, 8, 12, 13 of `tasks.BABA_TEMPLATES`, and their ABBA twins) and
  `tasks.STORE_TEMPLATE` never occur in training.
Held-out figures are measured on `tasks.ioi(..., names=HELDOUT_NAMES)` rows whose template is held
out: neither the names nor the template were seen in an IOI training sentence.

Training sentences (`training_batch`): 80% IOI sentences of the training templates and names (30%
of them without the words before the first name), 20% filler; half of them after one or two
name-free PREFIX_TEMPLATES sentences; each followed by <|endoftext|>. `NameRows` explains how the
names' embedding rows are trained so that held-out names behave like trained ones.

Loss: next-token cross-entropy on every position of the full sentence (the answer included), with
the answer position of IOI sentences weighted `--answer-weight` times more. The full LM loss trains
every embedding (held-out names only ever appear as inputs and targets of filler sentences) and gives
a model that continues its own sentences sensibly (`model.generate`); the extra weight on the answer
makes the one position that needs the IOI circuit count for more than one of ~25 targets. The MoE
twin adds a load-balancing loss on its router logits.

The saved directory is a Hugging Face-style checkpoint (config.json, model.safetensors in the
transformers key layout, tokenizer.json); the final figures are measured on the model `hooked.load`
reads back from it, not on the in-memory one.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import hooked
from hooked import metrics, tasks
from hooked.models import GPT2, GPT2Config, Qwen3Moe, Qwen3MoeConfig
from hooked.tokenizer import HookedTokenizer

BUNDLED = Path(hooked.__file__).resolve().parent / "bundled"

# ----------------------------------------------------------------------------- the data split
HELDOUT_NAMES: tuple[str, ...] = tasks.HELDOUT_NAMES  # NAMES[4::5]: 21 of the 109 names
TRAIN_NAMES: tuple[str, ...] = tuple(name for name in tasks.NAMES if name not in HELDOUT_NAMES)
HELDOUT_TEMPLATES: tuple[int, ...] = tasks.HELDOUT_TEMPLATES  # (5, 8, 12, 13): ids into tasks.BABA_TEMPLATES (and ABBA)
TRAIN_TEMPLATES: tuple[int, ...] = tuple(i for i in range(len(tasks.BABA_TEMPLATES)) if i not in HELDOUT_TEMPLATES)

# One name, named twice: copying a name from the context, never choosing between two. Any name.
# "The" is here because held-out template 13 is the only IOI template that starts with it.
FILLER_TEMPLATES: tuple[str, ...] = (
    "Then, [C] went to the [PLACE]. [C] had a [OBJECT].",
    "The [PLACE] had a [OBJECT]. [C] got it, and afterwards [C] went to the [PLACE].",
    "When [C] was at the [PLACE], [C] found a [OBJECT].",
)

# No name: put before a training sentence (--prefix-fraction), so that no circuit can key on absolute positions.
PREFIX_TEMPLATES: tuple[str, ...] = (
    "The [PLACE] had a [OBJECT].",
    "After the lunch, the [OBJECT] was at the [PLACE].",
    "Then, it was a long day at the [PLACE].",
)

END_OF_TEXT = "<|endoftext|>"  # BOS, EOS and padding
UNKNOWN = "<|unk|>"  # any word outside the vocabulary

EVAL_SEED = 12345  # the held-out prompts (tasks.ioi seeds); training draws from random.Random(--seed)


# ----------------------------------------------------------------------------- tokenizer
def _pre_tokenizer():
    from tokenizers import pre_tokenizers

    # Whitespace, then every punctuation mark alone: " Mary" -> ["Mary"], "store." -> ["store", "."]
    return pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])


def vocabulary() -> list[str]:
    """Every word of the templates (IOI, store, filler), names, places and objects; specials first."""
    pre = _pre_tokenizer()
    words = set(tasks.NAMES) | set(tasks.PLACES) | set(tasks.OBJECTS)
    for template in (
        *tasks.BABA_TEMPLATES,
        *tasks.ABBA_TEMPLATES,
        tasks.STORE_TEMPLATE,
        *FILLER_TEMPLATES,
        *PREFIX_TEMPLATES,
    ):
        for slot in ("[A]", "[B]", "[C]", "[PLACE]", "[OBJECT]"):
            template = template.replace(slot, " ")
        words |= {word for word, _ in pre.pre_tokenize_str(template)}
    return [END_OF_TEXT, UNKNOWN, *sorted(words)]


def build_tokenizer():
    """A word-level `tokenizers.Tokenizer`: one token per word or punctuation mark, names included.

    Decoding joins the words with spaces and drops the space before punctuation (the WordPiece
    decoder's clean-up; no token starts with its "##" prefix), so text round-trips.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models

    vocab = {word: index for index, word in enumerate(vocabulary())}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNKNOWN))
    tokenizer.pre_tokenizer = _pre_tokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tokenizer.add_special_tokens([AddedToken(END_OF_TEXT, special=True), AddedToken(UNKNOWN, special=True)])
    return tokenizer


# ----------------------------------------------------------------------------- data
def ioi_sentence(rng: random.Random, names, template_ids, drop_opening: float = 0.0) -> str:
    """A whole IOI sentence, answer included: a random template (ABBA or BABA), two names, a place, an object.

    With probability `drop_opening` the words before the first name go ("Then, [B] and [A] went ..."
    -> "[B] and [A] went ..."): after a name-free sentence that ends with a place, the first name then
    follows the place, so "the name after the place is the giver" stops being a valid shortcut.
    """
    template_id = rng.choice(template_ids)
    template = (tasks.ABBA_TEMPLATES if rng.random() < 0.5 else tasks.BABA_TEMPLATES)[template_id]
    if rng.random() < drop_opening:
        template = template[min(template.index("[A]"), template.index("[B]")) :]
    io, s = rng.sample(list(names), 2)
    text = template.replace("[PLACE]", rng.choice(tasks.PLACES)).replace("[OBJECT]", rng.choice(tasks.OBJECTS))
    return text.replace("[A]", io).replace("[B]", s)


def _fill_nouns(rng: random.Random, template: str) -> str:
    while "[PLACE]" in template:
        template = template.replace("[PLACE]", rng.choice(tasks.PLACES), 1)
    while "[OBJECT]" in template:
        template = template.replace("[OBJECT]", rng.choice(tasks.OBJECTS), 1)
    return template


def filler_sentence(rng: random.Random) -> str:
    return _fill_nouns(rng, rng.choice(FILLER_TEMPLATES).replace("[C]", rng.choice(tasks.NAMES)))


def training_batch(
    rng: random.Random, batch_size: int, filler_fraction: float, prefix_fraction: float, drop_opening: float
) -> tuple[list[str], list[bool]]:
    """Sentences, and which are IOI (they end with the IO). A sentence may follow 1-2 name-free ones."""
    texts, is_ioi = [], []
    for _ in range(batch_size):
        ioi = rng.random() >= filler_fraction
        text = ioi_sentence(rng, TRAIN_NAMES, TRAIN_TEMPLATES, drop_opening) if ioi else filler_sentence(rng)
        if rng.random() < prefix_fraction:
            prefix = [_fill_nouns(rng, rng.choice(PREFIX_TEMPLATES)) for _ in range(rng.randint(1, 2))]
            text = " ".join([*prefix, text])
        texts.append(text)
        is_ioi.append(ioi)
    return texts, is_ioi


def eval_sets(n: int) -> dict[str, tasks.Task]:
    """The evaluation prompt sets, from `hooked.tasks.ioi` (the prompts end before the answer).

    "heldout": held-out names in held-out templates (the headline figure); "store": held-out names in
    tasks.STORE_TEMPLATE (never trained); "heldout_names", "heldout_templates": one of the two held
    out; "train": the training distribution (fresh draws).
    """

    def rows(task: tasks.Task, keep) -> tasks.Task:
        picked = [i for i, template_id in enumerate(task.per_prompt["template_id"]) if keep(template_id)][:n]
        pick = lambda values: [values[i] for i in picked]  # noqa: E731
        params = dict(task.params, per_prompt={key: pick(value) for key, value in task.per_prompt.items()})
        return tasks.Task(
            task.name, pick(task.clean), pick(task.corrupt), pick(task.correct), pick(task.incorrect), task.seed, params
        )

    held = lambda t: t in HELDOUT_TEMPLATES  # noqa: E731
    trained = lambda t: t not in HELDOUT_TEMPLATES  # noqa: E731
    big = 8 * n  # enough rows that the filter keeps n
    return {
        "heldout": rows(tasks.ioi(big, seed=EVAL_SEED, names=HELDOUT_NAMES), held),
        "store": tasks.ioi(n, seed=EVAL_SEED, template="store", names=HELDOUT_NAMES),
        "heldout_names": rows(tasks.ioi(big, seed=EVAL_SEED + 1, names=HELDOUT_NAMES), trained),
        "heldout_templates": rows(tasks.ioi(big, seed=EVAL_SEED + 2, names=TRAIN_NAMES), held),
        "train": rows(tasks.ioi(big, seed=EVAL_SEED + 3, names=TRAIN_NAMES), trained),
    }


@torch.no_grad()
def evaluate(model, task: tasks.Task) -> dict[str, float]:
    """Mean logit difference (IO minus S, last position) and the fraction of prompts where IO wins."""
    metric = metrics.logit_diff(model, task.correct, task.incorrect)
    diff = metric(model(model.to_tokens(task.clean)))
    return {"logit_diff": float(diff.mean()), "accuracy": float((diff > 0).float().mean()), "n": len(task)}


# ----------------------------------------------------------------------------- models
ARCHITECTURES = ("gpt2", "qwen3moe")


def make_config(architecture: str, d_vocab: int):
    if architecture == "gpt2":
        return GPT2Config(n_layers=4, d_model=128, n_heads=4, d_mlp=512, d_vocab=d_vocab, n_ctx=64)
    return Qwen3MoeConfig(
        n_layers=4,
        d_model=128,
        n_heads=4,
        n_kv_heads=2,
        d_head=32,
        d_mlp=512,
        d_vocab=d_vocab,
        tie_word_embeddings=True,
        max_position_embeddings=64,
        n_experts=8,
        top_k=2,
        d_expert_mlp=128,
        norm_topk_prob=True,
    )


def init_weights(model, seed: int, name_ids: torch.Tensor, name_std: float, name_dims: int):
    """GPT-2's initialisation: matrices N(0, 0.02), the projections into the residual stream scaled by
    1/sqrt(2 n_layers), biases 0, norm weights 1. Then the name rows of the embedding: Gaussian in a
    random `name_dims`-dimensional subspace, name_std per model dimension on average. Drawn in
    named_parameters order from one generator. Returns a function drawing new name rows like those."""
    generator = torch.Generator().manual_seed(seed)
    residual_writers = ("attn.c_proj.weight", "mlp.c_proj.weight", "attn.o_proj.weight", "experts.down_proj")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.zero_()
            elif parameter.ndim == 1:
                parameter.fill_(1.0)
            else:
                std = 0.02 / math.sqrt(2 * model.cfg.n_layers) if name.endswith(residual_writers) else 0.02
                parameter.copy_(std * torch.randn(parameter.shape, generator=generator))
        embedding = model.W_E
        d_model = embedding.shape[1]
        basis = torch.linalg.qr(
            torch.randn((d_model, name_dims), generator=generator)
        ).Q.T  # [name_dims d_model], orthonormal rows
        scale = name_std * math.sqrt(d_model / name_dims)
        embedding[name_ids] = scale * torch.randn((len(name_ids), name_dims), generator=generator) @ basis
    return lambda n, generator: scale * torch.randn((n, name_dims), generator=generator) @ basis


def hf_config(model, tokenizer, extra: dict) -> dict:
    """config.json as transformers writes it for the architecture (what hooked.weights reads)."""
    cfg, eot = model.cfg, tokenizer.token_to_id(END_OF_TEXT)
    special = {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot}
    if isinstance(model, GPT2):
        config = {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "n_layer": cfg.n_layers,
            "n_embd": cfg.d_model,
            "n_head": cfg.n_heads,
            "n_inner": cfg.d_mlp,
            "n_positions": cfg.n_ctx,
            "n_ctx": cfg.n_ctx,
            "vocab_size": cfg.d_vocab,
            "activation_function": cfg.activation,
            "layer_norm_epsilon": cfg.layer_norm_eps,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False,
            "tie_word_embeddings": True,
            "initializer_range": 0.02,
            "use_cache": True,
            **special,
        }
    else:
        config = {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "num_hidden_layers": cfg.n_layers,
            "hidden_size": cfg.d_model,
            "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.n_kv_heads,
            "head_dim": cfg.d_head,
            "intermediate_size": cfg.d_mlp,
            "vocab_size": cfg.d_vocab,
            "rms_norm_eps": cfg.rms_norm_eps,
            "rope_theta": cfg.rope_theta,
            "max_position_embeddings": cfg.max_position_embeddings,
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "attention_bias": cfg.attention_bias,
            "hidden_act": "silu",
            "attention_dropout": 0.0,
            "num_experts": cfg.n_experts,
            "num_experts_per_tok": cfg.top_k,
            "moe_intermediate_size": cfg.d_expert_mlp,
            "decoder_sparse_step": cfg.decoder_sparse_step,
            "mlp_only_layers": list(cfg.mlp_only_layers),
            "norm_topk_prob": cfg.norm_topk_prob,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
            "use_sliding_window": False,
            "initializer_range": 0.02,
            "use_cache": True,
            **special,
        }
    return {**config, "torch_dtype": "float32", "hooked_ioi": extra}


def checkpoint_tensors(model) -> dict[str, torch.Tensor]:
    """The model's weights under transformers' checkpoint keys (the inverse of `checkpoint_renames`)."""
    out = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().contiguous().clone()
        if isinstance(model, GPT2):
            key = (
                name.replace("blocks.", "transformer.h.")
                .replace(".ln1.", ".ln_1.")
                .replace(".ln2.", ".ln_2.")
                .replace("ln_final.", "transformer.ln_f.")
            )
            out["transformer." + key if key.startswith(("wte.", "wpe.")) else key] = tensor
            continue
        parts = name.split(".")
        if name == "embed_tokens.weight":
            out["model.embed_tokens.weight"] = tensor
        elif name == "ln_final.weight":
            out["model.norm.weight"] = tensor
        elif name.endswith("experts.gate_up_proj"):  # [n_experts, 2 d_expert_mlp, d_model]: gate rows, then up
            for expert, (gate, up) in enumerate(zip(*tensor.chunk(2, dim=1), strict=True)):
                out[f"model.layers.{parts[1]}.mlp.experts.{expert}.gate_proj.weight"] = gate.contiguous()
                out[f"model.layers.{parts[1]}.mlp.experts.{expert}.up_proj.weight"] = up.contiguous()
        elif name.endswith("experts.down_proj"):
            for expert, down in enumerate(tensor):
                out[f"model.layers.{parts[1]}.mlp.experts.{expert}.down_proj.weight"] = down.contiguous()
        else:
            key = "model.layers." + name.removeprefix("blocks.")
            key = key.replace(".ln1.", ".input_layernorm.").replace(".ln2.", ".post_attention_layernorm.")
            out[key.replace(".attn.", ".self_attn.")] = tensor
    return out


def save(model, tokenizer, directory: Path, extra: dict) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file(checkpoint_tensors(model), str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "model.safetensors").chmod(0o644)  # save_file creates it 0600
    (directory / "config.json").write_text(json.dumps(hf_config(model, tokenizer, extra), indent=2) + "\n")
    tokenizer.save(str(directory / "tokenizer.json"))


# ----------------------------------------------------------------------------- training
def load_balancing_loss(router_logits: list[torch.Tensor], top_k: int) -> torch.Tensor:
    """Switch-Transformer auxiliary loss per sparse layer, n_experts * sum_e f_e * P_e (1 when balanced)."""
    total = router_logits[0].new_zeros(())
    for logits in router_logits:
        logits = logits.reshape(-1, logits.shape[-1]).float()
        probs = logits.softmax(-1)
        chosen = F.one_hot(probs.topk(top_k, dim=-1).indices, logits.shape[-1]).sum(1).float()  # [tokens, n_experts]
        total = total + logits.shape[-1] * (chosen.mean(0) / top_k * probs.mean(0)).sum()
    return total / len(router_logits)


class NameRows:
    """How the names' embedding rows are trained, so that held-out names work as well as trained ones.

    Every name row starts as a random vector in one shared random subspace (`init_weights`). Two
    rules then make the rows exchangeable, so that no circuit can be specific to the training names:
    - `share_gradient`: after each backward, every name row gets the mean of the names' gradients
      (the embedding has no weight decay), so all names move together and differ only by their
      initial random rows. Without it, the IO/S names would be shaped by IOI and the held-out ones not.
    - `rows_for_step`: on a share of the later steps, the training names' rows are replaced for that
      step by their shared part plus newly drawn random differences, so that the copying and the
      duplicate detection must work for any name vector, not just the 88 seen ones.
    """

    def __init__(self, model, tokenizer, draw, seed: int):
        self.embedding_name = next(name for name, p in model.named_parameters() if p is model.W_E)
        self.name_ids = torch.tensor([tokenizer.token_to_id(name) for name in tasks.NAMES])
        self.train_ids = torch.tensor([tokenizer.token_to_id(name) for name in TRAIN_NAMES])
        self.train_rows_at_init = model.W_E[self.train_ids].detach().clone()
        self.draw = draw
        self.generator = torch.Generator().manual_seed(seed + 1)

    def rows_for_step(self, model) -> dict[str, torch.Tensor]:
        embedding = model.W_E
        new = embedding[self.train_ids] - self.train_rows_at_init + self.draw(len(self.train_ids), self.generator)
        return {self.embedding_name: embedding.index_put((self.train_ids,), new)}

    def share_gradient(self, model) -> None:
        grad = model.W_E.grad
        grad[self.name_ids] = grad[self.name_ids].mean(0, keepdim=True)


def train(args) -> dict:
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(args.threads)
    tokenizer = build_tokenizer()
    d_vocab = tokenizer.get_vocab_size()
    model_class = GPT2 if args.model == "gpt2" else Qwen3Moe
    model = model_class(make_config(args.model, d_vocab))
    name_ids = torch.tensor([tokenizer.token_to_id(name) for name in tasks.NAMES])
    draw = init_weights(model, args.seed, name_ids, args.name_init_std, args.name_dims)
    names = NameRows(model, tokenizer, draw, args.seed)
    eot = tokenizer.token_to_id(END_OF_TEXT)
    model.tokenizer = HookedTokenizer(tokenizer, eot, eot, eot, "scripts/train_ioi.py")
    prepend_bos = model.default_prepend_bos  # GPT-2: True; Qwen3: False (as the loaded model's to_tokens)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.model}: {n_params:,} parameters, vocabulary {d_vocab}, BOS prepended: {prepend_bos}", flush=True)

    router_logits: list[torch.Tensor] = []  # each sparse layer's, for the load-balancing loss
    if isinstance(model, Qwen3Moe):
        for block in model.blocks:
            if hasattr(block.mlp, "gate"):
                block.mlp.gate.register_forward_hook(lambda module, inputs, output: router_logits.append(output))

    # No weight decay on the embedding, the norms and the biases (as GPT-2 / minGPT).
    decay = [p for p in model.parameters() if p.ndim >= 2 and p is not model.W_E]
    no_decay = [p for p in model.parameters() if p.ndim < 2 or p is model.W_E]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.98),
    )
    warmup = min(100, args.steps // 10)

    def lr_at(step: int) -> float:  # linear warm-up, then cosine down to a tenth
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    curve_sets = {name: task for name, task in eval_sets(args.eval_n).items() if name in ("heldout", "train")}
    rng = random.Random(args.seed)
    start = time.perf_counter()
    running = None
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            figures = {name: evaluate(model, task) for name, task in curve_sets.items()}
            model.train()
            print(
                f"step {step:5d}  loss {running if running is not None else float('nan'):.4f}  "
                f"heldout logit_diff {figures['heldout']['logit_diff']:6.2f} acc {figures['heldout']['accuracy']:.3f}  "
                f"train logit_diff {figures['train']['logit_diff']:6.2f} acc {figures['train']['accuracy']:.3f}  "
                f"lr {lr_at(min(step, args.steps - 1)):.2e}  {time.perf_counter() - start:6.1f}s",
                flush=True,
            )
        if step == args.steps:
            break
        texts, is_ioi = training_batch(
            rng, args.batch_size, args.filler_fraction, args.prefix_fraction, args.drop_opening
        )
        tokens, mask = model.tokenizer.encode_batch(texts, prepend_bos)
        # Every sentence ends with <|endoftext|>, so that generation stops after the answer.
        tokens = torch.cat([tokens, torch.full((len(texts), 1), eot)], dim=1)
        mask = torch.cat([mask, torch.ones((len(texts), 1), dtype=torch.bool)], dim=1)
        router_logits.clear()
        if step >= args.fresh_names_from * args.steps and rng.random() < args.fresh_names:
            logits = torch.func.functional_call(model, names.rows_for_step(model), (tokens,), {"attention_mask": mask})
        else:
            logits = model(tokens, attention_mask=mask)
        log_probs = logits[:, :-1].float().log_softmax(-1)
        per_token = -log_probs.gather(-1, tokens[:, 1:, None])[..., 0]  # [batch, pos - 1]: predicting token t + 1
        weights = (mask[:, 1:] & mask[:, :-1]).float()
        weights[torch.tensor(is_ioi), -2] *= args.answer_weight  # the IO (left padding: last before <|endoftext|>)
        loss = (per_token * weights).sum() / weights.sum()
        total = loss
        if router_logits:
            total = total + args.aux_weight * load_balancing_loss(router_logits, model.cfg.top_k)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        names.share_gradient(model)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
    train_seconds = time.perf_counter() - start
    model.eval()
    return {"model": model, "tokenizer": tokenizer, "train_seconds": train_seconds, "n_params": n_params}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=ARCHITECTURES, required=True)
    parser.add_argument(
        "--out", type=Path, default=BUNDLED, help="parent directory; writes OUT/ioi-<model>/ (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument(
        "--answer-weight", type=float, default=5.0, help="loss weight of the IO answer position (others: 1)"
    )
    parser.add_argument("--filler-fraction", type=float, default=0.2, help="share of single-name filler sentences")
    parser.add_argument("--name-init-std", type=float, default=0.1, help="std of the names' initial embedding rows")
    parser.add_argument(
        "--prefix-fraction", type=float, default=0.5, help="share of sentences after 1-2 name-free ones"
    )
    parser.add_argument(
        "--drop-opening", type=float, default=0.3, help="share of IOI sentences without the words before the first name"
    )
    parser.add_argument(
        "--name-dims", type=int, default=32, help="the names' initial rows span a random subspace of this size"
    )
    parser.add_argument(
        "--fresh-names",
        type=float,
        default=0.5,
        help="share of steps that draw new embedding rows for the training names (see NameRows)",
    )
    parser.add_argument("--fresh-names-from", type=float, default=0.4, help="... from this fraction of the steps on")
    parser.add_argument("--aux-weight", type=float, default=0.01, help="MoE load-balancing loss weight")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-n", type=int, default=256, help="prompts per evaluation set on the training curve")
    parser.add_argument("--final-n", type=int, default=1000, help="prompts per evaluation set for the final figures")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-save", action="store_true", help="train and evaluate in memory only (for experiments)")
    args = parser.parse_args(argv)

    result = train(args)
    model, tokenizer = result["model"], result["tokenizer"]
    settings = {
        key: (str(value) if isinstance(value, Path) else value)
        for key, value in vars(args).items()
        if key not in ("out", "no_save")
    }
    extra = {
        "trained_by": "scripts/train_ioi.py",
        "settings": settings,
        "eval_seed": EVAL_SEED,
        "heldout_names": list(HELDOUT_NAMES),
        "heldout_templates": list(HELDOUT_TEMPLATES),
        "filler_templates": list(FILLER_TEMPLATES),
        "train_seconds": round(result["train_seconds"], 1),
    }
    if args.no_save:
        final_model, where = model, "in memory (--no-save)"
    else:
        directory = args.out / f"ioi-{args.model}"
        save(model, tokenizer, directory, extra)
        final_model, where = hooked.load(directory), str(directory)
        probe = final_model.to_tokens(tasks.ioi(4, seed=1).clean)
        with torch.no_grad():
            torch.testing.assert_close(final_model(probe), model(probe), rtol=0, atol=1e-5)
    final = {name: evaluate(final_model, task) for name, task in eval_sets(args.final_n).items()}
    if not args.no_save:  # the figures, for provenance (the tests compute their own)
        config = json.loads((directory / "config.json").read_text())
        config["hooked_ioi"]["final_figures"] = {
            name: {k: round(v, 4) for k, v in f.items()} for name, f in final.items()
        }
        (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"\nfinal figures of the model loaded from {where} (training took {result['train_seconds']:.0f}s):")
    for name, figures in final.items():
        print(
            f"  {name:18s} n={figures['n']:4d}  logit_diff {figures['logit_diff']:6.2f}  accuracy "
            f"{figures['accuracy']:.3f}"
        )
    if not args.no_save:
        size = (directory / "model.safetensors").stat().st_size
        print(f"  model.safetensors: {size / 1e6:.2f} MB")
    ok = final["heldout"]["logit_diff"] >= 3.0 and final["heldout"]["accuracy"] >= 0.95
    print("held-out target (logit_diff >= 3, accuracy >= 0.95):", "met" if ok else "NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
