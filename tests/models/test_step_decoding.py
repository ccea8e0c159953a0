"""When the decoding loop captures CUDA graphs: at a batch shape's second decoding, a few kept per model. The graphs
themselves run on a GPU only (tests/trainer/test_cuda.py); here a stand-in records the captures."""

import pytest
from torch import nn

from rlcaption.models import step_decoding


class RecordedGraph:
    captured: list = []

    def __init__(self, step, state, num_captions, config):
        self.key = state.shape_key
        RecordedGraph.captured.append(self.key)


class State:
    def __init__(self, shape_key):
        self.shape_key = shape_key


@pytest.fixture
def recorded_captures(monkeypatch):
    RecordedGraph.captured = []
    monkeypatch.setattr(step_decoding, "_DecodingGraph", RecordedGraph)
    monkeypatch.setattr(step_decoding, "_graph_key", lambda model, state, num_captions, config: state.shape_key)
    return RecordedGraph.captured


def decode_shapes(model, shapes):
    """The graph each decoding of `shapes` in turn would replay (None: step by step)."""
    graphs = [step_decoding._graphed_decoding(model, None, State(shape), 1, None) for shape in shapes]
    return [None if graph is None else graph.key for graph in graphs]


def test_a_graph_is_captured_at_the_second_decoding_of_a_shape(recorded_captures):
    model = nn.Linear(2, 2)
    replayed = decode_shapes(model, ["a", "a", "a", "b", "c", "b", "a"])
    assert replayed == [None, "a", "a", None, None, "b", "a"]
    assert recorded_captures == ["a", "b"]


def test_shapes_seen_once_are_never_captured_and_evict_no_graph(recorded_captures):
    model = nn.Linear(2, 2)
    # region features padded to each batch's largest count: a new shape at almost every batch
    shapes = ["common", "common"] + [f"regions {count}" for count in range(20)] + ["common"]
    replayed = decode_shapes(model, shapes)
    assert recorded_captures == ["common"]
    assert replayed[-1] == "common" and set(replayed[2:-1]) == {None}


def test_only_the_most_recent_graphs_are_kept_per_model(recorded_captures):
    model, other = nn.Linear(2, 2), nn.Linear(2, 2)
    keep = step_decoding.MAX_DECODING_GRAPHS_PER_MODEL
    shapes = [shape for index in range(keep + 1) for shape in (index, index)]
    decode_shapes(model, shapes)
    assert list(step_decoding._DECODING_GRAPHS[model]) == list(range(1, keep + 1))
    assert decode_shapes(other, [0]) == [None]  # graphs and shapes are per model
    assert decode_shapes(model, [0]) == [None]  # evicted: decoded step by step, captured again at the next use
    assert decode_shapes(model, [0]) == [0] and recorded_captures.count(0) == 2
