"""The toolkit the checks share: the dtype names and tolerances, building a learner's
module and loading known weights into it (lazy layers, parametrizations, raw parameters),
seeded reference weights, the reference parts a module exercise is graded with, the case
generators (shapes, masks with fully masked rows, large logits), the properties every
attention exercise has (masked weights 0, rows sum to 1, causality, the outputs' order) and
the mistakes of attention itself.

Every check of a module exercise builds the learner's class with :func:`build_module`
(guarded, lazy layers set up), then loads known weights with :func:`load_linear_weights`
(layers named by the spec) or :func:`load_reference_weights` (a whole reference module's
state, seeded by :func:`randomize_parameters`), so that its output can be compared with the
reference's on the same weights.
"""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch import nn
from torch.nn.modules.dropout import _DropoutNd
from torch.nn.parameter import is_lazy
from torch.nn.utils import parametrize

from ..trust import remote as _remote
from ..weights import set_parametrized
from . import _models as M
from ._core import CheckFailure, Context, Mistake, naming, warm_autograd, warm_meta
from .mistakes import Named, named


def dtype_name(dtype) -> str:
    """``float32`` for ``torch.float32``: how feedback names a dtype."""
    return str(dtype).replace("torch.", "")


#: What PyTorch says when one operation mixes tensors of two devices (a GPU's and the CPU's,
#: or the meta device's that the checks use to stand in for a GPU).
DEVICE_MISMATCH = ("expected all tensors to be on the same device", "not on the expected device")

#: Tolerances per dtype. The reference is computed in float64 from the same inputs, so the
#: allowed error is that of a correct computation in the candidate's dtype: ``TOL`` for one
#: attention-sized computation, ``LAYER_TOL`` for a layer (several matrix products and
#: norms), ``MODEL_TOL`` for a whole model (layers stacked, embeddings, output projection).
TOL = {
    np.float32: dict(rtol=1e-4, atol=1e-5),
    np.float64: dict(rtol=1e-7, atol=1e-10),
    torch.float32: dict(rtol=1e-4, atol=1e-5),
    torch.float64: dict(rtol=1e-7, atol=1e-10),
}
LAYER_TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float64: dict(rtol=1e-7, atol=1e-9)}
MODEL_TOL = {torch.float64: dict(rtol=1e-5, atol=1e-6), torch.float32: TOL[torch.float32]}


# ----------------------------------------------------------------------------- learner's module
def build_module(
    ctx: Context,
    cls,
    args: tuple,
    kwargs: dict,
    case: str,
    *,
    sample: tuple | None = None,
    earlier: dict | None = None,
    prepare=None,
) -> nn.Module:
    """Instantiate the learner's class (guarded) and make sure it is an nn.Module.

    With ``sample`` (inputs for one forward call), a module with lazy layers
    (``nn.LazyLinear``) is run once on them so its parameters get their shapes before
    weights are loaded; the check converts the module to the sample's dtype first.

    ``earlier`` (exercise class name -> the reference class, e.g. ``{"FeedForward":
    ref.FeedForward}``): the earlier exercises' classes that the learner's ``__init__``
    builds its parts from are the reference ones while it runs (:func:`reference_functions`),
    so a stub left in an earlier exercise (``raise NotImplementedError()`` in its
    ``__init__``) costs its points there only; the check then puts reference parts in
    place of the learner's anyway (:func:`substitute`).

    ``prepare(module)``, if given, runs on the built module before that first call (a check
    that puts reference parts in).
    """
    parts = reference_functions(cls, **earlier) if earlier else nullcontext()
    with parts:
        mod = ctx.call(cls, *args, case=case, call_name=f"{_name(cls)}(...)", **kwargs)
    if not isinstance(mod, nn.Module):
        ctx.fail(
            f"{_name(cls)}(...) did not build an nn.Module; got {type(mod).__name__}.",
            case=case,
            hint="subclass torch.nn.Module and call super().__init__() first in __init__.",
            mistake="wrong_type",
        )
    if prepare is not None:
        prepare(mod)
    if sample is not None and _lazy(mod):
        dtypes = {a.dtype for a in sample if isinstance(a, torch.Tensor) and a.is_floating_point()}
        if len(dtypes) == 1:
            mod.to(dtypes.pop())
        n = ctx.cases_run  # a set-up call, not a case
        label = case + " (a first call that sets up your lazy layers)"
        materialize_with(ctx, mod, lambda: ctx.call(mod, *sample, case=label), case)
        ctx.cases_run = n
    return mod


def _name(cls) -> str:
    return getattr(cls, "__name__", type(cls).__name__)


def _lazy(mod: nn.Module) -> list[str]:
    return [n for n, p in mod.named_parameters() if is_lazy(p)]


def materialize_with(ctx: Context, mod: nn.Module, dry_run, case: str) -> None:
    """Give lazy parameters (``nn.LazyLinear`` ...) their shapes before weights are loaded.

    ``dry_run()`` runs the learner's module once on a small input of the right dtype (under
    ``ctx.call``, so an exception in it is feedback); a parameter still uninitialised after
    it is reported, never touched. (:func:`build_module` does it with its ``sample``.)
    """
    if not _lazy(mod):
        return
    with torch.no_grad():
        dry_run()
    still = _lazy(mod)
    if still:
        ctx.fail(
            f"the lazy parameters {', '.join(still)} were still uninitialised after a first "
            "forward pass, so the check cannot load known weights into them.",
            case=case,
            mistake="lazy_not_initialised",
        )


def _weight_slot(mod: nn.Module, name: str) -> nn.Module | None:
    """The submodule ``name`` (dotted paths allowed) if it holds a ``weight`` tensor."""
    try:
        sub = mod.get_submodule(name)
    except (AttributeError, TypeError):
        return None
    try:
        w = sub.weight
    except Exception:  # noqa: BLE001 - no weight, or a parametrization that fails
        return sub if parametrize.is_parametrized(sub, "weight") else None
    return sub if isinstance(w, torch.Tensor) else None


def load_linear_weights(
    ctx: Context,
    mod: nn.Module,
    layers: dict[str, tuple[torch.Tensor, torch.Tensor | None, str]],
    case: str,
    *,
    raw_ok: bool,
    likely: dict[str, str] | None = None,
) -> None:
    """Copy weights into the learner's module by parameter name.

    ``layers`` maps an attribute name (``"w_q"``) to ``(weight (out, in), bias or None,
    spec)`` where ``spec`` is how the learner must declare it (``"nn.Linear(d_in=6,
    d_k=4, bias=False)"``). With ``raw_ok`` a bias-free layer may instead be a raw
    ``nn.Parameter`` of shape ``(in, out)`` used as ``x @ w``. ``likely`` maps a
    situation (``"missing w_o"``, ``"extra w_o"``, ``"shape w_q"``) to the likely mistake.

    A layer's weight may be parametrized (``torch.nn.utils.parametrize``): the weight is
    set through the parametrization (its ``right_inverse``, or its original tensor when
    the parametrization has none) and must then read back as loaded. Lazy parameters must
    have been materialized first (:func:`build_module`'s ``sample``); if not, that is feedback.
    """
    likely = likely or {}
    params = dict(mod.named_parameters())
    lazy = _lazy(mod)
    if lazy:
        ctx.fail(
            f"your module's parameters {', '.join(lazy)} are lazy (nn.LazyLinear or "
            "similar) and still have no shape, so the check cannot load known weights.",
            case=case,
            hint="declare the layers with their sizes, e.g. " + next(iter(layers.values()))[2],
        )
    used: set[str] = set()
    for name, (weight, bias, spec) in layers.items():
        out_f, in_f = weight.shape
        sub = _weight_slot(mod, name)
        parametrized = sub is not None and parametrize.is_parametrized(sub, "weight")
        if f"{name}.weight" in params or parametrized:
            if parametrized:
                ctx.cases_run -= 1  # reading the weight is set-up, not a case
                p = ctx.call(
                    getattr, sub, "weight", case=case, call_name=f"{name}'s parametrization"
                )
            else:
                p = params[f"{name}.weight"]
            if tuple(p.shape) != (out_f, in_f):
                why = likely.get(f"shape {name}", "")
                if tuple(p.shape) == (in_f, out_f) and in_f != out_f:
                    why = named("linear_in_out_swapped")
                ctx.fail(
                    f"{name}.weight has shape {tuple(p.shape)}, expected ({out_f}, {in_f}): "
                    f"declare self.{name} = {spec}.",
                    case=case,
                    likely=why,
                    mistake="wrong_shape",
                )
            if parametrized:
                used |= _load_parametrized(ctx, sub, name, weight, case)
            else:
                _copy(p, weight)
                used.add(f"{name}.weight")
            has_bias = f"{name}.bias" in params
            if bias is None and has_bias:
                ctx.fail(
                    f"{name} has a bias, but this exercise asks for none: declare "
                    f"self.{name} = {spec}.",
                    case=case,
                    mistake="bias_by_default",
                )
            if bias is not None and not has_bias:
                ctx.fail(
                    f"{name} has no bias, but this module was built with bias=True: "
                    f"declare self.{name} = {spec}.",
                    case=case,
                    mistake="bias_argument_ignored",
                )
            if bias is not None:
                b = params[f"{name}.bias"]
                if tuple(b.shape) != tuple(bias.shape):
                    ctx.fail(
                        f"{name}.bias has shape {tuple(b.shape)}, expected "
                        f"{tuple(bias.shape)}: declare self.{name} = {spec}.",
                        case=case,
                        mistake="wrong_shape",
                    )
                _copy(b, bias)
                used.add(f"{name}.bias")
        elif raw_ok and bias is None and name in params:
            p = params[name]
            if tuple(p.shape) != (in_f, out_f):
                ctx.fail(
                    f"the parameter {name} has shape {tuple(p.shape)}; a raw weight matrix "
                    f"must have shape ({in_f}, {out_f}) and be used as x @ {name}.",
                    case=case,
                    hint=f"or declare self.{name} = {spec}.",
                    mistake="wrong_shape",
                )
            _copy(p, weight.T)
            used.add(name)
        elif name in params:  # a raw nn.Parameter where this case needs a layer
            why = (
                f"{name} is a raw parameter, which cannot hold the bias this module was "
                "built with (bias=True)"
                if bias is not None
                else f"{name} is a raw parameter where this exercise asks for a layer"
            )
            ctx.fail(f"{why}: declare self.{name} = {spec}.", case=case, mistake="raw_parameter")
        else:
            missing = ", ".join(layers)
            has = ", ".join(params) or "none"
            ctx.fail(
                f"your module has no parameter named {name} (its parameters: {has}): the "
                f"check copies known weights into {missing} by name, so declare "
                f"self.{name} = {spec}.",
                case=case,
                mistake="parameter_names",
                likely=likely.get(f"missing {name}", ""),
            )
    extra = sorted(set(params) - used)
    if extra:
        why = [
            likely[f"extra {n.split('.')[0]}"]
            for n in extra
            if f"extra {n.split('.')[0]}" in likely
        ]
        ctx.fail(
            f"your module has parameters the exercise does not ask for: {', '.join(extra)}.",
            case=case,
            likely=why[0] if why else "",
            mistake=named("unexpected_parameters", parts=", ".join(layers)),
        )


def _load_parametrized(ctx: Context, sub: nn.Module, name: str, weight, case: str) -> set[str]:
    """Set a parametrized ``sub.weight`` to ``weight``; return the parameter names used."""
    plist = sub.parametrizations["weight"]
    # original, or original0, original1, ... when right_inverse returns several (weight_norm)
    first = next(plist.parameters())
    value = weight.to(dtype=first.dtype, device=first.device)
    n = ctx.cases_run  # set-up calls, not cases
    loaded = ctx.call(
        lambda: set_parametrized(sub, "weight", value),
        case=case,
        call_name=f"{name}'s parametrization",
    )
    ctx.cases_run = n
    if (
        not isinstance(loaded, torch.Tensor)
        or loaded.shape != value.shape
        or not torch.allclose(loaded.detach(), value, rtol=1e-5, atol=1e-6)
    ):
        ctx.fail(
            f"{name}.weight is parametrized, and after loading the check's weight into it, "
            f"{name}.weight reads back as something else.",
            case=case,
            mistake=named("parametrization_changes_weight", name=name),
        )
    prefix = f"{name}.parametrizations.weight."
    return {prefix + n for n, _ in plist.named_parameters()}


def _copy(p: torch.Tensor, value: torch.Tensor) -> None:
    with torch.no_grad():
        p.copy_(value.to(dtype=p.dtype, device=p.device))


# ------------------------------------------------------------------------ reference parts, weights
def dropout_p(part: nn.Module) -> float:
    """The dropout probability a learner's part uses: the largest ``p`` of its dropout
    modules, else a float attribute ``dropout``/``dropout_p``/``p``, else 0."""
    ps = [float(m.p) for m in part.modules() if isinstance(m, _DropoutNd)]
    if ps:
        return max(ps)
    for attr in ("dropout", "dropout_p", "attn_dropout", "p"):
        v = getattr(part, attr, None)
        if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < 1:
            return float(v)
    return 0.0


def substitute(ctx: Context, mod: nn.Module, name: str, make, case: str, spec: str) -> None:
    """Replace the learner's part ``mod.<name>`` (an earlier exercise) by the reference one
    built by ``make(p)``, ``p`` the dropout probability found in the learner's part, so a
    bug in the earlier exercise does not cost points again here."""
    part = getattr(mod, name, None) if isinstance(mod, nn.Module) else None
    if not isinstance(part, nn.Module):
        subs = ", ".join(n for n, _ in mod.named_children()) or "none"
        ctx.fail(
            f"your module has no submodule named {name} (its submodules: {subs}): use exactly "
            f"the attribute names of the exercise: self.{name} = {spec}.",
            case=case,
            mistake="parameter_names",
        )
    setattr(mod, name, make(dropout_p(part)))


@contextmanager
def reference_functions(candidate, **functions):
    """Inside, the learner's function or class sees the reference ``functions`` (earlier
    exercises) under their exercise names: ``split_heads`` in the globals that the function
    (a class: its ``forward``) looks names up in, the notebook's for code written there, is
    the reference one, so a bug in the earlier exercise costs points once, there. Only names
    that are defined there are replaced, and each is restored on the way out, whatever
    happened inside. (In a graded kernel the kernel does the same, and each call of a
    reference function is computed in the checker: the kernel holds no answer of its own
    notebook's exercises.)"""
    if _remote.is_remote(candidate):
        with _remote.reference_functions(candidate, functions):
            yield
        return
    try:  # whatever the candidate is: a hostile __getattr__ leaves its names alone
        namespace = getattr(candidate, "__globals__", None)
        if namespace is None:
            namespace = getattr(getattr(candidate, "forward", None), "__globals__", None)
    except Exception:  # noqa: BLE001
        namespace = None
    if not isinstance(namespace, dict):
        yield
        return
    saved = {n: namespace[n] for n in functions if callable(namespace.get(n))}
    namespace.update({n: functions[n] for n in saved})
    try:
        yield
    finally:
        namespace.update(saved)


def randomize_parameters(module: nn.Module, gen: torch.Generator) -> None:
    """Seeded float64 values for every parameter: weights ~ N(0, 1/fan_in), biases ~
    N(0, 0.25), LayerNorm gains in [0.5, 1.5] and shifts in [-0.5, 0.5] (so a missing or
    misplaced norm shows), embeddings ~ N(0, 1/d_model)."""
    with torch.no_grad():
        for mod in module.modules():
            if isinstance(mod, nn.LayerNorm):
                mod.weight.copy_(0.5 + torch.rand(mod.weight.shape, generator=gen))
                mod.bias.copy_(torch.rand(mod.bias.shape, generator=gen) - 0.5)
            elif isinstance(mod, nn.Linear):
                w = torch.randn(mod.weight.shape, generator=gen, dtype=torch.float64)
                mod.weight.copy_(w / math.sqrt(mod.in_features))
                if mod.bias is not None:
                    mod.bias.copy_(0.5 * torch.randn(mod.bias.shape, generator=gen))
            elif isinstance(mod, nn.Embedding):
                w = torch.randn(mod.weight.shape, generator=gen, dtype=torch.float64)
                mod.weight.copy_(w / math.sqrt(mod.embedding_dim))


def load_reference_weights(
    ctx: Context,
    mod: nn.Module,
    ref,
    specs: dict[str, str],
    case: str,
    likely: dict | None = None,
    *,
    layout: str = "",
) -> None:
    """Copy the reference's parameters (``ref``: a module, or a dict name -> tensor) into the
    learner's module by name. Missing: ``parameter_names`` (a bias: ``built_without_bias``),
    or ``likely["missing <part>"]`` / ``["no bias <part>"]``; extra: ``unexpected_parameters``.
    Parametrized weights are set through their parametrization; lazy parameters must have
    been materialised first (:func:`materialize_with`).

    With ``layout`` (the sub-modules the spec declares, for the hint), the learner's
    parameters must first be exactly the reference's, by name and shape, every difference
    named at once (``parameter_names``; ``wrong_shape``, or ``likely["shape <part>"]`` for a
    part with the wrong number of outputs): parametrized weights are refused."""
    ours = dict(ref.named_parameters()) if isinstance(ref, nn.Module) else ref
    likely = likely or {}
    if layout:
        _expect_same_parameters(ctx, mod, ours, case, layout, likely)

    def spec_for(name: str) -> str:
        for prefix, spec in specs.items():
            if name.startswith(prefix + ".") or name == prefix:
                return f"self.{prefix} = {spec}"
        return ""

    used: set[int] = set()
    # A module in a graded kernel: where every tensor lives, in one request; the copies
    # then go to the kernel together, before its next request.
    slots = _remote.tensor_slots(mod, list(ours)) if _remote.is_remote(mod) else {}
    for name, value in ours.items():
        owner = name.rpartition(".")[0]
        ids = _assign_tensor(
            ctx,
            mod,
            name,
            value,
            case,
            spec_for(name).partition(" = ")[2] or "...",
            slot=slots.get(name),
        )
        if ids is None:
            theirs = dict(mod.named_parameters(remove_duplicate=False))
            if name.endswith(".bias") and f"{owner}.weight" in theirs:
                has = ", ".join(dict(mod.named_parameters())) or "none"
                ctx.fail(
                    f"{owner} has no bias (its parameters: {has}); declare "
                    f"{spec_for(name) or 'self.' + owner}.",
                    case=case,
                    likely=likely.get(f"no bias {owner}", named("built_without_bias")),
                )
            has = ", ".join(sorted({n.split(".")[0] for n in theirs})) or "none"
            ctx.fail(
                f"your module has no parameter named {name} (its top-level parts: {has}): the "
                "check copies known weights in by name, so use exactly the attribute names "
                f"of the exercise: {spec_for(name) or owner}.",
                case=case,
                mistake="parameter_names",
                likely=likely.get(f"missing {owner}", ""),
            )
        used |= ids
    extra = sorted(n for n, p in mod.named_parameters() if id(p) not in used)
    if extra:
        ctx.fail(
            f"your module has parameters the exercise does not ask for: {', '.join(extra[:6])}"
            + (" ..." if len(extra) > 6 else "")
            + ".",
            case=case,
            mistake=named("unexpected_parameters", parts=", ".join(specs)),
        )


def _assign_tensor(
    ctx: Context,
    mod: nn.Module,
    name: str,
    value: torch.Tensor,
    case: str,
    spec: str,
    slot: dict | None = None,
):
    """Copy ``value`` into the tensor ``name`` of ``mod`` (a parameter, or a parametrized
    tensor such as a weight under ``weight_norm``); return the ids of the parameters that
    hold it, or None when ``mod`` has no such tensor. Shape mismatches become feedback."""
    owner, _, leaf = name.rpartition(".")
    if slot is not None or _remote.is_remote(mod):  # a graded kernel's: one request, not four
        slot = slot if slot is not None else _remote.tensor_slots(mod, [name])[name]
        if not slot["found"]:
            return None
        sub, parametrized, p = slot["sub"], slot["parametrized"], slot["param"]
    else:
        try:
            sub = mod.get_submodule(owner) if owner else mod
        except AttributeError:
            return None
        parametrized = parametrize.is_parametrized(sub, leaf)
        p = None if parametrized or not leaf else sub._parameters.get(leaf)
    if parametrized:
        current = getattr(sub, leaf)
        if tuple(current.shape) != tuple(value.shape):
            ctx.fail(
                f"{name} has shape {tuple(current.shape)}, expected {tuple(value.shape)}: "
                f"declare self.{owner} = {spec}.",
                case=case,
                mistake="wrong_shape",
            )
        # A plain tensor: setting a Parameter would register a second `leaf`.
        value = value.detach().to(dtype=current.dtype, device=current.device)
        plist = sub.parametrizations[leaf]

        def settable():  # the learner's parametrization, its error kept for the feedback
            try:
                return set_parametrized(sub, leaf, value)
            except Exception as err:
                return err

        n = ctx.cases_run  # a set-up call (guarded and timed), not a case
        loaded = ctx.call(settable, case=case, call_name=f"{owner}'s parametrization")
        ctx.cases_run = n
        if isinstance(loaded, Exception):
            ctx.fail(
                f"{name} is computed by a parametrization ({type(loaded).__name__}: {loaded}), "
                "so the check cannot set it to known values.",
                case=case,
                mistake="parametrization_not_settable",
            )
        if (
            not isinstance(loaded, torch.Tensor)
            or tuple(loaded.shape) != tuple(value.shape)
            or not torch.allclose(loaded.detach(), value, rtol=1e-5, atol=1e-6)
        ):
            ctx.fail(
                f"{name} is parametrized, and after loading the check's value into it, it "
                "reads back as something else.",
                case=case,
                mistake=named("parametrization_changes_weight", name=owner),
            )
        return {id(p) for p in plist.parameters()}
    if p is None:
        return None
    if tuple(p.shape) != tuple(value.shape):
        why = ""
        if p.dim() == 2 and tuple(p.shape) == tuple(value.shape)[::-1]:
            why = named("linear_in_out_swapped")
        ctx.fail(
            f"{name} has shape {tuple(p.shape)}, expected {tuple(value.shape)}: declare "
            f"self.{owner} = {spec}.",
            case=case,
            likely=why,
            mistake="wrong_shape",
        )
    _copy(p, value)
    return {id(p)}


def _visible_parameters(mod: nn.Module) -> dict[str, tuple]:
    """{name: shape} of ``mod``'s parameters as its forward sees them: a parametrized tensor
    (``w.parametrizations.weight.original``) by its own name (``w.weight``) and shape."""
    out = {}
    for name, p in mod.named_parameters():
        owner, sep, rest = name.partition("parametrizations.")
        if not sep:
            out[name] = tuple(p.shape)
            continue
        tensor = rest.split(".")[0]
        holder = mod.get_submodule(owner.rstrip("."))
        out[owner + tensor] = tuple(getattr(holder, tensor).shape)
    return out


def _expect_same_parameters(ctx: Context, mod: nn.Module, ours, case, layout, likely) -> None:
    got = _visible_parameters(mod)
    want = {k: tuple(v.shape) for k, v in ours.items()}
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    hint = f"declare exactly these sub-modules: {layout}."
    if missing or extra:
        ctx.fail(
            "your module's parameters do not have the names the exercise specifies"
            + (f"; missing: {', '.join(missing[:6])}" if missing else "")
            + (f"; unexpected: {', '.join(extra[:6])}" if extra else "")
            + ".",
            case=case,
            mistake="parameter_names",
            hint=hint,
        )
    for k, shape in want.items():
        if got[k] != shape:
            outputs = likely.get(f"shape {k.split('.')[0]}", "")
            ctx.fail(
                f"{k} has shape {got[k]}, expected {shape}.",
                case=case,
                likely=outputs if got[k][0] != shape[0] else "",
                hint=hint,
                mistake="wrong_shape",
            )


# ----------------------------------------------------------------------------- properties
def as_float64(x) -> np.ndarray:
    """A tensor or array as a float64 NumPy array (detached, on the CPU)."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def expect_masked_weights_zero(
    ctx: Context,
    weights,
    expected,
    allowed: np.ndarray,
    *,
    case: str,
    mistakes: list,
    otherwise: Named,
    axes: str = "",
) -> None:
    """The property of every masked attention: where ``allowed`` (broadcast to the weights)
    is False the weight is exactly 0. On a violation the feedback names the mistake among
    ``mistakes`` that explains the weights (``Context.diagnose``), else ``otherwise``;
    ``axes`` names the weights' axes in the message (``"batch, head, query, key"``)."""
    w = as_float64(weights)
    masked = ~np.broadcast_to(allowed, w.shape)
    if not np.any(w[masked] != 0):
        return
    idx = tuple(int(i) for i in np.argwhere(masked & (w != 0))[0])
    likely, hint = ctx.diagnose(weights, expected, mistakes, (), {})
    rule = f"({axes}); masked weights must be exactly 0." if axes else "(masked weights must be "
    ctx.fail(
        f"a masked position has nonzero weight {w[idx]:.3g} at index {idx} "
        + (rule if axes else rule + "exactly 0)."),
        case=case,
        likely=likely or otherwise,
        hint=hint or otherwise.hint,
    )


def rows_not_summing_to_one(allowed: np.ndarray | None = None, axis: int = -1):
    """The property that every row of attention weights (along ``axis``) sums to 1 (to 0 for
    a query that ``allowed``, broadcast to the weights, lets attend to nothing), as the
    ``fallback`` of ``Context.expect_close``: when no mistake model explains the weights,
    the feedback names the row that breaks it (``rows_not_normalised``; ``""``: none)."""

    def explain(got: np.ndarray, expected: np.ndarray) -> str:
        if got.shape != expected.shape or not np.all(np.isfinite(got)):
            return ""
        want = np.ones(np.delete(got.shape, axis))
        if allowed is not None:
            want = np.broadcast_to(allowed, got.shape).any(axis=axis).astype(np.float64)
        sums = got.sum(axis=axis)
        bad = np.argwhere(~np.isclose(sums, want, rtol=0, atol=1e-4))
        if not bad.size:
            return ""
        idx = tuple(int(i) for i in bad[0])
        total, one = f"{sums[idx]:.6g}", f"{want[idx]:g}"
        return named("rows_not_normalised", row=idx, total=total, want=one)

    return explain


def expect_not_swapped(
    ctx: Context,
    out,
    weights,
    out_shape: tuple,
    w_shape: tuple,
    *,
    case: str,
    types=(torch.Tensor, np.ndarray),
) -> None:
    """An attention's ``(out, weights)`` did not come back as ``(weights, out)``, judged
    from the shapes of what came back (arrays of ``types``) before anything else, so the
    feedback says so rather than that a shape is wrong."""
    if (
        isinstance(out, types)
        and isinstance(weights, types)
        and tuple(out.shape) == tuple(w_shape)
        and tuple(weights.shape) == tuple(out_shape)
        and tuple(w_shape) != tuple(out_shape)
    ):
        ctx.fail(
            "the outputs come back in the wrong order.", case=case, mistake="outputs_swapped_order"
        )


def expect_attention_values(
    ctx: Context,
    out,
    weights,
    out64: np.ndarray,
    w64: np.ndarray,
    *,
    case: str,
    allowed: np.ndarray | None,
    mistakes,
    tol: dict,
    out_hint: str,
    otherwise: Named,
    masked_mistakes: tuple = (),
    axes: str = "",
) -> None:
    """The values of an attention's ``out (..., n_q, d_v)`` and ``weights (..., n_q, n_k)``
    against the float64 ``out64``, ``w64``, in the order a learner can act on: the masked
    weights are exactly 0 (``allowed``: the mask, broadcast to the weights; a violation names
    the mistake among ``masked_mistakes`` and ``mistakes(1)`` that explains it, else
    ``otherwise``), then the weights (when no mistake model explains them, the row that does
    not sum to 1), then out (``out_hint`` when no mistake explains it: the weights are
    right). ``mistakes(which)`` gives the mistake models of out (0) or the weights (1)."""
    if allowed is not None:
        expect_masked_weights_zero(
            ctx,
            weights,
            w64,
            allowed,
            case=case,
            mistakes=[*masked_mistakes, *mistakes(1)],
            otherwise=otherwise,
            axes=axes,
        )
    ctx.expect_close(
        weights,
        w64,
        what="weights",
        case=case,
        mistakes=mistakes(1),
        fallback=rows_not_summing_to_one(allowed),
        **tol,
    )
    ctx.expect_close(out, out64, what="out", case=case, mistakes=mistakes(0), hint=out_hint, **tol)


def expect_tensor(ctx: Context, got, what: str, case: str, like: torch.Tensor | None = None):
    """``got`` is a tensor (and, given ``like``, of its shape): checked first, so that the
    checks after it can name a mistake from the values."""
    if not isinstance(got, torch.Tensor):
        ctx.fail(
            f"{what} must be a torch.Tensor; got {type(got).__name__}.",
            case=case,
            mistake="wrong_type",
        )
    if like is not None and tuple(got.shape) != tuple(like.shape):
        ctx.fail(
            f"{what} has shape {tuple(got.shape)}, expected {tuple(like.shape)}.",
            case=case,
            mistake="wrong_shape",
        )


def same_in_both_modes(train, evaluated) -> bool:
    """Against the dropout property: what a module returned in training mode is, as a
    tensor of the same shape, what it returned in eval mode on the same input."""
    return (
        isinstance(train, torch.Tensor)
        and isinstance(evaluated, torch.Tensor)
        and train.shape == evaluated.shape
        and torch.allclose(train, evaluated)
    )


def expect_dropout_applied(ctx: Context, train_out, eval_out, *, p: float, case: str, mistake: str):
    """The dropout property of a module built with dropout ``p`` > 0: its output in training
    mode is not its output in eval mode (``eval_out``, already checked against the
    reference)."""
    if isinstance(train_out, torch.Tensor) and torch.allclose(train_out, eval_out):
        ctx.fail(
            f"with dropout={p} the output in training mode equals the eval-mode output: no "
            "dropout was applied.",
            case=case,
            mistake=mistake,
        )


def _zero_output(module, args, out):
    """A forward hook: the part's output (the first of a tuple) as zeros."""
    if isinstance(out, tuple):
        return (torch.zeros_like(out[0]), *out[1:])
    return torch.zeros_like(out)


@dataclass(frozen=True)
class DropoutMistakes:
    """The mistake ids a residual layer's dropout check names (each exercise keeps its own):
    ``on_residual`` (a dropout on the residual stream), ``missing`` (one sub-layer's output
    not dropped; ``{name}`` and ``{dropout}`` filled in), ``never_applied`` (no sub-layer's
    output dropped; None: ``missing`` for the first) and ``misplaced`` (pre-norm only: the
    output minus x is not the live sub-layer's output dropped and rescaled)."""

    on_residual: str = "dropout_on_residual_stream"
    missing: str = "sublayer_dropout_missing"
    never_applied: str | None = None
    misplaced: str | None = None


#: The encoder's and decoder's ids (a default argument must not be a call: ruff's B008).
LAYER_DROPOUT_MISTAKES = DropoutMistakes()


@contextmanager
def _hooked_to_zero(mod: nn.Module, names: list[str]):
    """The default way to silence sub-layers: a forward hook returns zeros for each output."""
    hooks = [getattr(mod, name).register_forward_hook(_zero_output) for name in names]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


def expect_sublayer_dropout(
    ctx: Context,
    mod: nn.Module,
    run,
    sublayers: dict[str, str],
    *,
    p: float,
    case: str,
    mistakes: DropoutMistakes = LAYER_DROPOUT_MISTAKES,
    silence=None,
    residual: torch.Tensor | None = None,
) -> None:
    """Dropout placement, the property every residual layer of the course holds: the layer's
    own dropout acts on each sub-layer's output, before the residual add. ``mod`` was built
    with dropout ``p``; ``sublayers`` maps each part (``"self_attn"``) to the dropout the spec
    puts on its output (``"dropout1"``); ``run(c)`` returns the layer's output (a tensor).
    ``silence(names)`` is a context manager under which those parts' outputs are zero
    (default: forward hooks). With the parts' own dropout (attention weights, hidden units)
    off and every other part silenced, only the dropout on the live part's output can make
    the training-mode output differ from the eval-mode one; with every part silenced, nothing
    may. ``residual`` (a pre-norm layer's input x, whose output is x plus each part's output
    dropped) adds the scale: in training mode ``out - x`` is the eval-mode ``out - x`` with
    some elements zeroed and the others times 1 / (1 - p)."""
    silence = silence or partial(_hooked_to_zero, mod)
    for name in sublayers:
        for m in getattr(mod, name).modules():
            if isinstance(m, _DropoutNd):
                m.p = 0.0
    where = f"{case}, every sub-layer's output zeroed ({', '.join(sublayers)}), their dropout off"
    train, evaluated = _in_both_modes(ctx, mod, run, silence(list(sublayers)), where)
    if isinstance(train, torch.Tensor) and not same_in_both_modes(train, evaluated):
        ctx.fail(
            f"with dropout={p} and every sub-layer's output zeroed, the output in training "
            "mode differs from the eval-mode output: a dropout acts on the residual stream, "
            "where nothing should be dropped.",
            case=where + ", training mode",
            mistake=named(mistakes.on_residual, dropouts=", ".join(sublayers.values())),
        )
    missing, misplaced = [], []
    for name, drop in sublayers.items():
        where = f"{case}, only {name}'s output non-zero, its own dropout off"
        others = [other for other in sublayers if other != name]
        train, evaluated = _in_both_modes(ctx, mod, run, silence(others), where)
        if not (isinstance(train, torch.Tensor) and isinstance(evaluated, torch.Tensor)):
            continue
        if same_in_both_modes(train, evaluated):
            missing.append((name, drop, where))
        elif residual is not None and not _dropped_and_rescaled(train, evaluated, residual, p):
            misplaced.append((name, where))
    if missing and len(missing) == len(sublayers) and mistakes.never_applied:
        ctx.fail(
            f"with dropout={p} in training mode the output equals the eval-mode output, "
            "whichever sub-layer's output is live: "
            + ("neither is" if len(sublayers) == 2 else "none is")
            + " dropped.",
            case=missing[0][2] + ", training mode",
            mistake=mistakes.never_applied,
        )
    for name, drop, where in missing:
        ctx.fail(
            f"with dropout={p} in training mode, {name}'s output is not dropped: the output "
            "equals the eval-mode output.",
            case=where + ", training mode",
            mistake=named(mistakes.missing, name=name, dropout=drop),
        )
    for name, where in misplaced:
        ctx.fail(
            f"with dropout={p} in training mode, the output minus x is not {name}'s output "
            f"with some elements zeroed and the others scaled by 1/(1 - p) = {1 / (1 - p):g}.",
            case=where + ", training mode",
            mistake=named(mistakes.misplaced or mistakes.missing, name=name),
        )


def _dropped_and_rescaled(train, evaluated, x, p: float) -> bool:
    """Pre-norm: ``train - x`` is ``(evaluated - x) / (1 - p)`` where it is not zero (an
    output of another shape than x was judged by the value cases already)."""
    if not (train.shape == evaluated.shape == x.shape):
        return True
    d, e = train - x, (evaluated - x) / (1 - p)
    kept = torch.isclose(d, e, rtol=1e-9, atol=1e-12)
    return bool((kept | (d.abs() <= 1e-12)).all())


def _in_both_modes(ctx: Context, mod: nn.Module, run, silenced, where: str):
    """``run`` in training mode (seeded) then in eval mode, under the context manager
    ``silenced``: ``(train, evaluated)``."""
    with silenced:
        mod.train()
        torch.manual_seed(ctx.seed)
        train = run(where + ", training mode")
        mod.eval()
        evaluated = run(where + ", eval mode")
    return train, evaluated


def expect_gradient(
    ctx: Context,
    out,
    leaves: dict[str, torch.Tensor],
    want: tuple[torch.Tensor, ...],
    *,
    case: str,
    call_name: str,
    mistake: str,
    disconnected: str,
    tol: dict,
    grad_output: torch.Tensor | None = None,
    what: str = "the gradient of {name}",
    hint: str = "",
    errors: dict[str, str] | None = None,
) -> None:
    """The property of a loss that trains, or of a function the notebook differentiates:
    ``out``, which the learner's ``call_name`` computed from ``leaves`` (by name, tensors
    that require grad), is connected to them for autograd, and autograd's backward pass
    through the learner's code (given ``grad_output``, for a non-scalar ``out``) reaches each
    leaf with the reference's gradient ``want`` (in the order of ``leaves``) within ``tol``.
    ``disconnected`` says what is wrong when ``out`` has no ``grad_fn`` (``.detach()``, a
    tensor rebuilt from NumPy or Python numbers); ``mistake`` is named then and when a leaf
    gets no gradient; ``errors`` maps words of an error the backward pass raises to the
    mistake they mean (``"inplace operation"``)."""
    if not isinstance(out, torch.Tensor) or out.grad_fn is None:
        ctx.fail(disconnected, case=case, mistake=mistake)
    warm_autograd()
    try:
        grads = ctx.call(
            lambda: _remote.autograd_grad(
                out, list(leaves.values()), grad_output, allow_unused=True
            ),
            case=case,
            call_name=f"autograd's backward pass through {call_name}",
        )
    except CheckFailure as err:
        for words, named_id in (errors or {}).items():
            if words in str(err):
                raise naming(err, named(named_id)) from None
        raise
    for name, grad, w in zip(leaves, grads, want, strict=True):
        if grad is None:
            ctx.fail(f"no gradient reached {name}.", case=case, mistake=mistake)
        ctx.expect_close(grad, w, what=what.format(name=name), case=case, hint=hint, **tol)


def earlier_position_changed(before, after, atol: float) -> int | None:
    """The causality property: ``before`` and ``after`` are outputs ``(1, T, ...)`` for
    inputs that differ only in the last token; the first earlier position whose output
    moved by more than ``atol`` (None: causal)."""
    changed = (before[0, :-1] - after[0, :-1]).abs().amax(-1) > atol
    return int(changed.nonzero()[0]) if bool(changed.any()) else None


# ----------------------------------------------------------------------------- cases
# The building blocks of every attention exercise's cases (COURSE_DESIGN §5: one token, a
# batch of one, extra batch dims, d_k != d_v, n_q != n_k, large logits, masks with fully
# masked rows). A check lists its cases as a table and draws them with these, from its own
# seeded ``ctx.rng(salt)``, in the order of the table.
def normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    """Seeded float64 inputs of ``shape``, N(0, scale**2): ``scale`` of 4 or more gives
    scores in the tens or hundreds (large logits, where an unstable softmax overflows)."""
    return scale * rng.normal(size=shape)


def extreme_score_rows(rng: np.random.Generator, n: int, dtype=np.float64) -> np.ndarray:
    """Two rows of ``n`` >= 3 scores ``(2, n)`` at the edges of ``exp``'s range in ``dtype``,
    L = log of its largest value (709.8 for float64, 88.7 for float32): row 0 spans more
    than L although every value alone is within it (one at +0.98 L, the others from -0.98 L
    to -0.3 L), so a softmax shifted by the row's minimum or mean overflows where one shifted
    by its maximum cannot; row 1 is very negative (every score around -1000), so without the
    shift every ``exp`` underflows to 0 and the row divides 0 by 0. Every softmax exercise
    meets both rows (COURSE_DESIGN §5, large logits)."""
    if n < 3:
        raise ValueError(f"extreme_score_rows needs n >= 3 scores per row, got n={n}")
    L = float(np.log(np.finfo(dtype).max))
    wide = np.r_[0.98 * L, rng.uniform(-0.98 * L, -0.3 * L, n - 1)]
    negative = -1000.0 + rng.normal(size=n)
    return np.stack([rng.permutation(wide), negative]).astype(dtype)


def scores_case(label: str, scores: np.ndarray, v: np.ndarray) -> AttnCase:
    """The attention case whose scores ``q k^T / sqrt(d_k)`` are ``scores (n_q, n_k)`` (up
    to rounding): ``q`` is the scores themselves and ``k = sqrt(n_k) I``, so ``d_k = n_k``."""
    n_k = scores.shape[-1]
    k = math.sqrt(n_k) * np.eye(n_k)
    return AttnCase(label, scores.astype(np.float64), k, v)


def causal_mask(n: int) -> np.ndarray:
    """The causal mask ``(n, n)``: query i may attend to keys 0..i."""
    return np.tril(np.ones((n, n), dtype=bool))


def padding_mask(lengths: list[int], n_k: int) -> np.ndarray:
    """A padding mask ``(B, 1, n_k)`` (broadcast over the queries): sequence b has
    ``lengths[b]`` real keys; a length of 0 is a sequence whose every query has nothing to
    attend to (fully masked rows)."""
    mask = np.ones((len(lengths), 1, n_k), dtype=bool)
    for b, length in enumerate(lengths):
        mask[b, :, length:] = False
    return mask


def random_mask(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    p: float,
    *,
    attend: int | None,
    fully_masked: tuple[tuple[int, ...], ...] = (),
) -> np.ndarray:
    """A random mask ``(..., n_q, n_k)``, True (may attend) with probability ``p``, in which
    every query may attend to key ``attend`` (None: rows may come out fully masked by
    chance) except the rows ``fully_masked`` (indices of the leading axes and the query),
    which may attend to nothing."""
    mask = rng.random(shape) < p
    if attend is not None:
        mask[..., attend] = True
    for row in fully_masked:
        mask[row] = False
    return mask


# ----------------------------------------------------------------------------- attention
#: PyTorch's own attention, which no attention exercise may call in place of its code.
BUILTIN_ATTENTION = [
    (
        torch.nn.functional.scaled_dot_product_attention,
        "torch.nn.functional.scaled_dot_product_attention",
    ),
    (
        torch.nn.functional.multi_head_attention_forward,
        "torch.nn.functional.multi_head_attention_forward",
    ),
    (torch.nn.MultiheadAttention.forward, "torch.nn.MultiheadAttention"),
    # a Python copy of it (identity projections give attention itself)
    (
        torch.ao.nn.quantizable.MultiheadAttention.forward,
        "torch.ao.nn.quantizable.MultiheadAttention",
    ),
]


def _flex_attention() -> list[tuple[object, str]]:
    """PyTorch's flex attention (2.5 and later): in eager mode on a CPU it computes with
    plain PyTorch operations, no fused kernel, but it is PyTorch's attention all the same."""
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError:  # pragma: no cover - an older PyTorch
        return []
    return [(flex_attention, "torch.nn.attention.flex_attention.flex_attention")]


BUILTIN_ATTENTION += _flex_attention()


@dataclass
class AttnCase:
    """One case of an attention exercise: its label and float64 inputs ``q (..., n_q,
    d_k)``, ``k (..., n_k, d_k)``, ``v (..., n_k, d_v)``, ``mask`` broadcastable to
    ``(..., n_q, n_k)`` (True = may attend) or None."""

    label: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    mask: np.ndarray | None = None


def attention_mistakes(c: AttnCase, which: int) -> list[Mistake]:
    """The catalogued attention mistakes; ``which`` 0 = out, 1 = weights."""
    q, k, v = (as_float64(a) for a in (c.q, c.k, c.v))
    mask = c.mask
    d_k, d_v, n_k = q.shape[-1], v.shape[-1], k.shape[-2]

    def m(mistake_id, **kw):
        return Mistake.of(mistake_id, model=lambda: M.attention(q, k, v, mask, **kw)[which])

    out = [
        m("scale_missing", scale=1.0),
        m("scale_by_d_k", scale=float(d_k)),
    ]
    if d_v != d_k:
        out.append(m("scale_by_d_v", scale=math.sqrt(d_v)))
    if n_k != d_k:
        out.append(m("scale_by_n_k", scale=math.sqrt(n_k)))
    if q.shape[-2] > 1:
        out.append(m("softmax_over_queries", axis=-2))
    if mask is not None:
        out += [
            m("mask_inverted", mask_mode="inverted"),
            m("mask_after_softmax_weights", mask_mode="after_softmax"),
            m("mask_multiplied_weights", mask_mode="multiply"),
            m("mask_ignored", mask_mode="ignored"),
        ]
        if (~mask).all(axis=-1).any():
            out.append(m("fully_masked_row_uniform_fill", mask_mode="fill"))
            out.append(_additive_mask_mistake(q, k, v, mask, which))
    return out


def additive_softmax(s: np.ndarray, mask: np.ndarray, axis: int = -1) -> np.ndarray:
    """The additive-mask softmax, softmax(s + (1 - mask) * -1e10), in float64: exact zeros
    where a row has an allowed key, the unmasked softmax of a fully masked row."""
    return M.softmax(s + np.where(mask, 0.0, -1e10), axis)


def _additive_mask_mistake(q, k, v, mask, which: int) -> Mistake:
    """The additive mask (:func:`additive_softmax`), which fails only on a fully masked row;
    ``which`` 0 = out, 1 = weights."""

    def model():
        w = additive_softmax(M.scores(q, k), mask)
        return (w @ v, w)[which]

    return Mistake.of("additive_mask_full_row", model=model)


def inverted_mask_mistake(mask: np.ndarray, axis: int = -1) -> Mistake:
    """Recognise an inverted mask from where the weight went, whatever the fill value:
    no weight on any allowed key, all of it on masked ones."""

    def applies(got: np.ndarray, expected: np.ndarray) -> bool:
        m = np.broadcast_to(mask, got.shape)
        rows = (~m).any(axis=axis, keepdims=True) & m.any(axis=axis, keepdims=True)
        rows = np.broadcast_to(rows, got.shape)
        return bool(np.all(np.abs(got[rows & m]) < 1e-6) and np.any(got[rows & ~m] > 0))

    return Mistake.of("mask_inverted", applies=applies)


# ----------------------------------------------------------------------------- defaults
def _same_result(a, b) -> bool:
    """Whether two returns of the learner's function are the same (tensors and arrays to
    1e-6, element by element; tuples and lists item by item; anything else by ==)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and a.device == b.device
        ):
            return False
        if a.device.type == "meta":
            return True
        try:
            return bool(torch.allclose(a.double(), b.double(), 1e-6, 1e-9, equal_nan=True))
        except Exception:  # noqa: BLE001 - a tensor that cannot be compared is not the same
            return False
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape):
            return False
        try:
            return bool(np.allclose(a, b, rtol=1e-6, atol=1e-9, equal_nan=True))
        except Exception:  # noqa: BLE001 - object or string arrays
            return False
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_same_result(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a return that cannot be compared is not the same
        return False


def expect_spec_defaults(
    ctx: Context,
    fn,
    args_of,
    defaults: dict,
    *,
    case: str,
    signature: str,
    kwargs=dict,
    limit_scale: float = 1.0,
) -> None:
    """The learner's ``fn`` called with the optional arguments ``defaults`` left out returns
    what it returns with them given as the spec's values: its default arguments are the
    spec's. ``args_of()`` and ``kwargs()`` give each call its own positional and fixed
    keyword arguments (a fresh step function, a generator seeded alike); ``limit_scale``
    each call's time limit, in per-call limits."""
    left_out = ctx.call(fn, *args_of(), case=case, limit_scale=limit_scale, **kwargs())
    given = ctx.call(fn, *args_of(), case=case, limit_scale=limit_scale, **kwargs(), **defaults)
    if not _same_result(left_out, given):
        spelled = ", ".join(f"{k}={v!r}" for k, v in defaults.items())
        ctx.fail(
            f"called without {', '.join(defaults)}, your function returns something other than "
            f"with {spelled}: a default argument is not the spec's.",
            case=case,
            mistake="wrong_default",
            hint=f"give the optional arguments the spec's defaults: {signature}.",
        )


# ----------------------------------------------------------------------------- devices
#: What PyTorch says when one operation mixes a CPU tensor with another device's: the
#: general message, and that of index_add_ and its kin.
MIXED_DEVICES = (*DEVICE_MISMATCH, "expected to be in the same device")
#: The per-call limit of a call on the meta device, in per-call limits (expect_follows_device).
META_LIMIT_SCALE = 4.0


def expect_follows_device(
    ctx: Context,
    candidate,
    args: tuple,
    names: tuple[str, ...],
    mistake: str,
    what: str,
    **kwargs,
) -> None:
    """The notebooks run on the GPU when there is one: what the candidate returns must be on
    its inputs' device (``args``, on the meta device), and nothing it builds may be left on
    the CPU; ``names`` the outputs, ``mistake`` the id named when one is not. PyTorch's meta device
    (shapes, no data) stands in for a second device, so this runs without a GPU: a tensor
    built on the CPU and mixed with a meta tensor raises, as on a GPU. An answer that reads
    the data (``.item()``, ``.tolist()``, which a meta tensor has not) or an operation without
    a meta kernel (``torch.bincount``) is not judged here: its values were checked already."""
    warm_meta()
    meta = torch.device("meta")
    case = f"{what}, on PyTorch's meta device (tensors without data, standing in for a GPU)"
    try:
        # Under grading the learner's code runs in its own kernel, which pays the meta
        # device's first use (seconds of imports) inside this call: a longer limit, so that
        # it is not taken for a loop (the same code already returned in time on the CPU).
        got = ctx.call(candidate, *args, case=case, limit_scale=META_LIMIT_SCALE, **kwargs)
    except CheckFailure as err:
        if any(words in str(err).lower() for words in MIXED_DEVICES):
            raise naming(err, named(mistake)) from None
        return  # it needs the data, which a meta tensor has not: judged on the values
    if len(names) > 1:
        got = ctx.expect_tuple(got, names, case=case)
    for name, g in zip(names, got if len(names) > 1 else (got,), strict=True):
        if isinstance(g, torch.Tensor) and g.device != meta:
            ctx.fail(
                f"{name} is on {g.device}, expected the inputs' device ({meta}).",
                case=case,
                mistake=mistake,
            )
