"""How a cross-layer transcoder learns (`hooked.sae.train(model, data, cross_layer=True, ...)`): the trainer the
loop of hooked/sae/training/loop.py drives, with `DictionaryTrainer`'s surface, fed every layer's input and output
point from the same stream.

For the CLT of hooked/sae/clt.py (layer l reads x_l, its features write every layer m >= l through W_dec_l[:, m - l]),
on a batch of tokens with targets y_m (the clean activation at layer m's output point):

    loss = sum_m mean_tokens ||out_m - y_m||^2                      each output's squared error, as a transcoder's
         + standard: l1_coefficient * sum_l mean_tokens sum_i acts_l,i * sum_{m >= l} ||W_dec_l[i, m - l]||
         + jumprelu: l0_coefficient * sum_l mean_tokens #{i: pre_l,i > threshold_l,i}

The JumpReLU threshold learns through the straight-through estimator of the per-layer JumpReLU trainer (rectangle
kernel of width 0.05) and is kept >= 0, where circuit-tracer's `pre * (pre > threshold)` and SAELens'
`relu(pre) * (pre > threshold)` agree. Initialisation as the per-layer transcoder's: every decoder slice's rows
uniform at norm 0.1, the encoder drawn apart at norm 0.1, b_dec_m at the first batch's mean y_m, b_enc_l centring
layer l's pre-activations on its mean input; a skip CLT's W_skip starts at zero. Dead features are counted per
layer (`Run.steps_since_fired` is [n_layers d_sae]); resampling them is not offered.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor

from hooked.sae.clt import CLTConfig, CrossLayerTranscoder
from hooked.sae.training.config import DictionarySpec
from hooked.sae.training.trainers import (
    DECODER_INIT_NORM,
    JUMPRELU_BANDWIDTH,
    JUMPRELU_INIT_THRESHOLD,
    DictionaryTrainer,
    JumpReLU,
    StepFunction,
    StepResult,
)


class CLTTrainer(DictionaryTrainer):
    """Trains a `CrossLayerTranscoder` (module docstring); `points` are every layer's input and output. It keeps
    `DictionaryTrainer`'s surface, the one the loop drives, and overrides all of it."""

    def __init__(self, spec: DictionarySpec, cfg: CLTConfig, generator: torch.Generator):
        self.spec, self.generator = spec, generator
        self.clt = CrossLayerTranscoder(cfg, skip=spec.skip)
        self._initialize_weights()

    @property
    def points(self) -> tuple[str, ...]:
        return (*self.clt.cfg.hook_names(), *self.clt.cfg.hook_names_out())

    @property
    def d_sae(self) -> int:
        return self.clt.cfg.d_sae

    @property
    def feature_shape(self) -> tuple[int, int]:
        """The shape of the loop's per-feature counts: one row per layer."""
        return (self.clt.cfg.n_layers, self.clt.cfg.d_sae)

    @property
    def device(self) -> torch.device:
        return self.clt.device

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.clt.parameters())

    # ----------------------------------------------------------------- initialisation
    @torch.no_grad()
    def _initialize_weights(self) -> None:
        cfg = self.clt.cfg
        for module in self.clt.layers:
            W_dec = self._uniform(cfg.d_sae, module.W_dec.shape[1], cfg.d_out)
            module.W_dec.copy_(W_dec / W_dec.norm(dim=-1, keepdim=True) * DECODER_INIT_NORM)
            W_enc = self._uniform(cfg.d_sae, cfg.d_in)
            module.W_enc.copy_((W_enc / W_enc.norm(dim=-1, keepdim=True) * DECODER_INIT_NORM).T)
            if module.threshold is not None:
                module.threshold.fill_(JUMPRELU_INIT_THRESHOLD)

    def _uniform(self, *shape: int) -> Tensor:
        return torch.rand(shape, generator=self.generator).mul_(2).sub_(1).to(self.clt.dtype).to(self.clt.device)

    @torch.no_grad()
    def initialize(self, batch: dict[str, Tensor]) -> None:
        """From the first batch: b_dec_m at the mean of output m, b_enc_l centring layer l's pre-activations."""
        xs, ys = self.inputs(batch)
        for module, x, y in zip(self.clt.layers, xs, ys, strict=True):
            module.b_dec.copy_(y.mean(0))
            module.b_enc.copy_(-(x.mean(0) @ module.W_enc))

    def inputs(self, batch: dict[str, Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        """Every layer's input [tokens d_in] and target [tokens d_out], layer 0 first."""
        cfg = self.clt.cfg
        return [batch[name] for name in cfg.hook_names()], [batch[name] for name in cfg.hook_names_out()]

    # ----------------------------------------------------------------- a step
    def forward(self, batch: dict[str, Tensor], dead: Tensor | None) -> StepResult:
        """The loss of the module docstring on `batch`; `dead` is not used (no auxiliary loss for CLTs)."""
        xs, ys = self.inputs(batch)
        clt, cfg = self.clt, self.clt.cfg
        n_layers, d_out = cfg.n_layers, cfg.d_out
        outs: list[Tensor] = [module.b_dec.expand_as(y) for module, y in zip(clt.layers, ys, strict=True)]
        penalty, acts_by_layer = xs[0].new_zeros(()), []
        for layer, (module, x) in enumerate(zip(clt.layers, xs, strict=True)):
            pre = x @ module.W_enc + module.b_enc
            if module.threshold is None:
                acts = F.relu(pre)
                norms = module.W_dec.norm(dim=-1).sum(-1)  # [d_sae]: summed over the layers each feature writes
                penalty = penalty + self.spec.l1_coefficient * (acts * norms).sum(-1).mean()
            else:
                with torch.no_grad():
                    module.threshold.clamp_(min=0.0)
                acts = JumpReLU.apply(pre, module.threshold, JUMPRELU_BANDWIDTH)
                l0 = StepFunction.apply(pre, module.threshold, JUMPRELU_BANDWIDTH).sum(-1).mean()
                penalty = penalty + self.spec.l0_coefficient * l0
            acts_by_layer.append(acts)
            written = (acts @ module.W_dec.flatten(1)).view(-1, n_layers - layer, d_out)  # to layers layer..
            for offset in range(n_layers - layer):
                outs[layer + offset] = outs[layer + offset] + written[:, offset]
        if clt.has_skip:
            outs = [out + x @ module.W_skip for out, x, module in zip(outs, xs, clt.layers, strict=True)]
        mse = sum((out - y).pow(2).sum(-1).mean() for out, y in zip(outs, ys, strict=True))
        parts = {"mse": mse, ("l1" if clt.layers[0].threshold is None else "l0"): penalty}
        recons, targets = torch.stack(outs).detach(), torch.stack(ys)
        with torch.no_grad():
            active = torch.stack(acts_by_layer) > 0  # [n_layers tokens d_sae]
            variance = (targets - targets.mean(1, keepdim=True)).pow(2).sum()
            fvu = (recons - targets).pow(2).sum() / variance.clamp_min(1e-12)
        return StepResult(sum(parts.values()), parts, active.any(1), active.sum((0, 2)).float().mean(), fvu, recons)

    def before_update(self) -> None:
        pass

    def after_update(self) -> None:
        pass

    def resample(self, features: Tensor, batch: dict[str, Tensor], recons: Tensor, optimizer) -> None:
        raise NotImplementedError("a cross-layer transcoder's dead features are counted, not resampled")

    # ----------------------------------------------------------------- the result
    @torch.no_grad()
    def export(self) -> CrossLayerTranscoder:
        """The CLT as it runs (and saves): a copy, detached from training."""
        cfg = self.clt.cfg
        cfg = replace(
            cfg, metadata=dict(cfg.metadata), processing=None if cfg.processing is None else dict(cfg.processing)
        )
        out = CrossLayerTranscoder(cfg, skip=self.clt.has_skip)
        out.load_state_dict(self.clt.state_dict())
        return out.eval()
