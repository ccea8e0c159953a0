"""Agreement of the pure-Python caption tokenizer with the COCO toolkit's Java PTBTokenizer on COCO val2014.

    python benchmarks/tokenizer_agreement.py --data-dir ../shared/data

Runs Stanford CoreNLP 3.4.1's PTBTokenizer (shipped with pycocoevalcap, `-preserveLines -lowerCase`) once over the
202,654 captions of `coco-val2014-captions/val2014_imgid_to_captions.json`, caches its output (`--cache-dir`), applies
the toolkit's punctuation filter, and compares the token lists with `rlcaption.metrics.tokenize_caption`. Prints the
share of identical token lists, the time of both tokenizers and every differing caption (up to `--show`); writes the
figures as JSON with `--output`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

from rlcaption.metrics.tokenization import PUNCTUATIONS, ptb_tokenize_lines, tokenize_caption

CAPTIONS_FILE = Path("coco-val2014-captions") / "val2014_imgid_to_captions.json"


def load_captions(data_dir: Path) -> list[str]:
    """All captions of the file, images in increasing id order, captions in file order."""
    path = data_dir / CAPTIONS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; pass --data-dir pointing at the folder holding {CAPTIONS_FILE}.")
    by_image = json.loads(path.read_text(encoding="utf-8"))
    return [caption for image_id in sorted(by_image, key=int) for caption in by_image[image_id]]


def java_tokens(captions: list[str], cache_dir: Path) -> tuple[list[list[str]], float | None]:
    """The Java tokenizer's tokens of every caption (cached by content hash) and its run time (None when cached)."""
    digest = hashlib.sha256("\n".join(captions).encode("utf-8")).hexdigest()[:16]
    cache = cache_dir / f"ptb_tokens_{digest}.json"
    if cache.is_file():
        return json.loads(cache.read_text(encoding="utf-8")), None
    start = time.perf_counter()
    tokens = ptb_tokenize_lines(captions)
    elapsed = time.perf_counter() - start
    cache_dir.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(tokens), encoding="utf-8")
    return tokens, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="folder holding coco-val2014-captions/")
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/rlcaption_ptb_cache"))
    parser.add_argument("--show", type=int, default=50, help="how many differing captions to print")
    parser.add_argument("--output", type=Path, help="write the figures as JSON to this file")
    args = parser.parse_args()

    captions = load_captions(args.data_dir)
    reference, java_seconds = java_tokens(captions, args.cache_dir)
    reference = [[token for token in tokens if token not in PUNCTUATIONS] for tokens in reference]

    start = time.perf_counter()
    ours = [tokenize_caption(caption) for caption in captions]
    python_seconds = time.perf_counter() - start

    differing = [index for index, tokens in enumerate(ours) if tokens != reference[index]]
    agreement = 1 - len(differing) / len(captions)
    java_time = "cached" if java_seconds is None else f"{java_seconds:.2f} s"
    print(f"captions                     {len(captions):>10,}")
    print(f"identical token lists        {len(captions) - len(differing):>10,}")
    print(f"agreement                    {100 * agreement:>10.4f} %")
    print(f"Java PTBTokenizer (1 JVM)    {java_time:>10}")
    print(f"rlcaption tokenize_caption   {python_seconds:>8.2f} s")
    for index in differing[: args.show]:
        print(f"\n{captions[index]!r}\n  java:   {' '.join(reference[index])}\n  python: {' '.join(ours[index])}")
    if args.output is not None:
        figures = {
            "captions": len(captions),
            "identical": len(captions) - len(differing),
            "agreement": agreement,
            "java_seconds": java_seconds,
            "python_seconds": python_seconds,
            "differences": [
                {"caption": captions[index], "java": reference[index], "python": ours[index]} for index in differing
            ],
        }
        args.output.write_text(json.dumps(figures, indent=2, ensure_ascii=False), encoding="utf-8")


if __name__ == "__main__":
    main()
