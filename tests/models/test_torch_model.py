"""TorchModel beyond the shared adapter suite: outputs, options, weights; the CUDA paths
run only where PyTorch sees a GPU (skipped with the reason elsewhere)."""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from async_search.base import TensorSpec
from async_search.errors import DeviceNotFoundError, InputSpecError
from async_search.models import TorchModel

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (pip install -e '.[torch]')")

pytestmark = pytest.mark.timeout(300)

SPEC = TensorSpec((6,), np.float32)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: the CUDA paths (pinned buffers, "
                                       "the adapter's stream, CUDA graphs) run only there")


def mlp(seed=0, outputs=3):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, outputs))


def rows(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 6)).astype(np.float32)


def direct(net, x):
    with torch.inference_mode():
        return net.cpu()(torch.from_numpy(x)).numpy()


class TwoHeads(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.body, self.kind = mlp(), kind

    def forward(self, x):
        h = self.body(x)
        if self.kind == "dict":
            return {"policy": h[:, :2], "value": torch.tanh(h[:, 2:])}
        heads = (h[:, :2], torch.tanh(h[:, 2:]))
        return list(heads) if self.kind == "list" else heads


@pytest.mark.parametrize("kind", ["tuple", "list", "dict"])
def test_tuple_list_and_dict_outputs_keep_their_structure(kind):
    model = TorchModel(TwoHeads(kind), input_spec=SPEC, max_batch_size=8, device="cpu")
    out = model(rows(11))
    policy, value = (out["policy"], out["value"]) if kind == "dict" else out
    assert isinstance(out, dict if kind == "dict" else tuple)
    assert policy.shape == (11, 2) and value.shape == (11, 1)
    assert policy.dtype == value.dtype == np.float32


def test_outputs_are_the_callers_own_even_when_the_net_returns_its_input():
    model = TorchModel(torch.nn.Identity(), input_spec=SPEC, max_batch_size=8, device="cpu")
    x = rows(3)
    y = model(x)
    model(rows(3, seed=1))  # the same bucket buffer, refilled
    np.testing.assert_array_equal(y, x)
    y[:] = 0  # and writable
    full = rows(8)  # fills its bucket: runs without a copy of the input
    y = model(full)
    np.testing.assert_array_equal(y, rows(8))
    full[:] = 0  # the server reuses its batch buffers
    np.testing.assert_array_equal(y, rows(8))


class Prior(torch.nn.Module):
    """Returns (views of) its weights: a learned row, the same for every input row."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.prior = torch.nn.Parameter(torch.tensor([[1.0, 2.0]]))
        self.register_buffer("scale", torch.tensor([3.0]))

    def forward(self, x):
        if self.how == "expand":
            return self.prior.expand(len(x), -1)
        return {"prior": self.prior.expand(len(x), -1)[:, 1:],
                "scale": self.scale.expand(len(x))}


@pytest.mark.parametrize("how", ["expand", "slice_and_buffer"])
@pytest.mark.parametrize("n", [1, 3, 4])  # bucket 4: padded, and filling it
def test_outputs_that_are_views_of_the_weights_do_not_change_with_an_update(how, n):
    model = TorchModel(Prior(how), input_spec=SPEC, max_batch_size=4, device="cpu")
    x = rows(n)
    y = model(x)
    before = {k: v.copy() for k, v in y.items()} if isinstance(y, dict) else y.copy()
    updated = model.with_weights({"prior": torch.tensor([[10.0, 20.0]]),
                                  "scale": torch.tensor([30.0])})
    if how == "expand":
        np.testing.assert_array_equal(updated(x), np.tile([[10.0, 20.0]], (n, 1)))
        np.testing.assert_array_equal(y, before)
    else:
        updated(x)
        for k in before:
            np.testing.assert_array_equal(y[k], before[k])


def test_a_batch_that_fills_a_bucket_runs_alike_whatever_its_layout_and_weights():
    # Such a batch skips the padded path when it is contiguous and writable; read-only
    # and strided ones take the padded path; both must compute on this model's weights.
    net, other = mlp(0), mlp(1)
    model = TorchModel(net, input_spec=SPEC, batch_sizes=(2, 8), device="cpu")
    updated = model.with_weights(other.state_dict())
    x = rows(8)
    read_only = x.copy()
    read_only.flags.writeable = False
    strided = np.repeat(x, 2, axis=0)[::2]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on a non-writable array
        for batch in (x, read_only, strided, np.asfortranarray(x)):
            np.testing.assert_allclose(model(batch), direct(mlp(0), x), rtol=1e-6,
                                       atol=1e-6)
            np.testing.assert_allclose(updated(batch), direct(mlp(1), x), rtol=1e-6,
                                       atol=1e-6)
    with pytest.raises(InputSpecError):
        model(x.astype(np.float64))


def test_the_module_runs_in_eval_mode_under_inference_mode():
    seen = {}

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, x):
            seen["inference"] = torch.is_inference_mode_enabled()
            seen["training"] = self.training
            return self.drop(x)

    model = TorchModel(Probe().train(), input_spec=SPEC, device="cpu")
    x = rows(4)
    np.testing.assert_array_equal(model(x), x)  # no dropout
    assert seen == {"inference": True, "training": False}


def test_a_module_put_back_in_train_mode_fails_its_batches_until_it_is_in_eval_mode():
    # It ran in train mode: BatchNorm normalised over the padded batch (pad rows and
    # batch-mates changed a row) and serving rewrote the running statistics.
    net = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4))
    model = TorchModel(net, input_spec=SPEC, device="cpu", batch_sizes=(4, 8))
    x = rows(3)
    before = model(x)
    statistics = net[1].running_mean.clone()
    net.train()  # the caller trains the object the adapter holds
    for batch in (x, rows(4)):  # the padded path and one that fills its bucket
        with pytest.raises(RuntimeError, match="put back in train mode.*train a copy"):
            model(batch)
    assert torch.equal(net[1].running_mean, statistics)
    net.eval()
    np.testing.assert_array_equal(model(x), before)
    net[1].train()  # a submodule alone (its head fine-tuned, say): as batch-dependent
    with pytest.raises(RuntimeError, match="its BatchNorm1d among others"):
        model(x)
    assert torch.equal(net[1].running_mean, statistics)
    net.eval()


def test_train_mode_is_refused_however_a_module_holds_its_mode():
    # A mode set by plain assignment, one that a class computes (a property), and one
    # set in a module whose __dict__ was rebound after the adapter took it (a check
    # reading the dicts it saw first was blind to it) all count.
    class Computed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(6, 4)
            self.mode = "eval"

        @property
        def training(self):
            return self.mode == "train"

        @training.setter
        def training(self, value):
            self.mode = "train" if value else "eval"

        def forward(self, x):
            return self.linear(x)

    for net, switch in [
            (torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Dropout(0.5)),
             lambda net: setattr(net[1], "training", True)),
            (Computed(), lambda net: setattr(net, "mode", "train")),
            (torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Dropout(0.5)),
             lambda net: (setattr(net[1], "__dict__", dict(vars(net[1]))),
                          net[1].train()))]:
        model = TorchModel(net, input_spec=SPEC, device="cpu", batch_sizes=(4,))
        for batch in (rows(3), rows(4)):
            model(batch)
        switch(net)
        for batch in (rows(3), rows(4)):  # the padded path and one that fills its bucket
            with pytest.raises(RuntimeError, match="put back in train mode"):
                model(batch)


def test_a_layer_that_computes_the_same_in_either_mode_may_be_in_train_mode():
    # Each batch checks only the modes that change what is computed: the module's own
    # (net.train() is refused whatever the net holds), its Dropout's, and any layer
    # whose class is not exactly one of PyTorch's mode-free layers.
    class OwnLinear(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) * (2.0 if self.training else 1.0)

    net = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), OwnLinear(4, 4),
                              torch.nn.Dropout(0.5),
                              torch.nn.utils.spectral_norm(torch.nn.Linear(4, 4)))
    model = TorchModel(net, input_spec=SPEC, device="cpu", batch_sizes=(4,))
    x = rows(4)
    before = model(x)
    net[0].train()
    net[1].train()
    np.testing.assert_array_equal(model(x), before)  # nothing they compute changed
    net.eval()
    # (a Linear with spectral_norm's hook iterates its weight in train mode)
    for layer, what in [(net, "Sequential\\)"), (net[2], "OwnLinear"), (net[3], "Dropout"),
                        (net[4], "Linear")]:
        layer.train()
        with pytest.raises(RuntimeError, match=f"{what}.*put back in train mode"):
            model(x)
        net.eval()


@pytest.mark.parametrize("norm", [
    lambda: torch.nn.BatchNorm1d(4, track_running_stats=False),
    lambda: torch.nn.LazyBatchNorm1d(track_running_stats=False)])
def test_a_batch_norm_without_running_statistics_is_refused_when_the_adapter_is_made(norm):
    # It normalises by the batch's own statistics in eval mode too: it was served, each
    # row depending on its batch-mates and the pad rows, and one row alone failed in
    # PyTorch's words ("Expected more than 1 value per channel when training").
    net = torch.nn.Sequential(torch.nn.Linear(6, 4), norm(), torch.nn.Linear(4, 1))
    with pytest.raises(ValueError, match="BatchNorm1d has no running statistics"):
        TorchModel(net, input_spec=SPEC, device="cpu")
    if not isinstance(net[1], torch.nn.modules.lazy.LazyModuleMixin):
        # TorchScript keeps the rule (its modules are all RecursiveScriptModule)
        with pytest.raises(ValueError, match="BatchNorm1d has no running statistics"):
            TorchModel(torch.jit.script(net), input_spec=SPEC, device="cpu")
    kept = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4))
    assert TorchModel(kept, input_spec=SPEC, device="cpu")(rows(1)).shape == (1, 4)


@pytest.mark.parametrize("change", ["replace", "add", "drop statistics"])
def test_another_adapter_on_a_net_changed_since_the_first_was_made_is_refused(change):
    # It joined the first adapter's runner, whose checks were of the net as it was:
    # a BatchNorm without statistics swapped in was served batch-dependent, and
    # statistics dropped failed in a bare KeyError ('1.running_mean').
    net = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4),
                              torch.nn.Linear(4, 2))
    first = TorchModel(net, input_spec=SPEC, device="cpu", batch_sizes=(1, 4))
    x = rows(3)
    before = first(x)
    if change == "replace":
        net[1] = torch.nn.BatchNorm1d(4, track_running_stats=False)
    elif change == "add":
        net.append(torch.nn.Dropout(0.5))
    else:
        net[1].running_mean = net[1].running_var = None
    with pytest.raises(ValueError, match="the net changed since the adapter in use"):
        TorchModel(net, input_spec=SPEC, device="cpu", batch_sizes=(1, 4))
    if change == "add":  # the first adapter serves on, unchanged by the refusal
        del net[-1]
        np.testing.assert_array_equal(first(x), before)
        second = TorchModel(net, input_spec=SPEC, device="cpu", batch_sizes=(1, 4))
        np.testing.assert_array_equal(second(x), before)


def test_a_module_like_object_without_modes_or_parameters_still_serves():
    # The check of modes read .training, which a duck-typed module need not have, and
    # the lazy-layer check called parameters() and buffers(), which the documented
    # module-like contract (to, eval, state_dict) does not promise: AttributeError.
    class Wrap:
        def __init__(self):
            self.net = mlp()

        def __call__(self, x):
            return self.net(x)

        def to(self, device):
            self.net.to(device)
            return self

        def eval(self):
            self.net.eval()
            return self

        def state_dict(self):
            return self.net.state_dict()

    model = TorchModel(Wrap(), input_spec=SPEC, device="cpu")
    x = rows(3)
    np.testing.assert_allclose(model(x), direct(mlp(), x), rtol=1e-5, atol=1e-5)


def test_weights_of_dtypes_numpy_lacks_are_taken():
    # with_weights of a module with a float8 or complex32 buffer raised torch's own
    # TypeError ("Got unsupported ScalarType") when it looked for the NumPy dtype.
    class Holding(torch.nn.Module):
        def __init__(self, dtype):
            super().__init__()
            self.register_buffer("held", torch.zeros(2, dtype=dtype))

        def forward(self, x):
            return x

    dtypes = [torch.complex32] + [getattr(torch, name) for name in ("float8_e4m3fn",)
                                  if hasattr(torch, name)]
    for dtype in dtypes:
        model = TorchModel(Holding(dtype), input_spec=SPEC, device="cpu")
        updated = model.with_weights({"held": torch.ones(2, dtype=dtype)})
        np.testing.assert_array_equal(updated(rows(2)), rows(2))
        assert updated.module.held.dtype == dtype
    # PyTorch's one-byte floats saturate (1e6 and inf became 448 in float8_e4m3fn,
    # whose step at the top is 32: up to 464 rounds to 448) and float8_e8m0fnu has no
    # sign and no zero (-2 became 2): refused, what merely rounds taken.
    cases = [("float8_e4m3fn", [1e6, 1.0], "clamp to 448"),
             ("float8_e4m3fn", [470.0, 1.0], "clamp to 448"),
             ("float8_e4m3fn", [-np.inf, 1.0], "clamp to 448"),
             ("float8_e4m3fnuz", [np.inf, 1.0], "turn into NaN"),  # it has no inf
             ("float8_e4m3fn", [448.0, 464.0], [448.0, 448.0]),
             ("float8_e5m2fnuz", [61000.0, 1.0], [57344.0, 1.0]),
             ("float8_e8m0fnu", [-2.0, 1.0], "no sign, no zero"),
             ("float8_e8m0fnu", [2.0, 1.0], [2.0, 1.0])]
    for name, given, expected in cases:
        if not hasattr(torch, name):
            continue
        model = TorchModel(Holding(getattr(torch, name)), input_spec=SPEC, device="cpu")
        weights = {"held": np.array(given, np.float32)}
        if isinstance(expected, str):
            with pytest.raises(ValueError, match=expected):
                model.with_weights(weights)
        else:
            taken = model.with_weights(weights)
            taken(rows(1))
            assert taken.module.held.float().tolist() == expected, (name, given)


def test_lazy_buffers_beside_eager_weights_are_made_with_the_adapter():
    # LazyBatchNorm1d(affine=False) has lazy running statistics and no lazy weight:
    # only lazy parameters were looked for, so with_weights and on_device failed
    # before the first batch (torch's "uninitialized parameter or buffer").
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 4),
                                   torch.nn.LazyBatchNorm1d(affine=False))

    trained = make()
    trained(torch.randn(16, 6))
    trained.eval()
    model = TorchModel(make(), input_spec=SPEC, device="cpu")
    x = rows(2)
    updated = model.with_weights(trained.state_dict())
    np.testing.assert_allclose(updated(x), direct(trained, x), rtol=1e-5, atol=1e-5)
    copy = model.on_device("cpu")
    assert copy(x).shape == (2, 4)


def test_cuda_outputs_come_back_in_the_dtypes_of_cpu_outputs():
    # The CUDA path's pinned output buffers kept complex32 and the float8 types, which
    # .numpy() refuses (a TypeError for every batch); the CPU path converts them.
    from async_search.models.torch_model import _host_dtype, _host_rows

    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
              torch.int64, torch.bool, torch.complex64, torch.complex32]
    dtypes += [getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2")
               if hasattr(torch, name)]
    for dtype in dtypes:
        tensor = torch.ones((2, 3)).to(dtype)
        on_cpu = _host_rows(torch, tensor, 2, 2).dtype
        pinned = torch.empty((2, 3), dtype=_host_dtype(torch, dtype))
        pinned.copy_(tensor)
        assert pinned.numpy().dtype == on_cpu, dtype


def test_a_quantized_output_comes_back_as_its_values():
    # numpy() refuses a quantized tensor, and the cast to float32 that follows for the
    # reduced floats raised "Creation of quantized tensor requires quantized dtype".
    class Quantized(torch.nn.Module):
        def forward(self, x):
            return torch.quantize_per_tensor(x, 0.5, 0, torch.qint8)

    model = TorchModel(Quantized(), TensorSpec((3,), np.float32), device="cpu")
    x = np.array([[0.0, 1.0, 2.6]], np.float32)
    out = model(x)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[0.0, 1.0, 2.5]])


def test_a_class_given_for_its_instance_is_refused_by_name():
    # A module class has to, eval and state_dict, as its instances do: it got as far as
    # an AttributeError ("'torch.device' object has no attribute '_apply'").
    with pytest.raises(TypeError, match=r"got the class Linear: make one"):
        TorchModel(torch.nn.Linear, TensorSpec((3,), np.float32), device="cpu")


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_reduced_precision_returns_float32_close_to_float32(precision):
    net = mlp()
    x = rows(20)
    model = TorchModel(net, input_spec=SPEC, device="cpu", max_batch_size=8,
                       precision=precision)
    y = model(x)
    assert y.dtype == np.float32
    assert model.batch_tolerance == {"bfloat16": 5e-2, "float16": 1e-2}[precision]
    np.testing.assert_allclose(y, direct(net, x), rtol=0.1, atol=0.1)
    assert not np.array_equal(y, direct(net, x)), "computed in float32 after all"
    exact = rows(8)  # fills a bucket: runs without padding, in the same precision
    y = model(exact)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, direct(net, exact), rtol=0.1, atol=0.1)
    assert not np.array_equal(y, direct(net, exact)), "computed in float32 after all"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_module_that_returns_reduced_floats_itself_gives_float32_arrays(dtype):
    # No precision option: the module casts its own outputs (NumPy has no bfloat16).
    class Halving(torch.nn.Module):
        def forward(self, x):
            return {"value": x[:, :1].to(dtype), "same": x.to(dtype)}

    model = TorchModel(Halving(), input_spec=SPEC, device="cpu", max_batch_size=8)
    x = rows(3)
    out = model(x)
    for leaf in out.values():
        assert leaf.dtype == np.float32 and len(leaf) == 3
    np.testing.assert_allclose(out["same"], x, rtol=1e-2, atol=1e-2)
    assert not np.shares_memory(out["same"], x)


def test_options_are_checked_at_construction():
    with pytest.raises(ValueError, match="precision must be one of"):
        TorchModel(mlp(), input_spec=SPEC, device="cpu", precision="float8")
    with pytest.raises(ValueError, match="cuda_graphs needs a CUDA device"):
        TorchModel(mlp(), input_spec=SPEC, device="cpu", cuda_graphs=True)
    with pytest.raises(ValueError, match="batch_tolerance must be a finite number >= 0"):
        TorchModel(mlp(), input_spec=SPEC, device="cpu", batch_tolerance=-1)
    with pytest.raises(ValueError, match="PyTorch has no dtype"):
        TorchModel(mlp(), input_spec=TensorSpec((6,), "U4"), device="cpu")
    with pytest.raises(DeviceNotFoundError, match="no device 'cuda:7'"):
        TorchModel(mlp(), input_spec=SPEC, device="cuda:7")
    # taken for the CPU, where JAX and TensorFlow refuse a second CPU
    with pytest.raises(DeviceNotFoundError, match="no device 'cpu:1': PyTorch has one"):
        TorchModel(mlp(), input_spec=SPEC, device="cpu:1")
    assert TorchModel(mlp(), input_spec=SPEC, device="cpu:0").device.type == "cpu"


def test_cuda_graphs_are_the_default_on_cuda_only_and_checked():
    assert TorchModel(mlp(), input_spec=SPEC, device="cpu").cuda_graphs is False
    assert TorchModel(mlp(), input_spec=SPEC, device="cpu", cuda_graphs=False
                      ).cuda_graphs is False
    with pytest.raises(TypeError, match="cuda_graphs must be None, True or False"):
        TorchModel(mlp(), input_spec=SPEC, device="cpu", cuda_graphs="yes")
    assert TorchModel(mlp(), input_spec=SPEC, device="cpu",
                      cuda_graphs=np.bool_(False)).cuda_graphs is False
    with pytest.raises(ValueError, match="cuda_graphs needs a CUDA device"):
        TorchModel(mlp(), input_spec=SPEC, device="cpu", cuda_graphs=np.bool_(True))


def test_integer_inputs_reach_the_module_in_their_dtype():
    class Boards(torch.nn.Module):
        def forward(self, x):
            assert x.dtype == torch.int8
            return x.float().sum(dim=(1, 2)).unsqueeze(1)

    model = TorchModel(Boards(), input_spec=TensorSpec((6, 7), np.int8), device="cpu")
    x = np.ones((3, 6, 7), np.int8)
    np.testing.assert_array_equal(model(x), np.full((3, 1), 42.0, np.float32))


def test_weights_are_checked_and_staged_when_given():
    net, other = mlp(0), mlp(1)
    model = TorchModel(net, input_spec=SPEC, device="cpu")
    state = {k: v.clone() for k, v in other.state_dict().items()}
    updated = model.with_weights(state)
    for value in state.values():
        value.zero_()  # the caller changes its tensors after the update
    x = rows(5)
    np.testing.assert_allclose(updated(x), direct(other, x), rtol=1e-6, atol=1e-6)
    numpy_state = {k: v.numpy() for k, v in mlp(2).state_dict().items()}
    np.testing.assert_allclose(model.with_weights(numpy_state)(x), direct(mlp(2), x),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(model.with_weights(mlp(3))(x), direct(mlp(3), x),
                               rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"missing \['2.bias'\]"):
        model.with_weights({k: v for k, v in state.items() if k != "2.bias"})
    with pytest.raises(ValueError, match=r"'0.weight' has shape \(32, 5\)"):
        model.with_weights({**state, "0.weight": torch.zeros(32, 5)})
    with pytest.raises(TypeError, match="takes a state_dict or a module"):
        model.with_weights([1, 2])


def check_compile_gives_the_eager_outputs_and_sees_new_weights():
    net = mlp()
    model = TorchModel(net, input_spec=SPEC, device="cpu", batch_sizes=(2, 4), compile=True)
    x = rows(3)
    np.testing.assert_allclose(model(x), direct(mlp(), x), rtol=1e-4, atol=1e-4)
    updated = model.with_weights(mlp(1).state_dict())  # copied into the same parameters
    np.testing.assert_allclose(updated(x), direct(mlp(1), x), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(model(x), direct(mlp(), x), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_compile_gives_the_eager_outputs_and_sees_new_weights():
    # In a fresh interpreter: this one may hold TensorFlow, after which a PyTorch
    # build that ships Triton cannot compile (see the test below).
    script = ("import sys; sys.path.insert(0, {root!r}); "
              "from tests.models.test_torch_model import "
              "check_compile_gives_the_eager_outputs_and_sees_new_weights as check; "
              "check(); assert 'tensorflow' not in sys.modules; print('checked')")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", script.format(root=root)], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "checked" in done.stdout, done.stderr[-3000:]


def test_compile_after_tensorflow_with_triton_installed_raises_instead_of_aborting(
        monkeypatch):
    from async_search.models import torch_model

    monkeypatch.setitem(sys.modules, "tensorflow", sys.modules.get("tensorflow", object()))
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    monkeypatch.setattr(torch_model, "find_spec", lambda name: object())  # installed
    with pytest.raises(RuntimeError, match="Triton after TensorFlow"):
        TorchModel(mlp(), input_spec=SPEC, device="cpu", batch_sizes=(2,), compile=True)
    TorchModel(mlp(), input_spec=SPEC, device="cpu", batch_sizes=(2,))  # no compile: fine


# -- CUDA only ----------------------------------------------------------------------------
@needs_cuda
def test_cuda_is_the_default_and_batches_go_through_pinned_buffers_on_its_own_stream():
    net = mlp()
    model = TorchModel(net, input_spec=SPEC, max_batch_size=8)
    assert model.device == torch.device("cuda", 0)
    assert model.batch_tolerance == 1e-2 or not torch.backends.cudnn.allow_tf32
    x = rows(13)
    np.testing.assert_allclose(model(x), direct(mlp(), x), rtol=1e-2, atol=1e-2)
    runner = model._runner
    assert runner.stream != torch.cuda.default_stream(model.device)
    assert all(buffer.is_pinned() for buffer in runner._host.values())
    assert all(out.is_pinned() for _, outs in runner._host_out.values() for out in outs)


@needs_cuda
def test_a_module_that_writes_its_input_is_warmed_up_for_its_graph_on_a_copy():
    # The warm-up before capture ran the module three times on the batch itself: the
    # first batch of each bucket was computed on its input written four times.
    model = TorchModel(WritesItsInput(), input_spec=SPEC, max_batch_size=4,
                       cuda_graphs=True)
    x = rows(3)
    for _ in range(2):
        np.testing.assert_allclose(model(x), 2 * x.sum(axis=1, keepdims=True),
                                   rtol=1e-2, atol=1e-2)


@needs_cuda
def test_cuda_graphs_replay_per_bucket_and_keep_their_graph_across_updates():
    model = TorchModel(mlp(), input_spec=SPEC, max_batch_size=8, cuda_graphs=True)
    x = rows(5)
    np.testing.assert_allclose(model(x), direct(mlp(), x), rtol=1e-2, atol=1e-2)
    graphs = dict(model._runner._graphs)
    assert set(graphs) == {8}
    updated = model.with_weights(mlp(1).state_dict())
    np.testing.assert_allclose(updated(x), direct(mlp(1), x), rtol=1e-2, atol=1e-2)
    assert model._runner._graphs == graphs  # the same captured graph, new weights
    np.testing.assert_allclose(model(x), direct(mlp(), x), rtol=1e-2, atol=1e-2)


@needs_cuda
@pytest.mark.parametrize("graphs", [True, False])
def test_cuda_script_runs_the_compiled_pass_captured_or_not_and_sees_new_weights(graphs):
    model = TorchModel(mlp(), input_spec=SPEC, max_batch_size=8, script=True,
                       cuda_graphs=graphs)
    assert isinstance(model._runner.forward.compiled, torch.jit.ScriptModule)
    x = rows(5)
    for _ in range(4):  # TorchScript optimises after its first runs: each must be right
        np.testing.assert_allclose(model(x), direct(mlp(), x), rtol=1e-2, atol=1e-2)
    assert model.cuda_graphs is graphs and (set(model._runner._graphs) == {8}) is graphs
    updated = model.with_weights(mlp(1).state_dict())
    np.testing.assert_allclose(updated(x), direct(mlp(1), x), rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(model(x), direct(mlp(), x), rtol=1e-2, atol=1e-2)


@needs_cuda
def test_cuda_graphs_are_on_by_default_on_cuda_and_off_when_compiled_or_copied_to_the_cpu():
    model = TorchModel(mlp(), input_spec=SPEC, max_batch_size=8)
    assert model.cuda_graphs
    x = rows(3)
    np.testing.assert_allclose(model(x), direct(mlp(), x), rtol=1e-2, atol=1e-2)
    assert set(model._runner._graphs) == {4}
    assert not model.on_device("cpu").cuda_graphs
    assert model.on_device("cuda:0").cuda_graphs


@needs_cuda
def test_copies_capture_their_graphs_while_other_copies_serve():
    """Two device threads on one GPU: one captures a bucket's graph while the other
    serves batches (each synchronises its stream). In CUDA's default "global" capture
    mode the serving thread's synchronise fails its batch and breaks the capture."""
    import threading

    copies = [TorchModel(mlp(), input_spec=SPEC, max_batch_size=64, cuda_graphs=True)
              for _ in range(2)]
    errors, start = [], threading.Barrier(2)

    def work(model, sizes):
        try:
            start.wait(30)
            for _ in range(5):
                for n in sizes:  # each size a new bucket: a capture at its first batch
                    x = rows(n, seed=n)
                    np.testing.assert_allclose(model(x), direct(mlp(), x), rtol=1e-2,
                                               atol=1e-2)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(model, sizes)) for model, sizes in
               zip(copies, ([1, 3, 7, 15, 31, 63], [63, 31, 15, 7, 3, 1]))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert all(model.cuda_graphs and len(model._runner._graphs) == 6 for model in copies)


class Syncing(torch.nn.Module):
    """A module that reads a value back to the host mid-pass: no CUDA graph holds it."""

    def __init__(self):
        super().__init__()
        self.inner = mlp()

    def forward(self, x):
        out = self.inner(x)
        return out * (1.0 if out.abs().sum().item() >= 0 else -1.0)


@needs_cuda
def test_a_module_that_cannot_be_captured_runs_eagerly_with_a_warning(caplog):
    model = TorchModel(Syncing(), input_spec=SPEC, max_batch_size=8)
    x = rows(5)
    with caplog.at_level("WARNING", logger="async_search.models"):
        np.testing.assert_allclose(model(x), direct(mlp(), x), rtol=1e-2, atol=1e-2)
    assert "cannot be captured in a CUDA graph" in caplog.text
    assert not model.cuda_graphs
    np.testing.assert_allclose(model(rows(2)), direct(mlp(), rows(2)), rtol=1e-2, atol=1e-2)


@needs_cuda
def test_cuda_graphs_true_refuses_a_module_that_cannot_be_captured():
    model = TorchModel(Syncing(), input_spec=SPEC, max_batch_size=8, cuda_graphs=True)
    with pytest.raises(RuntimeError, match="cannot be captured"):
        model(rows(5))


@needs_cuda
@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_cuda_reduced_precision(precision):
    model = TorchModel(mlp(), input_spec=SPEC, precision=precision, max_batch_size=8)
    x = rows(9)
    y = model(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, direct(mlp(), x), rtol=0.1, atol=0.1)


@needs_cuda
def test_cuda_copies_go_to_other_devices_and_back():
    model = TorchModel(mlp(), input_spec=SPEC, max_batch_size=8)
    x = rows(4)
    last = f"cuda:{torch.cuda.device_count() - 1}"
    for device in ("cpu", last):
        copy = model.with_weights(mlp(1).state_dict()).on_device(device)
        assert copy.device == torch.device(device)
        np.testing.assert_allclose(copy(x), direct(mlp(1), x), rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(model(x), direct(mlp(), x), rtol=1e-2, atol=1e-2)



class WritesItsInput(torch.nn.Module):
    """Scales its input in place (as ``x.div_(255)`` or ``ReLU(inplace=True)`` on it)."""

    def forward(self, x):
        x.mul_(2.0)
        return x.sum(dim=1, keepdim=True)


@pytest.mark.parametrize("script", [False, True])  # in-place ops bump the version alike
@pytest.mark.parametrize("n", [1, 3, 4])  # a bucket's size runs without padding
def test_a_module_that_writes_its_input_never_writes_the_callers_array(n, script):
    import async_search as asr

    model = TorchModel(WritesItsInput(), input_spec=SPEC, device="cpu", batch_sizes=(1, 4),
                       script=script)
    x = rows(n)
    kept = x.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the first batch runs on a copy: nothing to say
        first = model(x)
    second = model(x)
    np.testing.assert_array_equal(x, kept)
    np.testing.assert_allclose(first, 2 * kept.sum(axis=1, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(first, second)
    import asyncio

    np.testing.assert_array_equal(asyncio.run(asr.immediate(model)(x)), first)
    np.testing.assert_array_equal(x, kept)


def test_a_module_that_writes_its_input_finds_zero_pad_rows_at_every_batch():
    class ShiftsThenSumsTheBatch(torch.nn.Module):
        def forward(self, x):
            x.sub_(1.0)  # the pad rows too: they must be zeros again at the next batch
            return x + x.sum(dim=0, keepdim=True)

    model = TorchModel(ShiftsThenSumsTheBatch(), input_spec=SPEC, device="cpu",
                       batch_sizes=(4,))
    x = rows(3)
    padded = np.vstack([x, np.zeros((1,) + SPEC.shape, np.float32)])
    expected = ShiftsThenSumsTheBatch()(torch.from_numpy(padded))[:3].numpy()
    for _ in range(3):
        np.testing.assert_allclose(model(x), expected, rtol=1e-6)


def test_a_module_that_starts_writing_its_input_later_is_copied_from_then_on():
    class WritesFromItsSecondBatch(torch.nn.Module):
        calls = 0

        def forward(self, x):
            self.calls += 1
            if self.calls > 2:
                x.mul_(2.0)
            return x.sum(dim=1, keepdim=True)

    model = TorchModel(WritesFromItsSecondBatch(), input_spec=SPEC, device="cpu",
                       batch_sizes=(4,))
    model(rows(4))  # on a copy: it does not write, so later batches run as they are
    model(rows(4))
    x = rows(4)
    with pytest.warns(RuntimeWarning, match="wrote its input in place"):
        model(x)  # written once, and said
    y = rows(4)
    model(y)
    np.testing.assert_array_equal(y, rows(4))  # copied from then on


def test_weights_of_another_kind_are_refused_not_truncated():
    class Shifted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(6, 2)
            self.register_buffer("shift", torch.ones(1, dtype=torch.int64))

        def forward(self, x):
            return self.linear(x) + self.shift

    model = TorchModel(Shifted(), input_spec=SPEC, device="cpu")
    state = {k: v.clone() for k, v in model.module.state_dict().items()}
    with pytest.raises(ValueError, match="'shift' is torch.float32.*would change"):
        model.with_weights({**state, "shift": torch.tensor([1.7])})
    with pytest.raises(ValueError, match="would change"):
        model.with_weights({**state, "linear.bias": torch.tensor([1 + 1j, 2j])})
    model.with_weights({**state, "linear.bias": np.zeros(2, np.float64)})  # same kind


class Scaled(torch.nn.Module):
    """``x * k + b``, with ``k`` a buffer of the given dtype."""

    def __init__(self, dtype=torch.int32):
        super().__init__()
        self.b = torch.nn.Parameter(torch.zeros(6))
        self.register_buffer("k", torch.full((1,), 3, dtype=dtype))

    def forward(self, x):
        return x * self.k.to(x.dtype) + self.b


@pytest.mark.parametrize("given", [[2 ** 40], np.array([2 ** 40]), [2 ** 70],
                                   torch.tensor([2 ** 31])],
                         ids=["a list", "an array", "a list of an int past int64",
                              "a tensor"])
def test_integers_past_a_weights_range_are_refused_in_any_form(given):
    """Lists and arrays too (a list of an int past int64 is an array of Python objects,
    which PyTorch would refuse with a TypeError): ValueError, the weights unchanged."""
    model = TorchModel(Scaled(), input_spec=SPEC, device="cpu")
    with pytest.raises(ValueError, match=r"'k' is \S+, the module's is torch.int32: "
                                         r"(it holds|a cast)"):
        model.with_weights({"b": torch.ones(6), "k": given})
    np.testing.assert_allclose(model(rows(2)), 3 * rows(2), rtol=1e-6)


def test_a_finite_float_past_a_reduced_floats_range_is_refused():
    """float32 3.4e38 is finite and becomes inf in bfloat16 (whose largest is 3.39e38),
    1e5 becomes inf in float16: refused; values that round are taken."""
    for dtype, huge in ((torch.bfloat16, 3.4e38), (torch.float16, 1e5)):
        net = Scaled()
        net.b = torch.nn.Parameter(torch.zeros(6, dtype=dtype))
        model = TorchModel(net, input_spec=SPEC, device="cpu")
        state = {"b": torch.full((6,), 0.1), "k": torch.ones(1, dtype=torch.int32)}
        assert model.with_weights(state).module is net  # rounded into the weight: taken
        with pytest.raises(ValueError, match=rf"'b' is torch.float32, the module's is "
                                             rf"{dtype}: it holds finite values past"):
            model.with_weights({**state, "b": torch.full((6,), huge)})


def test_a_module_with_lazy_layers_gets_its_parameters_from_the_input_spec():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.LazyLinear(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model = TorchModel(net, input_spec=SPEC, device="cpu")
    x = rows(3)
    np.testing.assert_allclose(model(x), direct(net, x), rtol=1e-6, atol=1e-6)


# -- script=True: the module compiled by TorchScript -----------------------------------------
def resnet(kind, seed):
    from async_search import problems

    if kind == "cost_to_go":
        return problems.CostToGoResNet(problems.SlidingPuzzle(3), first_width=32, width=16,
                                       blocks=1, seed=seed)
    return problems.PolicyValueResNet(problems.ConnectFour(), channels=8, blocks=1,
                                      value_hidden=8, seed=seed)


@pytest.mark.parametrize("kind", ["cost_to_go", "policy_value"])
def test_script_gives_the_eager_outputs_bit_for_bit_and_sees_new_weights(kind):
    from async_search import problems

    net = resnet(kind, 0)
    module = problems.torch_resnet(net)
    model = TorchModel(module, input_spec=net.input_spec, device="cpu", batch_sizes=(4, 8),
                       script=True)
    assert isinstance(model._runner.forward.compiled, torch.jit.ScriptModule)
    assert model.module is module  # the module given: its weights are the compiled pass's
    rng = np.random.default_rng(0)
    # A full bucket: eager on the same rows sums in the same order (a padded batch of
    # another size may not, by its last bits).
    x = rng.standard_normal((8, *net.input_spec.shape)).astype(np.float32)

    def eager(m):
        with torch.inference_mode():
            out = m(torch.from_numpy(x))
        return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]

    def outputs(y):
        return list(y) if isinstance(y, tuple) else [y]

    expected = eager(problems.torch_resnet(net))
    for got, want in zip(outputs(model(x)), expected):
        np.testing.assert_array_equal(got, want)
    other = problems.torch_resnet(resnet(kind, 1))
    updated = model.with_weights(other.state_dict())  # copied into the shared parameters
    for got, want in zip(outputs(updated(x)), eager(other)):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(outputs(model(x)), expected):  # and the old ones back
        np.testing.assert_array_equal(got, want)
    copy = model.on_device("cpu")
    assert copy.script and isinstance(copy._runner.forward.compiled, torch.jit.ScriptModule)
    for got, want in zip(outputs(copy(x)), expected):
        np.testing.assert_array_equal(got, want)


class Unscriptable(torch.nn.Module):
    def forward(self, x, *rest):  # TorchScript takes no *args
        return x.sum(dim=1, keepdim=True)


def test_script_refuses_what_torchscript_cannot_compile_and_is_checked():
    with pytest.raises(ValueError, match="TorchScript cannot compile Unscriptable"):
        TorchModel(Unscriptable(), input_spec=SPEC, device="cpu", script=True)
    model = TorchModel(Unscriptable(), input_spec=SPEC, device="cpu")  # eager: runs
    np.testing.assert_allclose(model(rows(2)), rows(2).sum(axis=1, keepdims=True),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="script and compile are exclusive"):
        TorchModel(mlp(), input_spec=SPEC, device="cpu", script=True, compile=True)
    with pytest.raises(TypeError, match="script must be True or False"):
        TorchModel(mlp(), input_spec=SPEC, device="cpu", script="yes")
    assert TorchModel(mlp(), input_spec=SPEC, device="cpu", script=np.bool_(True)).script
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PyTorch's deprecation of the API stays quiet
        TorchModel(mlp(), input_spec=SPEC, device="cpu", script=True)


class NotMine(Exception):
    """An exception of the test's own module, raised inside a compiled pass."""


class RaisesOnNegatives(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.linear = torch.nn.Linear(6, 1)

    def forward(self, x):
        if bool((x < -100).any()):
            if self.kind == "value":
                raise ValueError("no rows below -100\nplease")
            if self.kind == "spoof":  # a message that names another exception
                raise RuntimeError("overflow\nbuiltins.ValueError: see above")
            if self.kind == "assertion":
                raise AssertionError("below -100")
            if self.kind == "assert":
                assert False, "below -100"
            if self.kind == "bare":  # no call: TorchScript says only "RuntimeError:"
                raise ValueError
            if self.kind == "bare own":
                raise NotMine
            raise NotMine("below -100")
        return self.linear(x)


@pytest.mark.parametrize("kind, error, message", [
    ("value", ValueError, "no rows below -100\nplease"),
    ("own", NotMine, "below -100"),
    # The last line that named an exception won: a RuntimeError whose message names a
    # ValueError came back as the caller's ValueError; an assert as torch.jit.Error.
    ("spoof", RuntimeError, "overflow\nbuiltins.ValueError: see above"),
    ("assertion", AssertionError, "below -100"),
    ("assert", AssertionError, "below -100"),
    # torch.jit.Error, a server's failure to a router, for a caller's ValueError
    ("bare", ValueError, ""),
    ("bare own", NotMine, ""),
])
def test_a_raise_in_a_scripted_pass_raises_what_it_names_and_fails_its_batch_only(
        kind, error, message):
    model = TorchModel(RaisesOnNegatives(kind), input_spec=SPEC, device="cpu",
                       batch_sizes=(4,), script=True)
    x = rows(2)
    x[1, 0] = -1000
    with pytest.raises(error) as raised:
        model(x)
    assert type(raised.value) is error and str(raised.value) == message
    assert isinstance(raised.value.__cause__, torch.jit.Error)  # TorchScript's, kept
    assert model(rows(2)).shape == (2, 1)


def test_a_value_error_in_a_scripted_pass_is_the_callers_to_a_router():
    import asyncio

    import async_search as asr
    from async_search.routing import BreakerPolicy

    async def main():
        models = [TorchModel(RaisesOnNegatives("value"), input_spec=SPEC, device="cpu",
                             script=True) for _ in range(2)]
        async with asr.serve(models[0]) as a, asr.serve(models[1]) as b:
            router = asr.Router({"a": a, "b": b},
                                breaker=BreakerPolicy(failure_threshold=2))
            bad = np.full((1, 6), -1000, np.float32)
            for _ in range(4):
                with pytest.raises(ValueError, match="no rows below -100"):
                    await router(bad)
            assert {b.state.value for b in router.breakers.values()} == {"closed"}
            assert (await router(rows(1))).shape == (1, 1)

    asyncio.run(main())


def test_scripted_adapters_made_from_threads_at_once_all_compile_and_keep_the_filters():
    from tests.helpers import failures_in_threads

    filters = list(warnings.filters)
    made = []
    failed = failures_in_threads(
        lambda seed: made.append(TorchModel(mlp(seed), input_spec=SPEC, device="cpu",
                                            script=True)), [(seed,) for seed in range(8)])
    assert not failed, failed[0]
    assert len(made) == 8 and warnings.filters == filters


def test_script_refuses_precision_and_a_pass_that_fails_only_compiled():
    with pytest.raises(ValueError, match="script and precision are exclusive"):
        TorchModel(mlp(), input_spec=SPEC, device="cpu", script=True, precision="bfloat16")
    net = mlp()
    net[0] = torch.nn.utils.parametrizations.weight_norm(net[0])  # compiles, fails to run
    with pytest.raises(ValueError, match="compiles, but its compiled pass fails on a row "
                                         "of zeros where the eager one runs"):
        TorchModel(net, input_spec=SPEC, device="cpu", script=True)
    assert TorchModel(net, input_spec=SPEC, device="cpu")(rows(2)).shape == (2, 3)


class RefusesZeros(torch.nn.Module):
    def forward(self, x):
        if bool((x == 0).all()):
            raise ValueError("an all-zero batch")
        return x.sum(dim=1, keepdim=True)


def test_a_module_that_fails_on_zeros_eagerly_too_is_compiled_all_the_same():
    model = TorchModel(RefusesZeros(), input_spec=SPEC, device="cpu", batch_sizes=(2,),
                       script=True)
    np.testing.assert_allclose(model(rows(2)), rows(2).sum(axis=1, keepdims=True),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="an all-zero batch"):
        model(np.zeros((2, 6), np.float32))


def test_outputs_in_a_buffer_the_module_keeps_are_the_callers_own():
    # A module writing its outputs into a buffer it keeps: the first caller's array
    # changed to the second caller's values at the next batch.
    class OutBuffer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 2)
            self.register_buffer("out", torch.zeros(8, 2), persistent=False)

        def forward(self, x):
            return torch.matmul(x, self.lin.weight.t(), out=self.out[:x.shape[0]])

    model = TorchModel(OutBuffer(), input_spec=SPEC, device="cpu", batch_sizes=[1, 8])
    first = model(np.ones((1, 6), np.float32))
    kept = first.copy()
    model(np.full((1, 6), 5.0, np.float32))
    np.testing.assert_array_equal(first, kept)


def test_a_complex32_output_keeps_its_imaginary_part():
    class Complex(torch.nn.Module):
        def forward(self, x):
            return torch.complex(x, x + 1).to(torch.complex32)

    model = TorchModel(Complex(), input_spec=TensorSpec((2,), np.float16), device="cpu")
    out = model(np.ones((1, 2), np.float16))
    assert out.dtype == np.complex64
    np.testing.assert_array_equal(out, [[1 + 2j, 1 + 2j]])


def test_a_sparse_output_is_the_nets_model_output_error():
    from async_search.errors import ModelOutputError

    class Sparse(torch.nn.Module):
        def forward(self, x):
            return x.to_sparse()

    with pytest.raises(ModelOutputError, match="layout .*dense"):
        TorchModel(Sparse(), input_spec=SPEC, device="cpu")(rows(2))


def test_a_ragged_output_is_the_nets_model_output_error():
    # A nested tensor of the strided layout got past the layout check and failed in
    # PyTorch's words: "NestedTensorImpl doesn't support sizes. Please file an issue."
    from async_search.errors import ModelOutputError

    class Ragged(torch.nn.Module):
        def forward(self, x):
            return torch.nested.nested_tensor([x[i, :i + 1] for i in range(len(x))])

    with pytest.raises(ModelOutputError, match="nested .*dense"):
        TorchModel(Ragged(), input_spec=SPEC, device="cpu")(rows(2))


def test_a_module_with_extra_state_is_served_and_updated_leaving_that_state():
    class WithExtra(torch.nn.Module):
        def __init__(self, seed):
            super().__init__()
            torch.manual_seed(seed)
            self.lin = torch.nn.Linear(6, 2)
            self.step = seed

        def forward(self, x):
            return self.lin(x)

        def get_extra_state(self):
            return {"step": self.step}

        def set_extra_state(self, state):
            self.step = state["step"]

    net, other = WithExtra(0), WithExtra(1)
    model = TorchModel(net, input_spec=SPEC, device="cpu")  # was a raw AttributeError
    x = rows(3)
    np.testing.assert_allclose(model(x), direct(net, x), rtol=1e-6)
    updated = model.with_weights(other.state_dict())
    np.testing.assert_allclose(updated(x), direct(other, x), rtol=1e-6)
    assert net.step == 0
    # on_device wrote the state_dict's values in order, extra state included: the dict
    # got a weight's copy_ (AttributeError), once another model had run since
    np.testing.assert_allclose(model(x), direct(net, x), rtol=1e-6)
    moved = updated.on_device("cpu")
    np.testing.assert_allclose(moved(x), direct(other, x), rtol=1e-6)


def test_an_update_reaches_a_buffer_that_forward_assigns_anew():
    # The adapter copied into the tensors the module held when it was made: a forward
    # that assigns a buffer a new tensor kept the old weights, silently.
    class Clamped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin = torch.nn.Linear(6, 2)
            self.register_buffer("scale", torch.ones(2))

        def forward(self, x):
            self.scale = self.scale.clamp(min=0.0)
            return self.lin(x) * self.scale

    net = Clamped()
    model = TorchModel(net, input_spec=SPEC, device="cpu")
    x = rows(3)
    model(x)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    state["scale"].zero_()
    assert not model.with_weights(state)(x).any()


def test_a_module_that_writes_its_input_through_data_never_writes_the_callers_array():
    # .data and NumPy writes leave the tensor's version as it was: they went unseen,
    # and every batch after the first ran on (and doubled) the caller's array.
    class Doubles(torch.nn.Module):
        def forward(self, x):
            x.data.mul_(2)
            return x[:, :2]

    model = TorchModel(Doubles(), input_spec=SPEC, device="cpu", batch_sizes=(4,))
    for _ in range(3):
        x = rows(4)
        want = x[:, :2] * 2
        np.testing.assert_array_equal(model(x), want)
        np.testing.assert_array_equal(x, rows(4))


def test_weights_without_batch_norm_counters_update_the_rest():
    # residual_nets' weights and torch_resnet_weights leave num_batches_tracked out (it
    # counts training steps; eval mode never reads it): they were refused as missing.
    net = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4))
    other = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4)).eval()
    model = TorchModel(net, input_spec=SPEC, device="cpu")
    weights = {k: v for k, v in other.state_dict().items()
               if not k.endswith("num_batches_tracked")}
    x = rows(5)
    np.testing.assert_allclose(model.with_weights(weights)(x), direct(other, x),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="missing \\['1.running_mean'\\]"):
        model.with_weights({k: v for k, v in weights.items() if k != "1.running_mean"})


@pytest.mark.parametrize("lazy", ["conj", "neg"])
def test_a_complex_output_with_a_lazy_conjugate_or_negative_bit_is_served(lazy):
    # numpy() refuses such tensors: the batch failed with a RuntimeError.
    class Lazy(torch.nn.Module):
        def forward(self, x):
            z = torch.complex(x, 2 * x).conj()
            return z if lazy == "conj" else z.imag

    x = rows(3)
    z = x - 2j * x
    np.testing.assert_array_equal(TorchModel(Lazy(), input_spec=SPEC, device="cpu")(x),
                                  z if lazy == "conj" else z.imag)


def test_weights_on_the_meta_device_are_refused_naming_the_weight():
    model = TorchModel(mlp(), input_spec=SPEC, device="cpu")
    with torch.device("meta"):
        shapes_only = mlp()
    with pytest.raises(ValueError, match="weight '0.weight' is on the meta device"):
        model.with_weights(shapes_only)
    np.testing.assert_allclose(model(rows(2)), direct(mlp(), rows(2)), rtol=1e-6)


@pytest.mark.parametrize("compile", ["yes", 1, None])
def test_compile_takes_a_bool_or_a_dict_of_options(compile):
    with pytest.raises(TypeError, match="compile must be True, False or a dict"):
        TorchModel(mlp(), input_spec=SPEC, device="cpu", compile=compile)


def test_compile_with_an_empty_dict_of_options_is_compile_with_the_defaults(monkeypatch):
    """{} read as no compile: the module ran eagerly, and script=True beside it was
    taken."""
    from async_search.models import torch_model

    with pytest.raises(ValueError, match="script and compile are exclusive"):
        TorchModel(mlp(), input_spec=SPEC, device="cpu", compile={}, script=True)
    # Compiled here, in a process that may hold TensorFlow, Triton (where PyTorch ships
    # it) would abort it: the adapter's refusal of that case shows the compile path
    # was taken, wherever the suite runs (it failed where Triton is installed).
    monkeypatch.setattr(torch_model, "_triton_would_follow_tensorflow", lambda: True)
    with pytest.raises(RuntimeError, match=r"TorchModel\(compile=...\): torch.compile"):
        TorchModel(mlp(), input_spec=SPEC, device="cpu", compile={})
    assert TorchModel(mlp(), input_spec=SPEC, device="cpu", compile=False).compile is False


class ReassignsItsBuffer(torch.nn.Module):
    """A forward that assigns its buffer a new tensor (a running statistic)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.zeros(6))

    def forward(self, x):
        self.offset = self.offset.clone()
        return x + self.offset


@pytest.mark.parametrize("script", [False, True])
def test_new_weights_reach_a_buffer_the_forward_assigns_anew_compiled_or_not(script):
    """Compiled, the copy's buffer was a tensor of its own after the first pass (the
    one on zeros), and with_weights wrote the eager module's: the update was taken and
    never seen."""
    model = TorchModel(ReassignsItsBuffer(), input_spec=SPEC, device="cpu", script=script)
    model(rows(2))
    updated = model.with_weights({"offset": torch.full((6,), 7.0)})
    np.testing.assert_array_equal(updated(np.zeros((2, 6), np.float32)),
                                  np.full((2, 6), 7.0, np.float32))
    np.testing.assert_array_equal(model(np.zeros((1, 6), np.float32)),  # its own again
                                  np.zeros((1, 6), np.float32))
    # The module (after a call of the model) and copies hold the new weights too
    # (written to the compiled copy's buffer alone, they were not).
    updated(np.zeros((1, 6), np.float32))
    assert float(updated.module.state_dict()["offset"][0]) == 7.0
    np.testing.assert_array_equal(updated.on_device("cpu")(np.zeros((1, 6), np.float32)),
                                  np.full((1, 6), 7.0, np.float32))


def test_a_scripted_module_whose_state_dict_renames_its_weights_takes_new_weights():
    """The compiled copy has no state_dict hooks: read through it, the names of the
    module's state_dict were not there (KeyError)."""
    from tests.models.shadowing_net import RenamesItsWeights
    net = RenamesItsWeights()
    model = TorchModel(net, input_spec=SPEC, device="cpu", script=True)
    model(rows(1))
    zeros = {name: torch.zeros_like(value) for name, value in net.state_dict().items()}
    assert sorted(zeros) == ["w.linear.bias", "w.linear.weight"]
    np.testing.assert_array_equal(model.with_weights(zeros)(rows(2)),
                                  np.zeros((2, 1), np.float32))


def test_a_bare_raise_of_a_nets_own_class_raises_it_not_the_builtin_of_its_name():
    from tests.models import shadowing_net
    model = TorchModel(shadowing_net.RaisesItsOwn(), input_spec=SPEC, device="cpu",
                       script=True)
    with pytest.raises(shadowing_net.LookupError):
        model(np.full((1, 6), -1000, np.float32))
    with pytest.raises(ValueError):  # a comment after a bare raise
        model(np.full((1, 6), 1000, np.float32))
    with pytest.raises(KeyError):  # an if on its line, a comment naming another
        model(np.full((1, 6), 75, np.float32))
    with pytest.raises(IndexError):  # an elif on its line
        model(np.full((1, 6), -75, np.float32))
    assert model(rows(1)).shape == (1, 1)


@pytest.mark.parametrize("script", [False, True])
def test_new_weights_reach_a_renamed_tied_buffer_the_forward_assigns_anew(script):
    """Matched by name, a buffer that a state_dict hook renames, or that one tensor
    holds under two names, was skipped: the update was taken and never seen."""
    from tests.models.shadowing_net import ReassignsRenamedTiedBuffers
    model = TorchModel(ReassignsRenamedTiedBuffers(), input_spec=SPEC, device="cpu",
                       script=script)
    model(rows(2))
    seven = torch.full((6,), 7.0)
    updated = model.with_weights({"w.offset": seven, "w.alias": seven})
    np.testing.assert_array_equal(updated(np.zeros((2, 6), np.float32)),
                                  np.full((2, 6), 7.0, np.float32))


def test_a_scripted_buffer_of_another_shape_refuses_weights_of_the_modules_old_shape():
    """Checked against the module's (6,) buffer, (6,) weights were taken, and the
    compiled pass, whose buffer is (1,) now, failed at the first batch."""
    from tests.models.shadowing_net import ShrinksItsBuffer
    model = TorchModel(ShrinksItsBuffer(), input_spec=SPEC, device="cpu", script=True)
    model(rows(2))
    with pytest.raises(ValueError, match=r"weight 'offset' has shape \(6,\), the "
                                         r"module's has \(1,\)"):
        model.with_weights({"offset": torch.full((6,), 7.0)})
    updated = model.with_weights({"offset": torch.full((1,), 7.0)})
    np.testing.assert_array_equal(updated(np.zeros((2, 6), np.float32)),
                                  np.full((2, 6), 7.0, np.float32))
    # The module and copies take the reshaped buffer too (skipped, they ran on zeros).
    assert tuple(updated.module.offset.shape) == (1,)
    np.testing.assert_array_equal(updated.on_device("cpu")(np.zeros((2, 6), np.float32)),
                                  np.full((2, 6), 7.0, np.float32))


def test_eager_weights_staged_for_a_buffer_a_batch_then_reshaped_fail_loudly():
    """Staged against the (6,) buffer, then the old model's batch made it (1,): the
    update must fail at its first batch, not run on the old buffer unsaid."""
    from tests.models.shadowing_net import ShrinksItsBuffer
    model = TorchModel(ShrinksItsBuffer(), input_spec=SPEC, device="cpu")
    updated = model.with_weights({"offset": torch.full((6,), 7.0)})
    model(rows(2))
    with pytest.raises(ValueError, match=r"weight 'offset' has shape \(6,\), the "
                                         r"module's has \(1,\) now"):
        updated(np.zeros((1, 6), np.float32))


def test_a_buffer_tied_to_one_the_compiled_pass_reshaped_keeps_its_own_tensor():
    """The alias of a reshaped buffer was assigned the new value too, and then the
    compiled copy's alias broadcast it: 4 where the eager module gives 3."""
    from tests.models.shadowing_net import ShrinksOneOfTiedBuffers
    eager = ShrinksOneOfTiedBuffers()
    eager(torch.zeros(2, 6))
    eager.load_state_dict({"a": torch.full((1,), 2.0)})
    want = eager(torch.zeros(1, 6)).numpy()
    model = TorchModel(ShrinksOneOfTiedBuffers(), input_spec=SPEC, device="cpu",
                       script=True)
    model(np.zeros((2, 6), np.float32))
    updated = model.with_weights({"a": torch.full((1,), 2.0)})
    np.testing.assert_array_equal(updated(np.zeros((1, 6), np.float32)), want)
    np.testing.assert_array_equal(updated.on_device("cpu")(np.zeros((1, 6), np.float32)),
                                  want)


def test_eager_weights_that_would_broadcast_into_a_widened_buffer_fail_loudly():
    from tests.models.shadowing_net import GrowsItsBuffer
    model = TorchModel(GrowsItsBuffer(), input_spec=SPEC, device="cpu")
    updated = model.with_weights({"offset": torch.full((1,), 7.0)})
    model(rows(2))  # the buffer is (6,) now
    with pytest.raises(ValueError, match=r"weight 'offset' has shape \(1,\), the "
                                         r"module's has \(6,\) now"):
        updated(np.zeros((1, 6), np.float32))


def test_a_scripted_module_whose_state_dict_hook_reads_numpy_is_made_and_updated():
    """Its hook fails on the Parameters of state_dict(keep_vars=True): the adapter's
    construction raised RuntimeError."""
    from tests.models.shadowing_net import CopiesInAHook
    net = CopiesInAHook()
    model = TorchModel(net, input_spec=SPEC, device="cpu", script=True)
    model(rows(2))
    zeros = {name: torch.zeros_like(value) for name, value in net.state_dict().items()}
    np.testing.assert_array_equal(model.with_weights(zeros)(rows(2)),
                                  np.zeros((2, 6), np.float32))


def test_an_adapter_cannot_be_pickled_or_copied_and_says_what_to_send_instead():
    import copy
    import pickle
    model = TorchModel(mlp(), input_spec=SPEC, device="cpu")
    for duplicate in (pickle.dumps, copy.deepcopy, copy.copy):
        with pytest.raises(TypeError, match="TorchModel holds a net on its device .*model "
                                            "factory"):
            duplicate(model)
    assert model.with_weights(mlp(1)) is not model  # its own copies are made as before


def test_a_second_adapter_on_a_module_put_back_in_train_mode_puts_it_in_eval_mode():
    # It shared the first adapter's runner and skipped the module's eval(): its first
    # batch failed with the train-mode error.
    import torch

    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    spec = TensorSpec((4,), np.float32)
    first = TorchModel(net, input_spec=spec, device="cpu", max_batch_size=4)
    net.train()
    second = TorchModel(net, input_spec=spec, device="cpu", max_batch_size=4)
    assert second._runner is first._runner and not net.training
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(second(x), first(x))


def test_adapters_made_on_one_module_in_two_threads_at_once_share_one_runner():
    # Each missed the other in the registry and made a runner of its own: an update of
    # one changed the other's rows.
    import threading
    import time

    import torch

    class SlowToMove(torch.nn.Linear):
        def to(self, *args, **kwargs):
            time.sleep(0.2)  # both threads inside the making at once
            return super().to(*args, **kwargs)

    torch.manual_seed(0)
    net = SlowToMove(4, 1)
    spec = TensorSpec((4,), np.float32)
    made = {}
    threads = [threading.Thread(target=lambda name=name: made.__setitem__(
        name, TorchModel(net, input_spec=spec, device="cpu", max_batch_size=4)))
        for name in ("served", "reference")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert made["served"]._runner is made["reference"]._runner
    x = np.ones((1, 4), np.float32)
    before = made["reference"](x).copy()
    updated = made["served"].with_weights({"weight": torch.zeros(1, 4),
                                           "bias": torch.full((1,), 7.0)})
    assert updated(x).ravel().tolist() == [7.0]
    np.testing.assert_array_equal(made["reference"](x), before)



def test_adapters_share_a_module_whose_eq_raises_and_forget_it_once_collected():
    # The registry's lookup compared modules with their own __eq__: one that raised
    # failed the second adapter with its error.
    import gc

    from async_search.models import weights

    class EqRaises(torch.nn.Linear):
        def __eq__(self, other):
            raise RuntimeError("no eq")

        __hash__ = torch.nn.Linear.__hash__

    net = EqRaises(6, 3)
    first = TorchModel(net, input_spec=SPEC, device="cpu", max_batch_size=4)
    second = TorchModel(net, input_spec=SPEC, device="cpu", max_batch_size=4)
    assert second._runner is first._runner
    with pytest.raises(ValueError, match="other options is in use"):
        TorchModel(net, input_spec=SPEC, device="cpu", max_batch_size=8)
    key = id(net)
    assert key in weights._RUNNERS._kept
    del first, second, net
    gc.collect()
    assert key not in weights._RUNNERS._kept  # the entry left with its net
