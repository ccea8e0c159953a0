"""Model cards of the shapes CLIPs: retrieval results in the metadata and the tables."""

import pytest
from huggingface_hub import ModelCard

from rlcaption.shapes.clip_model_card import render_clip_model_card, retrieval_eval_results
from tiny_clips import make_processor, make_shapes_clip

SCORES = {"t2i_R@1": 0.875, "t2i_R@5": 0.99, "i2t_R@1": 0.8125}


def test_card_carries_the_recalls_in_its_metadata_and_tables(tmp_path):
    model = make_shapes_clip(make_processor())
    card = render_clip_model_card(
        model,
        repo_id="org/tiny-clip",
        scores=SCORES,
        model_summary="a test CLIP.",
        training_settings={"epochs": 3},
        num_images=1000,
        validation_scores={"t2i_R@1": 0.5, "t2i_R@5": 0.75, "i2t_R@1": 0.25},
    )
    card.save(tmp_path / "README.md")
    loaded = ModelCard.load(tmp_path / "README.md")
    reported = {result.metric_name: result.metric_value for result in loaded.data.eval_results}
    assert reported == {"text-to-image R@1": 0.875, "text-to-image R@5": 0.99, "image-to-text R@1": 0.8125}
    assert all(
        result.metric_type == "recall" and result.dataset_split == "test" for result in loaded.data.eval_results
    )
    assert "| text-to-image R@1 | 0.875 | 0.500 |" in loaded.text
    assert "| epochs | 3 |" in loaded.text and "1,000 images" in loaded.text
    assert "a 2-block CNN (channels [4, 8]" in loaded.text
    parameters = sum(parameter.numel() for parameter in model.parameters())
    assert f"{parameters / 1e3:.0f}k parameters" in loaded.text


def test_unknown_score_keys_and_mismatched_validation_scores_are_rejected():
    with pytest.raises(ValueError, match="R@1"):
        retrieval_eval_results({"recall@1": 0.5}, dataset_type="shapes", dataset_name="shapes")
    with pytest.raises(ValueError, match="same recalls"):
        render_clip_model_card(
            make_shapes_clip(make_processor()), "org/x", SCORES, "s", {}, 10, validation_scores={"t2i_R@1": 0.5}
        )
