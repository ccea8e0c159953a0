import numpy as np
import pytest

from rlcaption.metrics.retrieval import retrieval_recall

# Three images and one text each, ranks worked out by hand from the cosine similarities:
#            I0=(1,0)  I1=(0,1)  I2=(1,1)/sqrt2
# T0=(1,.1)   .995      .100      .774     -> own I0 first                       (T2I rank 0)
# T1=(1,.9)   .743      .669      .999     -> own I1 third                       (T2I rank 2)
# T2=(0,1)    0         1         .707     -> own I2 second                      (T2I rank 1)
# Columns read as image queries: I0's own T0 is first (rank 0), I1's own T1 is behind T2 (rank 1), I2's own T2 is
# behind T0 and T1 (rank 2).
HAND_TEXTS = np.array([[1.0, 0.1], [1.0, 0.9], [0.0, 1.0]])
HAND_IMAGES = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])


def test_hand_computed_ranks():
    recalls = retrieval_recall(HAND_TEXTS, HAND_IMAGES, ks=(1, 2, 3))
    assert recalls == pytest.approx(
        {
            "t2i_R@1": 1 / 3,
            "t2i_R@2": 2 / 3,
            "t2i_R@3": 1.0,
            "i2t_R@1": 1 / 3,
            "i2t_R@2": 2 / 3,
            "i2t_R@3": 1.0,
        }
    )


def test_cosine_similarity_ignores_scale_and_accepts_torch():
    torch = pytest.importorskip("torch")
    expected = retrieval_recall(HAND_TEXTS, HAND_IMAGES, ks=(1, 2))
    scaled = retrieval_recall(HAND_TEXTS * np.array([[3.0], [0.2], [7.0]]), HAND_IMAGES * 5.0, ks=(1, 2))
    assert scaled == expected
    from_torch = retrieval_recall(
        torch.tensor(HAND_TEXTS, dtype=torch.float32, requires_grad=True), torch.tensor(HAND_IMAGES), ks=(1, 2)
    )
    assert from_torch == expected


def test_several_texts_per_image_i2t_hit_when_any_text_is_in_top_k():
    images = np.array([[1.0, 0.0], [0.0, 1.0]])
    # image 0 owns texts 0 and 1, image 1 owns texts 2 and 3; text 1 (0.1, 1) looks more like image 1
    texts = np.array([[1.0, 0.0], [0.1, 1.0], [0.0, 1.0], [0.2, 1.0]])
    recalls = retrieval_recall(texts, images, ks=(1, 2), text_to_image_index=[0, 0, 1, 1])
    # T2I: texts 0, 2, 3 find their image first; text 1 ranks its image second
    assert recalls["t2i_R@1"] == pytest.approx(3 / 4)
    assert recalls["t2i_R@2"] == 1.0
    # I2T: each image has an own text with similarity 1 (texts 0 and 2), which nothing beats
    assert recalls["i2t_R@1"] == 1.0
    # Without text 0, image 0's only text (similarity .0995) is behind text 3 of image 1 (similarity .196) and
    # ahead of text 2 (similarity 0): rank 1. Image 1's text 2 (similarity 1) is first.
    recalls = retrieval_recall(texts[1:], images, ks=(1, 2), text_to_image_index=[0, 1, 1])
    assert recalls["i2t_R@1"] == pytest.approx(1 / 2)
    assert recalls["i2t_R@2"] == 1.0


def test_ties_count_against_the_query():
    # A collapsed text encoder: all 4 captions share one embedding. Images 0-2 are identical (exact ties);
    # image 3 is parallel to the captions (cosine 1 > cosine .926 of the others).
    texts = np.ones((4, 3))
    images = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 1.0, 1.0]])
    recalls = retrieval_recall(texts, images, ks=(1, 3, 4))
    # T2I: texts 0-2 have images 3 (better) and two tied twins ahead -> rank 3; text 3 -> rank 0
    assert recalls["t2i_R@1"] == pytest.approx(1 / 4)
    assert recalls["t2i_R@3"] == pytest.approx(1 / 4)
    assert recalls["t2i_R@4"] == 1.0
    # I2T: every image sees 4 identical texts; its own ties with the 3 others -> rank 3 for every image
    assert recalls["i2t_R@1"] == 0.0 and recalls["i2t_R@3"] == 0.0 and recalls["i2t_R@4"] == 1.0


def _brute_force_recall(texts, images, owner, ks):
    texts = texts / np.linalg.norm(texts, axis=1, keepdims=True)
    images = images / np.linalg.norm(images, axis=1, keepdims=True)
    similarity = texts @ images.T
    t2i_ranks = [int(np.where(np.argsort(-row) == owner[t])[0][0]) for t, row in enumerate(similarity)]
    i2t_ranks = []
    for image in range(images.shape[0]):
        order = np.argsort(-similarity[:, image])
        i2t_ranks.append(min(int(np.where(order == t)[0][0]) for t in np.flatnonzero(owner == image)))
    t2i_ranks, i2t_ranks = np.array(t2i_ranks), np.array(i2t_ranks)
    return {
        **{f"t2i_R@{k}": float((t2i_ranks < k).mean()) for k in ks},
        **{f"i2t_R@{k}": float((i2t_ranks < k).mean()) for k in ks},
    }


def test_matches_sorting_on_random_embeddings_without_ties():
    rng = np.random.default_rng(0)
    images = rng.normal(size=(40, 16))
    owner = np.repeat(np.arange(40), 3)
    texts = images[owner] + rng.normal(scale=1.5, size=(120, 16))  # noisy captions: recall well below 1
    ks = (1, 5, 10)
    recalls = retrieval_recall(texts, images, ks=ks, text_to_image_index=owner)
    assert recalls == pytest.approx(_brute_force_recall(texts, images, owner, ks), abs=1e-12)
    assert 0.0 < recalls["t2i_R@1"] < 1.0


@pytest.mark.parametrize(
    "texts, images, kwargs, message",
    [
        (np.zeros((2, 2)), np.eye(2), {}, "zero vectors"),
        (np.eye(2), HAND_IMAGES, {}, "pass `text_to_image_index`"),
        (np.ones((2, 3)), np.eye(2), {}, "dims 3 and 2 differ"),
        (np.eye(2), np.eye(2), {"text_to_image_index": [0, 0]}, r"Images \[1\] have no text"),
        (np.eye(2), np.eye(2), {"text_to_image_index": [0, 5]}, r"entries \[5\]"),
        (np.eye(2), np.eye(2), {"text_to_image_index": [0.0, 1.0]}, "one integer image index"),
        (np.eye(2), np.eye(2), {"ks": (0,)}, "positive integers"),
        (np.array([[np.nan, 1.0], [1.0, 0.0]]), np.eye(2), {}, "NaN"),
        (np.ones(3), np.eye(3), {}, "shape"),
    ],
)
def test_bad_inputs_are_rejected(texts, images, kwargs, message):
    with pytest.raises(ValueError, match=message):
        retrieval_recall(texts, images, **kwargs)
