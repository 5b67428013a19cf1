"""TransformerLens tests/unit/test_hook_points.py, ported.

Changes to the upstream file:
- `HookPoint` from `hooked`.
- `test_add_hook_prepend` replaced its mocks of TransformerLens' internals (`LensHandle`, the torch
  `register_forward_hook` that TransformerLens' HookPoint registers through) by the behaviour they stood for:
  the hook added with `prepend=True` is first in `fwd_hooks` and runs first. (hooked's HookPoint does not
  register torch module hooks, and `register_forward_hook` on it raises, as documented.)
- `test_add_hook_with_level` and every `level=` in `TestHookPointHasHooks`: see DIFFERENCES.
- Not ported: `test_enable_reshape`, `test_enable_reshape_with_none`, `test_reshape_functionality_integration`,
  `test_reshape_functionality_hook_returns_none_integration` (TransformerLens' `enable_reshape` with a
  `conversion_utils` tensor conversion belongs to its `model_bridge`, which hooked does not have);
  `test_invalid_direction_raises_error` keeps its call but expects hooked's `ValueError` naming the
  directions instead of beartype's `BeartypeCallHintParamViolation` (hooked does not use beartype).
"""

from unittest import mock

import pytest

from hooked import HookPoint

DIFFERENCES = [
    "Hook context levels: `add_hook(..., level=k)` and `has_hooks(level=k)` raise `ValueError` (documented in "
    "docs/hooks.md for `add_hook`, `remove_hooks`, `remove_all_hook_fns`: every registration is owned by the "
    "`with model.hooks(...)` block or call that made it, so there are no levels to filter by). Each upstream "
    "call with a `level=` other than None expects that error; the same test's other assertions are kept "
    "with the hooks added without a level.",
    "test_invalid_direction_raises_error: `has_hooks(dir='invalid')` raises `ValueError` naming the valid "
    "directions; TransformerLens' beartype annotation raises `BeartypeCallHintParamViolation`.",
]

LEVEL_ERROR = "hook levels"


def setup_hook_point_and_hook():
    hook_point = HookPoint()

    def hook(activation, hook):
        return activation

    return hook_point, hook


@mock.patch("torch.utils.hooks.RemovableHandle", autospec=True)
def test_add_hook_forward(mock_handle):
    mock_handle.return_value.id = 0
    hook_point, hook = setup_hook_point_and_hook()
    hook_point.add_hook(hook, dir="fwd")
    assert len(hook_point.fwd_hooks) == 1


@mock.patch("torch.utils.hooks.RemovableHandle", autospec=True)
def test_add_hook_backward(mock_handle):
    mock_handle.return_value.id = 0
    hook_point, hook = setup_hook_point_and_hook()
    hook_point.add_hook(hook, dir="bwd")
    assert len(hook_point.bwd_hooks) == 1


@mock.patch("torch.utils.hooks.RemovableHandle", autospec=True)
def test_add_hook_permanent(mock_handle):
    mock_handle.return_value.id = 0
    hook_point, hook = setup_hook_point_and_hook()
    hook_point.add_hook(hook, dir="fwd", is_permanent=True)
    assert hook_point.fwd_hooks[0].is_permanent


@mock.patch("torch.utils.hooks.RemovableHandle", autospec=True)
def test_add_hook_with_level(mock_handle):
    mock_handle.return_value.id = 0
    hook_point, hook = setup_hook_point_and_hook()
    with pytest.raises(ValueError, match=LEVEL_ERROR):  # hooked: no levels (DIFFERENCES)
        hook_point.add_hook(hook, dir="fwd", level=5)
    assert len(hook_point.fwd_hooks) == 0


def test_add_hook_prepend():
    import torch

    hook_point, _ = setup_hook_point_and_hook()
    calls = []

    def hook1(activation, hook):
        calls.append("hook1")
        return activation

    def hook2(activation, hook):
        calls.append("hook2")
        return activation

    hook_point.add_hook(hook1, dir="fwd")
    hook_point.add_hook(hook2, dir="fwd", prepend=True)

    assert len(hook_point.fwd_hooks) == 2
    hook_point(torch.zeros(2))
    assert calls == ["hook2", "hook1"]


class TestHookPointHasHooks:
    """Comprehensive test suite for HookPoint.has_hooks method."""

    def setup_method(self):
        """Set up fresh HookPoint and sample hook for each test."""
        self.hook_point = HookPoint()

        def sample_hook(activation, hook):
            return activation

        self.sample_hook = sample_hook

    def test_no_hooks_returns_false(self):
        """Test that has_hooks returns False when no hooks are present."""
        assert not self.hook_point.has_hooks()
        assert not self.hook_point.has_hooks(dir="fwd")
        assert not self.hook_point.has_hooks(dir="bwd")
        assert not self.hook_point.has_hooks(dir="both")

    def test_forward_hook_detection(self):
        """Test detection of forward hooks."""
        self.hook_point.add_hook(self.sample_hook, dir="fwd")

        assert self.hook_point.has_hooks()
        assert self.hook_point.has_hooks(dir="fwd")
        assert self.hook_point.has_hooks(dir="both")

        assert not self.hook_point.has_hooks(dir="bwd")

    def test_backward_hook_detection(self):
        """Test detection of backward hooks."""
        self.hook_point.add_hook(self.sample_hook, dir="bwd")

        assert self.hook_point.has_hooks()
        assert self.hook_point.has_hooks(dir="bwd")
        assert self.hook_point.has_hooks(dir="both")

        assert not self.hook_point.has_hooks(dir="fwd")

    def test_both_direction_hooks(self):
        """Test detection when both forward and backward hooks are present."""
        self.hook_point.add_hook(self.sample_hook, dir="fwd")
        self.hook_point.add_hook(self.sample_hook, dir="bwd")

        assert self.hook_point.has_hooks()
        assert self.hook_point.has_hooks(dir="fwd")
        assert self.hook_point.has_hooks(dir="bwd")
        assert self.hook_point.has_hooks(dir="both")

    def test_permanent_hook_detection(self):
        """Test detection of permanent hooks."""
        self.hook_point.add_hook(self.sample_hook, dir="fwd", is_permanent=True)

        assert self.hook_point.has_hooks()
        assert self.hook_point.has_hooks(including_permanent=True)

        assert not self.hook_point.has_hooks(including_permanent=False)

    def test_non_permanent_hook_detection(self):
        """Test detection of non-permanent hooks."""
        self.hook_point.add_hook(self.sample_hook, dir="fwd", is_permanent=False)

        assert self.hook_point.has_hooks()
        assert self.hook_point.has_hooks(including_permanent=True)
        assert self.hook_point.has_hooks(including_permanent=False)

    def test_mixed_permanent_hooks(self):
        """Test detection with mix of permanent and non-permanent hooks."""
        self.hook_point.add_hook(self.sample_hook, dir="fwd", is_permanent=True)
        self.hook_point.add_hook(self.sample_hook, dir="fwd", is_permanent=False)

        assert self.hook_point.has_hooks(including_permanent=True)
        assert self.hook_point.has_hooks(including_permanent=False)

    def test_only_permanent_hooks(self):
        """Test detection when only permanent hooks are present."""
        self.hook_point.add_hook(self.sample_hook, dir="fwd", is_permanent=True)
        self.hook_point.add_hook(self.sample_hook, dir="bwd", is_permanent=True)

        assert self.hook_point.has_hooks(including_permanent=True)
        assert self.hook_point.has_hooks(dir="fwd", including_permanent=True)
        assert self.hook_point.has_hooks(dir="bwd", including_permanent=True)

        assert not self.hook_point.has_hooks(including_permanent=False)
        assert not self.hook_point.has_hooks(dir="fwd", including_permanent=False)
        assert not self.hook_point.has_hooks(dir="bwd", including_permanent=False)

    def test_context_level_filtering(self):
        """Test context level filtering functionality. hooked: levels raise (DIFFERENCES)."""
        for level in (0, 1, 2):
            with pytest.raises(ValueError, match=LEVEL_ERROR):
                self.hook_point.add_hook(self.sample_hook, dir="fwd", level=level)
        self.hook_point.add_hook(self.sample_hook, dir="fwd")

        for level in (0, 1, 2, 3, -1):
            with pytest.raises(ValueError, match=LEVEL_ERROR):
                self.hook_point.has_hooks(level=level)

        # Should detect all hooks when level is None
        assert self.hook_point.has_hooks(level=None)

    def test_context_level_with_direction(self):
        """Test context level filtering combined with direction filtering. hooked: levels raise."""
        with pytest.raises(ValueError, match=LEVEL_ERROR):
            self.hook_point.add_hook(self.sample_hook, dir="fwd", level=0)
        with pytest.raises(ValueError, match=LEVEL_ERROR):
            self.hook_point.add_hook(self.sample_hook, dir="bwd", level=1)
        with pytest.raises(ValueError, match=LEVEL_ERROR):
            self.hook_point.has_hooks(dir="fwd", level=0)

    def test_context_level_with_permanent_flags(self):
        """Test context level filtering combined with permanent hook filtering. hooked: levels raise."""
        with pytest.raises(ValueError, match=LEVEL_ERROR):
            self.hook_point.add_hook(self.sample_hook, dir="fwd", level=0, is_permanent=True)
        with pytest.raises(ValueError, match=LEVEL_ERROR):
            self.hook_point.has_hooks(level=0, including_permanent=True)

    def test_all_parameters_combined(self):
        """Test all parameters combined in various ways (hooked: without levels)."""
        self.hook_point.add_hook(self.sample_hook, dir="fwd", is_permanent=True)
        self.hook_point.add_hook(self.sample_hook, dir="fwd", is_permanent=False)
        self.hook_point.add_hook(self.sample_hook, dir="bwd", is_permanent=False)

        assert self.hook_point.has_hooks(dir="fwd", including_permanent=True)
        assert self.hook_point.has_hooks(dir="fwd", including_permanent=False)
        assert self.hook_point.has_hooks(dir="bwd", including_permanent=False)
        with pytest.raises(ValueError, match=LEVEL_ERROR):
            self.hook_point.has_hooks(dir="bwd", level=1, including_permanent=False)

    @pytest.mark.unchecked
    def test_invalid_direction_raises_error(self):
        """Test that invalid direction parameter raises error (hooked: ValueError, DIFFERENCES)."""
        with pytest.raises(ValueError, match="fwd"):
            self.hook_point.has_hooks(dir="invalid")  # type: ignore

    def test_multiple_hooks_same_criteria(self):
        """Test detection when multiple hooks match the same criteria (hooked: without levels)."""
        self.hook_point.add_hook(self.sample_hook, dir="fwd", is_permanent=False)
        self.hook_point.add_hook(self.sample_hook, dir="fwd", is_permanent=False)
        self.hook_point.add_hook(self.sample_hook, dir="fwd", is_permanent=False)

        assert self.hook_point.has_hooks(dir="fwd", including_permanent=False)

    def test_hook_removal_affects_detection(self):
        """Test that removing hooks affects detection."""
        self.hook_point.add_hook(self.sample_hook, dir="fwd")
        assert self.hook_point.has_hooks()

        self.hook_point.remove_hooks(dir="both")
        assert not self.hook_point.has_hooks()

    def test_default_parameter_values(self):
        """Test that default parameter values work correctly (hooked: without levels)."""
        self.hook_point.add_hook(self.sample_hook, dir="fwd", is_permanent=True)
        self.hook_point.add_hook(self.sample_hook, dir="bwd", is_permanent=False)

        assert self.hook_point.has_hooks()
        assert self.hook_point.has_hooks(dir="both", including_permanent=True, level=None)

    def test_edge_case_empty_after_filtering(self):
        """Test edge case where hooks exist but are filtered out (hooked: without levels)."""
        self.hook_point.add_hook(self.sample_hook, dir="fwd", is_permanent=True)

        assert not self.hook_point.has_hooks(including_permanent=False)
        assert not self.hook_point.has_hooks(dir="bwd")
        assert not self.hook_point.has_hooks(dir="bwd", including_permanent=True)

    def test_functional_hook_execution_still_works(self):
        """Test that has_hooks doesn't interfere with actual hook functionality."""
        import torch

        results = []

        def test_hook(activation, hook):
            results.append("hook_called")
            return activation

        self.hook_point.add_hook(test_hook, dir="fwd")
        assert self.hook_point.has_hooks()

        test_input = torch.tensor([1.0, 2.0, 3.0])
        output = self.hook_point(test_input)

        assert torch.equal(output, test_input)
        assert "hook_called" in results

    def test_hook_point_with_conversions(self):
        """Test has_hooks with hook conversions if they exist."""
        import torch

        def simple_hook(activation, hook):
            return activation * 2

        self.hook_point.add_hook(simple_hook, dir="fwd")

        assert self.hook_point.has_hooks()
        assert self.hook_point.has_hooks(dir="fwd")

        test_input = torch.tensor([1.0, 2.0])
        output = self.hook_point(test_input)
        expected = torch.tensor([2.0, 4.0])
        assert torch.allclose(output, expected)
