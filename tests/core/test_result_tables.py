"""Every analysis result is a table with one home (hooked/tables.py): `table()`, `to_csv(path)` and `to_dict()` come
from the one method each result implements, `rows()`.

Each result is built here by hand from a tiny case whose numbers are exact in float32 (halves and quarters), and its
CSV text and dict are compared with literals written out below: what these classes wrote before they shared the
base (issue 40), so the move changed no byte. The literals were worked out by hand from the definitions (ranks by
|score|, means of two prompts, change = mean - base mean) and checked against the code as it was before the move.
"""

from __future__ import annotations

import sys

import pytest
import torch

from hooked.analysis import PositionAttention
from hooked.circuits.attribution import EdgeScores
from hooked.circuits.graph import graph_of_shape
from hooked.interventions.results import SweepResult
from hooked.sae.attribution import FeatureScores
from hooked.sae.evaluation import COLUMNS, EvaluationTable
from hooked.tables import ResultTable


def sweep() -> SweepResult:
    values = torch.tensor([[0.5, 1.5], [-1.0, 0.0]])  # [variant prompt]
    return SweepResult(["L0H0", "L0H1"], values, torch.tensor([1.0, 2.0]), "logit_diff", {"model": "tiny"})


SWEEP_CSV = (
    "variant,logit_diff,change,p0,p1\r\nbase,1.5,0.0,1.0,2.0\r\nL0H0,1.0,-0.5,0.5,1.5\r\nL0H1,-0.5,-2.0,-1.0,0.0\r\n"
)
SWEEP_DICT = {
    "metric": "logit_diff",
    "variants": ["L0H0", "L0H1"],
    "values": [[0.5, 1.5], [-1.0, 0.0]],
    "base": [1.0, 2.0],
    "provenance": {"model": "tiny"},
}


def edges() -> EdgeScores:
    # One layer, one head, no MLP: sources input, L0H0; receivers L0H0.q, L0H0.k, L0H0.v, logits.
    graph = graph_of_shape(1, 1, 1, mlp_layers=())
    matrix = torch.tensor([[0.5, -2.0, 0.25, 1.0], [0.0, 0.0, 0.0, -0.75]])  # [source receiver]
    return EdgeScores(graph, matrix, "eap", {"model": "tiny"})


EDGES_CSV = (
    "edge,source,receiver,score,rank\r\n"
    "input->L0H0.k,input,L0H0.k,-2.0,1\r\n"
    "input->logits,input,logits,1.0,2\r\n"
    "L0H0->logits,L0H0,logits,-0.75,3\r\n"
    "input->L0H0.q,input,L0H0.q,0.5,4\r\n"
    "input->L0H0.v,input,L0H0.v,0.25,5\r\n"
)
EDGES_DICT = {
    "method": "eap",
    "scores": {
        "input->L0H0.q": 0.5,
        "input->L0H0.k": -2.0,
        "input->L0H0.v": 0.25,
        "input->logits": 1.0,
        "L0H0->logits": -0.75,
    },
    "provenance": {"model": "tiny"},
}


def features() -> FeatureScores:
    names = ["L0.resid_post.F0", "L0.resid_post.F1", "L1.mlp_out.F3"]
    per_prompt = torch.tensor([[0.0, -1.0, 0.5], [1.0, -2.0, 0.0]])  # [prompt feature]
    return FeatureScores(
        names, per_prompt.mean(0), per_prompt, torch.tensor([1.0, 2.0]), torch.tensor([0.5, -0.5]), None, {"m": 1}
    )


FEATURES_CSV = (
    "feature,point,index,score,rank\r\n"
    "L0.resid_post.F1,L0.resid_post,1,-1.5,1\r\n"
    "L0.resid_post.F0,L0.resid_post,0,0.5,2\r\n"
    "L1.mlp_out.F3,L1.mlp_out,3,0.25,3\r\n"
)
FEATURES_DICT = {
    "scores": {"L0.resid_post.F0": 0.5, "L0.resid_post.F1": -1.5, "L1.mlp_out.F3": 0.25},
    "clean": [1.0, 2.0],
    "corrupt": [0.5, -0.5],
    "provenance": {"m": 1},
}


def evaluation() -> EvaluationTable:
    row = dict(
        zip(
            COLUMNS, ["sae", "blocks.0.hook_resid_post", None, 8, 2.5, 0.25, 3.0, 3.5, 5.0, 0.75, 1, 0, 12], strict=True
        )
    )
    return EvaluationTable([row])


EVALUATION_CSV = (
    "dictionary,hook_name,hook_name_out,d_sae,l0,fvu,ce_clean,ce_spliced,ce_zero_ablated,loss_recovered,"
    "dead_features,dense_features,n_tokens\r\n"
    "sae,blocks.0.hook_resid_post,,8,2.5,0.25,3.0,3.5,5.0,0.75,1,0,12\r\n"
)


def attention() -> PositionAttention:
    values = torch.tensor([[[[0.5, 0.25], [0.0, 1.0]]], [[[1.5, 0.75], [1.0, 0.0]]]])  # [prompt layer head name]
    return PositionAttention(values, ("IO", "S1"))


ATTENTION_CSV = "layer,head,IO,S1\r\n0,0,1.0,0.5\r\n0,1,0.5,0.5\r\n"


@pytest.mark.parametrize(
    ("make", "expected_csv"),
    [(sweep, SWEEP_CSV), (edges, EDGES_CSV), (features, FEATURES_CSV), (evaluation, EVALUATION_CSV)],
)
def test_csv_is_what_it_was(make, expected_csv, tmp_path):
    path = make().to_csv(tmp_path / "deeper" / "result.csv")  # the folder is made
    assert path == tmp_path / "deeper" / "result.csv"
    assert path.read_bytes() == expected_csv.encode()


@pytest.mark.parametrize(("make", "expected"), [(sweep, SWEEP_DICT), (edges, EDGES_DICT), (features, FEATURES_DICT)])
def test_dict_is_what_it_was(make, expected):
    assert make().to_dict() == expected


def test_the_results_that_had_no_csv_or_dict_get_them_from_their_rows(tmp_path):
    assert attention().to_csv(tmp_path / "attention.csv").read_bytes() == ATTENTION_CSV.encode()
    assert attention().to_dict() == {
        "rows": [{"layer": 0, "head": 0, "IO": 1.0, "S1": 0.5}, {"layer": 0, "head": 1, "IO": 0.5, "S1": 0.5}]
    }
    (row,) = evaluation()
    assert evaluation().to_dict() == {"rows": [row]}


@pytest.mark.parametrize(
    ("make", "index", "columns", "first"),
    [
        (sweep, ["variant"], ["logit_diff", "change", "p0", "p1"], ("base", [1.5, 0.0, 1.0, 2.0])),
        (edges, ["edge"], ["source", "receiver", "score", "rank"], ("input->L0H0.k", ["input", "L0H0.k", -2.0, 1])),
        (
            features,
            ["feature"],
            ["point", "index", "score", "rank"],
            ("L0.resid_post.F1", ["L0.resid_post", 1, -1.5, 1]),
        ),
        (evaluation, [None], list(COLUMNS), (0, ["sae", "blocks.0.hook_resid_post", None, 8, 2.5, 0.25, 3.0, 3.5])),
        (attention, ["layer", "head"], ["IO", "S1"], ((0, 0), [1.0, 0.5])),
    ],
)
def test_table_is_a_dataframe_of_the_rows(make, index, columns, first):
    frame = make().table()
    assert list(frame.index.names) == index and list(frame.columns) == columns
    label, values = first
    assert frame.index[0] == label and list(frame.iloc[0])[: len(values)] == values
    assert len(frame) == len(make().rows())


def test_table_without_pandas_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    for make in (sweep, edges, features, evaluation, attention):
        name = type(make()).__name__
        with pytest.raises(
            ImportError, match=rf"{name}.table\(\) makes a pandas DataFrame.*pip install 'hooked\[plot\]'"
        ):
            make().table()


def test_a_result_without_rows_is_refused_where_it_is_defined():
    with pytest.raises(TypeError, match=r"Scores is a ResultTable but lacks a rows\(\) method"):

        class Scores(ResultTable):
            table_index = "name"

    with pytest.raises(TypeError, match=r"Named is a ResultTable but lacks a `table_index`"):

        class Named(ResultTable):
            def rows(self) -> list[dict]:
                return [{"name": "a"}]

    class Fine(ResultTable):
        table_index = "name"

        def rows(self) -> list[dict]:
            return [{"name": "a", "score": 0.5}]

    assert Fine().to_dict() == {"rows": [{"name": "a", "score": 0.5}]}
