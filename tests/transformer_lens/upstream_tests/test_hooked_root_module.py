"""TransformerLens tests/unit/test_hooked_root_module.py, ported.

Changes to the upstream file:
- `test_enable_hook_with_name`, `test_enable_hooks_for_points`, `test_enable_hook_with_string_param`,
  `test_enable_hook_with_callable_param` call TransformerLens' private `_enable_hook*` methods on a
  `HookedRootModule` whose `mod_dict` is replaced by `Mock(HookPoint)`s, and check the `add_hook` call each
  mock received, including `level=model.context_level`. hooked has no such private methods, no
  `context_level` (DIFFERENCES) and derives `mod_dict` / `hook_dict` from the module tree (they cannot be
  assigned), so each is ported as what it checks through the public call it backs: a small
  `HookedRootModule` with two real `HookPoint`s, `linear` and `attn`, and `add_hook(name | filter, hook,
  dir=...)`, which must attach the hook in that direction to the matching point and to no other.
- Not ported: `test_legacy_hook_points_import_still_works` and
  `test_legacy_hook_points_attribute_error_for_unknown_names`, which check TransformerLens' own
  deprecation shim (`transformer_lens.hook_points.HookedRootModule` moved to `transformer_lens.HookedRootModule`);
  hooked exports both classes from `hooked` (and `hooked.hooks`) and has no legacy path.
"""

import torch

from hooked import HookedRootModule, HookPoint

DIFFERENCES = [
    "No hook context levels: TransformerLens' `_enable_hook*` pass `level=self.context_level` to each "
    "`HookPoint.add_hook`; hooked's registrations belong to the block or call that made them, and a `level=` "
    "raises (docs/hooks.md). The ports check the attached hooks instead of the `level=` argument.",
]


class TwoPoints(HookedRootModule):
    def __init__(self):
        super().__init__()
        self.linear = HookPoint()
        self.attn = HookPoint()
        self.setup()

    def forward(self, x):
        return self.attn(self.linear(x))


def attached(model, direction):
    return {name: len(getattr(point, f"{direction}_hooks")) for name, point in model.hook_dict.items()}


def test_enable_hook_with_name():
    model = TwoPoints()

    def hook(x, hook):
        return None

    model.add_hook("linear", hook, dir="fwd")
    assert attached(model, "fwd") == {"linear": 1, "attn": 0}
    assert attached(model, "bwd") == {"linear": 0, "attn": 0}
    model.reset_hooks()


def test_enable_hooks_for_points():
    model = TwoPoints()

    def enabled(x):
        return x == "attn"

    def hook(x, hook):
        return None

    model.add_hook(enabled, hook, dir="bwd")
    assert attached(model, "bwd") == {"linear": 0, "attn": 1}
    assert attached(model, "fwd") == {"linear": 0, "attn": 0}
    model.reset_hooks()


def test_enable_hook_with_string_param():
    model = TwoPoints()
    seen = []
    model.add_hook("linear", lambda x, hook: seen.append(hook.name), dir="fwd")
    model(torch.zeros(2))
    assert seen == ["linear"]
    model.reset_hooks()


def test_enable_hook_with_callable_param():
    model = TwoPoints()
    seen = []

    def enabled(x):
        return x == "attn"

    model.add_hook(enabled, lambda x, hook: seen.append(hook.name), dir="fwd")
    model(torch.zeros(2))
    assert seen == ["attn"]
    assert attached(model, "fwd") == {"linear": 0, "attn": 1}
    model.reset_hooks()
