import math

from PIL import Image

from rlcaption.demo import DemoSettings, run_demo


def test_quick_demo_trains_both_models_and_judges_them_on_grounding_too(tmp_path, capsys):
    settings = DemoSettings.quick()
    results = run_demo(output_dir=str(tmp_path), settings=settings)

    assert set(results) == {"XE greedy", "XE beam 3", "SCST greedy", "SCST beam 3"}
    for scores in results.values():
        assert 0.0 <= scores["CIDEr"] and 0.0 <= scores["generic_share"] <= 1.0
        assert math.isnan(scores["object_f1"]) or 0.0 <= scores["object_f1"] <= 1.0
    printed = capsys.readouterr().out
    # the evaluator CLIP shipped in checkpoints/ judges both models
    assert "| model | CIDEr-D | BLEU-4 | object F1 | generic | parse failures | CLIP-S | t2i R@1 |" in printed
    assert all(0.0 <= scores["CLIP-S"] <= 2.5 and 0.0 <= scores["t2i_R@1"] <= 1.0 for scores in results.values())
    assert "image encoder pretrained on the scene annotations" in printed
    # both models were saved and the picture shows the test images
    assert (tmp_path / "xe" / "model.safetensors").is_file() and (tmp_path / "scst" / "model.safetensors").is_file()
    with Image.open(tmp_path / "captions.png") as picture:
        assert picture.width > 400 and picture.height > 200
