"""Metric rewards: per-caption values equal to the metric modules and to pycocoevalcap, bad input, SPIDEr."""

import datasets
import numpy as np
import pytest
import torch
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge

from metric_fixtures import java_problem, load_fakecap
from rlcaption.metrics import spice
from rlcaption.metrics.cider import DocumentFrequencies, compute_cider_d
from rlcaption.metrics.tokenization import normalize_caption
from rlcaption.rewards import CiderReward, SpiderReward, get_reward, prepare_reward


@pytest.fixture(scope="module")
def fakecap_rows():
    """(completions, references, image_ids) of the toolkit's example, raw (untokenized) captions."""
    predictions, references = load_fakecap()
    image_ids = list(predictions)
    return list(predictions.values()), [references[i] for i in image_ids], image_ids


def tokenized(completions, references):
    predictions = {row: normalize_caption(caption) for row, caption in enumerate(completions)}
    refs = {
        row: [normalize_caption(reference) for reference in image_refs] for row, image_refs in enumerate(references)
    }
    return predictions, refs


def test_cider_reward_equals_compute_cider_d_with_training_document_frequencies(fakecap_rows, tmp_path):
    completions, references, image_ids = fakecap_rows
    training_corpus = references[:700]
    reward = get_reward("cider", document_frequencies=training_corpus)
    values = reward(completions=completions[500:], references=references[500:], image_id=image_ids[500:])
    predictions, tokenized_refs = tokenized(completions[500:], references[500:])
    document_frequencies = DocumentFrequencies.from_references(
        [[normalize_caption(reference) for reference in refs] for refs in training_corpus]
    )
    _, per_image = compute_cider_d(predictions, tokenized_refs, document_frequencies)
    np.testing.assert_allclose(values, [per_image[row] for row in range(len(values))], rtol=0, atol=1e-9)
    # cached references (second call), a saved file and tensor image ids give the same values
    assert values == reward(completions=completions[500:], references=references[500:], image_id=image_ids[500:])
    document_frequencies.save(tmp_path / "df.json")
    from_file = get_reward("cider", document_frequencies=str(tmp_path / "df.json"))
    np.testing.assert_allclose(
        from_file(completions=completions[500:], references=references[500:], image_id=torch.tensor(image_ids[500:])),
        values,
        rtol=0,
        atol=1e-12,
    )
    # no image_id: cached by the reference tuple
    np.testing.assert_allclose(
        reward(completions=completions[500:], references=references[500:]), values, rtol=0, atol=1e-12
    )


def test_cider_reward_without_document_frequencies_equals_pycocoevalcap_on_the_batch(fakecap_rows):
    completions, references, _ = fakecap_rows
    values = get_reward("cider")(completions=completions[:200], references=references[:200])
    predictions, tokenized_refs = tokenized(completions[:200], references[:200])
    _, theirs = Cider().compute_score(tokenized_refs, {row: [caption] for row, caption in predictions.items()})
    np.testing.assert_allclose(values, theirs, rtol=0, atol=1e-9)


def test_cider_reward_without_document_frequencies_counts_every_row_of_repeated_images(fakecap_rows):
    """An SCST-like call: 4 completions per image, each image's references repeated for each of them (the same list
    object, or an equal copy), one completion empty. Every row is one document, the empty one too, as in the COCO
    code: the values equal pycocoevalcap's `Cider` on all rows."""
    completions, references, image_ids = fakecap_rows
    rows = [(image, sample) for image in range(6) for sample in range(4)]
    row_completions = [completions[image + 6 * sample] for image, sample in rows]
    row_completions[5] = " ... "  # punctuation only: empty once tokenized
    row_references = [references[image] if sample % 2 else list(references[image]) for image, sample in rows]
    row_ids = [image_ids[image] for image, _ in rows]
    values = get_reward("cider")(completions=row_completions, references=row_references, image_id=row_ids)
    predictions, tokenized_refs = tokenized(row_completions, row_references)
    _, theirs = Cider().compute_score(tokenized_refs, {row: [caption] for row, caption in predictions.items()})
    np.testing.assert_allclose(values, theirs, rtol=0, atol=1e-9)
    assert values[5] == 0.0 and min(values[:5] + values[6:]) >= 0 and max(values) > 0
    with pytest.raises(ValueError, match="References of row 2 must all be strings"):
        get_reward("cider")(completions=["a", "b", "c"], references=[["a dog"], ["a dog"], ["a dog", ["a cat"]]])


@pytest.mark.parametrize("n", [4, 2])
def test_bleu_reward_equals_pycocoevalcap_per_image(fakecap_rows, n):
    completions, references, _ = fakecap_rows
    values = get_reward("bleu", n=n)(completions=completions[:150], references=references[:150])
    predictions, tokenized_refs = tokenized(completions[:150], references[:150])
    _, theirs = Bleu(4).compute_score(
        tokenized_refs, {row: [caption] for row, caption in predictions.items()}, verbose=0
    )
    np.testing.assert_allclose(values, theirs[n - 1], rtol=0, atol=1e-9)


def test_rouge_reward_equals_pycocoevalcap_per_image(fakecap_rows):
    completions, references, _ = fakecap_rows
    values = get_reward("rouge_l")(completions=completions[:150], references=references[:150])
    predictions, tokenized_refs = tokenized(completions[:150], references[:150])
    _, theirs = Rouge().compute_score(tokenized_refs, {row: [caption] for row, caption in predictions.items()})
    np.testing.assert_allclose(values, theirs, rtol=0, atol=1e-9)


@pytest.mark.parametrize("name", ["cider", "bleu", "rouge_l"])
def test_empty_and_punctuation_only_completions_score_zero(name):
    references = [["A dog on a couch.", "a dog lying on a sofa"]] * 3
    # a training corpus where the dog n-grams are rare enough to carry weight
    kwargs = {"document_frequencies": references[:1] + [["a cat on a mat"]]} if name == "cider" else {}
    values = get_reward(name, **kwargs)(completions=["", " ... !", "a dog on a sofa"], references=references)
    assert values[:2] == [0.0, 0.0] and values[2] > 0


@pytest.mark.parametrize("name", ["cider", "bleu", "rouge_l"])
def test_bad_inputs_raise_clear_errors(name):
    reward = get_reward(name)
    with pytest.raises(ValueError, match="image_id 77 has no references"):
        reward(completions=["a dog", "a cat"], references=[["a dog"], []], image_id=[76, 77])
    with pytest.raises(ValueError, match="2 completions but 1 reference"):
        reward(completions=["a dog", "a cat"], references=[["a dog"]])
    with pytest.raises(ValueError, match="needs `references`"):
        reward(completions=["a dog"])
    with pytest.raises(ValueError, match="'image_id' has 1 values for 2"):
        reward(completions=["a dog", "a cat"], references=[["a dog"], ["a cat"]], image_id=[1])


def test_conversational_completions_long_and_non_ascii_captions():
    references = [["Ein Hund liegt auf dem Sofa.", "a dog on a sofa"], ["a cat", "a cat on a mat"]]
    reward = CiderReward(document_frequencies=references)
    plain = reward(completions=["ein hund über dem sofa", " ".join(["cat"] * 1000)], references=references)
    chat = reward(
        completions=[
            [{"role": "assistant", "content": "ein hund über dem sofa"}],
            [{"role": "assistant", "content": " ".join(["cat"] * 1000)}],
        ],
        references=references,
    )
    assert plain == chat and all(np.isfinite(plain)) and plain[0] > 0
    assert plain[1] < 1e-6  # the Gaussian length penalty crushes a 1,000-word caption


def test_spider_is_the_mean_of_cider_and_spice(monkeypatch, fakecap_rows):
    completions, references, image_ids = fakecap_rows
    fake_spice = {row: 0.1 * (row % 5) for row in range(20)}
    monkeypatch.setattr(spice, "compute_spice", lambda predictions, refs: (0.0, fake_spice))
    spider = SpiderReward(document_frequencies=references)
    cider = CiderReward(document_frequencies=references)
    inputs = {"completions": completions[:20], "references": references[:20], "image_id": image_ids[:20]}
    expected = (np.array(cider(**inputs)) + np.array([fake_spice[row] for row in range(20)])) / 2
    np.testing.assert_allclose(spider(**inputs), expected, rtol=0, atol=1e-12)


def test_spider_raises_the_spice_error_instead_of_substituting(monkeypatch):
    def spice_cannot_run(predictions, references):
        raise RuntimeError("SPICE needs Stanford CoreNLP 3.6.0 jars; run `rlcaption download-spice`")

    monkeypatch.setattr(spice, "compute_spice", spice_cannot_run)
    reward = get_reward("spider", document_frequencies=[["a dog on a sofa"]])
    with pytest.raises(RuntimeError, match="download-spice"):
        reward(completions=["a dog"], references=[["a dog on a sofa"]])


@pytest.mark.slow  # starts a METEOR JVM (5-20 s)
@pytest.mark.java
@pytest.mark.skipif(java_problem() is not None, reason=f"METEOR 1.5 needs Java >= 8: {java_problem()}")
def test_meteor_reward_equals_compute_meteor(fakecap_rows):
    from rlcaption.metrics.meteor import compute_meteor

    completions, references, _ = fakecap_rows
    values = get_reward("meteor")(completions=completions[:30] + [""], references=references[:31])
    _, theirs = compute_meteor(*tokenized(completions[:30], references[:30]))
    np.testing.assert_allclose(values[:30], [theirs[row] for row in range(30)], rtol=0, atol=1e-9)
    assert values[30] == 0.0


@pytest.fixture(autouse=True)
def isolated_datasets_cache(tmp_path, monkeypatch):
    """Document frequencies remembered in this test's own cache: none from an earlier run is found."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets_cache")


def training_set(references, image_ids):
    return datasets.Dataset.from_dict({"captions": references, "image_id": image_ids})


def training_set_without_captions():
    return datasets.Dataset.from_dict({"image_id": [1, 2], "scene": ["a", "b"]})


@pytest.mark.parametrize("reward_class", [CiderReward, SpiderReward])
def test_prepare_counts_the_document_frequencies_of_the_training_captions(monkeypatch, fakecap_rows, reward_class):
    monkeypatch.setattr(spice, "compute_spice", lambda predictions, refs: (0.0, dict.fromkeys(predictions, 0.25)))
    completions, references, image_ids = fakecap_rows
    inputs = {"completions": completions[300:400], "references": references[300:400], "image_id": image_ids[300:400]}
    unprepared = reward_class()(**inputs)  # frequencies of the batch's own references
    prepared = reward_class()
    prepare_reward(prepared, training_set(references[:300], image_ids[:300]), None)
    explicit = reward_class(document_frequencies=references[:300])
    np.testing.assert_array_equal(prepared(**inputs), explicit(**inputs))
    assert not np.allclose(prepared(**inputs), unprepared)
    # a later training set replaces frequencies counted by prepare
    prepared.prepare(training_set(references[:50], image_ids[:50]), None)
    cider = prepared.cider if reward_class is SpiderReward else prepared
    assert cider.document_frequencies.num_documents == 50


def test_prepare_keeps_document_frequencies_given_when_built(fakecap_rows):
    _, references, image_ids = fakecap_rows
    given = DocumentFrequencies.from_references([[normalize_caption(r) for r in refs] for refs in references[:20]])
    reward = CiderReward(document_frequencies=given)
    reward.prepare(training_set(references, image_ids), None)
    reward.prepare(training_set_without_captions(), None)  # the dataset is not read at all
    assert reward.document_frequencies is given and reward.scorer.document_frequencies is given


@pytest.mark.parametrize("name", ["cider", "spider"])
def test_prepare_without_a_captions_column_names_the_reward_and_the_fix(name):
    reward = get_reward(name)
    expected = rf"The '{name}' reward .* columns \['image_id', 'scene'\]\. Pass a training set with a `captions` col"
    with pytest.raises(ValueError, match=expected + r".*document_frequencies="):
        reward.prepare(training_set_without_captions(), None)
    with pytest.raises(ValueError, match=rf"The '{name}' reward .* got no training dataset"):
        prepare_reward(reward, None, None)


def test_document_frequencies_are_counted_once_per_training_set(monkeypatch, fakecap_rows, tmp_path):
    completions, references, image_ids = fakecap_rows
    countings = []
    from_references = DocumentFrequencies.from_references.__func__

    def counting(cls, corpus, *args, **kwargs):
        countings.append(len(corpus))
        return from_references(cls, corpus, *args, **kwargs)

    monkeypatch.setattr(DocumentFrequencies, "from_references", classmethod(counting))
    first_launch = CiderReward()
    first_launch.prepare(training_set(references[:300], image_ids[:300]), None)
    assert countings == [300]
    # the next launch builds the same training set again: its frequencies are read, in the file format of `save`
    next_launch, spider = CiderReward(), SpiderReward()
    next_launch.prepare(training_set(references[:300], image_ids[:300]), None)
    spider.prepare(training_set(references[:300], image_ids[:300]), None)
    assert countings == [300]
    counted, read = first_launch.document_frequencies, next_launch.document_frequencies
    assert (read.num_documents, read.max_n) == (counted.num_documents, counted.max_n) == (300, 4)
    assert read.index == counted.index  # the same n-grams in the same order
    np.testing.assert_array_equal(read.counts, counted.counts)
    assert spider.cider.document_frequencies.index == counted.index
    inputs = {"completions": completions[300:400], "references": references[300:400], "image_id": image_ids[300:400]}
    np.testing.assert_array_equal(next_launch(**inputs), first_launch(**inputs))
    # another training set is counted
    CiderReward().prepare(training_set(references[:299], image_ids[:299]), None)
    assert countings == [300, 299]
    # a file of another format under the remembered name is counted again, and replaced
    (cache_file,) = (tmp_path / "datasets_cache" / "rlcaption_cider_document_frequencies").glob(
        f"{training_set(references[:300], image_ids[:300])._fingerprint}*"
    )
    cache_file.write_bytes(b"not document frequencies")
    CiderReward().prepare(training_set(references[:300], image_ids[:300]), None)
    assert countings == [300, 299, 300]
    assert DocumentFrequencies.load(cache_file).index == counted.index
