import pytest

from flytune_build import reset_stats
from flytune_build.core.codec import Fields
from flytune_build.core.device import INTERPRETER, DeviceIdentity, parse_spec
from flytune_build.core.errors import DeviceError, ProjectError
from flytune_build.core.target import Target, match_level, parse_targets
from flytune_build.runtime import device

H200 = DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 132)
H200_NVL = DeviceIdentity("cuda", "sm_90", "NVIDIA H200 NVL", 132)
H200_MIG = DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 16)
MI300X = DeviceIdentity("hip", "gfx942", "AMD Instinct MI300X", 304)
MI300A = DeviceIdentity("hip", "gfx942", "AMD Instinct MI300A", 228)
MI308 = DeviceIdentity("hip", "gfx942", "AMD Instinct MI308X", 80)


def test_spec_round_trip():
    assert parse_spec("cuda:sm_90:132:NVIDIA H200") == H200
    assert parse_spec("interpreter") == INTERPRETER
    assert parse_spec(H200.spec()) == H200
    assert parse_spec("hip:gfx942:304:AMD Instinct MI300X") == MI300X


@pytest.mark.parametrize("spec,field,rule", [
    ("cuda:sm_90", "<document>", "must be `interpreter`"),
    ("cuda:sm_90:lots:NVIDIA H200", "units", "whole number"),
    ("metal:sm_90:1:x", "backend", "must be one of"),
    ("cuda:gfx942:1:x", "arch", "not a cuda arch"),
    ("cuda:sm_90:132:", "name", "printable ASCII"),
])
def test_bad_spec(spec, field, rule):
    with pytest.raises(DeviceError) as e:
        parse_spec(spec)
    assert e.value.field == field and rule in e.value.rule and e.value.file == "FLYTUNE_DEVICE"


def test_match_levels_distinguish_same_name_different_hardware():
    assert match_level(H200, H200) == "exact"
    assert match_level(H200, H200_NVL) == "arch_units"      # different SKU, same arch and SMs
    assert match_level(H200, H200_MIG) == "arch"            # a MIG slice keeps the name, loses SMs
    assert match_level(MI300X, MI300A) == "arch"
    assert match_level(MI300X, MI308) == "arch"
    assert match_level(H200, MI300X) is None
    assert match_level(H200, INTERPRETER) is None
    assert match_level(INTERPRETER, INTERPRETER) == "exact"


def test_target_defaults_accept_the_safe_two_levels():
    f = Fields("pyproject.toml", ProjectError)
    t = Target.from_json("sm_90", f, "targets[0]")
    assert t.accept == ("exact", "arch_units") and t.backend == "cuda"
    assert t.covers(H200) and t.covers(H200_MIG)
    full = Target.from_json({"arch": "sm_90", "name": "NVIDIA H200", "units": 132, "accept": ["arch", "exact"]},
                            f, "targets[1]")
    assert full.covers(H200) and not full.covers(H200_NVL) and not full.covers(H200_MIG)
    assert full.accept == ("exact", "arch")


@pytest.mark.parametrize("value,field,rule", [
    ([3], "tool.flytune.targets[0]", "must be an object"),
    (["hopper"], "tool.flytune.targets[0]", "arch such as"),
    ([{"arch": 90}], "tool.flytune.targets[0].arch", "must be a string"),
    ([{"arch": "sm_90", "units": "132"}], "tool.flytune.targets[0].units", "must be an integer"),
    ([{"arch": "sm_90", "accept": ["close"]}], "tool.flytune.targets[0].accept[0]", "must be one of"),
    ([{"arch": "sm_90", "accept": []}], "tool.flytune.targets[0].accept", "at least one"),
    ([{"arch": "sm_90", "nmae": "x"}], "tool.flytune.targets[0].nmae", "did you mean `name`"),
    (["sm_90", "sm_90"], "tool.flytune.targets[1]", "repeats target"),
])
def test_bad_targets(value, field, rule):
    with pytest.raises(ProjectError) as e:
        parse_targets(value, Fields("pyproject.toml", ProjectError), "tool.flytune.targets")
    assert e.value.field == field and rule in e.value.rule


def test_detection_honours_override_then_interpreter(monkeypatch):
    monkeypatch.setenv("FLYTUNE_DEVICE", "cuda:sm_90:132:NVIDIA H200")
    reset_stats()
    assert device.current() == H200
    monkeypatch.delenv("FLYTUNE_DEVICE")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    reset_stats()
    assert device.current() == INTERPRETER
