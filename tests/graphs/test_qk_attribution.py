"""hooked.graphs.qk_attribution against the head's score written out in float64 torch on the weights, per family,
sharing no code with hooked/graphs/qk.py: the residual stream at a position built from the run's pieces (embeddings,
attention outputs, and the MLP outputs split by the transcoders' explicit arithmetic), each norm's scale computed
from that stream by hand, the raw projection weights (GPT-2's Conv1D columns, GPT-NeoX's interleaved rows, the
grouped q_proj / k_proj), the per-head (Qwen3, Gemma 3) or whole-projection (OLMo 2) q/k norms, and the half-split
rotary turn from the config's theta (GPT-NeoX's leading rotary_dim only; Gemma 3's local and scaled global tables).
Then an intervention: removing one key-side feature's write from the residual stream (norms frozen) moves the
model's own score by that feature's total.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch import Tensor

import hooked
import hooked.sae
from hooked import graphs
from hooked.graphs import page
from hooked.graphs import qk as qk_module
from hooked.graphs.heads import _attention, _ov_write
from hooked.testing import ARCHITECTURES
from tests.graphs.test_attribute import explicit_layers, tiny, transcoders_of

TOKENS = torch.tensor([3, 17, 42, 8, 25, 11, 60])
QUERY = 6
LAYER = 1  # the second of two blocks: layer 0's features, errors and attention output are in its residual stream


# ----------------------------------------------------------------------------- the reference
@torch.no_grad()
def reference_pieces(model, transcoders, position: int) -> dict[str, Tensor]:
    """label -> vector [d_model] of every piece of resid_pre of block LAYER at `position`, from the run's embedding
    and attention outputs and the transcoders' weights."""
    layers = explicit_layers(transcoders)
    names = [*model.embedding_hook_names, f"blocks.{LAYER}.hook_resid_pre", "blocks.0.hook_attn_out"]
    _, cache = model.run_with_cache(
        TOKENS[None], names_filter=names + [layer.read for layer in layers] + [layer.write for layer in layers]
    )
    pieces = {f"token {int(TOKENS[position])} @{position}": cache["hook_embed"][0, position]}
    if "hook_pos_embed" in cache:
        pieces[f"pos embed @{position}"] = cache["hook_pos_embed"][0, position]
    x = {m: cache[layers[m].read][0, position] for m in range(LAYER)}
    acts = {s: layers[s].features(x[s][None])[0] for s in range(LAYER)}
    for m in range(LAYER):
        pieces[f"attn L{m} @{position}"] = cache[f"blocks.{m}.hook_attn_out"][0, position]
        recon = layers[m].b_dec.clone()
        for s in range(m + 1):
            if m in layers[s].decoders:
                recon = recon + acts[s] @ layers[s].decoders[m]
        if layers[m].skip is not None:
            pieces[f"skip L{m} @{position}"] = x[m] @ layers[m].skip
            recon = recon + pieces[f"skip L{m} @{position}"]
        pieces[f"transcoder bias L{m} @{position}"] = layers[m].b_dec
        pieces[f"error L{m} @{position}"] = cache[layers[m].write][0, position] - recon
    for s in range(LAYER):
        for f in acts[s].nonzero().flatten().tolist():
            rows = sum(layers[s].decoders[m][f] for m in range(s, LAYER) if m in layers[s].decoders)
            pieces[f"L{s} F{f} @{position}"] = acts[s][f] * rows
    resid = cache[f"blocks.{LAYER}.hook_resid_pre"][0, position]
    torch.testing.assert_close(sum(pieces.values()), resid, rtol=1e-10, atol=1e-10)  # they are the stream
    return pieces


@torch.no_grad()
def reference_side(model, architecture: str, transcoders, head: int, position: int, side: str) -> dict[str, Tensor]:
    """label -> the term's part [d_head] of the rotated query ("q") or key ("k") at `position`, bias included."""
    cfg, block = model.cfg, model.blocks[LAYER]
    attn = block.attn
    pieces = reference_pieces(model, transcoders, position)
    resid = sum(pieces.values())
    n_heads, d_head = cfg.n_heads, cfg.d_head
    n_kv = getattr(cfg, "n_kv_heads", n_heads)
    index = head if side == "q" else head // (n_heads // n_kv)
    part = 0 if side == "q" else 1
    # the input norm: a linear map `norm` and a constant `shift`, the scale from the whole stream
    if architecture in ("gpt2", "gpt_neox"):
        centred = resid - resid.mean()
        scale = (centred.pow(2).mean() + cfg.layer_norm_eps).sqrt()
        norm = lambda v: (v - v.mean()) / scale * block.ln1.weight  # noqa: E731
        shift = block.ln1.bias
    elif architecture == "olmo2":  # no norm before attention
        norm, shift = (lambda v: v), torch.zeros_like(resid)
    else:
        scale = (resid.pow(2).mean() + cfg.rms_norm_eps).sqrt()
        gain = 1 + block.ln1.weight if architecture.startswith("gemma") else block.ln1.weight
        norm, shift = (lambda v: v / scale * gain), torch.zeros_like(resid)
    # the projection's rows for this head, and its bias
    if architecture == "gpt2":  # Conv1D [in, out], out = (q|k|v, head, d_head)
        columns = slice(part * cfg.d_model + index * d_head, part * cfg.d_model + (index + 1) * d_head)
        weight, bias = attn.c_attn.weight[:, columns].T, attn.c_attn.bias[columns]
    elif architecture == "gpt_neox":  # rows (head, q|k|v, d_head)
        weight = attn.query_key_value.weight.view(n_heads, 3, d_head, -1)[index, part]
        bias = attn.query_key_value.bias.view(n_heads, 3, d_head)[index, part]
    else:
        linear = attn.q_proj if side == "q" else attn.k_proj
        weight = linear.weight.view(-1, d_head, cfg.d_model)[index]
        bias = torch.zeros(d_head, dtype=resid.dtype) if linear.bias is None else linear.bias.view(-1, d_head)[index]
    # the q/k norm's scale, from the whole (every head's, for OLMo 2) projection of the stream
    qk_norm = None
    if architecture in ("qwen3", "qwen3_moe", "gemma3", "olmo2"):
        linear = attn.q_proj if side == "q" else attn.k_proj
        norm_module = attn.q_norm if side == "q" else attn.k_norm
        projected = norm(resid) + shift
        if architecture == "olmo2":
            whole = projected @ linear.weight.T + (0 if linear.bias is None else linear.bias)
            qk_scale = (whole.pow(2).mean() + cfg.rms_norm_eps).sqrt()
            qk_gain = norm_module.weight.view(-1, d_head)[index]
        else:
            own = projected @ weight.T + bias
            qk_scale = (own.pow(2).mean() + cfg.rms_norm_eps).sqrt()
            qk_gain = 1 + norm_module.weight if architecture == "gemma3" else norm_module.weight
        qk_norm = lambda v: v / qk_scale * qk_gain  # noqa: E731
    # the rotary turn of `position`: half-split pairs over the leading rotary_dim dimensions
    rotate = None
    if architecture != "gpt2":
        rotary_dim, theta, factor = cfg.rotary_dim if architecture == "gpt_neox" else d_head, cfg.rope_theta, 1.0
        if architecture == "gemma3":
            sliding = cfg.layer_types[LAYER] == "sliding_attention"
            theta = cfg.rope_local_theta if sliding else cfg.rope_theta
            scaling = cfg.rope_local_scaling if sliding else cfg.rope_scaling
            factor = 1.0 if scaling is None else scaling.factor
        inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)) / factor
        angle = position * inv_freq
        cos, sin = angle.cos(), angle.sin()

        def rotate(v):
            half = rotary_dim // 2
            x1, x2, rest = v[..., :half], v[..., half:rotary_dim], v[..., rotary_dim:]
            return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)

    def finish(v):
        v = qk_norm(v) if qk_norm is not None else v
        return rotate(v) if rotate is not None else v

    terms = {label: finish(norm(vector) @ weight.T) for label, vector in pieces.items()}
    terms["query bias" if side == "q" else "key bias"] = finish(shift @ weight.T + bias)
    return terms


def scaling_of(model, architecture: str) -> float:
    if architecture.startswith("gemma"):
        return model.cfg.query_pre_attn_scalar**-0.5
    return model.cfg.d_head**-0.5


@torch.no_grad()
def model_scores(model, head: int) -> Tensor:
    _, cache = model.run_with_cache(TOKENS[None], names_filter=f"blocks.{LAYER}.attn.hook_attn_scores")
    return cache[f"blocks.{LAYER}.attn.hook_attn_scores"][0, head, QUERY]


def numeric_labels(terms) -> list[str]:
    """The labels with a token's text as its id (the tiny models have no tokenizer, so they already are)."""
    return [t.label for t in terms]


# ----------------------------------------------------------------------------- the cases
CASES = [(architecture, "skip set") for architecture in ARCHITECTURES] + [
    ("llama", "clt"),  # a CLT feature writes to every layer below the head's: its piece sums those writes
    ("gpt_neox", "skip clt"),
    ("gemma2", "set"),
]


@pytest.fixture(scope="module")
def models():
    return {architecture: tiny(architecture) for architecture in ARCHITECTURES}


@pytest.mark.parametrize(("architecture", "kind"), CASES)
def test_every_term_is_the_float64_reference_and_the_pairs_add_up_to_the_models_score(models, architecture, kind):
    model = models[architecture]
    transcoders = transcoders_of(model, kind)
    head = model.cfg.n_heads - 1  # with grouped-query attention, a query head reading kv head > 0
    result = graphs.qk_attribution(model, TOKENS, transcoders, LAYER, head, QUERY)
    assert result.kv_head == head // (model.cfg.n_heads // getattr(model.cfg, "n_kv_heads", model.cfg.n_heads))
    expected_q = reference_side(model, architecture, transcoders, head, QUERY, "q")
    assert sorted(numeric_labels(result.query_terms)) == sorted(expected_q)
    magnitude = max(float(v.abs().max()) for v in expected_q.values())
    for term, vector in zip(result.query_terms, result.query_vectors, strict=True):
        # float32 storage of float64 arithmetic, and RMSNorms that run in float32 whatever the model's dtype
        torch.testing.assert_close(vector.double(), expected_q[term.label], rtol=1e-5, atol=1e-6 * magnitude)
    scores = model_scores(model, head)
    scaling = scaling_of(model, architecture)
    softcap = getattr(model.cfg, "attn_logit_softcapping", None)
    for key, terms, vectors in zip(result.keys, result.key_terms, result.key_vectors, strict=True):
        expected_k = reference_side(model, architecture, transcoders, head, key, "k")
        assert sorted(numeric_labels(terms)) == sorted(expected_k)
        for term, vector in zip(terms, vectors, strict=True):
            torch.testing.assert_close(vector.double(), expected_k[term.label], rtol=1e-5, atol=1e-6 * magnitude)
        form = scaling * sum(expected_q.values()) @ sum(expected_k.values())
        pairs = result.pairs(key)
        assert pairs.shape == (len(result.query_terms), len(terms))
        score = float(scores[key])
        predicted = form if softcap is None else softcap * math.tanh(form / softcap)
        assert predicted == pytest.approx(score, rel=1e-5, abs=1e-5)  # the reference is the model's score
        assert float(pairs.sum()) == pytest.approx(float(form), rel=1e-5, abs=1e-5)  # the pairs add up to it
        assert float(result.forms[result.keys.index(key)]) == pytest.approx(float(form), rel=1e-5, abs=1e-5)
        assert result.score(key) == pytest.approx(score, rel=1e-5, abs=1e-5)  # the score it reports: the hook's
    assert result.attributed == (
        "score" if softcap is None else f"form: the score is {softcap:g} * tanh(form / {softcap:g})"
    )
    visible = [k for k in range(QUERY + 1) if float(scores[k]) > torch.finfo(scores.dtype).min / 2]
    assert result.keys == visible  # the masked keys (a sliding window) are left out, and listed
    assert result.masked == [k for k in range(len(TOKENS)) if k not in visible]


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_removing_a_key_side_feature_moves_the_score_by_its_total(models, architecture):
    """Subtract the feature's write from the residual stream the head reads at the key position, every norm scale of
    the block held at its clean value: the score moves by minus that feature's key-side total."""
    model = models[architecture]
    transcoders = transcoders_of(model, "skip set")
    head, key = 0, QUERY - 1
    result = graphs.qk_attribution(model, TOKENS, transcoders, LAYER, head, QUERY, key=key)
    totals = result.key_totals(key)
    features = [(j, t) for j, t in enumerate(result.key_terms[0]) if t.kind == "feature"]
    j, term = max(features, key=lambda item: abs(float(totals[item[0]])))
    source, feature = map(int, re.match(r"L(\d+) F(\d+) @", term.label).groups())
    assert term.address == f"L{source}.mlp_out.F{feature}@{key}"
    layer = explicit_layers(transcoders)[source]
    with torch.no_grad():
        _, clean = model.run_with_cache(
            TOKENS[None], names_filter=lambda n: n == layer.read or n.startswith(f"blocks.{LAYER}.")
        )
        act = layer.features(clean[layer.read][0, key][None])[0, feature]
        write = act * layer.decoders[source][feature]

    frozen = [n for n in clean if n.startswith(f"blocks.{LAYER}.") and n.endswith("hook_scale")]
    scores = f"blocks.{LAYER}.attn.hook_attn_scores"
    seen = {}

    def remove(activation, hook):
        activation = activation.clone()
        activation[0, key] -= write
        return activation

    def keep(activation, hook):
        seen["scores"] = activation.detach().clone()

    hooks = [(f"blocks.{LAYER}.hook_resid_pre", remove), (scores, keep)]
    hooks += [(n, lambda activation, hook: clean[hook.name]) for n in frozen]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        model(TOKENS[None], stop_at_layer=LAYER + 1)
    before, after = float(clean[scores][0, head, QUERY, key]), float(seen["scores"][0, head, QUERY, key])
    softcap = result.softcap
    if softcap is not None:  # the form moves by the total: compare forms
        before, after = (softcap * math.atanh(s / softcap) for s in (before, after))
    assert abs(float(totals[j])) > 1e-3  # a feature that matters
    assert after - before == pytest.approx(-float(totals[j]), rel=1e-5, abs=1e-6)


def test_query_heads_of_one_group_share_the_key_side(models):
    model = models["llama"]  # 4 query heads, 2 key/value heads
    transcoders = transcoders_of(model, "set")
    a, b = (graphs.qk_attribution(model, TOKENS, transcoders, LAYER, h, QUERY) for h in (2, 3))
    assert a.kv_head == b.kv_head == 1
    for va, vb in zip(a.key_vectors, b.key_vectors, strict=True):
        assert torch.equal(va, vb)  # the same arithmetic on the same kv head's weights
    assert not torch.equal(a.query_vectors, b.query_vectors)


def test_results_list_the_top_pairs_and_plain_types(models):
    model = models["gpt2"]
    result = graphs.qk_attribution(model, TOKENS, transcoders_of(model, "set"), LAYER, 1, QUERY, top=5)
    rows = result.rows()
    assert len(rows) == 5 * len(result.keys)
    for key in result.keys:
        mine = [r for r in rows if r["key"] == key]
        full = result.pairs(key).flatten().abs().sort(descending=True).values[:5]
        assert [abs(r["contribution"]) for r in mine] == pytest.approx(full.tolist())
    as_dict = result.to_dict()
    assert as_dict["attributed"] == "score" and len(as_dict["keys"]) == len(result.keys)
    first = as_dict["keys"][0]
    assert sum(first["key_totals"].values()) == pytest.approx(first["form"], rel=1e-5, abs=1e-6)
    assert sum(first["query_totals"].values()) == pytest.approx(first["form"], rel=1e-5, abs=1e-6)
    assert "L1.H1" in repr(result)


def test_masked_keys_and_bad_indices_are_refused_by_name(models):
    model = models["mistral"]  # a sliding window of 4: query 6 sees keys 3..6
    transcoders = transcoders_of(model, "set")
    with pytest.raises(ValueError, match="outside the head's sliding window of 4"):
        graphs.qk_attribution(model, TOKENS, transcoders, LAYER, 0, QUERY, key=1)
    with pytest.raises(ValueError, match="after the query"):
        graphs.qk_attribution(model, TOKENS, transcoders, LAYER, 0, 2, key=4)
    with pytest.raises(ValueError, match="head must be a query head index in 0..3"):
        graphs.qk_attribution(model, TOKENS, transcoders, LAYER, 4, QUERY)
    with pytest.raises(ValueError, match="layer must be a block index in 0..1"):
        graphs.qk_attribution(model, TOKENS, transcoders, 2, 0, QUERY)
    with pytest.raises(ValueError, match="query must be a position"):
        graphs.qk_attribution(model, TOKENS, transcoders, LAYER, 0, 7)
    assert graphs.qk_attribution(model, TOKENS, transcoders, LAYER, 0, -1, key=-2).keys == [5]


def test_a_map_that_drops_the_keys_rotary_turn_fails_the_completeness_check(models, monkeypatch):
    """The guard qk_attribution runs on every call: terms that do not add up to the model's score raise."""
    model = models["llama"]
    original = qk_module.HeadMaps._after_projection

    def without_key_rotary(self, side, position, x):
        if side == "k":
            tables, self.tables = self.tables, None
            try:
                return original(self, side, position, x)
            finally:
                self.tables = tables
        return original(self, side, position, x)

    monkeypatch.setattr(qk_module.HeadMaps, "_after_projection", without_key_rotary)
    with pytest.raises(RuntimeError, match="not the model's score"):
        graphs.qk_attribution(model, TOKENS, transcoders_of(model, "set"), LAYER, 0, QUERY)


# ----------------------------------------------------------------------------- explain_heads
def test_explain_heads_picks_heads_on_cross_position_edges_and_attributes_their_scores(models):
    model = models["llama"]
    transcoders = transcoders_of(model, "skip set")
    graph = graphs.attribute(model, TOKENS, transcoders)
    heads = graphs.explain_heads(model, graph, transcoders, top=3, pairs=4)
    assert len(heads) == 3
    assert [h.score for h in heads] == sorted((h.score for h in heads), reverse=True)
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS[None], names_filter=lambda n: n.endswith("hook_pattern"))
    for h in heads:
        assert h.key < h.query  # an edge between positions
        assert all(share > 0 for _, _, share in h.edges)
        # the QK side is qk_attribution's own answer for that head and pair of positions
        alone = graphs.qk_attribution(model, TOKENS, transcoders, h.layer, h.head, h.query, key=h.key, top=4)
        torch.testing.assert_close(h.qk.pairs(h.key), alone.pairs(h.key))
        assert h.qk.scores == pytest.approx(alone.scores)
        # the attention weight it used is the model's pattern (hooked/graphs/heads.py `_attention`)
        run = qk_module.QKRun(model, TOKENS, transcoders, [h.layer])
        weight = _attention(run, run.head(h.layer, h.head), h.query, h.key)
        pattern = float(cache[f"blocks.{h.layer}.attn.hook_pattern"][0, h.head, h.query, h.key])
        assert weight == pytest.approx(pattern, rel=1e-5)
    assert len(heads.rows()) == 3 * 4
    # the page's QK panel (Graph.show(qk=...)): each head's pairs on the target of its strongest edge, whose
    # positions are the ones its QK side attributes
    shown = heads.page_qk()
    for h in heads:
        assert graph.node(h.target).position == h.query
        listed = [(q, k, v) for q, k, v in shown[h.target] if q.startswith(f"L{h.layer}.H{h.head} q: ")]
        assert [v for *_, v in listed] == [v for *_, v in h.qk.top_pairs(h.key)]
        keys = {t.label: t.position for _, t, _ in h.qk.top_pairs(h.key)}
        assert all(keys[k] in (h.key, None) for _, k, _ in listed)  # None: the key bias
    data = page.page_data(graph, qk=shown)
    assert {node["i"] for node in data["nodes"] if node.get("qk")} == set(shown)
    assert set(heads.to_dict()["heads"][0]) == {"layer", "head", "score", "edges", "qk"}
    with pytest.raises(ValueError, match="top must be a positive integer"):
        graphs.explain_heads(model, graph, transcoders, top=0)


def test_terms_are_named_and_addressed_as_the_graphs_nodes():
    """On the bundled IOI model (a tokenizer: token labels carry the text), every feature, error and token node the
    graph has below the head's layer is a key-side term at its position, with the graph's label and address."""
    model = hooked.load("hooked/ioi-gpt2")
    transcoders = hooked.sae.load("hooked/ioi-gpt2/saes/transcoders", model=model)
    prompt = "When Mary and John went to the store, John gave a drink to"
    graph = graphs.attribute(model, prompt, transcoders)
    layer = 2
    result = graphs.qk_attribution(model, prompt, transcoders, layer, 0, -1)
    terms = {key: {t.label: t for t in result.key_terms[i]} for i, key in enumerate(result.keys)}
    checked = 0
    for i in range(graph.logit_offset):
        node = graph.node(i)
        if node.kind != "token" and node.layer >= layer:
            continue
        term = terms[node.position][graph.node_label(i, model.tokenizer)]
        assert term.kind == node.kind
        if node.kind == "feature":
            assert term.address == graph.feature_address(i)
        checked += 1
    assert checked > graph.n_pos * (layer + 1)  # tokens, errors and many features


def test_explain_heads_ov_write_is_the_heads_value_path_on_the_weights(models):
    """`_ov_write` (the size of what a head writes when it reads a piece) against GPT-2's raw weights: the piece
    through ln1 at the key position's scale (computed by hand from the stream), c_attn's value columns, c_proj's
    rows of the head."""
    model = models["gpt2"]
    transcoders = transcoders_of(model, "set")
    cfg, key, head = model.cfg, 3, 2
    run = qk_module.QKRun(model, TOKENS, transcoders, [LAYER])
    pieces = reference_pieces(model, transcoders, key)
    piece = pieces[f"error L0 @{key}"]
    resid = sum(pieces.values())
    scale = ((resid - resid.mean()).pow(2).mean() + cfg.layer_norm_eps).sqrt()
    block = model.blocks[LAYER]
    columns = slice(2 * cfg.d_model + head * cfg.d_head, 2 * cfg.d_model + (head + 1) * cfg.d_head)
    with torch.no_grad():
        normed = (piece - piece.mean()) / scale * block.ln1.weight
        value = normed @ block.attn.c_attn.weight[:, columns]
        write = value @ block.attn.c_proj.weight[head * cfg.d_head : (head + 1) * cfg.d_head]
    assert _ov_write(run, run.head(LAYER, head), key, piece) == pytest.approx(float(write.norm()), rel=1e-6)
