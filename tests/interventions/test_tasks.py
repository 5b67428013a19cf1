"""Tasks: the IOI templates and their ABBA/BABA structure, corruptions, seeding, facts, Task itself.

The checks read the prompts back with regular expressions built from the templates, not with the
generator's own helpers, so a slot filled wrongly shows up as a prompt that does not parse.
"""

import json
import re

import pytest
import torch

import hooked
from hooked import tasks
from hooked.interventions.tasks import (
    ABBA_TEMPLATES,
    BABA_TEMPLATES,
    FACTS,
    NAMES,
    OBJECTS,
    PLACES,
    STORE_TEMPLATE,
    Task,
)


def names_in(prompt: str) -> list[str]:
    """The names of a prompt, in order (template words like 'Then' or 'When' are not names)."""
    return [word for word in re.findall(r"[A-Z][a-z]+", prompt) if word in NAMES]


def template_regex(template: str, io: str, s: str) -> re.Pattern:
    """A pattern the template filled with IO and S matches, place and object left free."""
    pattern = re.escape(template[: -len(" [A]")])
    pattern = pattern.replace(re.escape("[A]"), io).replace(re.escape("[B]"), s)
    pattern = pattern.replace(re.escape("[PLACE]"), "(?P<place>[a-z]+)", 1).replace(re.escape("[PLACE]"), "(?P=place)")
    pattern = pattern.replace(re.escape("[OBJECT]"), "(?P<object>[a-z]+)", 1).replace(
        re.escape("[OBJECT]"), "(?P=object)"
    )
    return re.compile(pattern)


# ----------------------------------------------------------------------------- templates
def test_fifteen_baba_and_fifteen_abba_templates():
    assert len(BABA_TEMPLATES) == 15 and len(set(BABA_TEMPLATES)) == 15
    assert len(ABBA_TEMPLATES) == 15 and len(set(ABBA_TEMPLATES)) == 15


@pytest.mark.parametrize("index", range(15))
def test_abba_template_is_baba_with_the_first_clause_swapped(index):
    baba, abba = BABA_TEMPLATES[index], ABBA_TEMPLATES[index]
    assert re.findall(r"\[([AB])\]", baba) == ["B", "A", "B", "A"]
    assert re.findall(r"\[([AB])\]", abba) == ["A", "B", "B", "A"]
    # Only the names moved: the words around them are the same.
    assert re.sub(r"\[[AB]\]", "_", baba) == re.sub(r"\[[AB]\]", "_", abba)


def test_store_template_is_the_running_example():
    assert STORE_TEMPLATE == "When [A] and [B] went to the store, [B] gave a drink to [A]"


def test_name_lists_are_distinct_single_words():
    assert len(NAMES) >= 100 and len(set(NAMES)) == len(NAMES)
    assert all(re.fullmatch(r"[A-Z][a-z]+", name) for name in NAMES)
    assert all(re.fullmatch(r"[a-z]+", word) for word in PLACES + OBJECTS)


# ----------------------------------------------------------------------------- IOI structure
@pytest.mark.parametrize("template", ["baba", "abba"])
def test_every_prompt_fills_its_template_and_ends_before_the_io(template):
    task = tasks.ioi(120, seed=1, template=template)
    templates = BABA_TEMPLATES if template == "baba" else ABBA_TEMPLATES
    assert set(task.per_prompt["template_id"]) == set(range(15))  # 120 draws reach every template
    for prompt, correct, incorrect, template_id in zip(
        task.clean, task.correct, task.incorrect, task.per_prompt["template_id"], strict=True
    ):
        io, s = correct[1:], incorrect[1:]
        assert correct == " " + io and incorrect == " " + s and io != s
        match = template_regex(templates[template_id], io, s).fullmatch(prompt)
        assert match, (prompt, templates[template_id])
        assert match.groupdict().get("place", "store") in PLACES
        assert match.groupdict().get("object", "drink") in OBJECTS


def test_baba_names_the_subject_first_and_abba_the_indirect_object():
    for prompt, correct, incorrect in zip(*_columns(tasks.ioi(40, seed=2, template="baba")), strict=True):
        assert names_in(prompt) == [incorrect[1:], correct[1:], incorrect[1:]]  # S1, IO, S2
    for prompt, correct, incorrect in zip(*_columns(tasks.ioi(40, seed=2, template="abba")), strict=True):
        assert names_in(prompt) == [correct[1:], incorrect[1:], incorrect[1:]]  # IO, S1, S2


def test_mixed_alternates_abba_and_baba():
    task = tasks.ioi(10, seed=3)
    assert task.per_prompt["order"] == ["ABBA", "BABA"] * 5
    for prompt, correct, incorrect, order in zip(*_columns(task), task.per_prompt["order"], strict=True):
        io, s = correct[1:], incorrect[1:]
        assert names_in(prompt) == ([io, s, s] if order == "ABBA" else [s, io, s])


def test_store_template_prompts():
    task = tasks.ioi(6, seed=4, template="store")
    for prompt, correct, incorrect, order in zip(*_columns(task), task.per_prompt["order"], strict=True):
        first, second = (correct[1:], incorrect[1:]) if order == "ABBA" else (incorrect[1:], correct[1:])
        assert prompt == f"When {first} and {second} went to the store, {incorrect[1:]} gave a drink to"
    assert task.per_prompt["order"] == ["ABBA", "BABA"] * 3


# ----------------------------------------------------------------------------- corruptions
@pytest.mark.parametrize("template", ["mixed", "baba", "abba", "store"])
def test_swap_replaces_only_the_giver_by_the_indirect_object(template):
    task = tasks.ioi(30, seed=5, template=template, corruption="swap")
    for clean, corrupt, correct, incorrect in zip(task.clean, task.corrupt, task.correct, task.incorrect, strict=True):
        clean_words, corrupt_words = clean.split(" "), corrupt.split(" ")
        assert len(clean_words) == len(corrupt_words)
        changed = [i for i, (a, b) in enumerate(zip(clean_words, corrupt_words, strict=True)) if a != b]
        assert len(changed) == 1
        # The changed word is S2, the last name of the prompt; in the corrupt prompt it is the IO.
        assert clean_words[changed[0]].strip(",.") == incorrect[1:]
        assert corrupt_words[changed[0]].strip(",.") == correct[1:]
        assert names_in(corrupt)[-1] == correct[1:] and names_in(clean)[-1] == incorrect[1:]


def test_abc_fills_the_three_name_slots_with_three_new_names():
    swap = tasks.ioi(40, seed=6, corruption="swap")
    abc = tasks.ioi(40, seed=6, corruption="abc")
    # Same clean prompts and answers: only the corrupt prompts change with the corruption.
    assert (abc.clean, abc.correct, abc.incorrect) == (swap.clean, swap.correct, swap.incorrect)
    for clean, corrupt, correct, incorrect in zip(abc.clean, abc.corrupt, abc.correct, abc.incorrect, strict=True):
        new_names = names_in(corrupt)
        assert len(new_names) == 3 and len(set(new_names)) == 3
        assert not set(new_names) & {correct[1:], incorrect[1:]}
        # Same template, place and object: the prompts agree once the names are blanked out.
        assert re.sub("|".join(names_in(clean)), "_", clean) == re.sub("|".join(new_names), "_", corrupt)


def test_custom_names_are_the_only_names_used():
    pool = ["Mary", "John", "Tom"]
    task = tasks.ioi(30, seed=0, names=pool)
    assert {name for prompt in task.clean for name in re.findall(r"Mary|John|Tom", prompt)} <= set(pool)
    assert {answer[1:] for answer in task.correct + task.incorrect} <= set(pool)
    assert task.params["names"] == pool


# ----------------------------------------------------------------------------- seeding and arguments
def test_same_seed_same_task_other_seed_other_prompts():
    assert tasks.ioi(16, seed=3) == tasks.ioi(16, seed=3)
    assert tasks.ioi(16, seed=3, corruption="abc") == tasks.ioi(16, seed=3, corruption="abc")
    assert tasks.ioi(16, seed=3).clean != tasks.ioi(16, seed=4).clean
    assert tasks.ioi(16, seed=3, corruption="abc").corrupt != tasks.ioi(16, seed=4, corruption="abc").corrupt


def test_generation_does_not_touch_the_global_random_state():
    import random

    random.seed(123)
    expected = random.random()
    random.seed(123)
    tasks.ioi(20, seed=0, corruption="abc")
    tasks.facts(seed=0)
    assert random.random() == expected


@pytest.mark.parametrize("n", [1, 7, 64])
def test_n_prompts_and_a_prefix_of_a_longer_task(n):
    task = tasks.ioi(n, seed=9, corruption="abc")
    assert len(task) == len(task.clean) == len(task.corrupt) == len(task.correct) == len(task.incorrect) == n
    assert task == tasks.ioi(64, seed=9, corruption="abc")[:n]


@pytest.mark.unchecked
@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"n": 0}, ValueError, ["n", "at least 1", "0"]),
        ({"n": -3}, ValueError, ["at least 1"]),
        ({"n": 2.5}, TypeError, ["int", "float"]),
        ({"n": 4, "template": "bab"}, ValueError, ["'bab'", "'baba'", "'abba'", "'mixed'", "'store'"]),
        ({"n": 4, "corruption": "none"}, ValueError, ["'none'", "'swap'", "'abc'"]),
        ({"n": 4, "names": ["Mary", "Mary"]}, ValueError, ["at least 2 distinct names", "1"]),
        ({"n": 4, "names": ["Mary", "John", "Tom", "Anna"], "corruption": "abc"}, ValueError, ["at least 5"]),
        ({"n": 4, "names": "Mary"}, TypeError, ["list of names"]),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, error, words):
    with pytest.raises(error) as raised:
        tasks.ioi(**kwargs)
    for word in words:
        assert word in str(raised.value)


# ----------------------------------------------------------------------------- facts
FACT_OF = {prompt: (relation, answer) for relation, pairs in FACTS.items() for prompt, answer in pairs}


def test_facts_table():
    assert len(FACT_OF) >= 24
    for relation, pairs in FACTS.items():
        answers = [answer for _, answer in pairs]
        assert len(set(answers)) == len(answers), relation
        assert all(re.fullmatch(r" [A-Za-z]+", answer) for answer in answers)


def test_facts_pairs_each_prompt_with_another_fact_of_its_relation():
    task = tasks.facts(seed=0)
    assert len(task) == len(FACT_OF) and sorted(task.clean) == sorted(FACT_OF)
    for clean, corrupt, correct, incorrect, relation in zip(
        *_columns(task, corrupt=True), task.per_prompt["relation"], strict=True
    ):
        assert FACT_OF[clean] == (relation, correct)
        assert FACT_OF[corrupt] == (relation, incorrect)
        assert incorrect != correct and corrupt != clean


def test_facts_seeding_and_n():
    assert tasks.facts(seed=1) == tasks.facts(seed=1)
    assert tasks.facts(seed=1).clean != tasks.facts(seed=2).clean
    assert tasks.facts(5, seed=1) == tasks.facts(seed=1)[:5] and len(tasks.facts(5, seed=1)) == 5
    with pytest.raises(ValueError, match="at least 1"):
        tasks.facts(0)
    with pytest.raises(ValueError, match=f"only {len(FACT_OF)} facts"):
        tasks.facts(len(FACT_OF) + 1)


# ----------------------------------------------------------------------------- Task
def test_task_round_trips_through_json():
    for task in (tasks.ioi(6, seed=2, corruption="abc"), tasks.facts(4, seed=3)):
        data = json.loads(json.dumps(task.to_dict()))
        assert data["clean"] == task.clean and data["seed"] == task.seed
        assert Task.from_dict(data) == task


def test_slicing_keeps_prompts_answers_and_per_prompt_provenance_aligned():
    task = tasks.ioi(10, seed=0)
    part = task[3:7]
    assert isinstance(part, Task) and len(part) == 4
    assert (part.clean, part.corrupt, part.correct, part.incorrect) == (
        task.clean[3:7],
        task.corrupt[3:7],
        task.correct[3:7],
        task.incorrect[3:7],
    )
    assert part.per_prompt["index"] == [3, 4, 5, 6]
    assert part.per_prompt["order"] == task.per_prompt["order"][3:7]
    assert task.params["per_prompt"]["index"] == list(range(10))  # the original is untouched
    with pytest.raises(TypeError, match="slice"):
        task[0]


def test_task_checks_its_lists_line_up():
    with pytest.raises(ValueError, match="one entry per prompt"):
        Task("t", ["a", "b"], ["c", "d"], [" x"], [" y", " z"], 0)
    with pytest.raises(ValueError, match="per_prompt"):
        Task("t", ["a"], ["c"], [" x"], [" y"], 0, {"per_prompt": {"order": ["ABBA", "BABA"]}})


def test_task_is_frozen_and_its_repr_is_short():
    task = tasks.ioi(50, seed=1)
    with pytest.raises(AttributeError):
        task.seed = 2
    assert repr(task) == "Task('ioi', n=50, seed=1, template='mixed', corruption='swap')"


def test_check_single_tokens(gpt2):
    # The test tokenizer was trained on a few sentences: these names are one token, " Paris" is not.
    tasks.check_single_tokens(gpt2, tasks.ioi(12, names=["Mary", "John", "Tom", "Anna", "Alice", "Bob"]))
    mixed = Task("mixed", ["a", "b"], ["c", "d"], [" Mary", " Paris"], [" John", " Rome"], 0)
    with pytest.raises(ValueError) as raised:
        tasks.check_single_tokens(gpt2, mixed)
    message = str(raised.value)
    assert "' Paris' (3 tokens)" in message and "' Rome' (3 tokens)" in message and "'mixed'" in message
    assert "Mary" not in message and "John" not in message
    with pytest.raises(ValueError, match="' Paris'"):
        tasks.check_single_tokens(gpt2, tasks.facts())


# ----------------------------------------------------------------------------- token positions
SINGLE_TOKEN_NAMES = [
    "Mary",
    "John",
    "Tom",
    "Anna",
    "Alice",
    "Bob",
]  # one token each (with the space) for the test tokenizer


@pytest.fixture(scope="module")
def ioi_model():
    return hooked.load("hooked/ioi-gpt2")  # a word-level tokenizer, BOS prepended


def test_answers_the_tokenizer_does_not_know_are_refused(ioi_model):
    """The bundled models' word-level tokenizer turns " Paris" into <|unk|>: every fact would score the
    unknown token. check_single_tokens, the task builders given a model, and `hooked sweep --task facts` refuse."""
    with pytest.raises(ValueError) as raised:
        tasks.check_single_tokens(ioi_model, tasks.facts())
    message = str(raised.value)
    assert "task 'facts' has 32 answers this model's tokenizer does not know: ' Tokyo'," in message
    assert "unknown token '<|unk|>', id 1" in message and "get_vocab()" in message
    tasks.check_single_tokens(ioi_model, tasks.ioi(8))  # the paper's names are in its vocabulary
    mixed = Task("mixed", ["a", "b"], ["c", "d"], [" Mary", " Paris"], [" Mary John", " John"], 0)
    with pytest.raises(ValueError) as raised:
        tasks.check_single_tokens(ioi_model, mixed)
    message = str(raised.value)
    assert "1 answer that is not one token for this model's tokenizer: ' Mary John' (2 tokens)" in message
    assert "1 answer this model's tokenizer does not know: ' Paris' (each becomes" in message
    assert "' Mary'," not in message and "' John'," not in message

    with pytest.raises(ValueError, match="task 'facts' has 32 answers this model's tokenizer does not know"):
        tasks.facts(model=ioi_model)
    with pytest.raises(
        ValueError, match="task 'ioi' has 2 answers this model's tokenizer does not know: ' Quux', ' Zorblax'"
    ):
        tasks.ioi(4, names=["Zorblax", "Quux"], model=ioi_model)
    assert tasks.ioi_heldout(4, model=ioi_model).positions["IO"].shape == (4,)


def test_a_tokenizer_without_an_unknown_token_never_refuses_a_word(gpt2):
    """GPT-2's byte-level BPE spells every word in pieces: several tokens, never an unknown one."""
    assert tasks.facts(4, model=gpt2).positions["END"].shape == (4,)
    with pytest.raises(ValueError) as raised:
        tasks.check_single_tokens(gpt2, tasks.facts())
    assert "not one token" in str(raised.value) and "does not know" not in str(raised.value)


def test_sweep_on_facts_refuses_answers_the_model_does_not_know(tmp_path, capsys):
    from hooked.cli import main

    out = tmp_path / "out"
    assert main(["sweep", "hooked/ioi-gpt2", "--task", "facts", "--components", "heads", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "this model's tokenizer does not know: ' Tokyo'" in err and "'<|unk|>'" in err
    assert "use a model with a full English vocabulary (gpt2), or --task ioi" in err
    assert not out.exists()


def test_name_spans_are_where_the_names_are():
    task = tasks.ioi(40, seed=7)
    for prompt, correct, incorrect, spans in zip(
        task.clean, task.correct, task.incorrect, task.per_prompt["spans"], strict=True
    ):
        io, s = correct[1:], incorrect[1:]
        starts = {name: [m.start() for m in re.finditer(rf"\b{name}\b", prompt)] for name in (io, s)}
        assert starts == {io: [spans["IO"][0]], s: [spans["S1"][0], spans["S2"][0]]}
        assert {slot: prompt[a:b] for slot, (a, b) in spans.items()} == {"IO": io, "S1": s, "S2": s}


def test_positions_point_at_the_names_for_a_word_level_tokenizer(ioi_model):
    task = tasks.ioi(16, seed=0, model=ioi_model)
    assert set(task.positions) == {"IO", "S1", "S2", "END"}
    assert all(p.dtype == torch.long and p.shape == (16,) for p in task.positions.values())
    assert len({len(ioi_model.to_str_tokens(prompt)) for prompt in task.clean}) > 1  # mixed templates: lengths differ
    for row, (prompt, correct, incorrect) in enumerate(zip(*_columns(task), strict=True)):
        tokens = ioi_model.to_str_tokens(prompt)
        at = {slot: int(p[row]) for slot, p in task.positions.items()}
        assert tokens[0] == ioi_model.tokenizer.bos_token  # position 0 is the BOS
        assert (tokens[at["IO"]], tokens[at["S1"]], tokens[at["S2"]]) == (correct[1:], incorrect[1:], incorrect[1:])
        assert at["S1"] < at["S2"] and at["END"] == len(tokens) - 1
    unprefixed = task.with_positions(ioi_model, prepend_bos=False)
    assert all(torch.equal(unprefixed.positions[slot], task.positions[slot] - 1) for slot in task.positions)


@pytest.mark.parametrize("names", [SINGLE_TOKEN_NAMES, None])
def test_positions_point_at_the_names_for_a_byte_level_tokenizer(gpt2, names):
    """Names of one token carry their leading space (" John"); a name of several tokens gets its first."""
    task = tasks.ioi(16, seed=0, names=names, model=gpt2)
    spaced = 0
    for row, (prompt, spans) in enumerate(zip(task.clean, task.per_prompt["spans"], strict=True)):
        tokens = gpt2.to_str_tokens(prompt)
        assert tokens[0] == "<|endoftext|>"
        for slot, (start, end) in spans.items():
            position = int(task.positions[slot][row])
            before = "".join(tokens[1:position])
            assert len(before) <= start < len(before) + len(tokens[position]), (
                slot,
                tokens,
                position,
            )  # holds the first letter
            assert "".join(tokens[position:]).lstrip().startswith(prompt[start:end])
            if names is not None:
                assert tokens[position] == " " + prompt[start:end]
            spaced += tokens[position].startswith(" ")
        assert int(task.positions["END"][row]) == len(tokens) - 1
    assert spaced > 0


def test_positions_need_a_model_and_follow_slicing_and_json(ioi_model):
    task = tasks.ioi(8, seed=2)
    with pytest.raises(AttributeError, match=r"tasks.ioi\(..., model=model\) or call task.with_positions\(model\)"):
        _ = task.positions
    full = task.with_positions(ioi_model)
    assert full == task and tasks.ioi(8, seed=2, model=ioi_model).to_dict() == full.to_dict()
    part = full[2:6]
    assert part.per_prompt["spans"] == task.per_prompt["spans"][2:6]
    assert all(torch.equal(part.positions[slot], full.positions[slot][2:6]) for slot in full.positions)
    assert all(
        torch.equal(part.positions[slot], task[2:6].with_positions(ioi_model).positions[slot])
        for slot in full.positions
    )
    again = Task.from_dict(json.loads(json.dumps(part.to_dict())))
    assert again == part and all(torch.equal(again.positions[slot], part.positions[slot]) for slot in part.positions)
    with pytest.raises(ValueError, match="one entry per prompt"):
        Task("t", ["a"], ["c"], [" x"], [" y"], 0, token_positions={"END": [0, 1]})
    facts = tasks.facts(4).with_positions(ioi_model)  # no recorded slots: the last token only
    assert set(facts.positions) == {"END"}
    assert facts.positions["END"].tolist() == [len(ioi_model.to_str_tokens(p)) - 1 for p in facts.clean]


def _columns(task: Task, corrupt: bool = False):
    return (
        (task.clean, task.corrupt, task.correct, task.incorrect)
        if corrupt
        else (task.clean, task.correct, task.incorrect)
    )


def test_ioi_heldout_is_heldout_names_in_heldout_templates():
    held = tasks.ioi_heldout(40, seed=7)
    assert len(held) == 40 and held.seed == 7
    assert set(held.per_prompt["template_id"]) <= set(tasks.HELDOUT_TEMPLATES)
    assert {name.strip() for name in held.correct + held.incorrect} <= set(tasks.HELDOUT_NAMES)
    # the rows are the first qualifying rows of the full draw, in order (the training script's "heldout" set)
    full = tasks.ioi(400, seed=7, names=tasks.HELDOUT_NAMES)
    rows = [i for i, t in enumerate(full.per_prompt["template_id"]) if t in tasks.HELDOUT_TEMPLATES][:40]
    assert held.clean == [full.clean[i] for i in rows] and held.corrupt == [full.corrupt[i] for i in rows]
    assert tasks.ioi_heldout(10, seed=7).clean == held.clean[:10]
