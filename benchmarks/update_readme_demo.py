"""
Puts the results of the demo into the README: the block between the README's demo markers becomes the demo's
`results.md`, and its picture `captions.png` is copied to `docs/demo_captions.png`, which the block shows.
`make readme-demo` runs the demo and then this script, so the README shows what `make demo` writes.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from rlcaption.shapes.demo_report import readme_with_demo_block

REPOSITORY = Path(__file__).resolve().parent.parent
PICTURE = "docs/demo_captions.png"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", default="runs/demo", help="The demo's --output-dir (default: runs/demo).")
    parser.add_argument("--readme", default=str(REPOSITORY / "README.md"))
    args = parser.parse_args(argv)
    run_dir, readme = Path(args.run_dir), Path(args.readme)
    results = (run_dir / "results.md").read_text(encoding="utf-8")
    shutil.copyfile(run_dir / "captions.png", readme.parent / PICTURE)
    readme.write_text(readme_with_demo_block(readme.read_text(encoding="utf-8"), results, PICTURE), encoding="utf-8")
    print(f"{readme}: demo block from {run_dir / 'results.md'}; {readme.parent / PICTURE} from {run_dir}")


if __name__ == "__main__":
    main()
