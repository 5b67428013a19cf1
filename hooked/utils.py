"""TransformerLens-compatible helpers, so `from transformer_lens import utils` ports as `from hooked import utils`."""

from hooked.cache import act_name as get_act_name

__all__ = ["get_act_name"]
