"The float32-tail emulation (benchmarks.engine.tail_tf32): TF32 rounding as the tensor cores do it, and patches undone."
import torch

from benchmarks.engine import tail_tf32 as tt


def test_tf32_rounding():
    u = 2.0 ** -10                                                         # one TF32 ulp at 1
    x = torch.tensor([1 + u / 4, 1 + u / 2, 1 + 3 * u / 4, -(1 + u / 2), 1 + u, 3.0, float("inf"), float("nan")])
    r = tt.tf32(x)
    assert r[:6].tolist() == [1.0, 1 + u, 1 + u, -(1 + u), 1 + u, 3.0]    # nearest, ties away from zero, sign kept
    assert r[6] == float("inf") and torch.isnan(r[7])
    y = torch.randn(1000)
    m = (tt.tf32(y).view(torch.int32) & 0x1FFF)
    assert int(m.abs().sum()) == 0 and float(((tt.tf32(y) - y) / y).abs().max()) <= 2.0 ** -11   # 10 bits kept, half-ulp error
    assert tt.tf32(y.double()).dtype == torch.float64                      # other dtypes pass through


def test_tf32_dots_patch_and_restore():
    from solar_open2.moe import SolarMLP, SolarRouter
    saved = (torch.bmm, torch.baddbmm, torch.Tensor.baddbmm_, torch.einsum, SolarMLP.forward, SolarRouter.scores)
    a, b = torch.full((1, 1, 1), 1 + 2.0 ** -12), torch.ones(1, 1, 1)
    with tt.tf32_dots("all"):
        assert float(torch.bmm(a, b)) == 1.0 and float(torch.einsum("ijk,ikl->ijl", a, b)) == 1.0
    with tt.tf32_dots("exact"):
        assert float(torch.bmm(a, b)) == 1 + 2.0 ** -12
    assert (torch.bmm, torch.baddbmm, torch.Tensor.baddbmm_, torch.einsum, SolarMLP.forward, SolarRouter.scores) == saved
