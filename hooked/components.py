"""Each component's write to the residual stream, read out of an `ActivationCache`: heads, neurons, experts,
and the full decomposition into all of them (TransformerLens' `stack_head_results`, `get_neuron_results`,
`stack_neuron_results`, `get_full_resid_decomposition`, and hooked's `get_expert_results` /
`stack_expert_results`).

A block that normalises its sublayer outputs before the residual add (it declares `output_norms`: OLMo 2,
Gemma 2 and 3) adds no head's or neuron's write as it is: these helpers refuse it (`additive_writes`),
unless the caller asks for each write carried through the norm at its cached scale (`through_post_norm=True`,
`docs/hooks.md`). `ComponentWrites` is a mixin of `hooked.decomposition.ResidualDecomposition`, whose
helpers (`_slice`, `_layers_upto`, `apply_ln_to_stack`, ...) it uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hooked.layers import RMSNorm
from hooked.names import PosSlice, Slice, act_name

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer


class ComponentWrites:
    """Per-component writes to the residual stream (a mixin of `ResidualDecomposition`: no state of its own)."""

    def compute_head_results(self) -> None:
        """Put each head's write to the residual stream, `z[..., h, :] @ W_O[h]`, in the cache as
        `blocks.{i}.attn.hook_result` [batch pos head_index d_model] where it is not there already."""
        for i in range(self.model.cfg.n_layers):
            name = act_name("result", i)
            if name not in self.cache_dict:
                self.cache_dict[name] = self._head_results(i)

    def _head_results(self, layer: int, through_post_norm: bool = False) -> Tensor:
        """Block `layer`'s per-head writes [batch pos head_index d_model] (`hook_result`). With `through_post_norm`,
        on a block that normalises its attention output before the add, each head's write carried through that
        norm at the scale it had in this forward (see `stack_head_results`)."""
        post_norm = self._post_norm(layer, "attn") if through_post_norm else None
        if post_norm is None:
            additive_writes(self.model, layer, "per-head results (stack_head_results, get_full_resid_decomposition)")
        result = self._computed_head_results(layer)
        return result if post_norm is None else _through(result, *post_norm, extra_axis=True)

    def _post_norm(self, layer: int, sublayer: str) -> tuple[Tensor, Tensor] | None:
        """(gain [d_model], cached scale [batch pos 1]) of the norm block `layer` applies to its `sublayer`'s output
        ("attn" or "mlp") before the residual add; None where it adds the output as it is. A block's
        `output_norms` names its attention's norm, then its MLP's."""
        norms = getattr(type(self.model.blocks[layer]), "output_norms", ())
        if not norms:
            return None
        name = norms[0 if sublayer == "attn" else 1]
        norm = getattr(self.model.blocks[layer], name)
        if not isinstance(norm, RMSNorm):
            raise ValueError(
                f"blocks.{layer}.{name} is a {type(norm).__name__}, not an RMSNorm: through_post_norm"
                " divides by an RMS norm's cached scale only"
            )
        scale_name = f"blocks.{layer}.{name}.hook_scale"
        if scale_name not in self.cache_dict:
            raise KeyError(
                f"through_post_norm=True reads {scale_name} (the scale block {layer}'s post-norm divided by in"
                " this forward); this cache lacks it: cache it too (run_with_cache without a names_filter keeps it)"
            )
        return norm.gain.detach(), self.cache_dict[scale_name]

    def _computed_head_results(self, layer: int) -> Tensor:
        name = act_name("result", layer)
        if name in self.cache_dict:
            return self.cache_dict[name]
        z = self["z", layer]
        attention = self.model.blocks[layer].attn
        w_o = attention.W_O.detach().to(z.device, z.dtype)
        if getattr(self.model, "tensor_parallel", False):  # this rank holds its heads' W_O: gather the writes
            from hooked.distributed import HookShard

            shard = HookShard(self.model.parallel, z.ndim - 2, attention.hook_z.shard.ranges)
            return shard.gather(torch.einsum("...hd,hdm->...hm", shard.local_part(z), w_o.to(z.device)))
        return torch.einsum("...hd,hdm->...hm", z, w_o)

    def stack_head_results(
        self,
        layer: int | None = -1,
        return_labels: bool = False,
        incl_remainder: bool = False,
        pos_slice: PosSlice = None,
        apply_ln: bool = False,
        through_post_norm: bool = False,
    ):
        """Every head's write to the residual stream for blocks before `layer` (-1 or None: all blocks).

        Uses cached `hook_result` where present, else computes `z[..., h, :] @ W_O[h]` from the
        cached `hook_z` and the model's weights. Returns [component, batch, pos, d_model] with labels
        `L{layer}H{head}`; `incl_remainder` appends what is left of the residual stream.

        A block that normalises its attention output before the add (OLMo 2, Gemma 2 and 3: a post-norm)
        does not add any head's `hook_result`, so it is refused unless `through_post_norm=True`, which
        gives each head's write carried through that RMS norm at the scale it had in this forward,
        `gain * result[h] / scale` (`ln1_post.hook_scale` on Gemma, `ln1.hook_scale` on OLMo 2): the norm
        is linear once its scale is fixed, so these sum to the block's `hook_attn_out` (what the residual
        stream gains), as `apply_ln=True` fixes the final norm's scale. It is the head's share of this
        forward's output, not what the head would add alone (that would change the scale).
        """
        upto = self._layers_upto(layer)
        components, labels = [], []
        for i in range(upto):
            result = self._slice(self._head_results(i, through_post_norm), pos_slice)
            head_axis = result.ndim - 2
            for h in range(result.shape[head_axis]):
                components.append(result.select(head_axis, h))
                labels.append(f"L{i}H{h}")
        stack = torch.stack(components) if components else self._empty_stack(pos_slice)
        return self._finish_stack(stack, labels, upto, pos_slice, incl_remainder, apply_ln, return_labels)

    def _finish_stack(
        self,
        stack: Tensor,
        labels: list[str],
        upto: int,
        pos_slice,
        incl_remainder: bool,
        apply_ln: bool,
        return_labels: bool,
    ):
        """A stack of per-component writes, with the rest of the residual as a last `remainder` row and the
        final norm's scale applied when asked: what every `stack_*_results` returns."""
        if incl_remainder:
            resid = self._slice(self._final_or_pre(upto), pos_slice)
            stack = torch.cat([stack, (resid - stack.sum(0))[None]])
            labels.append("remainder")
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, upto, pos_slice=pos_slice, has_batch_dim=self.has_batch_dim)
        return (stack, labels) if return_labels else stack

    def _neuron_factors(
        self, layer: int, neuron_slice, pos_slice: PosSlice, through_post_norm: bool
    ) -> tuple[Tensor, Tensor]:
        """(activations [batch pos neurons], W_out rows [neurons d_model]) whose product is each neuron's write;
        with `through_post_norm` on a post-norm block, the activations divided by the norm's cached scale and
        W_out multiplied by its gain (`_through`, split across the two factors so no d_mlp x d_model stack forms)."""
        post_norm = self._post_norm(layer, "mlp") if through_post_norm else None
        w_out = Slice(neuron_slice).apply(self._neuron_weights(layer, post_norm is not None), 0)
        acts = Slice(neuron_slice).apply(self._slice(self["post", layer], pos_slice), -1)
        if post_norm is None:
            return acts, w_out.to(acts.device, acts.dtype)
        gain, scale = post_norm
        scale = self._slice(scale, pos_slice).to(acts.device, torch.float32)  # [batch pos 1] (or pos dropped)
        acts = (acts.float() / scale).to(acts.dtype)
        return acts, (w_out.float() * gain.to(w_out.device, torch.float32)).to(acts.device, acts.dtype)

    def _neuron_weights(self, layer: int, through_post_norm: bool = False) -> Tensor:
        if not through_post_norm:
            additive_writes(self.model, layer, "per-neuron results (get_neuron_results, stack_neuron_results)")
        mlp = self.model.blocks[layer].mlp
        if mlp is None:
            raise ValueError(f"block {layer} is attention-only (cfg.attn_only): it has no MLP, so no neurons")
        if _has_experts(mlp):
            raise ValueError(
                f"blocks.{layer}.mlp is a mixture of experts, with no dense neurons: split it into its experts with"
                f" cache.get_expert_results({layer}) or cache.stack_expert_results() (labels L{layer}.E{{expert}}),"
                " or keep it whole with decompose_resid(mode='mlp')"
            )
        w_out = getattr(mlp, "W_out", None)
        if w_out is None or w_out.ndim != 2 or act_name("post", layer) not in self.model.hook_dict:
            raise ValueError(f"blocks.{layer}.mlp has no dense neurons: keep it whole with decompose_resid(mode='mlp')")
        return w_out.detach()

    def get_neuron_results(
        self,
        layer: int,
        neuron_slice: PosSlice = None,
        pos_slice: PosSlice = None,
        project_output_onto: Tensor | None = None,
        through_post_norm: bool = False,
    ) -> Tensor:
        """Each neuron's write to the residual stream in block `layer`: `post[..., n] * W_out[n]`.

        [batch pos d_mlp d_model] (neurons chosen by `neuron_slice`, an int or `Slice(int)` picks one
        and drops the axis, as TransformerLens). `project_output_onto` ([d_model] or [d_model k]) is
        contracted with W_out first, so the d_mlp x d_model product is never built. `through_post_norm`:
        on a block that normalises its MLP output before the add, each write carried through that norm at
        its cached scale (see `stack_head_results`); they sum to `hook_mlp_out`.
        """
        acts, w_out = self._neuron_factors(layer, neuron_slice, pos_slice, through_post_norm)
        if project_output_onto is None:
            return acts[..., None] * w_out
        projected = w_out @ project_output_onto.to(acts.device, acts.dtype)
        return acts * projected if projected.ndim == w_out.ndim - 1 else acts[..., None] * projected

    def stack_neuron_results(
        self,
        layer: int | None,
        pos_slice: PosSlice = None,
        neuron_slice: PosSlice = None,
        return_labels: bool = False,
        incl_remainder: bool = False,
        apply_ln: bool = False,
        project_output_onto: Tensor | None = None,
        through_post_norm: bool = False,
    ):
        """Every neuron's write to the residual stream for blocks before `layer` (-1 or None: all).

        Returns [component, batch, pos, d_model] (or the projection's width) with labels `L{layer}N{neuron}`.
        Memory grows as layers x d_mlp x batch x pos x d_model: slice, or pass `project_output_onto`.
        Attention-only blocks have no neurons: none are listed for them. `through_post_norm` as in
        `get_neuron_results` (refused without it where a norm sits between the MLP and the residual add).
        """
        upto = self._layers_upto(layer)
        mlp_layers = [i for i in range(upto) if self._has_mlp(i)]
        # An int picks one neuron per layer but keeps the axis: TransformerLens drops it here and then
        # concatenates the layers along the position axis.
        neuron_slice = Slice.unwrap(neuron_slice)
        neurons = neuron_slice.apply(torch.arange(self.model.cfg.d_mlp), 0).tolist()
        labels = [f"L{i}N{n}" for i in mlp_layers for n in neurons]
        project, squeeze = project_output_onto, False
        if project is not None and project.ndim == 1:
            project, squeeze = project[:, None], True
        if apply_ln and project is not None:  # never builds the d_model stack
            stack = self._neurons_normalized_and_projected(
                mlp_layers, upto, neuron_slice, pos_slice, project, incl_remainder, through_post_norm
            )
        else:
            per_layer = [
                self.get_neuron_results(i, neuron_slice, pos_slice, project, through_post_norm) for i in mlp_layers
            ]
            if per_layer:
                stack = torch.cat(per_layer, dim=-2).movedim(-2, 0)
            else:
                stack = self._empty_stack(pos_slice, None if project is None else project.shape[-1])
            if incl_remainder:
                resid = self._slice(self._final_or_pre(upto), pos_slice)
                if project is not None:
                    resid = resid @ project.to(resid.device, resid.dtype)
                stack = torch.cat([stack, (resid - stack.sum(0))[None]])
            if apply_ln:
                stack = self.apply_ln_to_stack(stack, upto, pos_slice=pos_slice, has_batch_dim=self.has_batch_dim)
        if incl_remainder:
            labels.append("remainder")
        if squeeze:
            stack = stack.squeeze(-1)
        return (stack, labels) if return_labels else stack

    def _neurons_normalized_and_projected(
        self,
        mlp_layers: list[int],
        upto: int,
        neuron_slice,
        pos_slice,
        project: Tensor,
        incl_remainder: bool,
        through_post_norm: bool = False,
    ) -> Tensor:
        """`stack_neuron_results(apply_ln=True, project_output_onto=project)` without the [neurons batch pos
        d_model] stack: the norm is linear in each neuron's write once its scale is fixed, so
        `norm(a_n W_n) @ p = (a_n / s) (norm_1(W_n) @ p)`, where `norm_1` is the norm with scale 1 (centring
        for LayerNorm, nothing for RMSNorm): only [d_mlp k] forms and [neurons batch pos k] results are built."""
        norm, scale = self._norm_and_scale(upto, False, pos_slice)
        per_layer = []
        for i in mlp_layers:
            acts, w_out = self._neuron_factors(i, neuron_slice, pos_slice, through_post_norm)
            form = norm.normalize_with_scale(w_out, torch.ones((), dtype=w_out.dtype, device=w_out.device))
            form = (form @ project.to(form.device, form.dtype)).to(acts.device, acts.dtype)
            per_layer.append((acts / scale.to(acts.device))[..., None] * form)
        if per_layer:
            stack = torch.cat(per_layer, dim=-2).movedim(-2, 0)
        else:
            stack = self._empty_stack(pos_slice, project.shape[-1])
        if incl_remainder:
            resid = self._slice(self._final_or_pre(upto), pos_slice)
            resid = norm.normalize_with_scale(resid, scale.to(resid.device)) @ project.to(resid.device, resid.dtype)
            stack = torch.cat([stack, (resid - stack.sum(0))[None]])
        return stack

    def get_expert_results(self, layer: int, pos_slice: PosSlice = None) -> Tensor:
        """Each expert's write to the residual stream in mixture-of-experts block `layer`: [batch pos n_experts
        d_model].

        Expert e's write at a token is its routing weight times its output, `weight * down_e(expert_post)`,
        summed over the slots that hold e; an expert the token was not routed to writes zeros. Summed
        over experts it is `mlp_out` (Qwen3-MoE has no shared expert and no output bias), up to float
        rounding. Computed from the cached `mlp.hook_expert_post`, `hook_expert_weights` and
        `hook_expert_indices` (a default cache keeps them) and the model's expert weights.
        """
        layer = layer + self.model.cfg.n_layers if layer < 0 else layer
        additive_writes(self.model, layer, "per-expert results (get_expert_results)")
        mlp = self.model.blocks[layer].mlp
        if not _has_experts(mlp):
            raise ValueError(
                f"blocks.{layer}.mlp is dense, with no experts: its neurons are cache.get_neuron_results({layer})"
            )
        needed = [f"blocks.{layer}.mlp.{hook}" for hook in mlp.expert_result_hooks]
        missing = [name for name in needed if name not in self.cache_dict]
        if missing:
            raise KeyError(
                f"the expert results of block {layer} are computed from {', '.join(needed)}; this cache lacks"
                f" {', '.join(missing)}: cache them too (run_with_cache without a names_filter keeps them)"
            )
        post, weights, indices = (self._slice(self.cache_dict[name], pos_slice) for name in needed)
        return mlp.expert_results(post, weights, indices)

    def stack_expert_results(
        self,
        layer: int | None = -1,
        return_labels: bool = False,
        incl_remainder: bool = False,
        pos_slice: PosSlice = None,
        apply_ln: bool = False,
    ):
        """Every expert's write to the residual stream for the mixture-of-experts blocks before `layer`
        (-1 or None: all blocks); dense blocks have none (their neurons: `stack_neuron_results`).

        Returns [component, batch, pos, d_model] with labels `L{layer}.E{expert}` (component addresses,
        as `ablate.hooks` takes them), block by block, as `stack_head_results` orders heads; experts a
        token was not routed to are zeros there. `incl_remainder` appends what is left of the residual
        stream. Memory grows as sparse layers x n_experts x batch x pos x d_model: slice positions.
        """
        if not any(_has_experts(block.mlp) for block in self.model.blocks):
            raise ValueError(
                f"{type(self.model).__name__} has no mixture-of-experts block: split its MLPs with stack_neuron_results"
            )
        upto = self._layers_upto(layer)
        components, labels = [], []
        for i in range(upto):
            if not _has_experts(self.model.blocks[i].mlp):
                continue
            results = self.get_expert_results(i, pos_slice)
            components.append(results.movedim(-2, 0))
            labels += [f"L{i}.E{e}" for e in range(results.shape[-2])]
        stack = torch.cat(components) if components else self._empty_stack(pos_slice)
        return self._finish_stack(stack, labels, upto, pos_slice, incl_remainder, apply_ln, return_labels)

    def get_full_resid_decomposition(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        expand_neurons: bool = True,
        apply_ln: bool = False,
        pos_slice: PosSlice = None,
        return_labels: bool = False,
        project_output_onto: Tensor | None = None,
        expand_experts: bool | None = None,
        through_post_norm: bool = False,
    ):
        """The residual stream into `layer` split into every head, every neuron (or MLP), the
        embeddings and the accumulated output biases, in TransformerLens' order: heads, neurons,
        `embed`, `pos_embed`, `bias`. The rows sum to the residual stream. [component, batch, pos, d_model].

        A mixture-of-experts block is split into its experts (`L{i}.E{e}`, see `get_expert_results`)
        when `expand_experts` (default: `expand_neurons`), else kept whole (`{i}_mlp_out`); the MLP rows
        come block by block, each block's dense neurons, experts or whole output in its place.

        `through_post_norm=True` decomposes blocks that normalise their outputs before the add (OLMo 2,
        Gemma 2 and 3; refused without it): heads, neurons and output biases carried through those norms at
        their cached scales (see `stack_head_results`), so the rows still sum to the residual stream; the
        `bias` row then varies by position.
        """
        upto = self._layers_upto(layer)
        if mlp_input and upto == self.model.cfg.n_layers:
            raise ValueError("mlp_input=True needs a block to feed; the final residual goes to the unembedding")
        self._check_mlp_input(upto, mlp_input)
        expand_experts = expand_neurons if expand_experts is None else expand_experts
        heads, head_labels = self.stack_head_results(
            upto + int(self._mlp_after_attention(upto, mlp_input)),
            pos_slice=pos_slice,
            return_labels=True,
            through_post_norm=through_post_norm,
        )
        mlps, mlp_labels = self._mlp_rows(upto, mlp_input, expand_neurons, expand_experts, pos_slice, through_post_norm)
        embeddings, embedding_labels = self._embedding_rows(pos_slice)
        bias = self._bias_row(upto, mlp_input, expand_neurons, pos_slice, through_post_norm, like=heads)
        stack = torch.cat([heads, *mlps, *embeddings, bias])
        labels = [*head_labels, *mlp_labels, *embedding_labels, "bias"]
        if apply_ln:
            stack = self.apply_ln_to_stack(
                stack, upto, mlp_input=mlp_input, pos_slice=pos_slice, has_batch_dim=self.has_batch_dim
            )
        if project_output_onto is not None:
            stack = stack @ project_output_onto.to(stack.device, stack.dtype)
        return (stack, labels) if return_labels else stack

    def _mlp_rows(
        self,
        upto: int,
        mlp_input: bool,
        expand_neurons: bool,
        expand_experts: bool,
        pos_slice: PosSlice,
        through_post_norm: bool,
    ) -> tuple[list[Tensor], list[str]]:
        """The MLP rows of `get_full_resid_decomposition` (stacks [component batch pos d_model], and their labels):
        every neuron, or each MLP whole, of the blocks before `upto`; block by block on a mixture-of-experts model."""
        if any(_has_experts(self.model.blocks[i].mlp) for i in range(upto)):
            return self._mlp_rows_by_block(upto, expand_neurons, expand_experts, pos_slice, through_post_norm)
        if not any(self._has_mlp(i) for i in range(upto)):  # as TransformerLens: no MLP rows on an attn_only model
            return [], []
        if expand_neurons:
            neurons, labels = self.stack_neuron_results(
                upto, pos_slice=pos_slice, return_labels=True, through_post_norm=through_post_norm
            )
        else:
            neurons, labels = self.decompose_resid(
                upto, mlp_input=mlp_input, mode="mlp", pos_slice=pos_slice, incl_embeds=False, return_labels=True
            )
        return [neurons], list(labels)

    def _mlp_rows_by_block(
        self, upto: int, expand_neurons: bool, expand_experts: bool, pos_slice: PosSlice, through_post_norm: bool
    ) -> tuple[list[Tensor], list[str]]:
        """`_mlp_rows` where some blocks are sparse: per block its experts, dense neurons or whole output, in place."""
        components, labels = [], []
        for i in filter(self._has_mlp, range(upto)):
            sparse = _has_experts(self.model.blocks[i].mlp)
            if sparse and expand_experts:
                components.append(self.get_expert_results(i, pos_slice).movedim(-2, 0))
                labels += [f"L{i}.E{e}" for e in range(components[-1].shape[0])]
            elif not sparse and expand_neurons:
                neurons = self.get_neuron_results(i, pos_slice=pos_slice, through_post_norm=through_post_norm)
                components.append(neurons.movedim(-2, 0))
                labels += [f"L{i}N{n}" for n in range(components[-1].shape[0])]
            else:
                components.append(self._slice(self["mlp_out", i], pos_slice)[None])
                labels.append(f"{i}_mlp_out")
        return components, labels

    def _embedding_rows(self, pos_slice: PosSlice) -> tuple[list[Tensor], list[str]]:
        """One row per embedding the model adds (`embed`, and `pos_embed` where it has one)."""
        names = self.model.embedding_hook_names
        return [self._slice(self[name], pos_slice)[None] for name in names], [n.removeprefix("hook_") for n in names]

    def _bias_row(
        self,
        upto: int,
        mlp_input: bool,
        include_mlp_biases: bool,
        pos_slice: PosSlice,
        through_post_norm: bool,
        like: Tensor,
    ) -> Tensor:
        """The `bias` row [1 batch pos d_model] (dtype and shape of `like`): the output biases summed up to the
        residual stream decomposed, carried through the post-norms of the blocks that have them when asked."""
        written = range(upto + int(self._mlp_after_attention(upto, mlp_input)))  # the blocks whose biases are summed
        if through_post_norm and any(getattr(type(self.model.blocks[i]), "output_norms", ()) for i in written):
            return self._biases_through_post_norms(upto, mlp_input, include_mlp_biases, pos_slice).to(like.dtype)[None]
        bias = accumulated_bias(self.model, upto, mlp_input, include_mlp_biases=include_mlp_biases)
        return bias.to(like.device, like.dtype).expand(1, *like.shape[1:])

    def _biases_through_post_norms(
        self, upto: int, mlp_input: bool, include_mlp_biases: bool, pos_slice: PosSlice
    ) -> Tensor:
        """`accumulated_bias` where some blocks normalise their outputs: each output bias (`b_O`, `b_out`) carried
        through its block's post-norm at the cached scale ([batch pos d_model]; zeros where the family has none)."""
        like = self._slice(self[self.model.embedding_hook_names[0]], pos_slice)
        total = torch.zeros(like.shape, dtype=torch.float32, device=like.device)
        for i in range(upto + int(self._mlp_after_attention(upto, mlp_input))):
            block = self.model.blocks[i]
            parts = [("attn", block.attn.b_O)]
            if include_mlp_biases and i < upto and block.mlp is not None:
                parts.append(("mlp", block.mlp.b_out))
            for sublayer, bias in parts:
                bias = bias.detach().to(like.device, torch.float32)
                post_norm = self._post_norm(i, sublayer)
                if post_norm is None:
                    total = total + bias
                else:
                    gain, scale = post_norm
                    total = total + _through(
                        bias.expand_as(total), gain, self._slice(scale, pos_slice)
                    )  # float32 in, float32 out
        return total


def _has_experts(mlp: torch.nn.Module | None) -> bool:  # None: an attn_only block's
    """Whether `mlp` is a mixture of experts: it declares `expert_results` and the hooks that feed it."""
    return hasattr(mlp, "expert_results")


def additive_writes(model: HookedTransformer, layer: int, what: str) -> None:
    """Raise unless block `layer` adds its sublayers' outputs to the residual stream as they are: a block that
    declares `output_norms` (OLMo 2 normalises the attention and MLP outputs before the add) has no additive
    per-head, per-neuron or per-expert writes, so `what` (a stack of them) would be silently wrong. (The
    circuits graph reads the same declaration and takes such a layer's attention as one node.)"""
    norms = getattr(type(model.blocks[layer]), "output_norms", ())
    if norms:
        raise ValueError(
            f"{what}: block {layer} normalises its sublayer outputs ({', '.join(norms)}) before adding them to the "
            "residual"
            " stream, so a head's hook_result, a neuron's post * W_out or a bias is not what it adds and these terms do"
            " not sum to the residual stream; pass through_post_norm=True for each term carried through that norm at"
            " its cached scale (stack_head_results, stack_neuron_results, get_neuron_results,"
            " get_full_resid_decomposition), or use decompose_resid (hook_attn_out / hook_mlp_out are the added terms)"
        )


def mlp_reads_attention(model: HookedTransformer, layer: int) -> bool:
    """Whether block `layer`'s MLP reads its attention's output (resid_mid): a sequential block declares the
    children its second half computes (`mlp_stage`); a parallel-residual one (GPT-NeoX) declares none, and
    its MLP reads resid_pre."""
    return bool(type(model.blocks[layer]).mlp_stage)


def accumulated_bias(
    model: HookedTransformer, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True
) -> Tensor:
    """The output biases (attention `b_O`, MLP `b_out`) written to the residual stream before block `layer`
    ([d_model]); `mlp_input` adds block `layer`'s attention bias, which its MLP reads (not in a parallel-residual
    block, whose MLP reads resid_pre: TransformerLens 3.9 adds it there too). `model.accumulated_bias(...)` in
    TransformerLens."""
    n_layers = model.cfg.n_layers
    if not 0 <= layer <= n_layers:
        raise IndexError(f"layer {layer} is out of range for {n_layers} layers (0..{n_layers})")
    if mlp_input and layer == n_layers:
        raise ValueError("Cannot include attn_bias from beyond the final layer")
    total = torch.zeros(model.cfg.d_model, device=model.device, dtype=model.dtype)
    for i in range(layer + int(mlp_input and mlp_reads_attention(model, layer))):
        additive_writes(model, i, "accumulated_bias")
        block = model.blocks[i]
        total = total + block.attn.b_O.detach()  # each family's attention declares b_O (zeros without a bias)
        if include_mlp_biases and i < layer and block.mlp is not None:  # an attention-only block has no MLP
            total = total + block.mlp.b_out.detach()
    return total


def _through(write: Tensor, gain: Tensor, scale: Tensor, extra_axis: bool = False) -> Tensor:
    """`write` [... d_model] carried through an RMS post-norm whose scale is fixed at `scale` [... 1] (the
    one it had in the forward): `gain * write / scale`, in float32 as the norm computes, cast back.
    `extra_axis`: `write` has a head or neuron axis before d_model that `scale` lacks."""
    if extra_axis:
        scale = scale[..., None, :]
    return (write.float() / scale.to(write.device, torch.float32) * gain.to(write.device, torch.float32)).to(
        write.dtype
    )
