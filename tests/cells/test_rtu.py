"""The Recurrent Trace Unit, linear and non-linear: exact RTRL (functional and in place), SnAP-1 and TBPTT against
their autograd references in float64, its closed-form derivatives, stability for any parameter value, and its use in a
stack, the registry, the demo and the RL runner."""

from __future__ import annotations

import pytest
import torch

import onlinerec
import onlinerec.gradients.inplace as inplace
from onlinerec import RTRL, TBPTT, NotElementwiseError, RTUCell, SnAP, check_gradients
from onlinerec.cells import CELLS, Stack, build_cell_spec, cell_spec, make_cell
from onlinerec.gradients import derivatives, elementwise
from onlinerec.gradients.check import bptt_gradients, method_gradients, stepwise, truncated_gradients
from tests.helpers import TINY_RL, on, rel_err

VARIANTS = {
    "linear-relu": {},
    "nonlinear-relu": {"nonlinear": True},
    "nonlinear-tanh": {"nonlinear": True, "activation": "tanh"},
}


class AutodiffRTU(RTUCell):
    """Declines the closed form: the local derivatives come from autodiff of the recurrence."""

    def recurrence_derivatives(self, gates, c_prev, params):
        return None


def make(d, n, seed=0, cls=RTUCell, **kwargs):
    torch.manual_seed(seed)
    return cls(d, n, **kwargs).double()


def state_weights(problem, cell):
    """Loss weights of the state's shape (T, B, 2, N)."""
    inputs = problem[0]
    gen = torch.Generator().manual_seed(7)
    return torch.randn(*inputs.shape[:2], *cell.state_shape, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("carry", ["batched", "stepwise"])
@pytest.mark.parametrize("seg_len", [1, 4, 7])  # 7 does not divide T = 23; resets fall inside segments
@pytest.mark.parametrize("kwargs", VARIANTS.values(), ids=VARIANTS.keys())
def test_rtrl_equals_full_bptt(kwargs, seg_len, carry, problem, device):
    inputs, reset, _, d, n = problem
    cell = make(d, n, **kwargs).to(device)
    inputs, reset, weights = on(device, inputs, reset, state_weights(problem, cell))
    expected, x_expected = bptt_gradients(cell, inputs, reset, weights)
    method = RTRL() if carry == "batched" else stepwise(RTRL())
    got, x_got, _ = method_gradients(method, cell, inputs, reset, weights, seg_len)
    assert derivatives.has_closed_form(cell)
    assert set(got) == set(expected) == {"input_proj.weight", "nu_log", "theta_log"}
    for name in expected:
        assert rel_err(got[name], expected[name]) <= 1e-10, name
    assert rel_err(x_got, x_expected) > 1e-3  # inputs get within-segment backprop only: the segments are real


@pytest.mark.parametrize("kwargs", VARIANTS.values(), ids=VARIANTS.keys())
def test_rtrl_equals_full_bptt_with_autodiff_derivatives(kwargs, problem):
    inputs, reset, _, d, n = problem
    cell = make(d, n, cls=AutodiffRTU, **kwargs)
    weights = state_weights(problem, cell)
    expected, _ = bptt_gradients(cell, inputs, reset, weights)
    got, _, _ = method_gradients(RTRL(), cell, inputs, reset, weights, 5)
    assert not derivatives.has_closed_form(cell)
    for name in expected:
        assert rel_err(got[name], expected[name]) <= 1e-10, name


def _run(method, cell, inputs, reset, weights, seg_len, donate):
    """Parameter gradients after every segment, the input gradient and the final carry."""
    x = inputs.detach().requires_grad_(True)
    carry = method.init_carry(cell, inputs.shape[1])
    grads = []
    for s in range(0, inputs.shape[0], seg_len):
        cell.zero_grad()
        states, carry = method.unroll(cell, x[s : s + seg_len], reset[s : s + seg_len], carry, donate=donate)
        (states * weights[s : s + seg_len]).sum().backward()
        grads.append({k: p.grad.clone() for k, p in cell.named_parameters() if p.grad is not None})
    return grads, x.grad.clone(), carry


@pytest.mark.parametrize("lazy", [True, False], ids=["lazily-scaled", "direct"])
@pytest.mark.parametrize("method", [RTRL(), SnAP()], ids=["rtrl", "snap"])
@pytest.mark.parametrize("kwargs", VARIANTS.values(), ids=VARIANTS.keys())
def test_in_place_online_step_equals_the_functional_one_and_full_bptt(kwargs, method, lazy, problem, monkeypatch):
    inputs, reset, _, d, n = problem
    monkeypatch.setattr(inplace, "SMALL_CARRY", 0 if lazy else 1 << 30)  # a lazy K x K scale, or decayed directly
    cell = make(d, n, **kwargs)
    weights = state_weights(problem, cell)
    kept_grads, kept_x, kept = _run(method, cell, inputs, reset, weights, 1, donate=False)
    donated_grads, donated_x, donated = _run(method, cell, inputs, reset, weights, 1, donate=True)
    assert kept.scale is None
    assert donated.scale.shape == (inputs.shape[1], 2, 2, n) if lazy else donated.scale is None
    for a, b in zip(kept_grads, donated_grads):
        for name in a:
            assert rel_err(b[name], a[name]) <= 1e-12, name
    assert rel_err(donated_x, kept_x) <= 1e-12
    assert rel_err(donated.c, kept.c) <= 1e-12
    for name, s in kept.sensitivities.items():
        assert rel_err(donated.sensitivities[name], s) <= 1e-12, name
    expected, _ = bptt_gradients(cell, inputs, reset, weights)
    total = {k: sum(g[k] for g in donated_grads) for k in expected}  # the per-step gradients add up to full BPTT
    for name in expected:
        assert rel_err(total[name], expected[name]) <= 1e-10, name


@pytest.mark.parametrize("kwargs", VARIANTS.values(), ids=VARIANTS.keys())
def test_snap_equals_rtrl(kwargs, problem):
    inputs, reset, _, d, n = problem
    cell = make(d, n, **kwargs)
    weights = state_weights(problem, cell)
    rtrl, _, rtrl_carry = method_gradients(RTRL(), cell, inputs, reset, weights, 5)
    snap, _, snap_carry = method_gradients(SnAP(), cell, inputs, reset, weights, 5)
    for name in rtrl:
        assert rel_err(snap[name], rtrl[name]) <= 1e-12, name
    for name, s in rtrl_carry.sensitivities.items():
        assert rel_err(snap_carry.sensitivities[name], s) <= 1e-12, name


@pytest.mark.parametrize("kwargs", VARIANTS.values(), ids=VARIANTS.keys())
def test_tbptt_equals_truncated_backprop(kwargs, problem):
    inputs, reset, _, d, n = problem
    cell = make(d, n, **kwargs)
    weights = state_weights(problem, cell)
    expected = truncated_gradients(cell, inputs, reset, weights, 4)
    got, _, _ = method_gradients(TBPTT(), cell, inputs, reset, weights, 4)
    for name in expected:
        assert rel_err(got[name], expected[name]) <= 1e-12, name
    full, _ = bptt_gradients(cell, inputs, reset, weights)
    assert rel_err(got["nu_log"], full["nu_log"]) > 1e-3  # the truncation shows


class MixesNeighbours(RTUCell):
    """Reads the second component of the neighbouring unit: not element-wise."""

    def recurrence(self, gates, c_prev):
        return super().recurrence(gates, torch.stack([c_prev[..., 0, :], c_prev[..., 1, :].roll(1, -1)], dim=-2))


@pytest.mark.parametrize("kwargs", VARIANTS.values(), ids=VARIANTS.keys())
def test_the_elementwise_check_accepts_it(kwargs):
    cell = RTUCell(3, 5, **kwargs)
    names = elementwise.check_elementwise(cell, "recurrence", ("input_proj.weight",), 2, 5, 2)
    assert set(names) == {"nu_log", "theta_log"}
    RTRL().init_carry(cell, 2)  # RTRL takes it
    with pytest.raises(NotElementwiseError, match="MixesNeighbours"):  # and the check is not blind to a K = 2 cell
        elementwise.check_elementwise(MixesNeighbours(3, 5, **kwargs), "recurrence", ("input_proj.weight",), 2, 5, 2)


@pytest.mark.parametrize("kwargs", VARIANTS.values(), ids=VARIANTS.keys())
def test_the_step_is_the_complex_diagonal_recurrence(kwargs):
    """With z = c1 + i c2: z_t = lambda z_{t-1} + gamma (W1 x + i W2 x), lambda = exp(-exp(nu_log) + i exp(theta_log)),
    gamma = sqrt(1 - |lambda|^2); the non-linear RTU applies f to the real and the imaginary part."""
    torch.manual_seed(3)
    cell = RTUCell(3, 6, **kwargs).double()
    x, c_prev = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 2, 6, dtype=torch.float64)
    nu, theta = torch.exp(cell.nu_log.detach()), torch.exp(cell.theta_log.detach())
    lam = torch.exp(torch.complex(-nu, theta))
    gamma = torch.sqrt(1 - lam.abs() ** 2)
    w = cell.input_proj.weight.detach()
    z = lam * torch.complex(c_prev[:, 0], c_prev[:, 1]) + gamma * torch.complex(x @ w[:6].T, x @ w[6:].T)
    f = {"relu": torch.relu, "tanh": torch.tanh}[cell.activation] if cell.nonlinear else (lambda a: a)
    with torch.no_grad():
        c = cell(x, c_prev)
    torch.testing.assert_close(c, torch.stack([f(z.real), f(z.imag)], dim=1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kwargs", VARIANTS.values(), ids=VARIANTS.keys())
def test_every_parameter_value_is_stable(kwargs):
    """0 < |lambda| < 1 for nu_log and theta_log anywhere in a wide range, and a step without input shrinks every
    unit's pair by at least the factor |lambda| (the non-linear RTU: f is 1-Lipschitz with f(0) = 0)."""
    n = 400
    cell = RTUCell(2, n, **kwargs).double()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        cell.nu_log.copy_(torch.linspace(-20.0, 6.0, n, dtype=torch.float64))
        cell.theta_log.copy_(8 * torch.randn(n, generator=gen, dtype=torch.float64))
    c_prev = 10 * torch.randn(3, 2, n, generator=gen, dtype=torch.float64)
    gates = torch.randn(3, 2, n, generator=gen, dtype=torch.float64)
    linear = RTUCell(2, n).double()  # the same lambda without f: its Jacobian is lambda's 2 x 2 block
    linear.load_state_dict(cell.state_dict())
    _, d_state, _, _ = linear.recurrence_derivatives(gates, c_prev, {})
    blocks = d_state[0].permute(2, 0, 1)  # (N, 2, 2)
    modulus = torch.linalg.matrix_norm(blocks, ord=2)
    assert bool((modulus < 1).all()) and bool((modulus > 0).all())
    torch.testing.assert_close(modulus, torch.exp(-torch.exp(cell.nu_log.detach())), rtol=1e-12, atol=0)
    with torch.no_grad():
        c = cell.recurrence(torch.zeros_like(gates), c_prev)
    assert bool((c.norm(dim=1) <= modulus * c_prev.norm(dim=1) + 1e-12).all())


@pytest.mark.parametrize("kwargs", VARIANTS.values(), ids=VARIANTS.keys())
def test_closed_form_equals_autodiff_at_a_live_point(kwargs):
    torch.manual_seed(1)
    cell = RTUCell(4, 6, **kwargs).double()
    with torch.no_grad():
        cell.nu_log.sub_(1.0)  # |lambda| nearer 1, where gamma's term in dc/dnu_log is large
    params = {"nu_log": cell.nu_log.detach(), "theta_log": cell.theta_log.detach()}
    gates, c_prev = torch.randn(9, 2, 6, dtype=torch.float64), 3 * torch.randn(9, 2, 6, dtype=torch.float64)
    value, d_state, d_gates, d_params = cell.recurrence_derivatives(gates, c_prev, params)
    auto = derivatives.forward_mode(cell, "recurrence", params, gates, c_prev)
    with torch.no_grad():
        torch.testing.assert_close(value, cell.recurrence(gates, c_prev), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(d_state, auto.d_state, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(d_gates, auto.d_gates, rtol=1e-12, atol=1e-12)
    for k in params:
        torch.testing.assert_close(d_params[k], auto.d_params[k], rtol=1e-12, atol=1e-12, msg=k)


def test_the_readout_and_the_initialisation():
    torch.manual_seed(0)
    c = torch.randn(7, 2, 5)
    linear, nonlinear = RTUCell(3, 5), RTUCell(3, 5, nonlinear=True, activation="tanh")
    assert linear.output_size == nonlinear.output_size == 10
    torch.testing.assert_close(linear.readout(c, torch.zeros(7, 3)), torch.cat([c[:, 0].relu(), c[:, 1].relu()], -1))
    torch.testing.assert_close(nonlinear.readout(c, torch.zeros(7, 3)), torch.cat([c[:, 0], c[:, 1]], -1))
    cell = RTUCell(64, 2000, r_min=0.5, r_max=0.9, max_phase=0.3)
    r, theta = torch.exp(-torch.exp(cell.nu_log.detach())), torch.exp(cell.theta_log.detach())
    assert 0.5 <= r.min() and r.max() <= 0.9 and 0 <= theta.min() and theta.max() <= 0.3
    w = cell.input_proj.weight.detach()
    assert cell.input_proj.bias is None and abs(w.var().item() * 64 - 1) < 0.05  # LeCun normal: variance 1/D


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"activation": "gelu"}, "activation"),
        ({"nonlinear": "yes"}, "nonlinear"),
        ({"r_min": 0.9, "r_max": 0.5}, "r_min"),
        ({"max_phase": 0.0}, "max_phase"),
    ],
)
def test_bad_arguments_are_named(kwargs, says):
    with pytest.raises(ValueError, match=says):
        RTUCell(3, 5, **kwargs)


def test_it_is_registered_exported_and_rebuilt_from_its_spec():
    assert CELLS["rtu"] is RTUCell and onlinerec.RTUCell is RTUCell
    cell = make_cell("rtu", 3, 4, nonlinear=True, activation="tanh", r_min=0.5)
    assert type(cell) is RTUCell and cell.nonlinear and cell.activation == "tanh"
    spec = cell_spec(cell)
    assert spec == {
        "class_path": "rtu",
        "init_args": {"input_size": 3, "hidden_size": 4, "nonlinear": True, "activation": "tanh", "r_min": 0.5},
    }
    again = build_cell_spec(spec)
    assert (again.nonlinear, again.activation, again.output_size) == (True, "tanh", 8)


def test_a_stack_of_rtus_is_exact_within_a_segment():
    """A linear RTU under a non-linear one with a residual connection (2N -> 2N): RTRL equals BPTT within a segment,
    and make_cell builds the same kind of stack by name."""
    torch.manual_seed(0)
    stack = Stack([RTUCell(3, 4), RTUCell(8, 4, nonlinear=True, activation="tanh")], residual=True, norm="rms")
    assert stack.residual_layers == (1,) and stack.output_size == 8
    errors = check_gradients(stack, steps=12, segment=12)
    assert max(errors.values()) < 1e-10, errors
    deep = make_cell("rtu", 3, 4, layers=3, nonlinear=True)
    assert isinstance(deep, Stack) and [layer.input_size for layer in deep.layers] == [3, 8, 8]


def test_the_demo_and_the_rl_runner_train_it(tmp_path):
    from onlinerec.rl.experiment import parse_experiment
    from onlinerec.rl.runner import build, run_experiment
    from onlinerec.tasks.demo import DemoConfig, train_one

    torch.set_num_threads(1)
    tiny = dict(delay=2, steps=2, seeds=1, hidden_size=4, num_streams=2, eval_size=4, curve_points=2, M=4)
    cfg = DemoConfig(cell="rtu", cell_kwargs={"nonlinear": True}, out_dir=str(tmp_path / "demo"), **tiny)
    assert cfg.describe_cell() == "RTU N=4 (nonlinear=True)"
    result = train_one("rtrl", 0, cfg)
    assert result.curve_steps[-1] == cfg.steps
    args = [*TINY_RL, "--env", "memory:tmaze", "--env_kwargs", '{"length": 3}', "--stem", "mlp"]
    args += ["--eval_episodes", "0", "--cell", "rtu", "--total_frames", "8", "--out_dir", str(tmp_path / "rl")]
    experiment = parse_experiment(args)
    model, *_ = build(experiment)
    assert isinstance(model.cell, RTUCell)
    assert run_experiment(experiment)["updates"] == 1
