"""When calls are captured as CUDA graphs: at a key's (a batch shape's) second call, a few kept per model. The graphs
themselves run on a GPU only (tests/trainer/test_cuda.py); here a stand-in records the captures."""

import pytest
from torch import nn

from rlcaption.generation import step_decoding


@pytest.fixture
def recorded_captures():
    return []


def decode_shapes(model, shapes, captures):
    """The graph each call with a key of `shapes` in turn would replay (None: run eagerly); captures are recorded."""
    replayed = []
    for shape in shapes:
        graph = step_decoding._captured(model, shape, lambda shape=shape: captures.append(shape) or shape)
        replayed.append(graph)
    return replayed


def test_a_graph_is_captured_at_the_second_decoding_of_a_shape(recorded_captures):
    model = nn.Linear(2, 2)
    replayed = decode_shapes(model, ["a", "a", "a", "b", "c", "b", "a"], recorded_captures)
    assert replayed == [None, "a", "a", None, None, "b", "a"]
    assert recorded_captures == ["a", "b"]


def test_shapes_seen_once_are_never_captured_and_evict_no_graph(recorded_captures):
    model = nn.Linear(2, 2)
    # region features padded to each batch's largest count: a new shape at almost every batch
    shapes = ["common", "common"] + [f"regions {count}" for count in range(20)] + ["common"]
    replayed = decode_shapes(model, shapes, recorded_captures)
    assert recorded_captures == ["common"]
    assert replayed[-1] == "common" and set(replayed[2:-1]) == {None}


def test_only_the_most_recent_graphs_are_kept_per_model(recorded_captures):
    model, other = nn.Linear(2, 2), nn.Linear(2, 2)
    keep = step_decoding.MAX_GRAPHS_PER_MODEL
    shapes = [shape for index in range(keep + 1) for shape in (index, index)]
    decode_shapes(model, shapes, recorded_captures)
    assert list(step_decoding._CAPTURED_CALLS[model]) == list(range(1, keep + 1))
    assert decode_shapes(other, [0], recorded_captures) == [None]  # graphs and shapes are per model
    # evicted: run eagerly, captured again at the next use
    assert decode_shapes(model, [0], recorded_captures) == [None]
    assert decode_shapes(model, [0], recorded_captures) == [0] and recorded_captures.count(0) == 2


def test_a_call_that_cannot_be_captured_runs_eagerly_from_then_on():
    model, attempts = nn.Linear(2, 2), []

    def capture():
        attempts.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    assert [step_decoding._captured(model, "shape", capture) for _ in range(4)] == [None] * 4
    assert len(attempts) == 1


def test_a_graph_switch_is_set_by_its_call_and_set_back_after_a_with_block(monkeypatch):
    use, switch = step_decoding.use_cuda_graphs, step_decoding._CUDA_GRAPHS
    monkeypatch.setitem(switch, "enabled", True)
    use(False)  # a plain call keeps its setting
    assert switch["enabled"] is False
    with use(True):
        assert switch["enabled"] is True
        with use(False):
            assert switch["enabled"] is False
        assert switch["enabled"] is True  # the value before the inner block, not a default
    assert switch["enabled"] is False
    with pytest.raises(KeyError), use(True):
        raise KeyError("a failure inside the block")
    assert switch["enabled"] is False
