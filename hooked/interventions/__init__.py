"""Interventions: what a researcher does to a running model, registered as hooks by name.

| module | what |
|---|---|
| `ablate` | `zero`, `mean`, `resample`, `constant` callbacks and `ablate.hooks(model, addresses, method)` |
| `patch` | activation patching (head and residual sweeps) and attribution patching |
| `sweeps` | `hooked.sweep`: many variants of one forward as one batched pass |
| `row_blocks` | the row-block protocol sweeps, generation and circuits share: each variant owns a block of rows |
| `results` | `SweepResult`: the table, CSV / JSON, heatmaps |
| `metrics` | per-prompt metrics that declare what they read (`logit_diff`, `kl_div`, ...) |
| `tasks` | prompt sets as data (IOI, factual recall) |
| `addresses` | component addresses (`L9H9`, `L8.mlp`, `L3.E5`) and every component of a kind |
| `kinds` | the kinds of component, one declaration each: address form, hook point, selector, count |
| `positions` | positions in each prompt, turned into the padded batch's columns |

`hooked.ablate`, `hooked.patch`, `hooked.sweeps`, `hooked.metrics`, `hooked.tasks`, ... are the same modules
under their short names (hooked/__init__.py).
"""
