from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard

from hub_network import refuse_hub_requests
from rlcaption.hub import OBJECTIVE_CITATIONS, caption_eval_results, publish_folder, render_model_card
from rlcaption.models import ShowTellRL, ShowTellRLConfig

SCORES = {"CIDEr": 1.25, "Bleu_4": 0.5, "ROUGE_L": 0.625, "METEOR": 0.375}


def tiny_model() -> ShowTellRL:
    torch.manual_seed(0)
    config = ShowTellRLConfig(
        vocab_size=30,
        hidden_size=16,
        word_embedding_size=16,
        image_size=16,
        cnn_channels=[4, 8],
    )
    return ShowTellRL(config)


RENDER_FIELDS = dict(
    repo_id="org/show-tell-rl-test",
    dataset_type="shapes",
    dataset_name="shapes",
    model_summary="A test captioner.",
    training_summary="Trained for a test.",
    training_settings={"objective": "`spider_pg`", "rollouts per prefix (K)": 3},
    evaluation_summary="Beam search on the test split.",
    limitations="None known.",
    objective="spider_pg",
)


def render(**overrides):
    return render_model_card(tiny_model(), **{**RENDER_FIELDS, "scores": SCORES, **overrides})


# ---------------------------------------------------------------- model cards


# each method's paper by its title, as its card must cite it
PAPER_TITLES = {
    "xe": "Show and Tell: A Neural Image Caption Generator",
    "scst": "Self-critical Sequence Training for Image Captioning",
    "spider_pg": "Improved Image Captioning via Policy Gradient optimization of SPIDEr",
    "sle": "Better Captioning with Sequence-Level Exploration",
    "wtf": "Distinctive Image Captioning: Leveraging Ground Truth Captions in CLIP Guided Reinforcement Learning",
    "actor_critic": "Deep Reinforcement Learning-based Image Captioning with Embedding Reward",
    "psst": "Joint Optimization for Cooperative Image Captioning",
}


@pytest.mark.parametrize("objective", sorted(PAPER_TITLES))
def test_model_card_cites_the_paper_of_the_objective_that_trained_it(objective):
    card = render(objective=objective).text
    assert PAPER_TITLES[objective] in card.split("## Citation", 1)[1]
    for other, title in PAPER_TITLES.items():
        if other != objective:
            assert title not in card, other


def test_every_objective_with_a_citation_has_its_title_checked():
    assert set(OBJECTIVE_CITATIONS) == set(PAPER_TITLES)


# the published captioners' cards and the objective that trained each
PUBLISHED_CAPTIONERS = {
    "policy-value-shapes-ac": "actor_critic",
    "show-tell-rl-shapes-sle": "sle",
    "show-tell-rl-shapes-spider-pg-cider": "spider_pg",
    "show-tell-rl-shapes-wtf-rl": "wtf",
    "show-tell-rl-shapes-xe": "xe",
    "speaker-listener-shapes-psst": "psst",
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_CAPTIONERS))
def test_published_cards_cite_the_paper_of_their_objective(name):
    repository = Path(__file__).resolve().parent.parent
    citation = f"```bibtex\n{OBJECTIVE_CITATIONS[PUBLISHED_CAPTIONERS[name]]}\n```"
    for card in (repository / "checkpoints" / name / "README.md", repository / "model_cards" / f"{name}.md"):
        assert citation in card.read_text(encoding="utf-8").split("## Citation", 1)[1], card


def test_model_card_refuses_an_objective_without_a_known_paper():
    with pytest.raises(ValueError, match="OBJECTIVE_CITATIONS"):
        render(objective="my_method")


def test_model_card_carries_the_scores_in_its_metadata_and_its_table(tmp_path):
    render().save(tmp_path / "README.md")
    card = ModelCard.load(tmp_path / "README.md")  # what the Hub parses
    results = {result.metric_name: result for result in card.data.eval_results}
    assert {name: result.metric_value for name, result in results.items()} == {
        "CIDEr-D": 1.25, "BLEU-4": 0.5, "ROUGE-L": 0.625, "METEOR": 0.375,
    }  # fmt: skip
    assert results["CIDEr-D"].metric_type == "cider" and results["BLEU-4"].metric_type == "bleu"
    assert all(result.dataset_split == "test" and result.task_type == "image-to-text" for result in results.values())
    assert card.data.model_name == "show-tell-rl-test"
    assert card.data.pipeline_tag == "image-text-to-text" and card.data.library_name == "rlcaption"
    for row in ("| CIDEr-D | 1.250 |", "| BLEU-4 | 0.500 |", "| rollouts per prefix (K) | 3 |"):
        assert row in card.text, row
    assert 'ShowTellRL.from_pretrained("org/show-tell-rl-test")' in card.text
    parameters = sum(parameter.numel() for parameter in tiny_model().parameters())
    assert f"{parameters / 1e3:.0f}k parameters" in card.text


def test_the_pipeline_of_the_card_s_task_captions_as_generate_does():
    from transformers import pipeline
    from transformers.pipelines import SUPPORTED_TASKS

    from rlcaption.data import load_shapes
    from rlcaption.generation.decoding import generate_captions
    from rlcaption.inference import load_captioner

    checkpoint = str(Path(__file__).resolve().parent.parent / "checkpoints" / "show-tell-rl-shapes-xe")
    model, processor = load_captioner(checkpoint)
    task = render_model_card(model, **{**RENDER_FIELDS, "scores": SCORES}).data.pipeline_tag
    images = load_shapes(num_train=1, num_validation=1, num_test=3, image_size=48)["test"][:3]["image"]

    assert task in SUPPORTED_TASKS  # not a task transformers 5 renamed or removed
    captioner = pipeline(task, model=checkpoint)
    outputs = captioner(images=images, text=[""] * len(images))  # the text prompt the task needs: none

    pixel_values = processor(images=images, return_tensors="pt")["pixel_values"]
    expected = generate_captions(model, processor, {"pixel_values": pixel_values}, num_beams=1).texts
    assert all(expected) and [output["generated_text"] for output in outputs] == expected


def test_eval_results_reject_unknown_metric_keys():
    with pytest.raises(ValueError, match=r"\['CIDEr-D'\].*Bleu_4"):
        caption_eval_results({"CIDEr-D": 1.0}, dataset_type="shapes", dataset_name="shapes")


def test_scene_grounding_scores_reach_the_card_and_supports_do_not(tmp_path):
    scores = {**SCORES, "object_f1": 0.875, "generic_share": 0.125, "relation_accuracy": float("nan"),
              "num_captions": 500.0, "color_precision": 0.9}  # fmt: skip
    render(scores=scores).save(tmp_path / "README.md")
    card = ModelCard.load(tmp_path / "README.md")
    values = {result.metric_name: result.metric_value for result in card.data.eval_results}
    assert values["Object F1 (colour+shape)"] == 0.875 and values["Generic captions"] == 0.125
    # nan (nothing to count) and support counts are not results
    assert "Relation accuracy" not in values and not any("500" in str(value) for value in values.values())
    assert "| Object F1 (colour+shape) | 0.875 |" in card.text


def test_a_custom_template_is_filled(tmp_path):
    template = tmp_path / "card.md"
    rows = "{% for name, value in scores.items() %}{{ name }}={{ value }};{% endfor %}"
    template.write_text("---\n{{ card_data }}\n---\n\n# {{ model_name }}\n" + rows + "\n")
    card = render(template_path=template)
    assert "# show-tell-rl-test" in card.content
    # in the COCO evaluation code's order
    assert "BLEU-4=0.5;METEOR=0.375;ROUGE-L=0.625;CIDEr-D=1.25;" in card.content


def test_publish_folder_needs_a_saved_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        publish_folder(tmp_path, "org/name")


def test_trainer_evaluation_and_caption_set_scores_reach_the_card(tmp_path):
    scores = {**SCORES, "loss": 2.5, "num_images": 500.0, "runtime": 3.0, "Div-2": 0.4, "CLIP-S": 2.04,
              "t2i_R@1": 0.538, "sample5_CIDEr": 1.9, "beam5_Div-2": 0.31, "sample5_object_f1": 0.8}  # fmt: skip
    render(scores=scores).save(tmp_path / "README.md")
    values = {
        result.metric_name: result.metric_value for result in ModelCard.load(tmp_path / "README.md").data.eval_results
    }
    assert values["Div-2"] == 0.4 and values["Text-to-image R@1 (evaluator CLIP)"] == 0.538
    assert values["CIDEr-D, 5 samples per image"] == 1.9 and values["Div-2, beam-5 top 5 per image"] == 0.31
    assert values["Object F1 (colour+shape), 5 samples per image"] == 0.8
    assert 2.5 not in values.values() and 500.0 not in values.values()
    with pytest.raises(ValueError, match="sample5_BLEU"):
        caption_eval_results({"sample5_BLEU": 1.0}, dataset_type="shapes", dataset_name="shapes")


def test_push_to_hub_without_a_network_says_so_and_how_to_publish_later(monkeypatch):
    import huggingface_hub.constants

    refuse_hub_requests(monkeypatch)
    with pytest.raises(RuntimeError, match=r"Could not push the ShowTellRL to the Hub repo org/model: ConnectError"):
        tiny_model().push_to_hub("org/model")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(RuntimeError, match=r"OfflineModeIsEnabled.*hf upload org/model <folder>"):
        tiny_model().push_to_hub("org/model")
