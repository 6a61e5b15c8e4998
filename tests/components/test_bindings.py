"""Letter bindings round-trip through their recorded spec: the rebuilt factory builds the same module."""

import functools

import pytest
import torch
import yaml

from components import MLP, SSD, CDMoE, HybridLM, InnerFuncAttention, QCAttention
from components.bindings import binding_factory, binding_spec


@pytest.mark.parametrize("factory, spec", [
    (QCAttention, {"class_path": "components.QCAttention", "init_args": {}}),
    (functools.partial(QCAttention, n_heads=2, n_kv_heads=1),
     {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, "n_kv_heads": 1}}),
    (functools.partial(SSD, d_state=8, conv=True, rope=False, n_groups=1),
     {"class_path": "components.SSD", "init_args": {"d_state": 8, "conv": True, "rope": False, "n_groups": 1}}),
    ({"class_path": "components.MLP", "init_args": {"d_ff": 24, "activation": "switanh"}},
     {"class_path": "components.MLP", "init_args": {"d_ff": 24, "activation": "switanh"}}),
    # tuples, in lists and mappings too, are written as lists: YAML's safe loader reads no Python tuple
    (functools.partial(CDMoE, n_keys=(8, 8), n_experts=64),
     {"class_path": "components.CDMoE", "init_args": {"n_keys": [8, 8], "n_experts": 64}}),
    (functools.partial(InnerFuncAttention, inner={"retrieval": {"top_k": (2,)}}, mask=[("position", {"a": (1,)})]),
     {"class_path": "components.InnerFuncAttention",
      "init_args": {"inner": {"retrieval": {"top_k": [2]}}, "mask": [["position", {"a": [1]}]]}}),
])
def test_spec_records_the_class_and_every_keyword(factory, spec):
    assert binding_spec("X", factory) == spec
    assert yaml.safe_load(yaml.safe_dump(spec)) == spec  # plain values only


def test_a_class_the_top_package_does_not_export_is_recorded_by_its_module_path():
    from components.state.experts import MLPExperts

    assert binding_spec("X", functools.partial(MLPExperts, n_experts=2, d_ff=4))["class_path"] == \
        "components.state.experts.MLPExperts"
    assert binding_spec("X", functools.partial(MLP, d_ff=4))["class_path"] == "components.MLP"


def test_a_model_rebuilt_from_its_specs_has_the_same_modules_and_outputs():
    mixers = {"A": functools.partial(QCAttention, n_heads=2), "M": functools.partial(MLP, d_ff=40, activation="swisig")}
    model = HybridLM(30, 16, "AM -M", mixers)
    rebuilt = HybridLM(30, 16, "AM -M", yaml.safe_load(yaml.safe_dump(model.binding_specs())))
    assert str(rebuilt) == str(model)
    rebuilt.load_state_dict(model.state_dict())
    ids = torch.randint(0, 30, (2, 5))
    torch.testing.assert_close(rebuilt(ids), model(ids))
    assert binding_factory("A", model.binding_specs()["A"])(16).n_heads == 2


def test_bindings_that_cannot_be_recorded_are_refused_by_name():
    with pytest.raises(ValueError, match="letter 'A'.*cannot be recorded"):
        binding_spec("A", lambda d: QCAttention(d))
    with pytest.raises(ValueError, match="must not set d_model"):
        binding_spec("A", functools.partial(QCAttention, d_model=8))
    with pytest.raises(ValueError, match="argument init_args.act=.*cannot be recorded"):
        binding_spec("M", functools.partial(MLP, act=torch.nn.functional.silu))



@pytest.mark.parametrize("binding, error, message", [
    ({"class_path": "QCAttention"}, ValueError, "class_path 'QCAttention' must be a dotted path such as"),
    ({"class_path": "components.Nothing"}, ValueError, "module 'components' has no class 'Nothing'"),
    ({"class_path": "components.parse_pattern"}, ValueError, "module 'components' has no class 'parse_pattern'"),
    ({"class_path": "collections.OrderedDict"}, ValueError, "binding of letter 'Q': collections.OrderedDict is not an "
                                                            "nn.Module"),
    (3, TypeError, "HybridLM: the binding of letter 'Q' is not callable: 3"),
    ({"init_args": {"n_heads": 2}}, ValueError, r"binding of letter 'Q': a spec is \{class_path: ..., init_args: "
                                                r"\{...\}\}; got keys \['init_args'\]"),
    ({"class_path": "components.QCAttention", "init_arg": {}}, ValueError, r"got keys \['class_path', 'init_arg'\]"),
])
def test_a_binding_that_names_no_mixer_class_is_refused_by_name(binding, error, message):
    with pytest.raises(error, match=message):
        binding_factory("Q", binding)


def test_a_jsonargparse_binding_becomes_a_plain_partial_so_a_copy_of_the_model_leaves_the_command_line_behind():
    """jsonargparse binds a letter as ``partial(<its caller>, <its instantiator>, cls, **init_args)``; its instantiator
    holds the whole command line (the CLI, data, trainer). A copy of the model (Lightning's EMAWeightAveraging makes
    one) copied all of it, and under DDP failed on the launcher's lock: "cannot pickle '_thread.lock' object"."""
    import copy
    import threading

    class Instantiator:  # stands for jsonargparse's, which reaches a subprocess's lock through the trainer
        def __init__(self):
            self.lock = threading.Lock()

    def call(instantiator, cls, *args, **kwargs):
        return cls(*args, **kwargs)

    binding = functools.partial(call, Instantiator(), QCAttention, n_heads=2)
    model = HybridLM(vocab_size=32, d_model=16, pattern="AM", mixers={"A": binding})
    assert model.bindings["A"].func is QCAttention and model.bindings["A"].keywords == {"n_heads": 2}
    twin = copy.deepcopy(model)
    assert twin.blocks[0].sequence_mixer.n_heads == 2
    assert model.binding_specs()["A"] == {"class_path": "components.QCAttention",
                                          "init_args": {"n_heads": 2}}


def test_a_printed_component_names_its_settings():
    """``print(model)`` is how a user checks what a recipe built: each component shows the settings it was given."""
    from components import CohesiveMoE, InnerFuncAttention, RoutedMoE

    shown = {
        QCAttention(32, n_heads=4, n_kv_heads=2, qk_norm=True):
            ["n_heads=4, n_kv_heads=2, head_dim=8", "rope=True, qk_norm=True", "(q_norm): RMSNorm(8, eps=1e-06)"],
        QCAttention(32, n_heads=2, rope=False): ["rope=False, qk_norm=False"],
        QCAttention(32, n_heads=4, rope_fraction=0.5): ["rope=True, rope_fraction=0.5, qk_norm=False"],
        RoutedMoE(32, n_experts=4, top_k=2, d_ff=16, activation="swisig"):
            ["n_experts=4, top_k=2, normalize=False", "MLPExperts(n_experts=4, d_ff=16, activation=swisig)"],
        CohesiveMoE(32, n_experts=6, top_k=2, d_ff=16): ["CohesiveExperts(n_experts=6, d_ff=16)"],
        MLP(32, d_ff=48, activation="swisig"): ["activation=swisig, act=silu, d_ff=48"],
        SSD(32, n_heads=4, d_state=8, conv=True): ["conv=True, rope=True, n_heads=4, head_dim=8, d_state=8"],
        InnerFuncAttention(32, n_heads=4): ["inner=linear, mask=content, n_heads=4, n_kv_heads=4"],
    }
    for module, parts in shown.items():
        for part in parts:
            assert part in repr(module), (part, repr(module))
