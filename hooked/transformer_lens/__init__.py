"""TransformerLens compatibility: TransformerLens 3.9's modules, answered by hooked's own machinery.

| module | TransformerLens 3.9 | short path |
|---|---|---|
| `config` | `HookedTransformerConfig`, `HookedTransformer(cfg)` | `hooked.tl_config` |
| `aliases` | `supported_models.py`: official names and aliases (`"gpt2-small"`) | `hooked.aliases` |
| `patching` | `transformer_lens.patching` | `hooked.patching`, `hooked.tl_patching` |
| `evals` | `transformer_lens.evals` | `hooked.evals` |
| `utils` | `transformer_lens.utils` | `hooked.utils` |

What TransformerLens puts on the model itself is the model's: `from_pretrained`, `process_weights_` and
`HookedTransformer(cfg)` in hooked/models/building.py, the `set_use_*` switches in hooked/models/base.py, `model.W_Q`
and the other weight views in hooked/models/weight_views.py, and weight processing (TransformerLens'
`weight_processing.py`, which `hooked.load` applies too) in hooked/processing.py, also importable as
`hooked.transformer_lens.processing`. The models never import this folder: `HookedTransformer(cfg)` asks the config
to build its model. See docs/transformer-lens.md for the migration table.
"""  # noqa: E501  (a Markdown table: its rows cannot wrap)
