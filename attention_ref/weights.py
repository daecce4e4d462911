"""Copy known weights into a learner's module, however the exercise's spec lets it declare
them: an ``nn.Linear`` (or ``nn.LazyLinear``), a raw ``nn.Parameter`` used as ``x @ w``, or a
weight behind ``torch.nn.utils.parametrize``. The notebooks use it where they load
hand-made or PyTorch's weights into the learner's module, so that every declaration the
check accepts also runs the cells after it."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn.utils import parametrize


def load_projections(module: nn.Module, **weights: torch.Tensor) -> None:
    """Set bias-free projections of ``module`` by attribute name.

    Each keyword names an attribute (``w_q=...``) and gives its weight in ``nn.Linear``'s
    layout, ``(out_features, in_features)``. The attribute may be

    - an ``nn.Linear`` or ``nn.LazyLinear`` (lazy ones take their shape from the weight);
    - a raw ``nn.Parameter`` of shape ``(in_features, out_features)``, used as ``x @ w``:
      it receives the transpose;
    - a layer whose ``weight`` is parametrized: the weight is assigned through the
      parametrization's ``right_inverse``, or to its original tensor when it has none; either
      way the weight must then read back as given.

    Raises:
        TypeError: if a weight is not a tensor.
        ValueError: if ``module`` has no such attribute, or its shape does not fit.
    """
    for name, weight in weights.items():
        if not isinstance(weight, torch.Tensor):
            raise TypeError(
                f"{name} must be a tensor (out_features, in_features); got {type(weight).__name__}"
            )
        target = getattr(module, name, None)
        if isinstance(target, nn.Parameter) and not isinstance(
            target, nn.parameter.UninitializedParameter
        ):
            _copy(name, target, weight.T, layout="a raw parameter (in_features, out_features)")
        elif isinstance(target, nn.Module) and parametrize.is_parametrized(target, "weight"):
            _load_parametrized(name, target, weight)
        elif isinstance(target, nn.Module) and isinstance(
            getattr(target, "weight", None), nn.Parameter
        ):
            if isinstance(target.weight, nn.parameter.UninitializedParameter):
                target.load_state_dict({"weight": weight}, strict=False)  # materialises it
            else:
                _copy(name, target.weight, weight, layout="nn.Linear's (out_features, in_features)")
        else:
            has = [*dict(module.named_children()), *dict(module.named_parameters(recurse=False))]
            raise ValueError(
                f"the module has no projection {name!r} (an nn.Linear, a raw nn.Parameter or a "
                f"parametrized layer); its attributes: {', '.join(has) or 'none'}"
            )


def load_weights(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """``module.load_state_dict(state)`` for every declaration a spec allows: a weight behind
    a parametrization (``weight_norm`` stores it as ``original0``, ``original1``) is set
    through it, lazy layers take their shapes from ``state``, and the module's own buffers
    that ``state`` does not name (a call counter, a cached mask) are left as they are. A
    parameter the module holds under two names is loaded by either.

    Raises:
        ValueError: if ``state`` names a tensor the module does not have, a parameter of the
            module is not in ``state``, or a parametrization changes the value it is given.
    """
    plain, covered = {}, set()
    for name, value in state.items():
        owner, _, leaf = name.rpartition(".")
        try:
            sub = module.get_submodule(owner)
        except AttributeError:
            sub = None
        if sub is not None and parametrize.is_parametrized(sub, leaf):
            value = value.to(next(sub.parametrizations[leaf].parameters()))
            if not _reads_back(set_parametrized(sub, leaf, value), value):
                raise ValueError(f"{name}'s parametrization changes the value it is given")
            covered |= {id(p) for p in sub.parametrizations[leaf].parameters()}
        else:
            plain[name] = value
    missing, unexpected = module.load_state_dict(plain, strict=False)
    # A parameter reachable under two names (a layer kept in a Sequential and as an
    # attribute) is loaded when either name is in ``state``.
    aliases = dict(module.named_parameters(remove_duplicate=False))
    covered |= {id(aliases[n]) for n in plain if n in aliases}
    params = dict(module.named_parameters())
    missing = [n for n in missing if n in params and id(params[n]) not in covered]
    if missing or unexpected:
        raise ValueError(
            "the module's parameters do not match the weights by name"
            + (f"; not loaded: {', '.join(missing)}" if missing else "")
            + (f"; no such tensor in the module: {', '.join(unexpected)}" if unexpected else "")
        )


def is_a(module: object, cls: type) -> bool:
    """``isinstance(module, cls)``, where ``cls`` also stands for the class of the same name
    in another copy of ``cls``'s module: a notebook's hidden tests import the package afresh,
    so what a later cell imports holds new classes, which ``isinstance`` tells apart."""
    name = (cls.__module__, cls.__qualname__)
    return any(k is cls or (k.__module__, k.__qualname__) == name for k in type(module).__mro__)


def with_weights_of(
    reference: nn.Module, cls, *args, keep: tuple[str, ...] = (), **kwargs
) -> nn.Module:
    """``cls(*args, **kwargs)`` (the learner's class) holding ``reference``'s weights
    (:func:`load_weights`), on its device, in its dtype and in its mode (training or eval):
    the learner's module standing in for the course's, with the same numbers.

    ``keep`` names submodules (earlier exercises' parts, such as a decoder layer's
    ``self_attn``) that the new module gets as copies of the reference's, in place of its
    own, before the weights are loaded: as a check grades a module, with a bug in an
    earlier part counted there only, and parts the learner named otherwise still fitting.

    The learner's own initial weights, which are replaced, are drawn from a forked random
    state: the caller's seeded draws that follow are the same however ``cls`` draws them.

    Raises:
        TypeError: if ``reference`` is not an ``nn.Module`` or ``cls(...)`` does not build one.
        ValueError: as :func:`load_weights`, when their parameters do not match by name, or
            if ``reference`` has no submodule of a name in ``keep``.
    """
    if not isinstance(reference, nn.Module):
        raise TypeError(f"reference must be an nn.Module; got {type(reference).__name__}")
    with torch.random.fork_rng(devices=[]):
        module = cls(*args, **kwargs)
    if not isinstance(module, nn.Module):
        built = type(module).__name__
        raise TypeError(f"{getattr(cls, '__name__', cls)}(...) built a {built}, not an nn.Module")
    for name in keep:
        part = getattr(reference, name, None)
        if not isinstance(part, nn.Module):
            raise ValueError(f"the reference has no submodule {name!r} to keep")
        setattr(module, name, copy.deepcopy(part))
    first = next(iter(reference.parameters()), None)
    if first is not None:
        module = module.to(device=first.device, dtype=first.dtype)
    load_weights(module, reference.state_dict())
    return module.train(reference.training)


def set_parametrized(layer: nn.Module, leaf: str, value: torch.Tensor) -> torch.Tensor:
    """Set ``layer.<leaf>``, a tensor behind ``torch.nn.utils.parametrize``, to ``value``:
    through the parametrizations' ``right_inverse`` when each has one, else into the original
    tensor itself. Returns what ``layer.<leaf>`` reads back (a parametrization that changes
    its input reads back as something else; the caller decides what that means)."""
    plist = layer.parametrizations[leaf]
    with torch.no_grad():
        if all(hasattr(p, "right_inverse") for p in plist):
            setattr(layer, leaf, value)
        else:
            plist.original.copy_(value)
    return getattr(layer, leaf)


def _load_parametrized(name: str, layer: nn.Module, weight: torch.Tensor) -> None:
    plist = layer.parametrizations.weight
    # Its first original tensor gives dtype and device: a parametrization whose right_inverse
    # returns several tensors (weight_norm: g and v) has original0, original1, ... instead.
    value = weight.to(next(plist.parameters()))
    if not all(hasattr(p, "right_inverse") for p in plist):
        _expect_shape(name, plist.original, value, layout="nn.Linear's (out_features, in_features)")
    if not _reads_back(set_parametrized(layer, "weight", value), value):
        raise ValueError(f"{name}'s parametrization changes the weight it is given")


def _reads_back(loaded: torch.Tensor, value: torch.Tensor) -> bool:
    """``loaded`` is ``value`` up to rounding (weight_norm recomputes it from g and v)."""
    return loaded.shape == value.shape and torch.allclose(
        loaded.detach(), value, rtol=1e-5, atol=1e-6
    )


def _expect_shape(name: str, param: torch.Tensor, value: torch.Tensor, layout: str) -> None:
    if param.shape != value.shape:
        raise ValueError(
            f"{name} has shape {tuple(param.shape)}; the weight given fits {tuple(value.shape)} "
            f"as {layout}"
        )


def _copy(name: str, param: torch.Tensor, value: torch.Tensor, layout: str) -> None:
    _expect_shape(name, param, value, layout)
    with torch.no_grad():
        param.copy_(value)
