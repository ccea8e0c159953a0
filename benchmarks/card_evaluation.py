"""
Writes the "How to evaluate" section of every published checkpoint's card: a snippet that loads the checkpoint by
its Hub id, scores it on the split its card reports (`load_shapes()["test"]`, the shapes benchmark, for the
captioners) with the decoding and metrics of the recipe that trained it, and prints the scores of the card's table.

    python benchmarks/card_evaluation.py

puts the section into `checkpoints/<name>/README.md` after the evaluation (in place of the one a previous run wrote)
and copies the card to `model_cards/<name>.md`, with the plots it shows. The numbers of the cards do not change;
`tests/test_card_evaluation.py` runs the snippets.
"""

from __future__ import annotations

import shutil

from reproduction import REPOSITORY, write_card_section

HEADING = "How to evaluate"
EVALUATOR_CLIP = "rlcaption/shapes-clip-evaluator"

# name -> (class that loads it, its recipe's test beams, caption metrics, with the evaluator CLIP, caption sets)
CAPTIONERS = {
    "show-tell-rl-shapes-xe": ("ShowTellRL", 1, ["bleu", "rouge_l", "cider"], False, []),
    "show-tell-rl-shapes-spider-pg-cider": ("ShowTellRL", 3, ["bleu", "meteor", "rouge_l", "cider"], False, []),
    "show-tell-rl-shapes-sle": ("ShowTellRL", 5, ["bleu", "rouge_l", "cider"], True, ["sample", "beam"]),
    "show-tell-rl-shapes-wtf-rl": ("ShowTellRL", 3, ["bleu", "meteor", "rouge_l", "cider", "self_bleu"], True, []),
    "policy-value-shapes-ac": ("AutoModelForImageTextToText", 3, ["bleu", "rouge_l", "cider"], True, []),
    "speaker-listener-shapes-psst": ("AutoModelForImageTextToText", 3, ["bleu", "rouge_l", "cider"], True, []),
}

# what a captioner's card reports beyond `RLCaptionTrainer.evaluate`, computed as its recipe does
_EXTRA_IMPORTS = {
    "show-tell-rl-shapes-wtf-rl": "from rlcaption.evaluation import clip_scores\n",
    "policy-value-shapes-ac": "from rlcaption.evaluation import evaluate_model\n",
    "speaker-listener-shapes-psst": "from rlcaption.evaluation import listener_recall\n",
}
_EXTRA_SCORES = {
    "show-tell-rl-shapes-wtf-rl": """
# the reward CLIP's view of the same captions (rows "... (reward CLIP)")
predictions, _ = trainer.caption_dataset(test_split)
reward_clip = clip_scores(predictions, test_split, "rlcaption/shapes-clip-reward")
scores.update({f"reward_clip_{name}": value for name, value in reward_clip.items()})
""",
    "policy-value-shapes-ac": """
# lookahead beam search, λ = 0.4 (rows "... (lookahead beam search)")
lookahead = evaluate_model(model, processor, test_split, metrics=["cider", "bleu"], num_beams=3, max_new_tokens=20,
                           lookahead_lambda=0.4)
scores.update({f"lookahead_{name}": lookahead[name] for name in ("CIDEr", "Bleu_4", "object_f1")})
# the value network's explained variance needs the training's reward and samples: examples/train_actor_critic.py
""",
    "speaker-listener-shapes-psst": """
# the listener finds each image among the 500 from its speaker's beam-3 caption (rows "Listener R@k"), and every
# score again on the greedy captions (rows "... (greedy decoding)")
scores.update(listener_recall(model, processor, test_split, num_beams=3, max_new_tokens=20))
greedy = listener_recall(model, processor, test_split, max_new_tokens=20, clip="rlcaption/shapes-clip-evaluator",
                         caption_metrics=["bleu", "rouge_l", "cider"])
scores.update({"greedy_" + name.replace("clip_R@", "t2i_R@"): value for name, value in greedy.items()})
""",
}


def captioner_snippet(name: str) -> str:
    """The Python code that rescoring `rlcaption/<name>` takes; it leaves the scores in `scores`."""
    model_class, num_beams, metrics, with_clip, caption_sets = CAPTIONERS[name]
    repo_id = f"rlcaption/{name}"
    if model_class == "ShowTellRL":
        imports = (
            "from rlcaption import CaptionProcessor, RLCaptionConfig, RLCaptionTrainer, ShowTellRL, load_shapes\n"
        )
        loading = (
            f'model = ShowTellRL.from_pretrained("{repo_id}")\n'
            f'processor = CaptionProcessor.from_pretrained("{repo_id}")\n'
        )
    else:
        imports = (
            "from transformers import AutoModelForImageTextToText, AutoProcessor\n\n"
            "from rlcaption import RLCaptionConfig, RLCaptionTrainer, load_shapes  # and registers its models\n"
        )
        loading = (
            f'model = AutoModelForImageTextToText.from_pretrained("{repo_id}")\n'
            f'processor = AutoProcessor.from_pretrained("{repo_id}")\n'
        )
    options = [f"eval_num_beams={num_beams}", f"eval_metrics={metrics!r}".replace("'", '"')]
    if with_clip:
        options.append(f'eval_clip="{EVALUATOR_CLIP}"')
    if caption_sets:
        # the sampled caption sets are drawn with the run's seed, 0 in every published recipe run
        options += [f"eval_caption_sets={caption_sets!r}".replace("'", '"'), "seed=0"]
    return (
        imports
        + _EXTRA_IMPORTS.get(name, "")
        + "\n"
        + loading
        + 'test_split = load_shapes()["test"]  # the shapes benchmark: 500 test images of 48 px, seed 0\n'
        + 'args = RLCaptionConfig(output_dir="runs/evaluate", use_cpu=True, report_to=[],\n'
        + "                       "
        + ",\n                       ".join(options)
        + ")\n"
        + "trainer = RLCaptionTrainer(model=model.eval(), args=args, processing_class=processor)\n"
        + 'scores = {name.removeprefix("test_"): value\n'
        + '          for name, value in trainer.evaluate(test_split, metric_key_prefix="test").items()}\n'
        + _EXTRA_SCORES.get(name, "")
        + "print(scores)  # CIDEr, Bleu_4, object_f1, ...: the table above\n"
    )


def clip_snippet(name: str) -> str:
    """The Python code that rescoring the shapes CLIP `rlcaption/<name>` takes; it leaves the recalls in `scores`."""
    return f"""import rlcaption  # registers ShapesCLIP with the Auto classes
from rlcaption.data import load_shapes
from rlcaption.shapes.dataset import most_specific_reference
from rlcaption.metrics import clip_retrieval

# the CLIPs' splits: 1,000 validation and 1,000 test images rendered at 64 px (the processor resizes them to 48)
shapes = load_shapes(num_train=10000, num_validation=1000, num_test=1000, image_size=64)
scores = {{}}
for split in ("test", "validation"):
    queries = [most_specific_reference(captions) for captions in shapes[split]["captions"]]
    scores[split] = clip_retrieval(shapes[split]["image"], queries, model="rlcaption/{name}")
print(scores)  # t2i_R@1, i2t_R@1, ... of each split: the table above
"""


def embedding_snippet(name: str) -> str:
    """The Python code that rescoring the embedding `rlcaption/<name>` takes; it leaves the recalls in `scores`."""
    return f"""from transformers import AutoModel, AutoProcessor

from rlcaption.data import load_shapes  # importing rlcaption registers its models with the Auto classes
from rlcaption.metrics.clip import embed_images, embed_texts
from rlcaption.metrics.retrieval import retrieval_recall

model = AutoModel.from_pretrained("rlcaption/{name}").eval()
processor = AutoProcessor.from_pretrained("rlcaption/{name}")
test_split = load_shapes()["test"]  # the shapes benchmark: 500 test images of 48 px, seed 0
captions = [caption for references in test_split["captions"] for caption in references]  # all 2,500
owner = [image for image, references in enumerate(test_split["captions"]) for _ in references]
scores = retrieval_recall(embed_texts(model, processor, captions), embed_images(model, processor, test_split["image"]),
                          ks=(1, 5, 10), text_to_image_index=owner)
print(scores)  # t2i_R@1 (caption to image), i2t_R@1, ...: the table above
"""


def evaluation_snippet(name: str) -> str:
    """The snippet of the card of the published checkpoint `name`."""
    if name in CAPTIONERS:
        return captioner_snippet(name)
    if name.startswith("shapes-clip-"):
        return clip_snippet(name)
    return embedding_snippet(name)


def section_body(name: str) -> str:
    return (
        "The code that gives the table above (in a clone of rlcaption, the folder `checkpoints/<name>` in place of "
        "the Hub id gives the same numbers):\n\n"
        f"```python\n{evaluation_snippet(name)}```"
    )


def main() -> None:
    for folder in sorted((REPOSITORY / "checkpoints").iterdir()):
        card = folder / "README.md"
        if not card.is_file():
            continue
        write_card_section(card, HEADING, section_body(folder.name))
        shutil.copyfile(card, REPOSITORY / "model_cards" / f"{folder.name}.md")
        for picture in folder.glob("*.png"):  # the plots a reproduction put into the card, which it links beside it
            shutil.copyfile(picture, REPOSITORY / "model_cards" / picture.name)
        print(f"{card}: {HEADING}")


if __name__ == "__main__":
    main()
