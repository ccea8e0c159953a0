"""
What the reproduction benchmarks (`sle_reproduction.py`, `psst_reproduction.py`, `compare_objectives.py`, ...) share:
each run is made once (a run whose `eval_results.json` exists is read, not made again, so an interrupted reproduction
continues where it stopped), and the runs of a row are summarised as mean ± standard deviation over seeds in a Markdown
table.

Each reproduction also writes its page's tables and verdicts: between the markers `<!-- <script>: begin -->` and
`<!-- <script>: end -->` of its docs/methods page ([`write_page_block`]), and its verdicts into its row of the
README's Methods table ([`write_readme_verdict`]), rendered from its results, which it keeps in
`benchmarks/results/<script>.json` ([`RESULTS_DIRECTORY`]) so that a test can render them again and compare.

One cache serves them all: a run's folder holds `run_key.json` beside its results, with what made it: the recipe (an
`examples/` script, or the benchmark's own arm), its options, the code version (the git commit and a hash of the
uncommitted changes to tracked files, else the package version) and the torch and transformers versions. A folder made
by another recipe, other options, other code or other library versions is refused with the fields that differ, never
read as this run's results.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from verdicts import Comparison, summary_cell

from rlcaption.hub import provenance

REPOSITORY = Path(__file__).resolve().parent.parent
WARM_START = "checkpoints/show-tell-rl-shapes-xe"
EVALUATOR_CLIP = "checkpoints/shapes-clip-evaluator"


RUN_KEY_FILE = "run_key.json"


RESULTS_FILE = "eval_results.json"
# where each reproduction keeps the results its page block is rendered from (`<script stem>.json`)
RESULTS_DIRECTORY = REPOSITORY / "benchmarks" / "results"
# the fields of a run key besides its options, in the order a refusal names them
KEY_FIELDS = ("recipe", "code", "torch", "transformers")


def code_version() -> str:
    """The version of this repository's code ([`rlcaption.hub.provenance.code_version`]), whichever script asks."""
    return provenance.code_version(REPOSITORY)


def run_key(recipe: str, options: Sequence[str]) -> dict[str, Any]:
    """
    What makes a run's results: its recipe, its command-line options (all but `--output_dir`), the code version and
    the torch and transformers versions.
    """
    return {
        "recipe": recipe,
        "options": list(options),
        "code": code_version(),
        "torch": importlib.metadata.version("torch"),
        "transformers": importlib.metadata.version("transformers"),
    }


def _option_values(options: Sequence[str]) -> dict[str, list[str]]:
    """`["--a", "1", "--b", "x", "y"]` as `{"--a": ["1"], "--b": ["x", "y"]}`."""
    values: dict[str, list[str]] = {}
    flag = ""
    for option in options:
        if option.startswith("--"):
            flag = option
            values.setdefault(flag, [])
        else:
            values.setdefault(flag, []).append(option)
    return values


def _shown(values: list[str] | None) -> str:
    return "(absent)" if values is None else " ".join(values) or "(no value)"


def key_differences(cached: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """The fields in which the key of a cached run differs from the wanted one, each as `field: cached → wanted`."""
    differences = [
        f"{field}: {cached.get(field)!r} → {wanted[field]!r}"
        for field in KEY_FIELDS
        if cached.get(field) != wanted.get(field)
    ]
    cached_options, wanted_options = _option_values(cached.get("options", [])), _option_values(wanted["options"])
    for flag in sorted(set(cached_options) | set(wanted_options)):
        before, after = cached_options.get(flag), wanted_options.get(flag)
        if before != after:
            differences.append(f"option {flag}: {_shown(before)} → {_shown(after)}")
    return differences


def check_run_key(run_dir: Path, key: Mapping[str, Any]) -> None:
    """
    Refuses a run folder that another recipe, other options, other code or other library versions made (its
    `run_key.json` differs from `key`), and one with results but no key (nothing says what made them).

    Raises:
        `RuntimeError`: naming the differing fields and how to rerun.
    """
    key_file = run_dir / RUN_KEY_FILE
    rerun = f"delete {run_dir} to rerun it, or give the benchmark another --output-dir"
    if not key_file.is_file():
        if (run_dir / RESULTS_FILE).is_file():
            raise RuntimeError(
                f"{run_dir} holds results but no {RUN_KEY_FILE}: nothing says which options and code made them, so "
                f"they cannot be reused; {rerun}."
            )
        return
    differences = key_differences(json.loads(key_file.read_text()), key)
    if differences:
        raise RuntimeError(f"{run_dir} was made by another run ({'; '.join(differences)}); {rerun}.")


def run_once(run_dir: Path, key: Mapping[str, Any], make: Callable[[], dict]) -> dict:
    """
    The results of the run that `key` names ([`run_key`]), from the cache folder `run_dir`: read from its
    `eval_results.json` if the run was made, else made by `make()` (which returns them, or writes that file itself)
    after `key` is recorded in `run_dir/run_key.json`. A folder that another run made is refused ([`check_run_key`]).
    """
    check_run_key(run_dir, key)
    results = run_dir / RESULTS_FILE
    if not results.is_file():
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / RUN_KEY_FILE).write_text(json.dumps(key, indent=1))
        made = make()
        if not results.is_file():
            results.write_text(json.dumps(made, indent=1))
    return json.loads(results.read_text())


def run_recipe_once(recipe: str, run_dir: Path, options: Sequence[str]) -> dict[str, dict[str, float]]:
    """
    Runs `examples/<recipe> --output_dir <run_dir> <options>` on one core (its log in `run_dir/log.txt`) unless the
    run's scores are cached ([`run_once`]), and returns them by split (`{"test": {...}}`, and `"validation"` with
    `--score_validation`).
    """

    def launch() -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        command = [sys.executable, f"examples/{recipe}", "--output_dir", str(run_dir), *options]
        start = time.perf_counter()
        with open(run_dir / "log.txt", "w", encoding="utf-8") as log:
            completed = subprocess.run(command, cwd=REPOSITORY, env=env, stdout=log, stderr=subprocess.STDOUT)
        if completed.returncode != 0 or not (run_dir / RESULTS_FILE).is_file():
            raise RuntimeError(f"{' '.join(command)} failed; see {run_dir / 'log.txt'}.")
        print(f"[{run_dir.name}] {time.perf_counter() - start:.0f} s", flush=True)

    return run_once(run_dir, run_key(recipe, options), launch)


def summarise(runs: Sequence[Mapping[str, float]], keys: Sequence[str]) -> dict[str, tuple[float, float]]:
    """`{key: (mean, standard deviation)}` over the runs that report the key (0 deviation for one run)."""
    summary = {}
    for key in keys:
        values = [run[key] for run in runs if run.get(key) is not None]
        if values:
            summary[key] = (statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0)
    return summary


def markdown_table(
    rows: Mapping[str, Mapping[str, tuple[float, float]]],
    num_runs: Mapping[str, int],
    columns: Sequence[tuple[str, str]],
    first_header: str = "method",
    decimals: Mapping[str, int] | None = None,
) -> str:
    """One row per entry of `rows`, one `mean ± s.d.` cell per `(key, header)` of `columns`, with 3 decimals unless
    `decimals` gives the key others (a count of captions, seconds)."""
    lines = [
        f"| {first_header} | seeds | " + " | ".join(header for _, header in columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    places = {key: (decimals or {}).get(key, 3) for key, _ in columns}
    for name, summary in rows.items():
        cells = [
            f"{summary[key][0]:.{places[key]}f} ± {summary[key][1]:.{places[key]}f}" if key in summary else ""
            for key, _ in columns
        ]
        lines.append(f"| {name} | {num_runs[name]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def benchmark_command() -> str:
    """The command line that ran this benchmark, as a model card quotes it."""
    return " ".join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]])


def write_card_section(card: Path, heading: str, body: str, plot: Path | None = None, plot_caption: str = "") -> None:
    """
    Puts `## <heading>` with `body` into the model card `card` (a checkpoint's `README.md`) before its first section
    after the evaluation, or in place of the section of that heading a previous run wrote. With `plot`, the picture is
    copied beside the card and shown at the end of the section.
    """
    if plot is not None:
        if plot.resolve() != (card.parent / plot.name).resolve():
            shutil.copyfile(plot, card.parent / plot.name)
        body = f"{body.rstrip()}\n\n![{plot_caption}]({plot.name})"
    text = card.read_text(encoding="utf-8")
    section = f"## {heading}\n\n{body.strip()}\n\n"
    start = text.find(f"## {heading}\n")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + section + (text[end + 1 :] if end >= 0 else "")
    else:
        evaluation = text.find("## Evaluation\n")
        end = text.find("\n## ", evaluation + 1) if evaluation >= 0 else -1
        text = text[: end + 1] + section + text[end + 1 :] if end >= 0 else text.rstrip("\n") + "\n\n" + section
    card.write_text(text.rstrip("\n") + "\n", encoding="utf-8")


def _page_markers(script: str) -> tuple[str, str]:
    return f"<!-- {script}: begin -->", f"<!-- {script}: end -->"


def read_page_block(page: Path, script: str) -> str:
    """The block of `page` between `script`'s markers (see [`write_page_block`])."""
    text = page.read_text(encoding="utf-8")
    begin, end = _page_markers(script)
    if begin not in text or end not in text:
        raise ValueError(f"{page} has no block of {script}: add the lines `{begin}` and `{end}` where it goes.")
    return text[text.index(begin) + len(begin) : text.index(end)].strip("\n")


def write_page_block(page: Path, script: str, block: str) -> None:
    """Puts `block` between the lines `<!-- <script>: begin -->` and `<!-- <script>: end -->` of `page`, in place
    of what a previous run wrote there; the page must hold both markers."""
    read_page_block(page, script)  # the markers are there
    text = page.read_text(encoding="utf-8")
    begin, end = _page_markers(script)
    text = text[: text.index(begin) + len(begin)] + f"\n{block.strip()}\n" + text[text.index(end) :]
    page.write_text(text, encoding="utf-8")


README = REPOSITORY / "README.md"


def _methods_table_row(text: str, objective: str) -> tuple[int, list[str]]:
    """The index of the line of the README's Methods table whose objective column is `objective`, and its cells."""
    for index, line in enumerate(text.split("\n")):
        cells = line.split(" | ")
        if line.startswith("| ") and len(cells) > 2 and cells[2] == f"`{objective}`":
            return index, cells
    raise ValueError(f"The Methods table of {README} has no row whose objective is `{objective}`.")


def read_readme_verdict(objective: str) -> str:
    """The last cell (the reproduction in short) of `objective`'s row of the README's Methods table."""
    _, cells = _methods_table_row(README.read_text(encoding="utf-8"), objective)
    return cells[-1].removesuffix(" |")


def write_readme_verdict(objective: str, cell: str) -> None:
    """Puts `cell` as the last cell of `objective`'s row of the README's Methods table."""
    text = README.read_text(encoding="utf-8")
    index, cells = _methods_table_row(text, objective)
    lines = text.split("\n")
    lines[index] = " | ".join([*cells[:-1], f"{cell} |"])
    README.write_text("\n".join(lines), encoding="utf-8")


class GeneratedPage:
    """
    What a reproduction writes from its results: its block of a docs/methods page (between the markers of
    [`write_page_block`]), its row of the README's Methods table, and the results themselves, kept in
    `benchmarks/results/<script stem>.json` for the test that renders them again.

    Args:
        script: the benchmark's file name (`psst_reproduction.py`), which names the page's markers.
        page: the docs/methods page.
        objective: the objective of its row in the README's Methods table.
    """

    def __init__(self, script: str, page: Path, objective: str):
        self.script, self.page, self.objective = script, page, objective
        self.results = RESULTS_DIRECTORY / f"{Path(script).stem}.json"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """`--from-results FILE` (render an earlier run's results.json without reading any run) and `--page`."""
        parser.add_argument(
            "--from-results", type=Path, default=None,
            help="A results.json of an earlier run of this benchmark: render its tables without reading any run.",
        )  # fmt: skip
        parser.add_argument(
            "--page", action="store_true",
            help=f"Write the tables and verdicts into {self.page.relative_to(REPOSITORY)} and the README's Methods "
            f"table, and keep the results they come from in {self.results.relative_to(REPOSITORY)}.",
        )  # fmt: skip

    @staticmethod
    def _results_of(args: argparse.Namespace, run: Callable[[], dict], output_dir: Path) -> dict:
        """The results of `--from-results`, else those of `run()`, written to `output_dir/results.json`."""
        if args.from_results is not None:
            return json.loads(args.from_results.read_text(encoding="utf-8"))
        results = run()
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
        return results

    def report(
        self,
        args: argparse.Namespace,
        run: Callable[[], dict],
        output_dir: Path,
        render_tables: Callable[[dict], list[str]],
        page_block: Callable[[dict], str],
        comparisons_of: Callable[[dict], list[Comparison]],
    ) -> tuple[dict, list[str]]:
        """
        The results (`--from-results`, else `run()`'s, kept in `output_dir/results.json`) and their tables, printed;
        with `--page`, the results kept in `benchmarks/results/`, the page's block and the README's row written.
        """
        results = self._results_of(args, run, output_dir)
        tables = render_tables(results)
        print("\n\n".join(tables))
        if args.page:
            self.results.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
            write_page_block(self.page, self.script, page_block(results))
            write_readme_verdict(self.objective, summary_cell(comparisons_of(results)))
            print(f"page: {self.page}; README row `{self.objective}`; results: {self.results}")
        return results, tables


def provenance_line(results: Mapping[str, Any], selection: str) -> str:
    """Where a page block comes from: the command, the code version and the seeds of `results`, and how settings
    were chosen."""
    seeds = ", ".join(str(seed) for seed in results["seeds"])
    return (
        f"Generated from `{results['command']}` at {results['code']} (seeds {seeds}; {selection}); the results are in "
        f"`benchmarks/results/`."
    )


@contextmanager
def plot_to(path: Path, figsize: tuple[float, float] = (6, 4.2), legend_outside: bool = False) -> Iterator[Any]:
    """A matplotlib figure's axes to draw on; on exit, legend (right of the axes with `legend_outside`, for plots
    with many series) and grid are added and the figure is saved to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=figsize)
    yield axes
    if legend_outside:
        axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
