"""The `hooked` command: list a model's hook points, or run a prompt and show the next tokens.

    hooked hooks gpt2 --pos 12          # every hook name with its shape for a 12-token input
    hooked run ./my-checkpoint "The capital of France is" --top 5

MODEL is a hub id (read from the local Hugging Face cache when offline) or a checkpoint directory.
`hooks` reads only config.json: the model is built on the meta device, no weights are loaded.
"""

from __future__ import annotations

import argparse
import sys

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def list_hooks(model_name: str, batch: int, pos: int) -> list[tuple[str, tuple[int, ...]]]:
    from hooked.weights import architecture_for, build_on_meta, read_config, resolve

    config = read_config(resolve(model_name, config_only=True))
    model = build_on_meta(architecture_for(config), config)
    return list(model.hook_shapes(batch=batch, pos=pos).items())


def top_next_tokens(model_name: str, prompt: str, top: int, dtype: str, device: str, prepend_bos: bool | None):
    import hooked

    model = hooked.load(model_name, dtype=_DTYPES[dtype], device=device)
    with torch.inference_mode():
        logits = model(prompt, prepend_bos=prepend_bos)
    probs = logits[0, -1].float().softmax(-1)
    values, ids = probs.topk(min(top, probs.shape[-1]))
    return [(model.to_str_tokens(torch.tensor([i]))[0], int(i), float(p)) for p, i in zip(values, ids)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hooked", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    hooks = commands.add_parser("hooks", help="every hook name with its shape")
    hooks.add_argument("model", help="hub id or checkpoint directory")
    hooks.add_argument("--pos", type=int, default=8, help="input length (default 8)")
    hooks.add_argument("--batch", type=int, default=1)
    run = commands.add_parser("run", help="top next tokens for a prompt")
    run.add_argument("model", help="hub id or checkpoint directory")
    run.add_argument("prompt")
    run.add_argument("--top", type=int, default=10)
    run.add_argument("--dtype", choices=list(_DTYPES), default="float32")
    run.add_argument("--device", default="cpu")
    run.add_argument("--no-bos", dest="prepend_bos", action="store_false", default=None, help="do not prepend BOS")
    args = parser.parse_args(argv)

    try:
        if args.command == "hooks":
            rows = list_hooks(args.model, args.batch, args.pos)
            width = max(len(name) for name, _ in rows)
            for name, shape in rows:
                print(f"{name:<{width}}  {list(shape)}")
        else:
            for text, token_id, prob in top_next_tokens(args.model, args.prompt, args.top, args.dtype, args.device, args.prepend_bos):
                print(f"{prob:8.4f}  {token_id:>7}  {text!r}")
    except (ValueError, KeyError, RuntimeError, OSError) as error:
        print(f"hooked: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
