"""Tasks as data: prompts, their corrupted counterparts and one-token answers, made by a seeded function.

A `Task` holds parallel lists: `clean[i]` is a prompt, `corrupt[i]` its counterfactual, and
`correct[i]` / `incorrect[i]` the two answers (with their leading space) a metric compares after the
clean prompt. It keeps the seed and parameters that made it, so a saved result can say what it was
measured on.

    task = tasks.ioi(n=8, seed=0)
    task.clean[0]      # 'The house Jane and Scott went to had a ring. Scott gave it to'
    task.corrupt[0]    # 'The house Jane and Scott went to had a ring. Jane gave it to'
    task.correct[0], task.incorrect[0]   # (' Jane', ' Scott')

`ioi` is the indirect-object identification dataset of Wang et al. 2022, "Interpretability in the
Wild: a Circuit for Indirect Object Identification in GPT-2 small" (arXiv 2211.00593). Its
templates, names, places and objects are those of the paper's code (`ioi_dataset.py` in
github.com/redwoodresearch/Easy-Transformer). `facts` is a small factual-recall set in the style of
"The capital of France is" -> " Paris".

Template vocabulary (the paper's): `[A]` is the indirect object (IO, the right answer), `[B]` the
subject (S, the distractor), `[PLACE]` and `[OBJECT]` nouns. S is named twice: S1 in the first
clause and S2, the giver, in the second. Every template ends with the IO, which a prompt leaves out.

Token positions depend on the tokenizer, so a task knows them only for a model:
`ioi(8, model=model)` (or `task.with_positions(model)`) fills `task.positions["IO"]`, `["S1"]`,
`["S2"]` and `["END"]`, each a LongTensor [batch] of positions in the clean prompt as that model
tokenizes it (0 is the first token, BOS included when the model prepends one; END is the last
token). They plug straight into `positions=` of `hooked.interventions.ablate` and `hooked.interventions.patch` (one
position per
prompt). They come from the character spans of the name slots, recorded at generation in
`params["per_prompt"]["spans"]`: a name's position is its first token (the one holding its first
character, e.g. " John" with its space). With the "swap" corruption the corrupt prompt has the same
token layout as the clean one whenever the names are single tokens (GPT-2's are); with "abc" its names
differ, so only the clean prompt's positions are given.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

# The paper's names: every one is a single token (with its leading space) for GPT-2's tokenizer.
NAMES: tuple[str, ...] = (
    "Aaron",
    "Adam",
    "Alan",
    "Alex",
    "Alice",
    "Amy",
    "Anderson",
    "Andre",
    "Andrew",
    "Andy",
    "Anna",
    "Anthony",
    "Arthur",
    "Austin",
    "Blake",
    "Brandon",
    "Brian",
    "Carter",
    "Charles",
    "Charlie",
    "Christian",
    "Christopher",
    "Clark",
    "Cole",
    "Collins",
    "Connor",
    "Crew",
    "Crystal",
    "Daniel",
    "David",
    "Dean",
    "Edward",
    "Elizabeth",
    "Emily",
    "Eric",
    "Eva",
    "Ford",
    "Frank",
    "George",
    "Georgia",
    "Graham",
    "Grant",
    "Henry",
    "Ian",
    "Jack",
    "Jacob",
    "Jake",
    "James",
    "Jamie",
    "Jane",
    "Jason",
    "Jay",
    "Jennifer",
    "Jeremy",
    "Jessica",
    "John",
    "Jonathan",
    "Jordan",
    "Joseph",
    "Joshua",
    "Justin",
    "Kate",
    "Kelly",
    "Kevin",
    "Kyle",
    "Laura",
    "Leon",
    "Lewis",
    "Lisa",
    "Louis",
    "Luke",
    "Madison",
    "Marco",
    "Marcus",
    "Maria",
    "Mark",
    "Martin",
    "Mary",
    "Matthew",
    "Max",
    "Michael",
    "Michelle",
    "Morgan",
    "Patrick",
    "Paul",
    "Peter",
    "Prince",
    "Rachel",
    "Richard",
    "River",
    "Robert",
    "Roman",
    "Rose",
    "Ruby",
    "Russell",
    "Ryan",
    "Sarah",
    "Scott",
    "Sean",
    "Simon",
    "Stephen",
    "Steven",
    "Sullivan",
    "Taylor",
    "Thomas",
    "Tyler",
    "Victoria",
    "Warren",
    "William",
)

PLACES: tuple[str, ...] = ("store", "garden", "restaurant", "school", "hospital", "office", "house", "station")

OBJECTS: tuple[str, ...] = ("ring", "kiss", "bone", "basketball", "computer", "necklace", "drink", "snack")

# BABA: the subject is named first ("Then, John and Mary went ... John gave a drink to [Mary]").
BABA_TEMPLATES: tuple[str, ...] = (
    "Then, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Then, [B] and [A] had a lot of fun at the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Then, [B] and [A] were working at the [PLACE]. [B] decided to give a [OBJECT] to [A]",
    "Then, [B] and [A] were thinking about going to the [PLACE]. [B] wanted to give a [OBJECT] to [A]",
    "Then, [B] and [A] had a long argument, and afterwards [B] said to [A]",
    "After [B] and [A] went to the [PLACE], [B] gave a [OBJECT] to [A]",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give it to [A]",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give the [OBJECT] to [A]",
    "While [B] and [A] were working at the [PLACE], [B] gave a [OBJECT] to [A]",
    "While [B] and [A] were commuting to the [PLACE], [B] gave a [OBJECT] to [A]",
    "After the lunch, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Afterwards, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Then, [B] and [A] had a long argument. Afterwards [B] said to [A]",
    "The [PLACE] [B] and [A] went to had a [OBJECT]. [B] gave it to [A]",
    "Friends [B] and [A] found a [OBJECT] at the [PLACE]. [B] gave it to [A]",
)


def _swap_first_clause(template: str) -> str:
    """Swap the first [A] and the first [B]: a BABA template becomes its ABBA twin, and back."""
    first_a, first_b = template.index("[A]"), template.index("[B]")
    (start, start_name), (end, end_name) = sorted([(first_a, "[A]"), (first_b, "[B]")])
    return template[:start] + end_name + template[start + 3 : end] + start_name + template[end + 3 :]


# ABBA: the indirect object is named first ("Then, Mary and John went ... John gave a drink to [Mary]").
ABBA_TEMPLATES: tuple[str, ...] = tuple(_swap_first_clause(template) for template in BABA_TEMPLATES)

# The paper's running example, in its ABBA order; ioi(template="store") alternates it with its BABA twin.
STORE_TEMPLATE = "When [A] and [B] went to the store, [B] gave a drink to [A]"

IOI_TEMPLATES = ("mixed", "baba", "abba", "store")  # values of ioi(template=...)
IOI_CORRUPTIONS = ("swap", "abc")  # values of ioi(corruption=...)

# Factual recall, by relation. Every answer is one common GPT-2 token (with its leading space), and
# answers differ within a relation, so any other fact of the relation is a valid corruption.
FACTS: dict[str, tuple[tuple[str, str], ...]] = {
    "capital": (
        ("The capital of France is", " Paris"),
        ("The capital of Italy is", " Rome"),
        ("The capital of Germany is", " Berlin"),
        ("The capital of Japan is", " Tokyo"),
        ("The capital of England is", " London"),
        ("The capital of Spain is", " Madrid"),
        ("The capital of Russia is", " Moscow"),
        ("The capital of China is", " Beijing"),
        ("The capital of Greece is", " Athens"),
        ("The capital of Egypt is", " Cairo"),
        ("The capital of Canada is", " Ottawa"),
        ("The capital of Ireland is", " Dublin"),
        ("The capital of Austria is", " Vienna"),
        ("The capital of Portugal is", " Lisbon"),
        ("The capital of Sweden is", " Stockholm"),
        ("The capital of Poland is", " Warsaw"),
    ),
    "language": (
        ("The official language of France is", " French"),
        ("The official language of Germany is", " German"),
        ("The official language of Spain is", " Spanish"),
        ("The official language of Italy is", " Italian"),
        ("The official language of Japan is", " Japanese"),
        ("The official language of Russia is", " Russian"),
        ("The official language of China is", " Chinese"),
        ("The official language of Portugal is", " Portuguese"),
        ("The official language of Greece is", " Greek"),
        ("The official language of Poland is", " Polish"),
    ),
    "currency": (
        ("The currency of Japan is the", " yen"),
        ("The currency of the United States is the", " dollar"),
        ("The currency of the United Kingdom is the", " pound"),
        ("The currency of Germany is the", " euro"),
        ("The currency of China is the", " yuan"),
        ("The currency of Switzerland is the", " franc"),
    ),
}


@dataclass(frozen=True, repr=False)
class Task:
    """Parallel lists of prompts and answers, with what produced them.

    `params["per_prompt"]`, when present, holds lists aligned with the prompts (template ids,
    orders, row index in the generated set, character spans of named slots); slicing a task slices
    them too. `token_positions` are the token positions of those slots for one tokenizer (see
    `with_positions`); they are not compared, as they follow from the prompts and the tokenizer.
    """

    name: str
    clean: list[str]  # the prompts
    corrupt: list[str]  # the counterfactual prompts, one per clean prompt
    correct: list[str]  # right answer after the clean prompt, with its leading space
    incorrect: list[str]  # the distractor a metric compares it with
    seed: int
    params: dict[str, Any] = field(default_factory=dict)
    # slot -> [batch], see `positions`; lists (from JSON) become tensors
    token_positions: dict[str, Tensor | list[int]] | None = field(default=None, compare=False)

    def __post_init__(self):
        lengths = {name: len(getattr(self, name)) for name in ("clean", "corrupt", "correct", "incorrect")}
        lengths.update({f"params['per_prompt'][{key!r}]": len(value) for key, value in self.per_prompt.items()})
        if self.token_positions is not None:  # lists (from JSON) become tensors
            positions = {key: torch.as_tensor(value, dtype=torch.long) for key, value in self.token_positions.items()}
            object.__setattr__(self, "token_positions", positions)
            lengths.update({f"token_positions[{key!r}]": len(value) for key, value in positions.items()})
        if len(set(lengths.values())) > 1:
            raise ValueError(f"a task's lists must have one entry per prompt; their lengths are {lengths}")

    @property
    def per_prompt(self) -> dict[str, list]:
        return self.params.get("per_prompt", {})

    @property
    def positions(self) -> dict[str, Tensor]:
        """Slot -> LongTensor [batch]: where each prompt's IO, S1, S2 and END tokens are, for one tokenizer.

        `positions=task.positions["S2"]` ablates or patches S2 in each prompt. Only a task made for a
        model has them: `ioi(n, model=model)` or `task.with_positions(model)`.
        """
        if self.token_positions is None:
            raise AttributeError(
                f"task {self.name!r} has no token positions: they depend on the tokenizer; make it with"
                f" tasks.{self.name}(..., model=model) or call task.with_positions(model)"
            )
        return self.token_positions

    def with_positions(self, model, prepend_bos: bool | None = None) -> Task:
        """A copy whose `positions` are token positions in the clean prompts as `model` tokenizes them.

        Each recorded slot (`params["per_prompt"]["spans"]`: IO, S1, S2 for `ioi`) maps to the token
        holding its first character (a name of several tokens: its first token); END is each prompt's
        last token. Positions count from 0 and include the BOS token when the model prepends one
        (`prepend_bos`, as in `model.to_tokens`), so they match the positions `hooked.interventions.ablate` uses.
        """
        tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is None:
            raise ValueError(
                "token positions need the model's tokenizer, and this model has none; load it with its tokenizer files"
            )
        prepend = model.default_prepend_bos if prepend_bos is None else prepend_bos
        if prepend and tokenizer.bos_token_id is None:
            raise ValueError("prepend_bos=True, but this tokenizer has no BOS token; pass prepend_bos=False")
        first = 1 if prepend else 0  # the BOS token model.to_tokens puts first
        spans = self.per_prompt.get("spans")
        positions: dict[str, list[int]] = {}
        for row, prompt in enumerate(self.clean):
            offsets = tokenizer.tokenizer.encode(prompt, add_special_tokens=False).offsets
            if not offsets:
                raise ValueError(f"prompt {row} of task {self.name!r} has no tokens: {prompt!r}")
            for slot, (start, end) in (spans[row] if spans else {}).items():
                token = next((i for i, (a, b) in enumerate(offsets) if a < end and b > start), None)
                if token is None:
                    raise ValueError(
                        f"prompt {row}: no token covers {slot} ({prompt[start:end]!r}, characters"
                        f" {start}..{end}) in {prompt!r}; the tokenizer drops those characters"
                    )
                positions.setdefault(slot, []).append(first + token)
            positions.setdefault("END", []).append(first + len(offsets) - 1)
        return replace(
            self, token_positions={slot: torch.tensor(values, dtype=torch.long) for slot, values in positions.items()}
        )

    def __len__(self) -> int:
        return len(self.clean)

    def __getitem__(self, rows: slice) -> Task:
        """A sub-task of the rows `rows` selects: `task[:4]`."""
        if not isinstance(rows, slice):
            raise TypeError(
                f"index a task with a slice (task[{rows}:{rows}+1] for one prompt), not {type(rows).__name__}"
            )
        params = dict(self.params)
        if self.per_prompt:
            params["per_prompt"] = {key: value[rows] for key, value in self.per_prompt.items()}
        positions = self.token_positions
        return replace(
            self,
            clean=self.clean[rows],
            corrupt=self.corrupt[rows],
            correct=self.correct[rows],
            incorrect=self.incorrect[rows],
            params=params,
            token_positions=None
            if positions is None
            else {key: value.tolist()[rows] for key, value in positions.items()},
        )

    def to_dict(self) -> dict[str, Any]:
        """Everything about the task as plain JSON-serialisable data, prompts (and token positions) included."""
        data = copy.deepcopy(
            {
                "name": self.name,
                "seed": self.seed,
                "params": self.params,
                "clean": self.clean,
                "corrupt": self.corrupt,
                "correct": self.correct,
                "incorrect": self.incorrect,
            }
        )
        if self.token_positions is not None:
            data["token_positions"] = {key: value.tolist() for key, value in self.token_positions.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Task:
        """The task `to_dict` described."""
        return cls(**copy.deepcopy(data))

    def __repr__(self) -> str:
        settings = ", ".join(
            f"{key}={value!r}" for key, value in self.params.items() if key not in ("per_prompt", "names")
        )
        return f"Task({self.name!r}, n={len(self)}, seed={self.seed}" + (f", {settings})" if settings else ")")


# ----------------------------------------------------------------------------- IOI
def ioi(
    n: int,
    seed: int = 0,
    template: str = "mixed",
    corruption: str = "swap",
    names: Sequence[str] | None = None,
    model=None,
) -> Task:
    """`n` indirect-object identification prompts: the answer is the IO, the distractor is S.

        ioi(2, template="store").clean
        # ['When William and Jane went to the store, Jane gave a drink to',   (ABBA: answer ' William')
        #  'When Laura and Emily went to the store, Laura gave a drink to']   (BABA: answer ' Emily')

    template: "baba" or "abba" (the 15 templates in that order), "mixed" (ABBA and BABA alternating,
    ABBA first), "store" (STORE_TEMPLATE, its two orders alternating).
    corruption: "swap" replaces the giver S2 by the IO, so the other name becomes the right answer;
    "abc" fills the IO, S1 and S2 slots with three new names, distinct and unlike the clean ones.
    `correct`/`incorrect` are always the clean prompt's IO and S. Row i depends only on i and the
    arguments, so ioi(4) == ioi(8)[:4]; the clean prompts are the same for both corruptions.
    model: fills `task.positions` (IO, S1, S2, END per prompt) for its tokenizer (`Task.with_positions`),
    and refuses names its tokenizer does not know (`check_known_answers`).
    """
    _check_count(n, "n")
    if template not in IOI_TEMPLATES:
        raise ValueError(f"template must be one of {', '.join(map(repr, IOI_TEMPLATES))}, not {template!r}")
    if corruption not in IOI_CORRUPTIONS:
        raise ValueError(f"corruption must be one of {', '.join(map(repr, IOI_CORRUPTIONS))}, not {corruption!r}")
    name_pool = _name_pool(names, needed=5 if corruption == "abc" else 2)

    rng = random.Random(seed)
    # A second stream for the ABC names, so that the clean prompts are the same for both corruptions.
    corrupt_rng = random.Random(f"ioi-abc-{seed}")
    clean, corrupt, correct, incorrect, orders, template_ids, spans = [], [], [], [], [], [], []
    for i in range(n):
        order = {"baba": "BABA", "abba": "ABBA"}.get(template, "ABBA" if i % 2 == 0 else "BABA")
        template_id = 0 if template == "store" else rng.randrange(len(BABA_TEMPLATES))
        baba = _swap_first_clause(STORE_TEMPLATE) if template == "store" else BABA_TEMPLATES[template_id]
        slots = _name_slots(baba if order == "BABA" else _swap_first_clause(baba))
        io, s = rng.sample(name_pool, 2)
        nouns = {"[PLACE]": rng.choice(PLACES), "[OBJECT]": rng.choice(OBJECTS)}
        prompt, where = _fill_with_spans(slots, {"[IO]": io, "[S1]": s, "[S2]": s, **nouns})
        clean.append(prompt)
        spans.append(where)
        if corruption == "swap":
            corrupt.append(_fill(slots, {"[IO]": io, "[S1]": s, "[S2]": io, **nouns}))
        else:
            x, y, z = corrupt_rng.sample([name for name in name_pool if name not in (io, s)], 3)
            corrupt.append(_fill(slots, {"[IO]": x, "[S1]": y, "[S2]": z, **nouns}))
        correct.append(" " + io)
        incorrect.append(" " + s)
        orders.append(order)
        template_ids.append(template_id)
    params = {
        "template": template,
        "corruption": corruption,
        "names": "NAMES" if names is None else list(name_pool),
        "per_prompt": {"index": list(range(n)), "order": orders, "template_id": template_ids, "spans": spans},
    }
    task = Task("ioi", clean, corrupt, correct, incorrect, seed, params)
    return task if model is None else _for_model(task, model)


def _for_model(task: Task, model) -> Task:
    """`task` with its token positions for `model`, once every answer is a word its tokenizer knows."""
    check_known_answers(model, task)
    return task.with_positions(model)


def _name_slots(template: str) -> str:
    """[IO]/[S1]/[S2] in place of the template's names, the final IO (the answer) cut off."""
    if template.count("[A]") != 2 or template.count("[B]") != 2 or not template.endswith(" [A]"):
        raise ValueError(f"an IOI template names A and B twice each and ends with ' [A]': {template!r}")
    prompt = template[: -len(" [A]")].replace("[A]", "[IO]")
    first_b, second_b = prompt.index("[B]"), prompt.rindex("[B]")
    return prompt[:first_b] + "[S1]" + prompt[first_b + 3 : second_b] + "[S2]" + prompt[second_b + 3 :]


_SLOT = re.compile(r"\[(IO|S1|S2|PLACE|OBJECT)\]")


def _fill_with_spans(slots: str, values: dict[str, str]) -> tuple[str, dict[str, list[int]]]:
    """`_fill`, and where each name landed: {"IO": [start, end], "S1": ..., "S2": ...} in characters."""
    parts, spans, length, last = [], {}, 0, 0
    for match in _SLOT.finditer(slots):
        value = values[match.group(0)]
        parts.append(slots[last : match.start()])
        length += match.start() - last
        if match.group(1) in ("IO", "S1", "S2"):
            spans[match.group(1)] = [length, length + len(value)]
        parts.append(value)
        length += len(value)
        last = match.end()
    parts.append(slots[last:])
    return "".join(parts), spans


def _fill(slots: str, values: dict[str, str]) -> str:
    for slot, value in values.items():
        slots = slots.replace(slot, value)
    return slots


def _name_pool(names: Sequence[str] | None, needed: int) -> list[str]:
    if names is None:
        return list(NAMES)
    if isinstance(names, str):
        raise TypeError("names must be a list of names, not one string")
    pool = list(dict.fromkeys(names))  # distinct, in the given order, so the seed means the same draw
    if len(pool) < needed:
        raise ValueError(f"this corruption needs at least {needed} distinct names; got {len(pool)}: {pool}")
    return pool


# ----------------------------------------------------------------------------- facts
# The bundled IOI models' test split (scripts/train_ioi.py, docs/ioi-models.md): these names are never the IO
# or S of a training sentence, and these BABA templates (with their ABBA twins) never occur in training.
HELDOUT_NAMES: tuple[str, ...] = NAMES[4::5]
HELDOUT_TEMPLATES: tuple[int, ...] = (5, 8, 12, 13)


def ioi_heldout(n: int, seed: int = 12345, model=None) -> Task:
    """`n` IOI prompts of held-out names in held-out templates: the test set of the bundled IOI models.

        held = tasks.ioi_heldout(32)          # what docs/ioi-models.md calls "heldout" (seed 12345)
        circuit.faithfulness(held.clean, held.corrupt, metrics.logit_diff(model, held))  # its own answers

    The rows of `ioi(..., seed=seed, names=HELDOUT_NAMES)` whose template is one of HELDOUT_TEMPLATES, in
    order; `model=` fills `positions` as `ioi` does.
    """
    _check_count(n, "n")
    rows: list[int] = []
    generated = 8 * n
    while len(rows) < n:  # about 4 of 15 templates are held out: 8n rows almost always suffice
        task = ioi(generated, seed=seed, names=HELDOUT_NAMES)
        rows = [i for i, t in enumerate(task.per_prompt["template_id"]) if t in HELDOUT_TEMPLATES][:n]
        generated *= 2
    pick = lambda values: [values[i] for i in rows]  # noqa: E731
    params = dict(
        task.params,
        split="heldout names in heldout templates",
        per_prompt={key: pick(value) for key, value in task.per_prompt.items()},
    )
    held = Task("ioi", pick(task.clean), pick(task.corrupt), pick(task.correct), pick(task.incorrect), seed, params)
    return held if model is None else _for_model(held, model)


def facts(n: int | None = None, seed: int = 0, model=None) -> Task:
    """Factual-recall prompts from FACTS, each corrupted by another fact of the same relation.

        task = facts(seed=0)           # every fact, in an order the seed shuffles
        task.clean[0], task.correct[0], task.corrupt[0], task.incorrect[0]
        # ('The capital of Japan is', ' Tokyo', 'The capital of Russia is', ' Moscow')

    `incorrect` is the corrupting fact's answer. n=None takes every fact; facts(n) == facts()[:n].
    model: refuses answers its tokenizer does not know (English words such as " Paris" are unknown to a
    word-level tokenizer trained on other text), and fills `positions` (END only) for its tokenizer.
    """
    total = sum(len(pairs) for pairs in FACTS.values())
    if n is not None:
        _check_count(n, "n")
        if n > total:
            raise ValueError(f"n={n}, but FACTS holds only {total} facts (n=None takes them all)")
    rng = random.Random(seed)
    pool = [(relation, prompt, answer) for relation, pairs in FACTS.items() for prompt, answer in pairs]
    rng.shuffle(pool)
    clean, corrupt, correct, incorrect, relations = [], [], [], [], []
    for relation, prompt, answer in pool:
        other_prompt, other_answer = rng.choice([pair for pair in FACTS[relation] if pair[1] != answer])
        clean.append(prompt)
        corrupt.append(other_prompt)
        correct.append(answer)
        incorrect.append(other_answer)
        relations.append(relation)
    task = Task(
        "facts",
        clean,
        corrupt,
        correct,
        incorrect,
        seed,
        {"per_prompt": {"index": list(range(total)), "relation": relations}},
    )
    task = task if n is None else task[:n]
    return task if model is None else _for_model(task, model)


# ----------------------------------------------------------------------------- checks
def check_single_tokens(model, task: Task) -> None:
    """Raise a ValueError naming every answer of `task` that is not exactly one token `model` knows.

    Metrics read one logit per answer, so a multi-token answer cannot be scored, and an answer the
    tokenizer does not know (it becomes the unknown token, `<|unk|>`) would read the unknown token's
    logit, the same for every such answer.
    """
    unknown = _unknown_answers(model, task)
    several = []
    for answer in dict.fromkeys(task.correct + task.incorrect):
        if answer in unknown:
            continue
        try:
            model.to_single_token(answer)
        except ValueError:
            several.append(f"{answer!r} ({len(model.to_str_tokens(answer, prepend_bos=False))} tokens)")
    problems = (
        [
            f"{_count(several)} that {'is' if len(several) == 1 else 'are'} not one token for this model's"
            f" tokenizer: {_listed(several)}"
        ]
        if several
        else []
    )
    if unknown:
        problems.append(_unknown_problem(model, unknown))
    if problems:
        raise ValueError(
            f"task {task.name!r} has {'; and '.join(problems)}; a metric reads one logit per answer:"
            " give answers that are each one token of model.tokenizer.get_vocab()"
        )


def check_known_answers(model, task: Task) -> None:
    """Raise a ValueError naming every answer of `task` that `model`'s tokenizer turns into its unknown token.

    The task builders run it when given a model (`ioi(n, model=model)`); an answer of several known
    tokens passes here (`check_single_tokens` refuses it too).
    """
    unknown = _unknown_answers(model, task)
    if unknown:
        raise ValueError(
            f"task {task.name!r} has {_unknown_problem(model, unknown)}; give answers from"
            " model.tokenizer.get_vocab(), or a task made for this tokenizer"
        )


def _unknown_answers(model, task: Task) -> list[str]:
    """The distinct answers of `task` that become `model`'s unknown token, in order."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None or tokenizer.unk_token_id is None:
        return []
    answers = dict.fromkeys(task.correct + task.incorrect)
    return [
        answer
        for answer in answers
        if tokenizer.maps_to_unknown(answer, tokenizer.encode(answer, add_special_tokens=False))
    ]


def _unknown_problem(model, unknown: list[str]) -> str:
    tokenizer = model.tokenizer
    return (
        f"{_count(unknown)} this model's tokenizer does not know: {_listed([repr(a) for a in unknown])} (each"
        f" becomes its unknown token {tokenizer.unk_token!r}, id {tokenizer.unk_token_id}, whose logit every"
        " unknown word reads)"
    )


def _count(answers: list[str]) -> str:
    return f"{len(answers)} answer{'' if len(answers) == 1 else 's'}"


def _listed(answers: list[str]) -> str:
    return ", ".join(answers[:20]) + (f" and {len(answers) - 20} more" if len(answers) > 20 else "")


def _check_count(n: Any, what: str) -> None:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{what} must be an int, not {type(n).__name__}")
    if n < 1:
        raise ValueError(f"{what} must be at least 1, got {n}")
