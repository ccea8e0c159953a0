"""When calls are captured as CUDA graphs: at a key's (a batch shape's) second call, a few kept per model, where the
generation config says so. The graphs themselves run on a GPU only (tests/trainer/test_cuda.py); here a stand-in
records the captures."""

import pytest
import torch
from torch import nn
from transformers import GenerationConfig

from rlcaption.generation import step_decoding
from rlcaption.generation.captioners import captioner_for
from tiny_captioners import regions_show_tell


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


def test_graphs_are_a_setting_of_the_generation_config_on_by_default():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert step_decoding.uses_cuda_graphs(GenerationConfig(), cuda)
    assert not step_decoding.uses_cuda_graphs(GenerationConfig(cuda_graphs=False), cuda)
    assert not step_decoding.uses_cuda_graphs(GenerationConfig(), cpu)
    # how the loop runs, not what it decodes: the loop still decodes the config in place of generate()
    assert step_decoding.decodes_plainly(GenerationConfig(do_sample=False, max_new_tokens=4, cuda_graphs=False))


def test_two_models_in_one_process_decode_as_their_own_generation_configs_say(monkeypatch):
    # the decoding loop as on a GPU, with a stand-in for the graph that records whose decoding it holds
    graphed = []

    def graph_run_eagerly(model, function, inputs, settings):
        graphed.append(model)
        return function(**inputs)

    on_a_gpu = step_decoding.uses_cuda_graphs
    monkeypatch.setattr(
        step_decoding, "uses_cuda_graphs", lambda config, device: on_a_gpu(config, torch.device("cuda"))
    )
    monkeypatch.setattr(step_decoding, "graphed_call", graph_run_eagerly)
    step_by_step, graphs = (
        regions_show_tell(image_attention=False).eval(),
        regions_show_tell(image_attention=False).eval(),
    )
    step_by_step.generation_config.cuda_graphs = False
    image_inputs = {"image_features": torch.randn(2, 4, 6), "image_feature_mask": torch.ones(2, 4, dtype=torch.long)}
    greedy = {"do_sample": False, "num_beams": 1, "max_new_tokens": 4}

    def decodes_as_a_graph(model, **settings) -> bool:
        graphed.clear()
        captions = captioner_for(model).generate(image_inputs, GenerationConfig(**greedy, **settings))
        assert captions.shape[0] == 2
        return graphed == [model]

    assert not decodes_as_a_graph(step_by_step) and decodes_as_a_graph(graphs)
    # a config that says wins over the model's own setting
    assert decodes_as_a_graph(step_by_step, cuda_graphs=True) and not decodes_as_a_graph(graphs, cuda_graphs=False)
