"""The built-in task ``logic``: short puzzles whose answer a program checks.

Levels: the larger of two numbers; who is taller (older, faster, heavier) of two people; the
tallest of three (given two comparisons); the shortest of three; whether a number is even or odd; how often a letter occurs
in two words; a yes/no question about a rule (``All X are Y; Z is an X. Is Z a Y?``, sometimes with
a negation). Each answer is a word or a number on the last ``Answer:`` line, which
``compute_score`` (verl's reward signature, so the task runs through the plug-in path:
``verifier=custom verifier.function=megatron_rlep.tasks.logic:compute_score``) compares with
the ground truth, case and punctuation aside. Each prompt shows one worked example of the
puzzle's own kind. Splits as in ``arithmetic``: one bucket of eight
of the problem texts is the test split. ``docs/task_levels.md`` records how often the built-in
model passes each level.
"""

from __future__ import annotations

import re

from megatron_rlep.example import Example
from megatron_rlep.tasks import distinct
SYSTEM = {"role": "system", "content": "Answer the question. Put the final answer on its own "
                                      "line after \"Answer:\"."}
# one worked example per level, of the level's own kind (a 135M model copies the form it sees)
EXAMPLES = {
    1: ("Which is larger, 12 or 40?", "40 is more than 12.\nAnswer: 40"),
    2: ("Mia is older than Tom. Who is younger?", "Mia is older, so Tom is younger.\nAnswer: Tom"),
    3: ("Mia is faster than Tom. Tom is faster than Leo. Who is the fastest?",
        "Mia is faster than Tom, and Tom than Leo.\nAnswer: Mia"),
    4: ("Mia is heavier than Tom. Tom is heavier than Leo. Who is the lightest?",
        "Leo is lighter than Tom, and Tom than Mia.\nAnswer: Leo"),
    5: ("Is 47 even or odd?", "47 ends in 7, which is odd.\nAnswer: odd"),
    6: ("How many times does the letter o appear in \"moon soup\"?",
        "m-o-o-n s-o-u-p has o three times.\nAnswer: 3"),
    7: ("All dogs are animals. Rex is one of the dogs. Is Rex one of the animals? Answer yes or "
        "no.", "Every dog is an animal, and Rex is a dog.\nAnswer: yes"),
}


def prompt(level: int, question: str) -> tuple[dict, ...]:
    asked, answered = EXAMPLES[level]
    return (SYSTEM, {"role": "user", "content": asked},
            {"role": "assistant", "content": answered}, {"role": "user", "content": question})


VERIFIER = {"mode": "custom", "function": "megatron_rlep.tasks.logic:compute_score"}
NAMES = ("Ann", "Ben", "Cal", "Dee", "Eva", "Finn", "Gus", "Hana", "Ivy", "Jon", "Kai", "Lea",
         "Max", "Nia", "Otto", "Pia", "Quin", "Rosa", "Sam", "Tia", "Uma", "Vic", "Wes", "Xena",
         "Yuri", "Zoe")
RELATIONS = (("taller", "shorter", "tallest", "shortest"), ("older", "younger", "oldest",
                                                            "youngest"),
             ("faster", "slower", "fastest", "slowest"), ("heavier", "lighter", "heaviest",
                                                          "lightest"))
WORDS = ("banana", "letter", "mississippi", "coffee", "bubble", "pepper", "balloon", "cookie",
         "address", "committee", "assessment", "giraffe", "tomato", "potato", "puzzle", "rabbit",
         "kitten", "yellow", "summer", "winter", "button", "cherry", "dinner", "effect", "hammer",
         "mirror", "pillow", "sudden", "tunnel", "village", "success", "possess", "reading",
         "garden", "animal", "pizza", "zebra", "window", "orange", "planet")
KINDS = (("cats", "animals"), ("roses", "flowers"), ("oaks", "trees"), ("trout", "fish"),
         ("hawks", "birds"), ("ants", "insects"), ("violins", "instruments"),
         ("hammers", "tools"), ("apples", "fruits"), ("buses", "vehicles"),
         ("sonnets", "poems"), ("rubies", "gems"))


def _level_1(rng):
    a, b = rng.sample(range(10, 100), 2)
    return f"Which is larger, {a} or {b}?", str(max(a, b))


def _level_2(rng):
    x, y = rng.sample(NAMES, 2)
    more, less, _, _ = rng.choice(RELATIONS)
    ask = rng.choice([more, less])
    return f"{x} is {more} than {y}. Who is {ask}?", x if ask == more else y


def _three(rng):
    x, y, z = rng.sample(NAMES, 3)
    relation = rng.choice(RELATIONS)
    facts = [f"{x} is {relation[0]} than {y}.", f"{y} is {relation[0]} than {z}."]
    rng.shuffle(facts)
    return x, z, " ".join(facts), relation


def _level_3(rng):
    first, _, facts, relation = _three(rng)
    return f"{facts} Who is the {relation[2]}?", first


def _level_4(rng):
    _, last, facts, relation = _three(rng)
    return f"{facts} Who is the {relation[3]}?", last


def _level_5(rng):
    k = rng.randint(10, 999)
    return f"Is {k} even or odd?", "even" if k % 2 == 0 else "odd"


def _level_6(rng):
    words = " ".join(rng.sample(WORDS, 2))
    letter = rng.choice(sorted(set(words) - {" "}))
    return f"How many times does the letter {letter} appear in \"{words}\"?", \
        str(words.count(letter))


def _level_7(rng):
    (kind, group), name = rng.choice(KINDS), rng.choice(NAMES)
    if rng.random() < 0.5:
        return f"All {kind} are {group}. {name} is one of the {kind}. Is {name} one of the " \
               f"{group}? Answer yes or no.", "yes"
    return f"No {kind} are {group}. {name} is one of the {kind}. Is {name} one of the " \
           f"{group}? Answer yes or no.", "no"


LEVELS = {1: _level_1, 2: _level_2, 3: _level_3, 4: _level_4, 5: _level_5, 6: _level_6,
          7: _level_7}
ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


def normalize(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> dict:
    """verl's reward signature: 1 for the right word or number on the last ``Answer:`` line
    (within the last 300 characters), -1 otherwise; ``acc`` says which."""
    lines = ANSWER_LINE.findall(solution_str[-300:])
    pred = normalize(lines[-1]) if lines else None
    correct = pred is not None and pred == normalize(str(ground_truth))
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}


def examples(split: str = "train", levels=(1, 2, 3), n: int = 64, seed: int = 0) -> list[Example]:
    """``n`` distinct puzzles of ``split``, levels taken in turn, deterministic from ``seed``."""
    def draw(level, rng, index):
        question, answer = LEVELS[level](rng)
        return question, Example(f"G{level}-{index}", prompt(level, question), answer,
                                 f"logic-L{level}")

    return distinct("logic", LEVELS, split, levels, n, seed, draw)
