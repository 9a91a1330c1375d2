"""Embedded default dataset: synthetic English sentiment sentences with word rationales.

Why this exists: the benchmark has to run offline and reproducibly, without
downloading or redistributing a third-party corpus. So the project generates its
own small sentiment-classification dataset from a seed. Every sentence carries a
ground-truth rationale (the words that decide its label), which lets token
attribution methods be scored after fine-tuning a small BERT model (MiniLM).

Sentences come from clause templates (reviews of films, restaurants, products,
books, hotels, concerts, games and museums), filled with positive or negative
adjectives, verbs and nouns. On top of that there is label-flipping negation
("not", "never", "hardly"), optional intensifiers, neutral distractor phrases,
and "X , but Y" contrasts in which the clause after "but" decides the label.
Text is lowercase with punctuation as separate tokens, so ``sentence.split()``
lines up one-to-one with ``rationale``.
"""

import hashlib
import json
import random
from dataclasses import dataclass

DEFAULT_SEED: int = 0
DEFAULT_SIZE: int = 3000

_NEGATION_RATE = 0.25
_CONTRAST_RATE = 0.2
_INTENSIFIER_RATE = 0.3
_NOUN_ADJECTIVE_RATE = 0.3
_COLOR_RATE = 0.4
_POSTMODIFIER_RATE = 0.25
_PREFIX_RATE = 0.2
_SUFFIX_RATE = 0.3
_MIN_WORDS = 5
_MAX_WORDS = 25
_MAX_ATTEMPTS = 1000

# A word of a sentence under construction, with its rationale flag.
_Word = tuple[str, bool]

_NEGATORS = ("not", "never", "hardly")

# Sentiment vocabulary, keyed by polarity (1 = positive, 0 = negative).
_ADJECTIVES: dict[int, tuple[str, ...]] = {
    1: (
        "good",
        "great",
        "excellent",
        "wonderful",
        "delightful",
        "superb",
        "fantastic",
        "brilliant",
        "lovely",
        "enjoyable",
        "pleasant",
        "charming",
        "outstanding",
        "impressive",
        "amazing",
        "marvelous",
        "terrific",
        "splendid",
        "beautiful",
        "solid",
    ),
    0: (
        "bad",
        "terrible",
        "awful",
        "horrible",
        "dreadful",
        "boring",
        "disappointing",
        "poor",
        "mediocre",
        "bland",
        "dull",
        "unpleasant",
        "lousy",
        "annoying",
        "weak",
        "tedious",
        "miserable",
        "pathetic",
        "sloppy",
        "awkward",
    ),
}
# (past tense, base form)
_VERBS: dict[int, tuple[tuple[str, str], ...]] = {
    1: (
        ("loved", "love"),
        ("enjoyed", "enjoy"),
        ("adored", "adore"),
        ("liked", "like"),
        ("admired", "admire"),
        ("appreciated", "appreciate"),
    ),
    0: (
        ("hated", "hate"),
        ("disliked", "dislike"),
        ("despised", "despise"),
        ("loathed", "loathe"),
        ("regretted", "regret"),
        ("detested", "detest"),
    ),
}
_NOUNS: dict[int, tuple[str, ...]] = {
    1: (
        "masterpiece",
        "gem",
        "delight",
        "treat",
        "triumph",
        "joy",
        "winner",
        "success",
        "pleasure",
        "marvel",
    ),
    0: (
        "disaster",
        "mess",
        "failure",
        "letdown",
        "nightmare",
        "waste",
        "flop",
        "disappointment",
        "catastrophe",
        "chore",
    ),
}
_INTENSIFIERS = (
    "very",
    "really",
    "extremely",
    "quite",
    "truly",
    "so",
    "incredibly",
    "totally",
)

# Neutral distractors: never part of a rationale.
_TIME_PHRASES = (
    "yesterday",
    "last week",
    "last night",
    "on monday",
    "this morning",
    "in march",
    "last summer",
    "two days ago",
    "on friday evening",
    "after lunch",
)
_CONTEXT_PHRASES = (
    "with my sister",
    "with my parents",
    "with a colleague",
    "with two friends",
    "in the city center",
    "near the station",
    "on a tuesday",
    "at around eight",
    "after work",
    "during the holidays",
    "last weekend",
    "in the evening",
    "at noon",
    "in paris",
)
_COLORS = ("red", "blue", "green", "black", "white", "grey", "silver", "yellow")


@dataclass(frozen=True)
class _Domain:
    """What can be reviewed: subject nouns and neutral phrases that follow them."""

    subjects: tuple[str, ...]
    postmodifiers: tuple[str, ...]
    colorable: bool


_DOMAINS = (
    _Domain(
        ("film", "movie", "plot", "ending", "script", "soundtrack", "sequel", "cast"),
        ("we watched", "i saw", "everyone talked about"),
        colorable=False,
    ),
    _Domain(
        ("soup", "pasta", "service", "dessert", "pizza", "steak", "waiter", "salad"),
        ("at the corner place", "at that bistro", "near our office"),
        colorable=False,
    ),
    _Domain(
        ("phone", "laptop", "blender", "keyboard", "camera", "kettle", "printer"),
        ("i bought", "from the store", "my uncle ordered"),
        colorable=True,
    ),
    _Domain(
        ("book", "novel", "memoir", "biography", "cookbook", "story", "chapter"),
        ("i borrowed", "from the library", "i read on the train"),
        colorable=False,
    ),
    _Domain(
        ("hotel", "room", "bed", "breakfast", "pool", "staff", "lobby", "shower"),
        ("we booked", "by the harbor", "on the third floor"),
        colorable=False,
    ),
    _Domain(
        ("concert", "album", "show", "band", "singer", "performance", "playlist"),
        ("we heard", "from last year", "at the stadium"),
        colorable=False,
    ),
    _Domain(
        ("game", "app", "update", "puzzle", "controller", "level"),
        ("i downloaded", "my brother installed", "on my tablet"),
        colorable=False,
    ),
    _Domain(
        ("museum", "tour", "exhibition", "guide", "gallery"),
        ("we visited", "downtown", "near the river"),
        colorable=False,
    ),
)


@dataclass(frozen=True)
class _Template:
    """A clause pattern and its negated variants.

    Slots: {s} subject phrase, {a} adjective phrase, {v} past-tense verb,
    {vb} base-form verb, {n} noun phrase. Each negated variant contains exactly
    one negator, which flips the meaning of the sentiment slot.
    """

    plain: str
    negated: tuple[str, ...]


_TEMPLATES = (
    _Template(
        "the {s} was {a}",
        ("the {s} was not {a}", "the {s} was never {a}", "the {s} was hardly {a}"),
    ),
    _Template(
        "the {s} is {a}",
        ("the {s} is not {a}", "the {s} is never {a}", "the {s} is hardly {a}"),
    ),
    _Template("i {v} the {s}", ("i did not {vb} the {s}", "i never {v} the {s}")),
    _Template(
        "the {s} was {n}",
        ("the {s} was not {n}", "the {s} was never {n}", "the {s} was hardly {n}"),
    ),
    _Template("this {s} is {n}", ("this {s} is not {n}", "this {s} is hardly {n}")),
    _Template(
        "i found the {s} {a}",
        ("i did not find the {s} {a}", "i never found the {s} {a}"),
    ),
    _Template(
        "the {s} seemed {a} to me",
        ("the {s} never seemed {a} to me", "the {s} did not seem {a} to me"),
    ),
    _Template(
        "my experience with the {s} was {a}",
        (
            "my experience with the {s} was not {a}",
            "my experience with the {s} was hardly {a}",
        ),
    ),
    _Template(
        "everyone agreed the {s} was {a}",
        ("everyone agreed the {s} was not {a}",),
    ),
    _Template(
        "my friends {v} the {s}",
        ("my friends did not {vb} the {s}", "my friends never {v} the {s}"),
    ),
    _Template(
        "the {s} turned out to be {a}",
        ("the {s} did not turn out to be {a}",),
    ),
    _Template(
        "the {s} felt {a}",
        ("the {s} never felt {a}", "the {s} did not feel {a}", "the {s} hardly felt {a}"),
    ),
    _Template(
        "i would call the {s} {n}",
        (
            "i would not call the {s} {n}",
            "i would never call the {s} {n}",
            "i would hardly call the {s} {n}",
        ),
    ),
    _Template("the {s} was {a} overall", ("the {s} was not {a} overall",)),
    _Template("i really {v} the {s}", ("i never really {v} the {s}",)),
    _Template(
        "the critics {v} the {s}",
        ("the critics did not {vb} the {s}", "the critics never {v} the {s}"),
    ),
    _Template(
        "i thought the {s} was {a}",
        ("i did not think the {s} was {a}", "i never thought the {s} was {a}"),
    ),
    _Template("the {s} proved to be {n}", ("the {s} did not prove to be {n}",)),
)


def _neutral(phrase: str) -> list[_Word]:
    """Split a neutral phrase into words that are never rationale."""
    return [(word, False) for word in phrase.split()]


def _subject_phrase(subject: str, domain: _Domain, rng: random.Random) -> list[_Word]:
    """Subject noun with an optional color before it and a phrase after it."""
    words: list[_Word] = []
    if domain.colorable and rng.random() < _COLOR_RATE:
        words.append((rng.choice(_COLORS), False))
    words.append((subject, False))
    if rng.random() < _POSTMODIFIER_RATE:
        words.extend(_neutral(rng.choice(domain.postmodifiers)))
    return words


def _adjective_phrase(polarity: int, rng: random.Random) -> list[_Word]:
    """A sentiment adjective, optionally preceded by an (unmarked) intensifier."""
    words: list[_Word] = []
    if rng.random() < _INTENSIFIER_RATE:
        words.append((rng.choice(_INTENSIFIERS), False))
    words.append((rng.choice(_ADJECTIVES[polarity]), True))
    return words


def _noun_phrase(polarity: int, rng: random.Random) -> list[_Word]:
    """'a'/'an', an optional sentiment adjective, then a sentiment noun."""
    words: list[_Word] = []
    if rng.random() < _NOUN_ADJECTIVE_RATE:
        words.append((rng.choice(_ADJECTIVES[polarity]), True))
    words.append((rng.choice(_NOUNS[polarity]), True))
    article = "an" if words[0][0][0] in "aeiou" else "a"
    return [(article, False), *words]


def _fill(
    pattern: str, polarity: int, subject: str, domain: _Domain, rng: random.Random
) -> list[_Word]:
    """Fill a template pattern with words of the given sentiment polarity."""
    words: list[_Word] = []
    for token in pattern.split():
        if token == "{s}":
            words.extend(_subject_phrase(subject, domain, rng))
        elif token == "{a}":
            words.extend(_adjective_phrase(polarity, rng))
        elif token == "{v}":
            words.append((rng.choice(_VERBS[polarity])[0], True))
        elif token == "{vb}":
            words.append((rng.choice(_VERBS[polarity])[1], True))
        elif token == "{n}":
            words.extend(_noun_phrase(polarity, rng))
        else:
            words.append((token, token in _NEGATORS))
    return words


def _clause(label: int, subject: str, domain: _Domain, rng: random.Random) -> list[_Word]:
    """A clause meaning `label`, negated (with flipped sentiment words) at times."""
    template = rng.choice(_TEMPLATES)
    if rng.random() < _NEGATION_RATE:
        words = _fill(rng.choice(template.negated), 1 - label, subject, domain, rng)
    else:
        words = _fill(template.plain, label, subject, domain, rng)
    if rng.random() < _SUFFIX_RATE:
        words.extend(_neutral(rng.choice(_CONTEXT_PHRASES)))
    return words


def _sentence(label: int, rng: random.Random) -> list[_Word]:
    """One sentence with the given label; in a contrast, the last clause decides."""
    domain = rng.choice(_DOMAINS)
    words: list[_Word] = []
    if rng.random() < _PREFIX_RATE:
        words.extend(_neutral(rng.choice(_TIME_PHRASES) + " ,"))
    if rng.random() < _CONTRAST_RATE:
        first_subject, subject = rng.sample(domain.subjects, 2)
        first = _clause(1 - label, first_subject, domain, rng)
        words.extend((word, False) for word, _ in first)
        words.extend(_neutral(", but"))
    else:
        subject = rng.choice(domain.subjects)
    words.extend(_clause(label, subject, domain, rng))
    words.append((".", False))
    return words


def _records(split: str, examples: list[tuple[str, int, list[int]]]) -> list[dict]:
    """Turn (sentence, label, rationale) triples into numbered records."""
    return [
        {
            "id": f"default-{split}-{k}",
            "sentence": sentence,
            "label": label,
            "rationale": rationale,
        }
        for k, (sentence, label, rationale) in enumerate(examples)
    ]


def generate_default_dataset(
    seed: int = DEFAULT_SEED, size: int = DEFAULT_SIZE, test_fraction: float = 0.2
) -> dict[str, list[dict]]:
    """Generate `size` unique labelled sentences, split into train and test.

    Labels are exactly balanced over the whole dataset. Records are
    {"id", "sentence", "label" (0 negative, 1 positive), "rationale"}, where
    rationale holds one 0/1 per word of ``sentence.split()``.
    """
    if size < 1:
        raise ValueError(f"size must be at least 1, got {size}")
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    rng = random.Random(seed)
    seen: set[str] = set()
    examples: list[tuple[str, int, list[int]]] = []
    for index in range(size):
        label = index % 2
        for _ in range(_MAX_ATTEMPTS):
            words = _sentence(label, rng)
            sentence = " ".join(word for word, _ in words)
            if _MIN_WORDS <= len(words) <= _MAX_WORDS and sentence not in seen:
                break
        else:
            raise ValueError(f"could not generate {size} unique sentences")
        seen.add(sentence)
        examples.append((sentence, label, [int(flag) for _, flag in words]))
    rng.shuffle(examples)
    n_train = size - round(size * test_fraction)
    return {
        "train": _records("train", examples[:n_train]),
        "test": _records("test", examples[n_train:]),
    }


def dataset_fingerprint(seed: int = DEFAULT_SEED, size: int = DEFAULT_SIZE) -> str:
    """SHA-256 hex digest of the generated dataset (JSON, sorted keys), for provenance."""
    dataset = generate_default_dataset(seed=seed, size=size)
    payload = json.dumps(dataset, sort_keys=True)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()
