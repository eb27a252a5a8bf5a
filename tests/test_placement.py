"""The inputs' placements a measured search rotates over (`runtime.searching.placement`), on CPU tensors standing
in for device ones: copies are exact, keep aliasing and alignment, and never touch the caller's."""
import functools

import pytest
import torch

from flytune_build.core.config import Config
from flytune_build.runtime import callbacks as hooks
from flytune_build.runtime.searching import placement


@pytest.fixture
def anywhere(monkeypatch):
    monkeypatch.setattr(placement, "_placeable", lambda t: True)


def test_copies_hold_the_same_bytes_at_new_addresses_with_aliasing_and_alignment_kept(anywhere):
    pool = torch.arange(4096, dtype=torch.float16)
    x = pool[100:1100].view(10, 100)            # a view at an offset into a larger storage
    xt = x.t()                                  # the same storage again, transposed
    w = torch.randn(64)
    n = 7
    placed = placement.spread((x, xt, w, n), {"scale": 2.0}, {"x": x, "xt": xt, "w": w, "n": n}, 4)
    assert len(placed) == 4 and placed.note is None and placed.sites[0].args[0] is x
    for site in placed.sites[1:]:
        x2, xt2, w2, n2 = site.args
        assert n2 == 7 and site.kwargs == {"scale": 2.0} and site.bound["x"] is x2
        assert torch.equal(x2, x) and torch.equal(xt2, xt) and torch.equal(w2, w)
        assert x2.stride() == x.stride() and xt2.stride() == xt.stride()
        assert x2.data_ptr() != x.data_ptr() and x2.data_ptr() % placement.ALIGN == x.data_ptr() % placement.ALIGN
        assert x2.untyped_storage().data_ptr() == xt2.untyped_storage().data_ptr()   # still one storage
        x2[0, 1] = 99                                                                 # aliasing kept ...
        assert xt2[1, 0] == 99 and x[0, 1] != 99                                      # ... the caller's untouched
    assert len({s.args[0].data_ptr() for s in placed.sites}) == 4


def test_what_cannot_be_copied_exactly_or_is_too_big_leaves_one_placement(anywhere, monkeypatch):
    class Sub(torch.Tensor):
        pass
    sub = torch.zeros(8).as_subclass(Sub)
    placed = placement.spread((sub,), {}, {"x": sub}, 5)
    assert len(placed) == 1 and "Sub" in placed.note
    monkeypatch.setattr(placement, "LIMIT_BYTES", 1000)
    big = torch.zeros(1000)
    placed = placement.spread((big,), {}, {"x": big}, 5)
    assert len(placed) == 1 and "copies exceed" in placed.note and placed.sites[0].args[0] is big
    assert placement.spread((3,), {}, {"n": 3}, 5).note == "no device tensor argument"


def test_cpu_tensors_are_left_in_place():
    t = torch.zeros(4)
    assert len(placement.spread((t,), {}, {"t": t}, 5)) == 1


def test_each_config_visits_the_placements_in_one_order_and_inputs_are_made_fresh_on_each(anywhere):
    out = torch.zeros(4)
    placed = placement.spread((out,), {}, {"out": out}, 3)
    seen, freshened = [], []

    class Fn:
        def run(self, out, grid, warmup, **kw):
            seen.append((kw["BLOCK"], out.data_ptr()))

    class Kernel:
        fn, arg_names, search_hooks = Fn(), ["out"], (None, None)

        class hooks:
            @staticmethod
            def bind(config, source):
                return None
    launch = hooks.Launcher(Kernel(), None, lambda where: freshened.append(where["out"].data_ptr()), placed.sites)
    for _ in range(4):
        for block in (16, 32):
            launch.at(Config({"BLOCK": block}))()
    ptrs = [s.args[0].data_ptr() for s in placed.sites]
    assert [p for b, p in seen if b == 16] == [p for b, p in seen if b == 32] == ptrs + ptrs[:1]
    assert freshened == [p for _, p in seen]


# -- what the copies must carry along, and when the search keeps to the caller's tensors -------------------
def test_tensors_inside_tuples_and_descriptors_move_with_the_plain_argument(anywhere):
    from triton.tools.tensor_descriptor import TensorDescriptor

    x = torch.zeros(16, 16)
    desc = TensorDescriptor.from_tensor(x, [8, 8])
    placed = placement.spread((desc, x, (x, 3)), {}, {"d": desc, "x": x, "t": (x, 3)}, 3)
    for site in placed.sites[1:]:
        d2, x2, (tx2, n) = site.args
        assert x2.data_ptr() != x.data_ptr() and n == 3
        assert d2.base is x2 and tx2 is x2 and d2.block_shape == desc.block_shape
        assert site.bound["d"] is d2 and site.bound["t"][0] is x2


def test_a_hook_reaching_an_argument_other_than_through_nargs_keeps_the_caller_placement(anywhere):
    counter = torch.zeros(1, dtype=torch.int32)
    x = torch.ones(4)

    def reset(nargs, reset_only=False):   # resets the caller's counter: a copy's would never be reset
        counter.zero_()
    placed = placement.spread((x, counter), {}, {"x": x, "counter": counter}, 5, (reset,))
    assert len(placed) == 1 and "other than through nargs" in placed.note

    def through_nargs(nargs, reset_only=False):
        nargs["counter"].zero_()
    assert len(placement.spread((x, counter), {}, {"x": x, "counter": counter}, 5, (through_nargs,))) == 5

    class Resetter:   # the caller's counter held by a bound method's object, or by a callable object
        def __init__(self):
            self.counter = counter

        def reset(self, nargs, reset_only=False):
            self.counter.zero_()

        def __call__(self, nargs, reset_only=False):
            self.counter.zero_()
    state = {"counter": counter}

    def from_a_dict(nargs, reset_only=False):
        state["counter"].zero_()
    for hook in (Resetter().reset, Resetter(), from_a_dict, functools.partial(lambda c, nargs: c.zero_(), counter)):
        placed = placement.spread((x, counter), {}, {"x": x, "counter": counter}, 5, (hook,))
        assert len(placed) == 1 and "other than through nargs" in placed.note, hook
    harmless = functools.partial(through_nargs, reset_only=True)
    assert len(placement.spread((x, counter), {}, {"x": x, "counter": counter}, 5, (harmless,))) == 5


def test_views_of_one_storage_in_different_dtypes_are_copied_when_each_address_suits_its_dtype(anywhere):
    raw = torch.zeros(4096, dtype=torch.uint8)
    h, f = raw[2:258].view(torch.float16), raw[4:260].view(torch.float32)
    placed = placement.spread((h, f), {}, {"h": h, "f": f}, 3)
    assert len(placed) == 3, placed.note
    h2, f2 = placed.sites[1].args
    assert f2.data_ptr() - h2.data_ptr() == 2 and h2.untyped_storage().data_ptr() == f2.untyped_storage().data_ptr()


def test_the_first_estimate_is_device_time_where_the_launch_path_could_decide_the_timer(monkeypatch):
    """A fake device whose CPU launch path costs 30 us: events around each launch read it, so under
    REFINE_BELOW_MS a CUDA graph's device time answers; above it, or with no graph, the events do."""
    from triton import runtime

    from flytune_build.runtime.searching import bench

    clock = {"cpu": 0.0, "gpu": 0.0}
    kernel_ms = {"t": 0.002}

    class FakeEvent:
        def __init__(self, enable_timing):
            self.t = None

        def record(self):
            clock["gpu"] = max(clock["gpu"], clock["cpu"])
            self.t = clock["gpu"]

        def elapsed_time(self, end):
            return end.t - self.t

    class Device:
        Event = FakeEvent

        @staticmethod
        def synchronize():
            clock["cpu"] = clock["gpu"] = max(clock["cpu"], clock["gpu"])

    def launch():
        clock["cpu"] += 0.030                                               # Python's launch path
        clock["gpu"] = max(clock["gpu"], clock["cpu"]) + kernel_ms["t"]     # the kernel, once launched

    class Driver:
        @staticmethod
        def get_device_interface():
            return Device

    monkeypatch.setattr(type(runtime.driver), "active", property(lambda self: Driver()), raising=False)
    graphs = []
    monkeypatch.setattr(bench, "graph_bench", lambda fn, rep: graphs.append(rep) or kernel_ms["t"])
    assert bench.quick_ms(launch) == pytest.approx(0.002) and graphs == [bench.GRAPH_BELOW_MS]
    kernel_ms["t"] = 0.3                                                    # plainly over: no graph needed
    assert bench.quick_ms(launch) == pytest.approx(0.3) and len(graphs) == 1

    def no_graph(fn, rep):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(bench, "graph_bench", no_graph)
    kernel_ms["t"] = 0.002
    assert bench.quick_ms(launch) == pytest.approx(0.030, abs=0.0025)      # the bound: launch path included


def test_a_measured_search_rotates_over_the_placements_and_leaves_the_caller_tensors_as_they_were(
        anywhere, monkeypatch):
    """search.run with a stand-in kernel (no GPU here): every placement is timed, `reset_to_zero`
    zeroes the tensor of the placement being launched, the caller's tensor is restored, and a config
    pre_hook that reaches an argument other than through nargs keeps the search on the caller's tensors."""
    import types

    from flytune_build.runtime.searching import bench, search

    monkeypatch.setattr(search, "_precompile", lambda *a, **k: None)
    monkeypatch.setattr(bench, "on_gpu", lambda w, r, calls: bench.Measurement("cuda-events", w, r, 0.2))
    monkeypatch.setattr(bench, "gpu_bench", lambda fn, warmup=25, rep=100: fn() or 1.0)
    seen = []

    class Fn:
        def run(self, x, acc, grid, warmup, **kw):
            seen.append((x.data_ptr(), float(acc.sum())))
            acc.add_(1)
    configs = [Config({"BLOCK": 16}), Config({"BLOCK": 32})]
    kernel = types.SimpleNamespace(
        name="k", configs=configs, declared=configs, prune_configs_by={}, reset_to_zero=["acc"], restore_value=[],
        interpreted=False, search_hooks=(None, None), hooks=hooks.ConfigHooks(["x", "acc"], configs, configs),
        fn=Fn(), arg_names=["x", "acc"], do_bench=None, num_warmups=25, num_reps=100)
    x, acc = torch.ones(8), torch.full((4,), 7.0)
    result = search.run(kernel, (x, acc), {}, {"x": x, "acc": acc}, {}, None)
    assert result.measurement["placements"] == 5 and len({p for p, _ in seen}) == 5
    assert {s for _, s in seen} == {0.0} and torch.equal(acc, torch.full((4,), 7.0))

    class Declared:
        def __init__(self, config, pre_hook):
            self.config, self.pre_hook = config, pre_hook

        def all_kwargs(self):
            return dict(self.config.kwargs)

    def zero(nargs):
        acc.zero_()
    kernel.hooks = hooks.ConfigHooks(["x", "acc"], [Declared(configs[0], zero), Declared(configs[1], None)], configs)
    result = search.run(kernel, (x, acc), {}, {"x": x, "acc": acc}, {}, None)
    assert result.measurement["placements"] == 1 and "other than through nargs" in result.measurement["placement_note"]
