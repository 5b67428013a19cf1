"""How one SAE or transcoder learns: `DictionaryTrainer`, the surface the training loop drives (`points`, `d_sae`,
`feature_shape`, `device`, `initialize`, `parameters`, `forward` -> `StepResult`, `before_update`, `after_update`,
`resample`, `export`), one subclass per trainable architecture (each named by its declaration's `trainer`,
hooked/sae/architectures.py), and the autograd pieces they use.

The losses, in SAELens 6.54's terms (`saes/standard_sae.py`, `topk_sae.py`, `batchtopk_sae.py`, `jumprelu_sae.py`;
reconstruction = squared error summed over the output width, averaged over tokens, so coefficients carry over):

- `standard`: ReLU; + l1_coefficient * sum_i f_i ||W_dec_i|| (the L1 weighted by decoder norms; rows are free).
- `topk`: the k largest pre-activations, ReLU; decoder rows at unit norm (eai-sparsify 1.3.3 `sparse_coder.py`: the
  gradient along each row removed before the step, rows renormalised after); + aux_coefficient * AuxK (the dead
  features' top d_out/2 pre-activations reconstruct the residual, scaled by min(dead / (d_out/2), 1)). Trained
  sparse: the encoder's backward and the decoder touch only the k chosen features per token (as eai-sparsify's
  fused encoder), so a step costs one dense product, the encoder's.
- `batchtopk`: the k * tokens largest activations of the whole batch; otherwise as `topk`. Its threshold, an
  exponential average (rate 0.01) of the smallest activation kept, started at the first batch's, is saved as a
  JumpReLU dictionary with that one threshold for every feature, as SAELens saves it.
- `jumprelu`: relu(pre) * (pre > threshold), the threshold learnt through a straight-through estimator with a
  rectangle kernel of width `bandwidth`; + l0_coefficient * L0 (the step function, same estimator); the threshold
  kept >= 0. Decoder rows free (SAELens' JumpReLUTrainingSAE, "step" mode).

Initialisation (SAELens' `initialize_weights`): decoder rows drawn uniformly (its kaiming_uniform_), scaled to
norm 0.1 (1 for the unit-norm architectures), the encoder their transpose (a transcoder's encoder drawn apart). An
SAE's b_dec starts at the geometric median of the first batch (`geometric_median`; SAELens' trainers before 6.0
offered it as `b_dec_init_method="geometric_median"`, 6.54 starts at zero): the centre it subtracts from its input
(`apply_b_dec_to_input`) is then not pulled by the few tokens of outsized norm, such as a GPT-2's first position. A
transcoder's b_dec starts at the mean of the first batch's targets, its b_enc centring its pre-activations on that
batch's mean input (eai-sparsify's trainer).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from hooked.sae.dictionary import Dictionary, DictionaryConfig
from hooked.sae.training.config import DictionarySpec

JUMPRELU_BANDWIDTH = 0.05  # SAELens' jumprelu_bandwidth
JUMPRELU_INIT_THRESHOLD = 0.01  # SAELens' jumprelu_init_threshold
BATCHTOPK_THRESHOLD_RATE = 0.01  # SAELens' topk_threshold_lr
DECODER_INIT_NORM = 0.1  # SAELens' decoder_init_norm (Anthropic's April 2024 update)
RESAMPLE_ENCODER_SCALE = 0.2  # Anthropic's resampling: new encoder rows at 0.2 x the live rows' mean norm
GEOMETRIC_MEDIAN_STEPS = 30  # Weiszfeld iterations for an SAE's b_dec at the first batch's geometric median
PRE_BYTES = 8 * 2**20  # TopK computes its pre-activations this many bytes of rows at a time


@dataclass
class StepResult:
    """What one dictionary's forward on a batch gives the training loop."""

    loss: Tensor  # the total, to backpropagate
    parts: dict[str, Tensor]  # mse, l1 / l0 / auxk
    fired: Tensor  # [d_sae] bool: the features active on some token
    l0: Tensor  # mean active features per token
    fvu: Tensor  # fraction of variance unexplained on this batch
    recons: Tensor  # [tokens d_out], detached: what `resample` reads


@torch.no_grad()
def geometric_median(points: Float[Tensor, "tokens width"], steps: int = GEOMETRIC_MEDIAN_STEPS) -> Tensor:
    """The point minimising the summed Euclidean distance to `points` (Weiszfeld's iteration from their mean, in
    float64; a point the estimate lands on weighs as if 1e-8 away)."""
    x = points.double()
    median = x.mean(0)
    for _ in range(steps):
        weights = 1 / (x - median).norm(dim=-1).clamp_min(1e-8)
        median = (weights[:, None] * x).sum(0) / weights.sum()
    return median.to(points.dtype)


class DictionaryTrainer:
    """How an SAE or a transcoder learns: the surface the training loop drives (see the module docstring).

    Subclasses give the architecture: `encode_for_training` (features and their sparsity penalty) and what the
    decoder's rows are held to."""

    unit_norm_decoder = False

    def __init__(self, spec: DictionarySpec, cfg: DictionaryConfig, generator: torch.Generator):
        self.spec, self.generator = spec, generator
        self.dictionary = Dictionary(cfg, skip=spec.skip)
        self._initialize_weights()

    @property
    def points(self) -> tuple[str, ...]:
        """The hook points whose activations a step reads (a cross-layer transcoder's: every layer's)."""
        return (self.spec.hook_name,) + ((self.spec.hook_name_out,) if self.spec.hook_name_out is not None else ())

    @property
    def d_sae(self) -> int:
        return self.dictionary.cfg.d_sae

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """The shape of the loop's per-feature counts (a cross-layer transcoder's: [n_layers d_sae])."""
        return (self.d_sae,)

    @property
    def device(self) -> torch.device:
        return self.dictionary.device

    def parameters(self) -> list[torch.nn.Parameter]:
        """W_enc, b_enc, W_dec, b_dec, a skip's W_skip, then the rest its architecture declares (a threshold)."""
        d = self.dictionary
        declared = [getattr(d, name) for name in d.declaration.parameters if name != "b_enc"]
        return [d.W_enc, d.b_enc, d.W_dec, d.b_dec] + ([d.W_skip] if d.W_skip is not None else []) + declared

    # ----------------------------------------------------------------- initialisation
    @torch.no_grad()
    def _initialize_weights(self) -> None:
        d, cfg = self.dictionary, self.dictionary.cfg
        norm = 1.0 if self.unit_norm_decoder else DECODER_INIT_NORM
        W_dec = self._uniform(cfg.d_sae, cfg.d_out)
        d.W_dec.copy_(W_dec / W_dec.norm(dim=-1, keepdim=True) * norm)
        if cfg.is_transcoder:
            W_enc = self._uniform(cfg.d_sae, cfg.d_in)
            d.W_enc.copy_((W_enc / W_enc.norm(dim=-1, keepdim=True) * norm).T)
        else:
            d.W_enc.copy_(d.W_dec.T)

    def _uniform(self, *shape: int) -> Tensor:
        return torch.rand(shape, generator=self.generator).mul_(2).sub_(1).to(self.dictionary.dtype)

    @torch.no_grad()
    def initialize(self, batch: dict[str, Tensor]) -> None:
        """Data-dependent initialisation from the first batch: an SAE's b_dec at its geometric median; a
        transcoder's b_dec at the targets' mean, its b_enc centring its pre-activations on the inputs' mean."""
        x, y = self.inputs(batch)
        d = self.dictionary
        d.b_dec.copy_(y.mean(0) if d.cfg.is_transcoder else geometric_median(y))
        if d.cfg.is_transcoder:
            d.b_enc.copy_(-(x.mean(0) @ d.W_enc))

    def inputs(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        x = batch[self.spec.hook_name]
        return x, (batch[self.spec.hook_name_out] if self.spec.hook_name_out is not None else x)

    # ----------------------------------------------------------------- a step
    def encoder_input(self, x: Tensor) -> Tensor:
        d = self.dictionary
        return x - d.b_dec if d.cfg.apply_b_dec_to_input else x

    def forward(self, batch: dict[str, Tensor], dead: Tensor | None) -> StepResult:
        x, y = self.inputs(batch)
        d = self.dictionary
        acts, penalty = self.encode_for_training(self.encoder_input(x))
        recons = acts @ d.W_dec + d.b_dec
        if d.W_skip is not None:
            recons = recons + x @ d.W_skip.T
        mse = (recons - y).pow(2).sum(-1).mean()
        parts = {"mse": mse, **penalty}
        if dead is not None:
            parts.update(self.dead_loss(x, y, recons, dead))
        active = acts > 0
        return self._result(parts, active.any(0), active.sum(-1).float().mean(), recons, y)

    @staticmethod
    def _result(parts: dict[str, Tensor], fired: Tensor, l0: Tensor, recons: Tensor, y: Tensor) -> StepResult:
        recons = recons.detach()
        with torch.no_grad():
            fvu = (recons - y).pow(2).sum() / (y - y.mean(0)).pow(2).sum().clamp_min(1e-12)
        return StepResult(sum(parts.values()), parts, fired, l0, fvu, recons)

    def encode_for_training(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """(features [tokens d_sae], sparsity terms) of the encoder input."""
        raise NotImplementedError

    def dead_loss(self, x: Tensor, y: Tensor, recons: Tensor, dead: Tensor) -> dict[str, Tensor]:
        return {}

    @torch.no_grad()  # a graph through the gradient would chain every step to the last
    def before_update(self) -> None:
        if self.unit_norm_decoder:  # keep the step tangent to the unit sphere of each row (eai-sparsify)
            W, grad = self.dictionary.W_dec, self.dictionary.W_dec.grad
            if grad is not None:
                grad -= (grad * W).sum(-1, keepdim=True) * W

    @torch.no_grad()
    def after_update(self) -> None:
        if self.unit_norm_decoder:
            W = self.dictionary.W_dec
            W /= W.norm(dim=-1, keepdim=True) + torch.finfo(W.dtype).eps

    # ----------------------------------------------------------------- dead features
    @torch.no_grad()
    def resample(self, features: Tensor, batch: dict[str, Tensor], recons: Tensor, optimizer) -> None:
        """Re-initialise `features` (Anthropic's resampling, "Towards Monosemanticity"): each takes a token drawn
        with probability proportional to its squared reconstruction error; the decoder row points along what is
        left unexplained there (the input itself for an SAE), at the live rows' mean norm; the encoder reads the
        token's input direction at 0.2 x the live encoder norm; b_enc 0; Adam's moments for them reset."""
        x, y = self.inputs(batch)
        d = self.dictionary
        error = (y - recons).pow(2).sum(-1)
        if float(error.sum()) <= 0:
            return
        # the generator lives on the CPU, whatever the dictionary's device
        tokens = torch.multinomial(error.cpu(), len(features), replacement=True, generator=self.generator)
        tokens = tokens.to(error.device)
        live = torch.ones(d.cfg.d_sae, dtype=torch.bool, device=d.device)
        live[features] = False
        enc_norm = d.W_enc[:, live].norm(dim=0).mean() if live.any() else torch.tensor(1.0)
        dec_norm = d.W_dec[live].norm(dim=-1).mean() if live.any() else torch.tensor(1.0)
        direction_out = (y - recons)[tokens] if d.cfg.is_transcoder else self.encoder_input(x)[tokens]
        direction_in = self.encoder_input(x)[tokens]
        d.W_dec[features] = direction_out / direction_out.norm(dim=-1, keepdim=True).clamp_min(1e-8) * dec_norm
        scaled = direction_in / direction_in.norm(dim=-1, keepdim=True).clamp_min(1e-8)
        d.W_enc[:, features] = (scaled * enc_norm * RESAMPLE_ENCODER_SCALE).T
        d.b_enc[features] = 0.0
        self._resampled(features)
        for parameter, index in ((d.W_dec, (features,)), (d.W_enc, (slice(None), features)), (d.b_enc, (features,))):
            state = optimizer.state.get(parameter, {})
            for moment in ("exp_avg", "exp_avg_sq"):
                if moment in state:
                    state[moment][index] = 0.0

    def _resampled(self, features: Tensor) -> None:
        pass

    # ----------------------------------------------------------------- the result
    @torch.no_grad()
    def export(self) -> Dictionary:
        """The dictionary as it runs (and saves): a copy, detached from training."""
        d = self.dictionary
        cfg = replace(
            d.cfg,
            metadata=dict(d.cfg.metadata),
            processing=None if d.cfg.processing is None else dict(d.cfg.processing),
        )
        out = Dictionary(cfg, skip=d.W_skip is not None)
        out.load_state_dict(d.state_dict())
        return out.eval()


class StandardTrainer(DictionaryTrainer):
    """ReLU with the L1 of the features weighted by their decoder norms (SAELens' StandardTrainingSAE)."""

    def encode_for_training(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        d = self.dictionary
        pre = x @ d.W_enc + d.b_enc
        acts = F.relu(pre)
        l1 = (acts * d.W_dec.norm(dim=-1)).sum(-1).mean()
        return acts, {"l1": self.spec.l1_coefficient * l1}


class TopKTrainer(DictionaryTrainer):
    """The k largest pre-activations per token, ReLU; unit-norm decoder rows; AuxK on the dead features."""

    unit_norm_decoder = True

    def forward(self, batch: dict[str, Tensor], dead: Tensor | None) -> StepResult:
        x, y = self.inputs(batch)
        d = self.dictionary
        b_dec = d.b_dec if d.cfg.apply_b_dec_to_input else None
        acts, indices = TopKEncode.apply(x, b_dec, d.W_enc, d.b_enc, int(self.spec.k))
        recons = F.embedding_bag(indices, d.W_dec, per_sample_weights=acts, mode="sum") + d.b_dec
        if d.W_skip is not None:
            recons = recons + x @ d.W_skip.T
        parts = {"mse": (recons - y).pow(2).sum(-1).mean()}
        if dead is not None:
            parts.update(self.dead_loss(x, y, recons, dead))
        with torch.no_grad():
            active = acts > 0
            fired = torch.zeros(d.cfg.d_sae, dtype=torch.bool, device=d.device)
            fired[indices[active]] = True
        return self._result(parts, fired, active.sum(-1).float().mean(), recons, y)

    def dead_loss(self, x: Tensor, y: Tensor, recons: Tensor, dead: Tensor) -> dict[str, Tensor]:
        """AuxK (SAELens 6.54 `calculate_topk_aux_loss`, after eai-sparsify): the top d_out/2 dead features of each
        token reconstruct what the live ones left, without b_dec; only the dead columns are computed."""
        d = self.dictionary
        dead_features = dead.nonzero().squeeze(-1)
        k_aux = d.cfg.d_out // 2
        scale = min(len(dead_features) / k_aux, 1.0)
        k_aux = min(k_aux, len(dead_features))
        pre_dead = self.encoder_input(x) @ d.W_enc[:, dead_features] + d.b_enc[dead_features]
        values, chosen = pre_dead.topk(k_aux, dim=-1, sorted=False)
        residual = (y - recons).detach()
        predicted = F.embedding_bag(dead_features[chosen], d.W_dec, per_sample_weights=values, mode="sum")
        return {"auxk": self.spec.aux_coefficient * scale * (predicted - residual).pow(2).sum(-1).mean()}


class BatchTopKTrainer(TopKTrainer):
    """The k x tokens largest activations of the batch (SAELens' BatchTopKTrainingSAE); saved as JumpReLU with the
    running threshold for every feature."""

    def __init__(self, spec: DictionarySpec, cfg: DictionaryConfig, generator: torch.Generator):
        super().__init__(spec, cfg, generator)
        self.threshold: float | None = None  # float64 running minimum of the kept activations

    def forward(self, batch: dict[str, Tensor], dead: Tensor | None) -> StepResult:
        return DictionaryTrainer.forward(self, batch, dead)

    def encode_for_training(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        d = self.dictionary
        pre = x @ d.W_enc + d.b_enc
        acts = F.relu(pre)
        flat = acts.flatten()
        values, indices = flat.topk(min(flat.numel(), int(self.spec.k * acts.shape[0])), sorted=False)
        kept = torch.zeros_like(flat).scatter(0, indices, values).view_as(acts)
        with torch.no_grad():
            positive = values[values > 0]
            if positive.numel():
                smallest = float(positive.min())
                rate = BATCHTOPK_THRESHOLD_RATE
                self.threshold = smallest if self.threshold is None else (1 - rate) * self.threshold + rate * smallest
        return kept, {}

    @torch.no_grad()
    def export(self) -> Dictionary:
        out = super().export()
        out.threshold.fill_(self.threshold or 0.0)
        return out


class JumpReLUTrainer(DictionaryTrainer):
    """relu(pre) * (pre > threshold), threshold learnt by a straight-through estimator; L0 penalty (SAELens'
    JumpReLUTrainingSAE, "step" mode)."""

    def __init__(self, spec: DictionarySpec, cfg: DictionaryConfig, generator: torch.Generator):
        super().__init__(spec, cfg, generator)
        with torch.no_grad():
            self.dictionary.threshold.fill_(JUMPRELU_INIT_THRESHOLD)

    def encode_for_training(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        d = self.dictionary
        with torch.no_grad():  # kept >= 0, projected rather than clamped in the graph (SAELens)
            d.threshold.clamp_(min=0.0)
        pre = x @ d.W_enc + d.b_enc
        acts = JumpReLU.apply(pre, d.threshold, JUMPRELU_BANDWIDTH)
        l0 = StepFunction.apply(pre, d.threshold, JUMPRELU_BANDWIDTH).sum(-1).mean()
        return acts, {"l0": self.spec.l0_coefficient * l0}

    def _resampled(self, features: Tensor) -> None:
        self.dictionary.threshold[features] = JUMPRELU_INIT_THRESHOLD


# ============================================================================= autograd pieces
class TopKEncode(torch.autograd.Function):
    """(relu of the k largest pre-activations [tokens k], their feature indices) of x - b_dec, with a backward that
    touches only the chosen features: W_enc's gradient is a sparse [d_sae tokens] product, b_enc's and b_dec's
    per-feature sums (after eai-sparsify 1.3.3 `fused_encoder.py`, whose index_add the sparse product replaces).
    The pre-activations [tokens d_sae], the step's largest tensor, exist a block of rows at a time (`PRE_BYTES`)."""

    @staticmethod
    def forward(ctx, x, b_dec, W_enc, b_enc, k):
        centred = x - b_dec if b_dec is not None else x
        rows = max(1, PRE_BYTES // (W_enc.shape[1] * W_enc.element_size()))
        chosen = [torch.addmm(b_enc, block, W_enc).topk(k, dim=-1, sorted=False) for block in centred.split(rows)]
        acts = torch.cat([block.values for block in chosen]).relu_()
        indices = torch.cat([block.indices for block in chosen])
        ctx.save_for_backward(centred, W_enc, indices, acts)
        ctx.has_b_dec = b_dec is not None
        ctx.mark_non_differentiable(indices)
        return acts, indices

    @staticmethod
    def backward(ctx, grad_acts, grad_indices):
        centred, W_enc, indices, acts = ctx.saved_tensors
        n, k = indices.shape
        d_sae = W_enc.shape[1]
        grad = (grad_acts * (acts > 0)).reshape(-1)
        features = indices.reshape(-1)
        tokens = torch.arange(n, device=indices.device).repeat_interleave(k)
        by_feature = torch.sparse_coo_tensor(torch.stack([features, tokens]), grad, (d_sae, n), check_invariants=False)
        grad_W_enc = torch.sparse.mm(by_feature, centred).T  # [d_in d_sae]
        grad_b_enc = torch.zeros(d_sae, dtype=grad.dtype, device=grad.device).index_add_(0, features, grad)
        grad_b_dec = -(W_enc @ grad_b_enc) if ctx.has_b_dec else None
        return None, grad_b_dec, grad_W_enc, grad_b_enc, None


def _rectangle(x: Tensor) -> Tensor:
    return ((x > -0.5) & (x < 0.5)).to(x)


class JumpReLU(torch.autograd.Function):
    """relu(x) * (x > threshold); the threshold's gradient through a rectangle kernel of width `bandwidth`
    (SAELens 6.54 `jumprelu_sae.py`, with jumprelu_ste_to_input=False)."""

    @staticmethod
    def forward(ctx, x, threshold, bandwidth):
        ctx.save_for_backward(x, threshold)
        ctx.bandwidth = bandwidth
        return x * (x > threshold)

    @staticmethod
    def backward(ctx, grad_output):
        x, threshold = ctx.saved_tensors
        bandwidth = ctx.bandwidth
        ste = (threshold / bandwidth) * _rectangle((x - threshold) / bandwidth) * grad_output
        return (x > threshold) * grad_output, -ste.sum(0), None


class StepFunction(torch.autograd.Function):
    """The step function (x > threshold) with the same estimator for the threshold (SAELens' `Step`)."""

    @staticmethod
    def forward(ctx, x, threshold, bandwidth):
        ctx.save_for_backward(x, threshold)
        ctx.bandwidth = bandwidth
        return (x > threshold).to(x)

    @staticmethod
    def backward(ctx, grad_output):
        x, threshold = ctx.saved_tensors
        bandwidth = ctx.bandwidth
        ste = (1.0 / bandwidth) * _rectangle((x - threshold) / bandwidth) * grad_output
        return None, -ste.sum(0), None
