"""TransformerLens compatibility: what a TransformerLens 3.9 user types, answered by hooked's own machinery.

| module | TransformerLens 3.9 | short path |
|---|---|---|
| `model` | `HookedTransformer.from_pretrained`, `process_weights_`, `set_use_*`, `model.W_Q` ... (mixed into every model) | |
| `config` | `HookedTransformerConfig`, `HookedTransformer(cfg)` | `hooked.tl_config` |
| `processing` | `weight_processing.py`: `fold_ln`, centring, value-bias folding | `hooked.processing` |
| `aliases` | `supported_models.py`: official names and aliases (`"gpt2-small"`) | `hooked.aliases` |
| `patching` | `transformer_lens.patching` | `hooked.patching`, `hooked.tl_patching` |
| `evals` | `transformer_lens.evals` | `hooked.evals` |
| `utils` | `transformer_lens.utils` | `hooked.utils` |

See docs/transformer-lens.md for the migration table. Nothing here is imported by this folder's
`__init__`: the model base class reaches `model` alone (hooked/models/base.py).
"""  # noqa: E501  (a Markdown table: its rows cannot wrap)
