"""Tokenization: the pure-Python tokenizer against the COCO toolkit's Java PTBTokenizer and hand-checked cases."""

import json
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from rlcaption.metrics import tokenization
from rlcaption.metrics.tokenization import (
    PUNCTUATIONS,
    normalize_caption,
    ptb_tokenize_lines,
    tokenize_caption,
    tokenize_corpus,
)

FAKECAP = Path(__file__).parent.parent / "fixtures" / "fakecap"
requires_java = pytest.mark.skipif(shutil.which("java") is None, reason="needs `java` on PATH to run the PTBTokenizer")


def fakecap_captions() -> list[str]:
    """The fixture's 1,000 generated and 5,005 human captions, raw."""
    ground_truth = json.loads((FAKECAP / "captions_val2014_fakecap_gt_subset.json").read_text())
    results = json.loads((FAKECAP / "captions_val2014_fakecap_results.json").read_text())
    return [entry["caption"] for entry in results] + [entry["caption"] for entry in ground_truth["annotations"]]


# Each expected output was produced by Stanford CoreNLP 3.4.1's PTBTokenizer (-preserveLines -lowerCase) followed by
# the toolkit's punctuation filter.
@pytest.mark.parametrize(
    ("caption", "expected"),
    [
        ("A man riding a wave on top of a surfboard.", "a man riding a wave on top of a surfboard"),
        ("A red,whit,and black train.", "a red whit and black train"),
        ("Don't stop; it's a dog's life!", "do n't stop it 's a dog 's life"),
        ("The cat can't fly, cannot swim.", "the cat ca n't fly can not swim"),
        ("A wide sidewalk in the 1950's has a clock.", "a wide sidewalk in the 1950 's has a clock"),
        ("The hair in this horse 's mane is long.", "the hair in this horse 's mane is long"),
        ("it is at least 11 o' clock.", "it is at least 11 o clock"),
        ("it is 11 o'clock and hors d'oeuvres", "it is 11 o'clock and hors d'oeuvres"),
        ("graffiti'ed po'boy", "graffiti'ed po boy"),
        ("an oakland A's pitcher", "an oakland a 's pitcher"),
        ('The words "Connect_Anywhere" cover a photo', "the words connect_anywhere cover a photo"),
        ("to STOP [EATING ANIMALS].", "to stop -lsb- eating animals -rsb-"),
        ("A sign (red) on a pole", "a sign -lrb- red -rrb- on a pole"),
        ("a black-and-white close-up of his/her t-shirt", "a black-and-white close-up of his/her t-shirt"),
        ("a 10-foot fence and a 3-way stop", "a 10-foot fence and a 3-way stop"),
        ("the time is 11:43 p.m. on a t.v. in the U.S army", "the time is 11:43 p.m. on a t.v. in the u.s army"),
        ("the clock shows 1:42pm and 9:00 AM", "the clock shows 1:42 pm and 9:00 am"),
        ("1,000 people paid $5 for 1% milk", "1,000 people paid $ 5 for 1 % milk"),
        ("on West 25 1/2 street", "on west 25\u00a01/2 street"),
        ("Street signs for Richmond St. and Prince St. posted", "street signs for richmond st. and prince st. posted"),
        ("A man crossing a road on Division st.", "a man crossing a road on division st."),
        ("this is a street sign for W. Centre st.", "this is a street sign for w. centre st."),
        ("There is a yellow fire hydrant I. The street", "there is a yellow fire hydrant i the street"),
        ("a cake with two no. 2 candles", "a cake with two no. 2 candles"),
        ("a boat holding an ore.", "a boat holding an ore"),
        ("a car wash.", "a car wash"),
        ("a shelf.. by the curb?? Thanks!!!", "a shelf by the curb ?? thanks !!!"),
        ("a trash can.;", "a trash can."),
        ("A train on the track.Passengers wait", "a train on the track.passengers wait"),
        ("at Dunkin' Donuts", "at dunkin' donuts"),
        ("a 2+ seater sofa", "a 2 + seater sofa"),
        ("", ""),
        ("...!?", "!?"),
        (". , ; : -- ... ' ` ''", ""),
        ("\u201cHello\u201d said the man \u2014 twice\u2026", "hello said the man twice"),
        (
            "A na\u00efve caf\u00e9\u2019s cr\u00e8me br\u00fbl\u00e9e isn\u2019t here",
            "a na\u00efve caf\u00e9 's cr\u00e8me br\u00fbl\u00e9e is n't here",
        ),
        ("a dog \U0001f436 on a mat", "a dog on a mat"),
        ("\u00bd of a pizza for 50\u20ac, 2\u00a3 or 50\u00a2", "1/2 of a pizza for 50 $ 2 # or 50 cents"),
        ("x \u00a1hola! \u00bfqu\u00e9?", "x \u00a1 hola \u00bf qu\u00e9"),
    ],
)
def test_matches_java_ptb_tokenizer_on_hand_checked_cases(caption, expected):
    assert normalize_caption(caption) == expected
    assert tokenize_caption(caption) == expected.split(" ") if expected else tokenize_caption(caption) == []


def test_newlines_inside_a_caption_are_spaces():
    assert tokenize_caption("a dog\non grass.") == ["a", "dog", "on", "grass"]


def test_non_ascii_caption_gives_lower_cased_tokens():
    assert tokenize_caption("Un Café à Paris.") == ["un", "café", "à", "paris"]
    assert tokenize_caption("一只猫坐在垫子上。") == ["一只猫坐在垫子上", "。"]


def test_punctuation_tokens_never_survive():
    tokens = tokenize_caption('A dog -- running, jumping; playing: `fun\' and "loud" ... yes - no?')
    assert not PUNCTUATIONS.intersection(tokens)
    assert tokens == ["a", "dog", "running", "jumping", "playing", "fun", "and", "loud", "yes", "no"]


def test_tokenize_corpus_fast_keeps_keys_and_order():
    corpus = tokenize_corpus({"b": ["Two cats.", "A cat!"], "a": ["A dog."]})
    assert list(corpus) == ["b", "a"]
    assert corpus == {"b": ["two cats", "a cat"], "a": ["a dog"]}


def test_tokenize_corpus_rejects_unknown_tokenizer():
    with pytest.raises(ValueError, match="'spacy'"):
        tokenize_corpus({1: ["a dog"]}, tokenizer="spacy")


@pytest.mark.java
@requires_java
def test_fast_tokenizer_equals_java_on_fixture_captions():
    pycocoevalcap = pytest.importorskip("pycocoevalcap.tokenizer.ptbtokenizer")
    captions = fakecap_captions()[:1500]
    grouped = defaultdict(list)
    for index, caption in enumerate(captions):
        grouped[index // 5].append({"caption": caption})
    reference = pycocoevalcap.PTBTokenizer().tokenize(dict(grouped))
    ours = tokenize_corpus({key: [entry["caption"] for entry in entries] for key, entries in grouped.items()})
    assert ours == reference


@pytest.mark.java
@requires_java
def test_ptb_option_equals_pycocoevalcap_tokenizer():
    pycocoevalcap = pytest.importorskip("pycocoevalcap.tokenizer.ptbtokenizer")
    captions = {"x": ["A dog's toy (red).", "West 25 1/2 St."], "y": ["Two cats, sleeping!"]}
    reference = pycocoevalcap.PTBTokenizer().tokenize(
        {key: [{"caption": caption} for caption in texts] for key, texts in captions.items()}
    )
    assert tokenize_corpus(captions, tokenizer="ptb") == reference
    assert ptb_tokenize_lines([]) == []


@pytest.mark.parametrize(
    "caption",
    [
        "A Man Riding A WAVE on top of a surfboard.", "a dog on a mat", "  two cats  ", "The corner of Prince St.",
        "flags of Mass.", "he cannot swim.", "Gonna rain", "a car wash.", "a boat holding an ore.", ".", "",
    ],
)  # fmt: skip
def test_captions_of_letters_and_spaces_take_a_shortcut_with_the_lexers_tokens(caption):
    lexed = tuple(token.lower() for token in tokenization._lex(caption) if token.lower() not in PUNCTUATIONS)
    assert tuple(tokenize_caption(caption)) == lexed
