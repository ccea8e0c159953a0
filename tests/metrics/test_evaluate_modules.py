"""The `evaluate` metric modules: offline loading from the package, parity with evaluate_captions, composition."""

import os
import subprocess
import sys

import evaluate
import pytest

from metric_fixtures import load_fakecap
from rlcaption.metrics import corpus
from rlcaption.metrics.cider import DocumentFrequencies
from rlcaption.metrics.corpus import EVALUATE_MODULES, evaluate_captions, load_metric
from rlcaption.metrics.tokenization import normalize_caption


@pytest.fixture(scope="module")
def fakecap_lists():
    """200 images of the COCO toolkit's example as `evaluate` takes them: (predictions, references) lists."""
    predictions, references = load_fakecap()
    keys = list(predictions)[:200]
    return [predictions[key] for key in keys], [references[key] for key in keys]


def expected_scores(predictions, references, metrics, **kwargs):
    return evaluate_captions(dict(enumerate(predictions)), dict(enumerate(references)), metrics=metrics, **kwargs)


@pytest.mark.parametrize(("name", "metric"), [("bleu", "bleu"), ("rouge_l", "rouge_l"), ("cider_d", "cider")])
def test_module_equals_evaluate_captions(fakecap_lists, name, metric):
    predictions, references = fakecap_lists
    module = load_metric(name)
    assert isinstance(module, evaluate.EvaluationModule)
    assert module.compute(predictions=predictions, references=references) == expected_scores(
        predictions, references, [metric]
    )


def test_modules_compose_with_evaluate_combine(fakecap_lists):
    predictions, references = fakecap_lists
    combined = evaluate.combine([load_metric("bleu"), load_metric("rouge"), load_metric("cider")])
    scores = combined.compute(predictions=predictions, references=references)
    assert scores == expected_scores(predictions, references, ["bleu", "rouge_l", "cider"])


def test_batches_added_one_by_one_give_the_corpus_score(fakecap_lists):
    predictions, references = fakecap_lists
    module = load_metric("bleu")
    for start in range(0, len(predictions), 64):
        module.add_batch(predictions=predictions[start : start + 64], references=references[start : start + 64])
    assert module.compute() == expected_scores(predictions, references, ["bleu"])


def test_cider_module_takes_saved_training_document_frequencies(fakecap_lists, tmp_path):
    predictions, references = fakecap_lists
    frequencies = DocumentFrequencies.from_references(
        [[normalize_caption(caption) for caption in captions] for captions in references[:100]]
    )
    path = tmp_path / "document_frequencies.json.gz"
    frequencies.save(path)
    module = load_metric("cider_d")
    from_path = module.compute(predictions=predictions, references=references, document_frequencies=str(path))
    expected = expected_scores(predictions, references, ["cider"], document_frequencies=frequencies)
    assert from_path["CIDEr"] == pytest.approx(expected["CIDEr"], abs=1e-12)
    assert from_path["CIDEr"] != pytest.approx(expected_scores(predictions, references, ["cider"])["CIDEr"], abs=1e-3)


def test_spice_module_raises_instead_of_substituting(monkeypatch):
    def spice_unavailable():
        raise RuntimeError("SPICE needs the Stanford CoreNLP 3.6.0 jars")

    monkeypatch.setattr(corpus, "check_spice", spice_unavailable)
    for name in ("spice", "spider"):
        with pytest.raises(RuntimeError, match="CoreNLP"):
            load_metric(name).compute(predictions=["a cat"], references=[["a cat"]])


def test_every_listed_module_ships_with_the_package():
    for name in EVALUATE_MODULES:
        assert load_metric(name).name == name


def test_unknown_name_is_rejected():
    with pytest.raises(ValueError, match="'sacrebleu'"):
        load_metric("sacrebleu")


def test_module_without_references_names_the_index():
    with pytest.raises(ValueError, match="key 1"):
        load_metric("bleu").compute(predictions=["a cat", "a dog"], references=[["a cat"], []])


def test_modules_load_with_the_hub_offline(tmp_path):
    script = (
        "from rlcaption.metrics import load_metric\n"
        "print(load_metric('cider_d').compute(predictions=['a cat on a mat'], references=[['a cat on a mat']]))\n"
    )
    environment = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_EVALUATE_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf_home"),
        HF_MODULES_CACHE=str(tmp_path / "modules"),
    )
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=environment, timeout=120, check=False
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "CIDEr" in completed.stdout
