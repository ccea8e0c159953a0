"""Caption tokenization identical to the COCO caption evaluation toolkit.

The COCO toolkit (``pycocoevalcap``) tokenizes every caption with Stanford CoreNLP 3.4.1's ``PTBTokenizer``
(``-preserveLines -lowerCase``) and then drops the tokens of its punctuation list. ``tokenize_caption`` reproduces
that pipeline in pure Python, so metrics and rewards need no Java process; ``tokenize_corpus(..., tokenizer="ptb")``
runs the Java tokenizer itself when the exact toolkit behaviour is wanted.

The Python lexer follows the Penn Treebank conventions of the Java lexer for the text found in captions:

- punctuation is split off words (``"field."`` -> ``field .``), except inside numbers (``1,000``, ``3.5``,
  ``6:53``), abbreviations (``St.``, ``t.v.``, ``p.m.``, ``W.``) and dotted or slashed words (``his/her``);
- hyphenated words stay whole (``close-up``, ``t-shirt``), ``--`` is a separate token;
- clitics are split (``don't`` -> ``do n't``, ``can't`` -> ``ca n't``, ``cat's`` -> ``cat 's``, ``cannot`` ->
  ``can not``);
- quotes become ````` / ``''``, parentheses ``-LRB-``/``-RRB-``, braces ``-LCB-``/``-RCB-`` and square brackets
  ``-LSB-``/``-RSB-``; everything is lower-cased *after* lexing.

The toolkit then removes the tokens in `PUNCTUATIONS`. It compares *lower-cased* tokens with that upper-case list,
so the bracket tokens (``-lrb-``, ``-rrb-``, ...) survive the filter; we keep that quirk because the reference
scores depend on it.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from typing import TypeVar

__all__ = [
    "PUNCTUATIONS",
    "TOKENIZERS",
    "normalize_caption",
    "ptb_tokenize_lines",
    "tokenize_caption",
    "tokenize_corpus",
]

K = TypeVar("K")

# The toolkit's punctuation list (pycocoevalcap/tokenizer/ptbtokenizer.py), compared against lower-cased tokens.
PUNCTUATIONS = frozenset(
    ["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!", ",", ":", "-", "--", "...", ";"]
)

TOKENIZERS = ("fast", "ptb")

# Abbreviations the Java lexer keeps together with their final period (matched case-insensitively, as it does).
_ABBREVIATIONS = frozenset(
    """
    jan feb mar apr jun jul aug sep sept oct nov dec mon tue tues wed thu thurs fri penn la ct
    inc co cos corp pty ltd plc bancorp dept bhd assn univ intl sys invt elec natl mfg mtg
    tel est ext sq jr sr bros blvd rd esq etc al seq vs alex wm jos cie cf
    mr mrs ms dr drs prof profs sen sens rep reps atty attys lt col gen messrs gov govs adm rev maj sgt cpl
    pvt mt ft capt st ste ave pres lieut hon brig cmdr comdr pfc spc supt supts det mm mme mmes mlle mlles
    """.split()
)
# State abbreviations, recognised only when capitalised ("Mass." but not "mass.").
_STATE_ABBREVIATIONS = frozenset(
    "calif mass conn fla ill mich pa va ariz tenn md ga ore kan ky mo okla wash wis minn ala nev neb colo miss".split()
)
# Abbreviations that keep their period only before a number ("no. 2").
_NUMBER_ABBREVIATIONS = frozenset(["no", "nos"])

# Words the Java lexer splits in two although they contain no apostrophe.
_SPLIT_WORDS = {"cannot": ("can", "not"), "gonna": ("gon", "na"), "gotta": ("got", "ta"), "wanna": ("wan", "na")}

_ALNUM = r"[^\W_]"
# An apostrophe stays inside a word after a one-letter prefix ("o'clock", "d'oeuvres"; not "I'm") or between two
# vowels ("graffiti'ed"); elsewhere it starts a clitic ("it 's") or is a quote ("po ' boy").
_WORD_APOSTROPHE = rf"(?:(?<!{_ALNUM}{_ALNUM})(?<=[a-hj-xz])'(?=[a-z]{{2}})|(?<=[aeiouy])'(?=[aeiou]))"
_TOKEN = re.compile(
    rf"""
    (?P<fraction>\d+\ \d+/\d+)(?!{_ALNUM})                        # 25 1/2 (one token, joined by a no-break space)
    | (?P<number>[-+]?\d+(?:[.,:/]\d+)+|[-+]\d+)                   # 1,000  3.5  6:53  1/2  +9
    | (?P<acronym>[A-Za-z](?:\.[A-Za-z])+\.?)(?!{_ALNUM})         # t.v.  u.s  p.m.  e.g.
    | (?P<apostrophe_word>(?:dunkin|somethin|nothin|ol|goin|rock)'(?!{_ALNUM}))  # dunkin'
    | (?P<word>{_ALNUM}+(?:(?:[-/&_.]|{_WORD_APOSTROPHE}){_ALNUM}+)*)  # close-up  his/her  o'clock  graffiti'ed
    | (?P<clitic>(?:'s|'m|'d|'re|'ve|'ll|n't)(?!{_ALNUM}))          # the 's of "person 's"
    | (?P<ellipsis>\.\.\.)
    | (?P<dashes>--+)
    | (?P<exclamation>[?!]+)
    | (?P<double_quote>")
    | (?P<backquotes>``|`)
    | (?P<single_quotes>''|')
    | (?P<symbol>.)
    """,
    re.VERBOSE | re.IGNORECASE,
)
# Unicode the Java lexer rewrites before tokenizing (curly quotes, dashes, ellipsis, currencies, vulgar fractions,
# zero-width space), mapped to the ASCII the rest of this lexer handles the same way.
_UNICODE_REWRITES = str.maketrans(
    {
        **dict.fromkeys("\u201c\u201d\u201e\u201f\u00ab\u00bb", '"'),
        **dict.fromkeys("\u2018\u2019\u201a\u201b", "'"),
        **dict.fromkeys("\u2012\u2013\u2014\u2015", "--"),
        "\u2026": "...",
        "\u20ac": "$",
        "\u00a3": "#",
        "\u00a2": " cents ",
        "\u00bc": "1/4",
        "\u00bd": "1/2",
        "\u00be": "3/4",
        "\u2153": "1/3",
        "\u2154": "2/3",
        "\u200b": " ",
    }
)
# Characters outside the Basic Multilingual Plane (emoji) are untokenizable for the Java lexer, which deletes them.
_OUTSIDE_BMP = re.compile("[\U00010000-\U0010ffff]")
_SIMPLE_CAPTION = re.compile(r"[A-Za-z ]*")
_NEGATION = re.compile(rf"'t(?!{_ALNUM})", re.IGNORECASE)
_BRACKETS = {"(": "-LRB-", ")": "-RRB-", "{": "-LCB-", "}": "-RCB-", "[": "-LSB-", "]": "-RSB-"}


def _split_word(word: str) -> list[str]:
    """Split the lexer's two-part words ("cannot" -> "can not")."""
    parts = _SPLIT_WORDS.get(word.lower())
    if parts is None:
        return [word]
    return [word[: len(parts[0])], word[len(parts[0]) :]]


def _keeps_period(word: str, text: str, after: int) -> bool:
    """Whether the period at `text[after]`, right after `word`, belongs to the word (an abbreviation)."""
    rest = text[after + 1 :].lstrip()
    lowered = word.lower()
    if lowered in _ABBREVIATIONS:
        return True
    if lowered in _STATE_ABBREVIATIONS:
        return word[0].isupper()
    if lowered in _NUMBER_ABBREVIATIONS:
        return rest[:1].isdigit()
    if len(word) == 1 and word.isalpha():
        # an initial ("W. Centre St."), but not the pronoun "I." and not a letter ending the caption
        return lowered != "i" and bool(rest)
    # a period followed by a comma or semicolon stays on the word ("can.;")
    return rest[:1] in (",", ";") and not text[after + 1 : after + 2].isspace()


def _lex(text: str) -> list[str]:
    """Penn Treebank tokens of one line, original case, before punctuation removal."""
    text = _OUTSIDE_BMP.sub("", text.translate(_UNICODE_REWRITES))
    tokens: list[str] = []
    position = 0
    length = len(text)
    while position < length:
        if text[position].isspace():
            position += 1
            continue
        match = _TOKEN.match(text, position)
        kind = match.lastgroup
        token = match.group()
        position = match.end()
        if kind == "word" and token[-1] in "nN" and len(token) > 1 and _NEGATION.match(text, position):
            # "don't" -> "do n't": the negation clitic takes the word's last letter
            tokens.extend(_split_word(token[:-1]))
            tokens.append(token[-1] + text[position : position + 2])
            position += 2
        elif kind == "word":
            if position < length and text[position] == "." and _keeps_period(token, text, position):
                tokens.append(token + ".")
                position += 1
                continue
            tokens.extend(_split_word(token))
        elif kind == "double_quote":
            opens = position == 1 or text[position - 2].isspace() or text[position - 2] in "([{"
            tokens.append("``" if opens else "''")
        elif kind == "fraction":
            tokens.append(token.replace(" ", "\u00a0"))
        elif kind == "symbol":
            tokens.append(_BRACKETS.get(token, token))
        else:
            tokens.append(token)
    return tokens


def tokenize_caption(text: str) -> list[str]:
    """Tokenize one caption exactly as the COCO caption evaluation toolkit does.

    Args:
        text (`str`): a raw caption, any case and punctuation.

    Returns:
        `list[str]`: the lower-cased Penn Treebank tokens without the toolkit's punctuation tokens; empty for an
        empty or punctuation-only caption.
    """
    return list(_tokenize_cached(text))


@functools.lru_cache(maxsize=2**16)
def _tokenize_cached(text: str) -> tuple[str, ...]:
    # sampled captions repeat a lot during training, so the tokens of recent captions are kept
    simple = _simple_caption_words(text)
    if simple is not None:
        return simple
    lowered = (token.lower() for token in _lex(text.replace("\n", " ")))
    return tuple(token for token in lowered if token not in PUNCTUATIONS)


def _simple_caption_words(text: str) -> tuple[str, ...] | None:
    """The lower-cased words of a caption made only of ASCII letters and spaces with an optional final period, else
    None.

    Most captions look like that; for them the lexer's output is just the words, so the regular expressions can be
    skipped. Captions whose last word could keep the final period (an abbreviation) or containing a word the lexer
    splits ("cannot") take the full path.
    """
    body = text.strip()
    has_period = body.endswith(".")
    if has_period:
        body = body[:-1]
    if not _SIMPLE_CAPTION.fullmatch(body):
        return None
    words = body.lower().split()  # lower-cased once, not word by word: the words are ASCII letters
    if has_period and words and (words[-1] in _ABBREVIATIONS or words[-1] in _STATE_ABBREVIATIONS):
        return None
    if not _SPLIT_WORDS.keys().isdisjoint(words):
        return None
    return tuple(words)


def normalize_caption(text: str) -> str:
    """The tokens of `tokenize_caption` joined by single spaces (the form every metric scores)."""
    return " ".join(tokenize_caption(text))


def _find_ptb_jar() -> str:
    """Path of the Stanford CoreNLP 3.4.1 jar shipped with pycocoevalcap."""
    try:
        from pycocoevalcap.tokenizer import ptbtokenizer
    except ImportError as error:
        raise RuntimeError(
            "tokenizer='ptb' runs the COCO toolkit's Java PTBTokenizer, which ships with pycocoevalcap; install it "
            "with `pip install rlcaption[java]` or use tokenizer='fast'."
        ) from error
    jar = os.path.join(
        os.path.dirname(os.path.abspath(ptbtokenizer.__file__)), ptbtokenizer.STANFORD_CORENLP_3_4_1_JAR
    )
    if not os.path.isfile(jar):
        raise FileNotFoundError(f"Stanford CoreNLP jar not found at {jar}; reinstall pycocoevalcap==1.2.")
    return jar


def ptb_tokenize_lines(lines: list[str]) -> list[list[str]]:
    """Run the COCO toolkit's Java PTBTokenizer over captions, one JVM for all of them.

    Args:
        lines (`list[str]`): raw captions (newlines inside a caption are replaced by spaces, as the toolkit does).

    Returns:
        `list[list[str]]`: for each caption its lower-cased tokens before punctuation removal.

    Raises:
        `RuntimeError`: when Java is not on `PATH` or the tokenizer fails.
    """
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("tokenizer='ptb' needs a Java runtime on PATH (Java 8 or newer); use tokenizer='fast'.")
    if not lines:
        return []
    jar = _find_ptb_jar()
    text = "\n".join(line.replace("\n", " ").replace("\r", " ") for line in lines)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False) as handle:
        handle.write(text)
        path = handle.name
    try:
        command = [java, "-cp", jar, "edu.stanford.nlp.process.PTBTokenizer", "-preserveLines", "-lowerCase", path]
        completed = subprocess.run(command, capture_output=True, check=False)
    finally:
        os.remove(path)
    if completed.returncode != 0:
        raise RuntimeError(f"Java PTBTokenizer failed ({completed.returncode}): {completed.stderr.decode()[-2000:]}")
    output = completed.stdout.decode("utf-8").split("\n")
    if len(output) < len(lines):
        raise RuntimeError(f"Java PTBTokenizer returned {len(output)} lines for {len(lines)} captions.")
    # split on plain spaces only, as the toolkit does: a fraction token ("25\u00a01/2") holds a no-break space
    return [[token for token in line.rstrip().split(" ") if token] for line in output[: len(lines)]]


def tokenize_corpus(captions: Mapping[K, list[str]], tokenizer: str = "fast") -> dict[K, list[str]]:
    """Tokenize every caption of a corpus like the COCO toolkit's `PTBTokenizer.tokenize`.

    Args:
        captions (`Mapping[K, list[str]]`): raw captions per key (an image id, say).
        tokenizer (`str`, *optional*, defaults to `"fast"`): `"fast"` for the pure-Python tokenizer, `"ptb"` for
            the toolkit's Java PTBTokenizer (needs Java and pycocoevalcap).

    Returns:
        `dict[K, list[str]]`: for each key its captions, each as space-joined tokens without punctuation.
    """
    if tokenizer == "fast":
        return {key: [normalize_caption(caption) for caption in texts] for key, texts in captions.items()}
    if tokenizer != "ptb":
        raise ValueError(f"tokenizer={tokenizer!r} is not supported; use one of {TOKENIZERS}.")
    keys = [key for key, texts in captions.items() for _ in texts]
    flat = [caption for texts in captions.values() for caption in texts]
    result: dict[K, list[str]] = {key: [] for key in captions}
    for key, tokens in zip(keys, ptb_tokenize_lines(flat), strict=True):
        result[key].append(" ".join(token for token in tokens if token not in PUNCTUATIONS))
    return result
