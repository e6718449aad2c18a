"""CrossEntropyLoss and LinearCrossEntropyLoss against torch.nn's modules: the same constructor
arguments give the same loss and gradients (torch in float64), the same state_dict keys, torch's
class dim 1 for inputs of more than two dims, and this library's options passed through."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import onlinesoftmax

from conftest import DEVICE, assert_matches, make_logits


def _class_targets(shape, classes, gen, ignored=1):
    target = torch.randint(0, classes, shape, generator=gen)
    target.view(-1)[:ignored] = -100
    return target.to(DEVICE)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", [(6, 37), (3, 37, 2, 3), (37,)], ids=["N-C", "N-C-d1-d2", "C"])
def test_module_matches_torch_module(shape, reduction, gen):
    # (N, C, d1, d2): torch's module reads dim 1 as the classes; ours must too (a view, no copy).
    print(f"seed {gen.initial_seed()}")
    x = make_logits(shape, torch.float32, gen).requires_grad_()
    target_shape = shape[:1] + shape[2:] if len(shape) > 1 else ()
    target = _class_targets(target_shape, shape[0] if len(shape) == 1 else shape[1], gen,
                            ignored=0 if len(shape) == 1 else 1)
    classes = x.shape[1] if x.dim() > 1 else x.shape[0]
    weight = (torch.rand(classes, generator=gen) + 0.5).to(DEVICE)
    kwargs = dict(weight=weight, ignore_index=-100, reduction=reduction, label_smoothing=0.1)
    ours = onlinesoftmax.CrossEntropyLoss(**kwargs)
    theirs = torch.nn.CrossEntropyLoss(**{**kwargs, "weight": weight.double()})
    x64 = x.detach().double().requires_grad_()
    got, want = ours(x, target), theirs(x64, target)
    assert got.shape == want.shape and got.dtype == x.dtype
    assert_matches(got, want, torch.float32, "loss")
    upstream = torch.rand(got.shape, generator=gen).to(DEVICE) + 0.5
    (got * upstream).sum().backward()
    (want * upstream.double()).sum().backward()
    assert_matches(x.grad, x64.grad, torch.float32, "gradient")


def test_module_probability_targets_at_dim_1(gen):
    x = make_logits((4, 19, 3), torch.float32, gen)
    p = torch.softmax(torch.randn(4, 19, 3, generator=gen), dim=1).to(DEVICE)
    got = onlinesoftmax.CrossEntropyLoss(label_smoothing=0.2)(x, p)
    want = torch.nn.CrossEntropyLoss(label_smoothing=0.2)(x.double(), p.double())
    assert_matches(got, want, torch.float32, "probability targets")


def test_module_weight_is_a_buffer_as_torch():
    weight = torch.rand(11) + 0.5
    ours, theirs = onlinesoftmax.CrossEntropyLoss(weight), torch.nn.CrossEntropyLoss(weight)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight"]
    assert ours.double().weight.dtype == torch.float64  # moved with the module
    assert list(onlinesoftmax.CrossEntropyLoss().state_dict()) == []


def test_module_legacy_reduction_arguments():
    # torch's deprecated size_average / reduce map to reduction by torch's own rule, with its warning.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert onlinesoftmax.CrossEntropyLoss(size_average=False).reduction == "sum"
        assert onlinesoftmax.CrossEntropyLoss(reduce=False).reduction == "none"
    assert len(caught) == 2


def test_module_options_reach_the_function(gen):
    x = make_logits((5, 40), torch.float32, gen)
    target = _class_targets((5,), 40, gen)
    options = dict(z_loss=1e-3, softcap=5.0, temperature=0.7)
    got = onlinesoftmax.CrossEntropyLoss(**options)(x, target)
    assert got == onlinesoftmax.cross_entropy(x, target, **options)
    assert got != onlinesoftmax.cross_entropy(x, target)
    # inplace_backward: the module's input is overwritten with the gradient, as the function's.
    logits = x.clone().requires_grad_()
    work = logits.detach().clone().requires_grad_()
    onlinesoftmax.CrossEntropyLoss(inplace_backward=True)(work * 1, target).backward()
    torch.nn.functional.cross_entropy(logits, target).backward()
    assert_matches(work.grad, logits.grad.double(), torch.float32, "in place through the module")


def _linear_modules(bias, gen):
    weight = (torch.rand(23, generator=gen) + 0.5).to(DEVICE)
    ours = onlinesoftmax.LinearCrossEntropyLoss(16, 23, bias=bias, weight=weight, label_smoothing=0.1,
                                                device=DEVICE, chunk=4)
    with torch.no_grad():
        ours.linear.weight.copy_(torch.randn(23, 16, generator=gen) / math.sqrt(16) * 3)
        if bias:
            ours.linear.bias.copy_(torch.randn(23, generator=gen))
    return ours, weight


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_linear_module_matches_its_projection_then_torch(bias, gen):
    print(f"seed {gen.initial_seed()}")
    ours, weight = _linear_modules(bias, gen)
    h = make_logits((3, 5, 16), torch.float32, gen, scale=1.0).requires_grad_()  # (..., in_features)
    target = _class_targets((3, 5), 23, gen)
    got = ours(h, target)
    params64 = {name: p.detach().double().requires_grad_() for name, p in ours.linear.named_parameters()}
    h64 = h.detach().double().requires_grad_()
    logits = torch.nn.functional.linear(h64, params64["weight"], params64.get("bias"))
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, 23), target.reshape(-1), weight=weight.double(),
                                             label_smoothing=0.1)
    assert_matches(got, want, torch.float32, "loss")
    got.backward()
    want.backward()
    assert_matches(h.grad, h64.grad, torch.float32, "grad input")
    for name, p in ours.linear.named_parameters():
        assert_matches(p.grad, params64[name].grad, torch.float32, f"grad {name}")


@pytest.mark.skipif(not hasattr(torch.nn, "LinearCrossEntropyLoss"),
                    reason="torch.nn.LinearCrossEntropyLoss is torch 2.13's")
def test_linear_module_loads_torchs_state_dict(gen):
    theirs = torch.nn.LinearCrossEntropyLoss(16, 23, bias=True, device=DEVICE)
    ours = onlinesoftmax.LinearCrossEntropyLoss(16, 23, bias=True, device=DEVICE)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    h = make_logits((6, 16), torch.float32, gen, scale=1.0)
    target = _class_targets((6,), 23, gen)
    assert_matches(ours(h, target), theirs.double()(h.double(), target), torch.float32, "torch's module")


def test_linear_module_arguments():
    assert onlinesoftmax.LinearCrossEntropyLoss(4, 7).ignore_index == -100  # torch's None
    with pytest.raises(ValueError, match=r"weight must have shape \(7,\)"):
        onlinesoftmax.LinearCrossEntropyLoss(4, 7, weight=torch.ones(6))
