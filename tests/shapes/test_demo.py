import math
import os
import re
from pathlib import Path

import pytest
from PIL import Image

from rlcaption.shapes.demo import DemoSettings, run_demo
from rlcaption.shapes.demo_report import (
    README_BLOCK_BEGIN,
    README_BLOCK_END,
    caption_habits,
    distinct_scene_indices,
    idle_cores,
    readme_with_demo_block,
)

REPOSITORY = Path(__file__).resolve().parents[2]


def _object(shape, color, size="small", row=0, column=0):
    return {"shape": shape, "color": color, "size": size, "row": row, "column": column, "x": 0.0, "y": 0.0}


def _table_headers(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("| model |")]


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("demo")
    results = run_demo(output_dir=str(output_dir), settings=DemoSettings.quick())
    return output_dir, results


def test_quick_demo_trains_both_models_and_judges_them_on_grounding_too(quick_demo):
    output_dir, results = quick_demo
    assert set(results) == {"XE greedy", "XE beam 3", "SCST greedy", "SCST beam 3"}
    for scores in results.values():
        assert 0.0 <= scores["CIDEr"] and 0.0 <= scores["generic_share"] <= 1.0
        assert math.isnan(scores["object_f1"]) or 0.0 <= scores["object_f1"] <= 1.0
    # the evaluator CLIP shipped in checkpoints/ judges both models
    assert all(0.0 <= scores["CLIP-S"] <= 2.5 and 0.0 <= scores["t2i_R@1"] <= 1.0 for scores in results.values())
    # both models were saved and the picture shows the test images
    assert (output_dir / "xe" / "model.safetensors").is_file() and (
        output_dir / "scst" / "model.safetensors"
    ).is_file()
    with Image.open(output_dir / "captions.png") as picture:
        assert picture.width > 400 and picture.height > 200


def test_the_demo_writes_its_tables_and_timings(quick_demo):
    output_dir, results = quick_demo
    written = (output_dir / "results.md").read_text()
    assert _table_headers(written)[0] == (
        "| model | CIDEr-D | BLEU-4 | object F1 | generic | parse failures | CLIP-S | t2i R@1 |"
    )
    cider = f"{results['SCST beam 3']['CIDEr']:.3f}"
    assert re.search(rf"^\| SCST beam 3 \| {re.escape(cider)} \|", written, re.MULTILINE)
    assert "states a relation" in written and "From XE to SCST, greedy:" in written
    assert re.search(
        r"One run, seed 0: \d+ s \(scene pretraining \d+ s, XE \d+ s, SCST \d+ s, scoring \d+ s\)", written
    )
    assert re.search(r"CPU time \d+ s user \+ \d+ s sys, \d torch thread", written)


def test_the_readme_block_is_the_demos_results_and_picture(quick_demo):
    output_dir, _ = quick_demo
    readme = (REPOSITORY / "README.md").read_text()
    block = readme[readme.index(README_BLOCK_BEGIN) : readme.index(README_BLOCK_END)]
    # the README shows the demo's tables, column for column, and the picture the update copies in
    assert _table_headers(block) == _table_headers((output_dir / "results.md").read_text())
    assert "](docs/demo_captions.png)" in block and (REPOSITORY / "docs" / "demo_captions.png").is_file()


def test_readme_block_replaces_only_what_lies_between_the_markers():
    readme = f"intro\n{README_BLOCK_BEGIN}\nold table\n{README_BLOCK_END}\nrest\n"
    updated = readme_with_demo_block(readme, "| model | CIDEr-D |\n", "docs/demo_captions.png")
    assert updated.startswith(f"intro\n{README_BLOCK_BEGIN}\n") and updated.endswith(f"{README_BLOCK_END}\nrest\n")
    assert "old table" not in updated and "| model | CIDEr-D |" in updated and "(docs/demo_captions.png)" in updated
    assert readme_with_demo_block(updated, "| model | CIDEr-D |\n", "docs/demo_captions.png") == updated
    with pytest.raises(ValueError, match="demo results"):
        readme_with_demo_block("no markers", "table", "picture.png")


def test_caption_habits_count_repeated_objects_sizes_and_relations():
    scenes = [[_object("circle", "orange")], [_object("square", "red", "large"), _object("star", "blue", column=2)]]
    repeated = ["an orange square and an orange square", "a large red square left of a small blue star"]
    habits = caption_habits(repeated, scenes)
    assert habits == {"repeated_object_share": 0.5, "size_share": 0.5, "relation_share": 0.5}
    plain = caption_habits(["an orange circle", "a red square and a blue star"], scenes)
    assert plain == {"repeated_object_share": 0.0, "size_share": 0.0, "relation_share": 0.0}


def test_distinct_scenes_skip_near_duplicates():
    base = [_object("circle", "red"), _object("star", "blue", column=2)]
    recoloured = [_object("circle", "green"), _object("star", "blue", column=2)]
    other = [_object("hexagon", "gray", row=2), _object("square", "yellow", row=1)]
    single = [_object("circle", "red")]
    assert distinct_scene_indices([base, recoloured, other, single, base], 3) == [0, 2, 3]


def test_idle_cores_is_a_usable_thread_count():
    assert 1 <= idle_cores(sample_seconds=0.05) <= len(os.sched_getaffinity(0))
