"""A mixture-of-experts feed-forward network: notebook 15.

Mixtral, Qwen3-MoE, DeepSeek-V3 and GPT-OSS replace the feed-forward network of each block
by ``E`` experts (each a :class:`~attention_ref.modern.SwiGLU`) and a *router*, a linear
layer ``gate: d_model -> E`` whose scores pick ``k`` experts per token. A token's output is
the gated sum of its ``k`` experts' outputs; the other ``E - k`` experts never see it, so a
model with 8 experts and ``k = 2`` computes a quarter of its feed-forward weights per token.

How the gates come from the router's logits ``z`` (one row per token), as each model does it:

- ``"mixtral"``: ``p = softmax(z)`` over all experts, the top ``k`` of ``p``, renormalised
  to sum to 1 among them;
- ``"qwen3"``: the same, renormalised only with ``norm_topk_prob=True`` (Qwen3-MoE's
  configurations set it; Qwen2-MoE's do not);
- ``"deepseek_v3"``: ``s = sigmoid(z)``; the experts are *selected* on ``s + b``, with a
  correction bias ``b`` (load balancing without an auxiliary loss: during training, after
  each step, ``b_i`` moves by a fixed step gamma, up for an expert below its share of the
  load and down for one above it, by the sign of the error, not by gradient) and
  group-limited: the experts form ``n_group`` groups, a group scores the sum of its two best
  ``s + b``, only the ``topk_group`` best groups compete (the others' experts score 0, as in
  ``transformers``' port, :func:`deepseek_port_route`; DeepSeek's own gate gives them
  -inf, :func:`deepseek_route`); the
  *gates* are the selected ``s`` (without ``b``), normalised to sum to 1
  (``norm_topk_prob``), times ``routed_scaling_factor``. Shared experts (one SwiGLU of
  ``n_shared`` times the width) see every token and are added ungated;
- ``"gpt_oss"``: the top ``k`` *logits* (the router has a bias), softmax over those ``k``
  only (the same gates as ``"mixtral"``, since softmax then renormalise is softmax over
  the chosen; but ``probs`` are not defined over all experts: the softmax of all logits
  is returned for the loss). Its experts are :class:`ClampedSwiGLU`.

Each expert runs only on its tokens (``index_select`` of its rows, ``index_add_`` of its
outputs): no dense computation over all experts.

The auxiliary load-balancing loss of the Switch Transformer (Fedus et al., 2021),
:func:`load_balancing_loss`: ``E * sum_i f_i * P_i`` with ``f_i`` the share of the routing
assignments that went to expert ``i`` and ``P_i`` the mean router probability of expert
``i``; 1 per selected slot when perfectly balanced, larger when the router favours a few.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ._validate import describe, require_tensor
from .modern import SwiGLU

ROUTERS = ("mixtral", "qwen3", "deepseek_v3", "gpt_oss")


def _positive(name: str, n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be a positive int; got {describe(n)}")
    return n


def _check_groups(E: int, n_group: int, topk_group: int) -> None:
    if E % _positive("n_group", n_group) or not 1 <= _positive("topk_group", topk_group) <= n_group:
        raise ValueError(
            f"n_group={n_group} must divide the {E} experts and topk_group={topk_group} be "
            "between 1 and n_group"
        )


def _group_limited_top_k(
    choice: torch.Tensor, top_k: int, n_group: int, topk_group: int, *, outside: float
) -> torch.Tensor:
    """DeepSeek-V3's group-limited selection: the ``top_k`` experts ``(N, top_k)`` of
    ``choice (N, E)`` (the biased scores) among the ``topk_group`` best of ``n_group`` groups
    of consecutive experts, a group scored by the sum of its two best choices (its best, if it
    has one expert). The experts of the other groups score ``outside`` (``-inf`` in DeepSeek's
    gate, ``0`` in transformers' port)."""
    E = choice.shape[1]
    grouped = choice.unflatten(-1, (n_group, E // n_group))  # (N, groups, E / groups)
    group_score = grouped.topk(min(2, E // n_group), dim=-1).values.sum(-1)  # (N, groups)
    best = group_score.topk(topk_group, dim=-1).indices  # (N, topk_group)
    eligible = torch.zeros_like(group_score, dtype=torch.bool).scatter(1, best, True)
    eligible = eligible[:, :, None].expand_as(grouped).flatten(1)  # (N, E)
    return choice.masked_fill(~eligible, outside).topk(top_k, dim=-1).indices


def route(
    logits: torch.Tensor,
    top_k: int,
    router: str = "mixtral",
    *,
    norm_topk_prob: bool = True,
    correction_bias: torch.Tensor | None = None,
    n_group: int = 1,
    topk_group: int = 1,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gates and chosen experts from the router's logits.

    Args:
        logits: ``(N, E)``, one row per token.
        top_k: experts per token.
        router: ``"mixtral"``, ``"qwen3"``, ``"deepseek_v3"`` or ``"gpt_oss"`` (see the
            module's doc).

    Returns:
        ``(gates (N, top_k), experts (N, top_k) long, probs (N, E))``: ``probs`` are the
        softmax (sigmoid for DeepSeek) scores the load-balancing loss reads. Computed in the
        logits' dtype.
    """
    _require_logits(logits, top_k)
    if router == "gpt_oss":
        top, experts = logits.topk(top_k, dim=-1)  # (N, k): the largest logits
        return top.softmax(dim=-1), experts, logits.softmax(dim=-1)
    if router in ("mixtral", "qwen3"):
        probs = logits.softmax(dim=-1)  # (N, E)
        gates, experts = probs.topk(top_k, dim=-1)  # (N, k)
        if router == "mixtral" or norm_topk_prob:
            gates = gates / gates.sum(-1, keepdim=True)
        return gates, experts, probs
    if router != "deepseek_v3":
        raise ValueError(f"router must be one of {ROUTERS}; got {router!r}")
    return deepseek_port_route(
        logits, correction_bias, top_k, norm_topk_prob=norm_topk_prob, n_group=n_group,
        topk_group=topk_group, routed_scaling_factor=routed_scaling_factor,
    )  # fmt: skip


def _require_logits(logits: torch.Tensor, top_k: int) -> int:
    """The number of experts E of router ``logits`` ``(N, E)``; a clear error for other
    logits, or a ``top_k`` not in ``1 .. E``."""
    require_tensor("logits", logits)
    if logits.dim() != 2:
        raise ValueError(f"logits must be (tokens, experts); got shape {tuple(logits.shape)}")
    E = logits.shape[1]
    if not 1 <= _positive("top_k", top_k) <= E:
        raise ValueError(f"top_k must be between 1 and the number of experts {E}; got {top_k}")
    return E


def deepseek_port_route(
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    top_k: int,
    *,
    norm_topk_prob: bool = True,
    n_group: int = 1,
    topk_group: int = 1,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's router as ``transformers``' ``DeepseekV3TopkRouter`` ports it (4.57),
    the routing of :class:`MoEFeedForward` with ``router="deepseek_v3"`` and of
    :func:`route` for that router.

    Args:
        logits: ``(N, E)``, one row per token.
        bias: ``(E,)``, the selection bias (``e_score_correction_bias``), or None (no bias).
        top_k: experts per token.
        norm_topk_prob: divide the chosen scores by their sum (plus ``1e-20``).
        n_group, topk_group: the experts form ``n_group`` groups of ``E / n_group`` (by
            index), a group scored by the sum of its two best ``sigmoid(logits) + bias``
            (its best, if it has one expert); only the ``topk_group`` best groups compete.
        routed_scaling_factor: multiplies the gates.

    Returns:
        ``(gates (N, top_k), experts (N, top_k) long, scores (N, E))`` as
        :func:`deepseek_route`'s, but for one thing: the experts outside the best groups
        score 0 here, where DeepSeek's own gate gives them ``-inf``. The two pick different
        experts where an eligible expert's ``s + b < 0``: an expert outside the best groups
        then beats it here. In the logits' dtype and on their device.
    """
    E = _require_logits(logits, top_k)
    if bias is not None:
        require_tensor("bias", bias)
        if tuple(bias.shape) != (E,):
            raise ValueError(f"bias must be ({E},), one per expert; got shape {tuple(bias.shape)}")
    _check_groups(E, n_group, topk_group)
    scores = logits.sigmoid()  # (N, E)
    choice = scores if bias is None else scores + bias  # (N, E): the bias steers selection only
    experts = _group_limited_top_k(choice, top_k, n_group, topk_group, outside=0.0)  # (N, k)
    gates = scores.gather(1, experts)  # (N, k): the scores, not the biased choice
    if norm_topk_prob:
        gates = gates / (gates.sum(-1, keepdim=True) + 1e-20)
    return gates * routed_scaling_factor, experts, scores


def deepseek_route(
    logits: torch.Tensor,
    bias: torch.Tensor,
    top_k: int,
    *,
    n_group: int = 1,
    topk_group: int = 1,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's router, as DeepSeek's own gate computes it (``inference/model.py``).

    Args:
        logits: ``(N, E)``, one row per token.
        bias: ``(E,)``, the selection bias (load balancing without an auxiliary loss).
        top_k: experts per token.
        n_group: the experts form ``n_group`` groups of ``E / n_group`` (by index);
            a group scores the sum of its two best ``sigmoid(logits) + bias`` (its best, if it
            has one expert), and only the experts of the ``topk_group`` best groups may be
            chosen (the others are masked with ``-inf``; ``transformers``' port masks them with
            0, which lets an expert outside the groups win where an eligible one's
            ``s + b < 0``).
        routed_scaling_factor: multiplies the gates (2.5 in DeepSeek-V3).

    Returns:
        ``(gates (N, top_k), experts (N, top_k) long, scores (N, E))``: ``scores`` is
        ``sigmoid(logits)``; the experts are the ``top_k`` of ``scores + bias`` among the
        eligible; the gates are their ``scores`` (without the bias), divided by their sum,
        times ``routed_scaling_factor``. In the logits' dtype and on their device.
    """
    require_tensor("logits", logits)
    require_tensor("bias", bias)
    if logits.dim() != 2:
        raise ValueError(f"logits must be (tokens, experts); got shape {tuple(logits.shape)}")
    E = logits.shape[1]
    if tuple(bias.shape) != (E,):
        raise ValueError(f"bias must be ({E},), one per expert; got shape {tuple(bias.shape)}")
    _positive("top_k", top_k)
    _check_groups(E, n_group, topk_group)
    if top_k > topk_group * (E // n_group):
        raise ValueError(
            f"top_k={top_k} is more than the {topk_group * (E // n_group)} experts of the "
            f"topk_group={topk_group} groups"
        )
    scores = logits.sigmoid()  # (N, E)
    choice = scores + bias  # (N, E): the bias steers the selection only
    experts = _group_limited_top_k(choice, top_k, n_group, topk_group, outside=float("-inf"))
    gates = scores.gather(1, experts)  # (N, k): the scores, not the biased choice
    gates = gates / gates.sum(-1, keepdim=True)
    return gates * routed_scaling_factor, experts, scores


def update_bias(bias: torch.Tensor, load: torch.Tensor, gamma: float) -> torch.Tensor:
    """DeepSeek-V3's balancing step, after each training step: ``bias_i`` goes up by
    ``gamma`` for an expert that got fewer than the mean number of assignments ``load``
    ``(E,)``, down by ``gamma`` for one that got more (the sign of the error, not its size;
    no gradient). Returns the new bias."""
    require_tensor("bias", bias)
    require_tensor("load", load)
    if load.shape != bias.shape:
        raise ValueError(f"load {tuple(load.shape)} and bias {tuple(bias.shape)} must match")
    load = load.to(bias.dtype)
    return bias + gamma * torch.sign(load.mean() - load)


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """The Switch Transformer's auxiliary loss ``E * sum_i f_i * P_i``.

    ``probs (N, E)``: router probabilities; ``experts (N, k)``: the chosen experts.
    ``f_i``: the number of assignments to expert ``i`` over ``N`` (the ``f_i`` sum to ``k``;
    for ``k = 1`` the share of tokens); ``P_i``: ``probs[:, i]`` averaged over the tokens.
    Equals ``transformers``' ``load_balancing_loss_func`` without an attention mask.
    """
    require_tensor("probs", probs)
    if probs.dim() != 2 or experts.dim() != 2 or experts.shape[0] != probs.shape[0]:
        raise ValueError(
            f"probs must be (N, E) and experts (N, k) with the same N; got "
            f"{tuple(probs.shape)} and {tuple(experts.shape)}"
        )
    N, E = probs.shape
    counts = torch.zeros(E, dtype=probs.dtype, device=probs.device)
    counts.index_add_(0, experts.flatten(), torch.ones_like(experts.flatten(), dtype=probs.dtype))
    f = counts / N  # (E,)
    P = probs.mean(0)  # (E,)
    return E * (f * P).sum()


class ClampedSwiGLU(nn.Module):
    """GPT-OSS's expert: a SwiGLU with biases, clamped, and a sharper sigmoid::

        g = min(w_gate(x), limit)            u = clamp(w_up(x), -limit, limit)
        out = w_down((u + 1) * g * sigmoid(alpha * g))

    (``alpha = 1.702``, ``limit = 7``). Attributes ``w_gate``, ``w_up``, ``w_down``
    (``nn.Linear`` with biases). forward(x ``(..., d_model)``) returns ``(..., d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, alpha: float = 1.702, limit: float = 7.0) -> None:
        super().__init__()
        self.w_gate = nn.Linear(d_model, d_ff)
        self.w_up = nn.Linear(d_model, d_ff)
        self.w_down = nn.Linear(d_ff, d_model)
        self.alpha, self.limit = float(alpha), float(limit)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.w_gate(x).clamp(max=self.limit)  # (..., d_ff)
        u = self.w_up(x).clamp(-self.limit, self.limit)
        return self.w_down((u + 1) * g * torch.sigmoid(self.alpha * g))  # (..., d_model)


class MoEFeedForward(nn.Module):
    """A mixture-of-experts feed-forward network.

    Attributes: ``gate`` (``nn.Linear(d_model, n_experts, bias=router_bias)``, the router),
    ``experts`` (``n_experts`` of ``expert(d_model, d_ff)``, :class:`SwiGLU` by default),
    ``e_score_correction_bias`` (buffer ``(n_experts,)``, DeepSeek-V3 only), ``shared``
    (``expert(d_model, n_shared * d_ff)`` or None). The routing options are those of
    :func:`route`: ``router="deepseek_v3"`` routes with :func:`deepseek_port_route`, the
    others with :func:`route`, given only the exercise's arguments (``norm_topk_prob``).

    forward(x ``(..., d_model)``) returns ``(..., d_model)``. After each call,
    ``last_routing`` holds ``(gates, experts, probs)`` (for :func:`load_balancing_loss`)
    and ``tokens_per_expert`` ``(n_experts,)`` how many tokens each expert ran on.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        n_experts: int,
        top_k: int,
        router: str = "mixtral",
        *,
        norm_topk_prob: bool = True,
        n_group: int = 1,
        topk_group: int = 1,
        routed_scaling_factor: float = 1.0,
        n_shared: int = 0,
        router_bias: bool = False,
        expert: Callable[..., nn.Module] = SwiGLU,
    ) -> None:
        super().__init__()
        for name, n in (("d_model", d_model), ("d_ff", d_ff), ("n_experts", n_experts)):
            _positive(name, n)
        if router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}; got {router!r}")
        if not 1 <= _positive("top_k", top_k) <= n_experts:
            raise ValueError(f"top_k={top_k} must be between 1 and n_experts={n_experts}")
        self.d_model, self.n_experts, self.top_k, self.router = d_model, n_experts, top_k, router
        self.options = dict(
            norm_topk_prob=norm_topk_prob,
            n_group=n_group,
            topk_group=topk_group,
            routed_scaling_factor=routed_scaling_factor,
        )
        self.gate = nn.Linear(d_model, n_experts, bias=router_bias)
        self.experts = nn.ModuleList(expert(d_model, d_ff) for _ in range(n_experts))
        if router == "deepseek_v3":
            self.register_buffer("e_score_correction_bias", torch.zeros(n_experts))
        else:
            self.e_score_correction_bias = None
        self.shared = expert(d_model, n_shared * d_ff) if n_shared else None
        self.last_routing: tuple[torch.Tensor, ...] | None = None
        self.tokens_per_expert: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        require_tensor("x", x)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (..., d_model={self.d_model}); got {tuple(x.shape)}")
        flat = x.reshape(-1, self.d_model)  # (N, D)
        logits = self.gate(flat)  # (N, E)
        if self.router == "deepseek_v3":
            gates, experts, probs = deepseek_port_route(
                logits, self.e_score_correction_bias, self.top_k, **self.options
            )
        else:  # route's own arguments only: a kernel grading notebook 15 runs the learner's
            norm = self.options["norm_topk_prob"]
            gates, experts, probs = route(logits, self.top_k, self.router, norm_topk_prob=norm)
        out = torch.zeros_like(flat)  # (N, D)
        counts = torch.zeros(self.n_experts, dtype=torch.long, device=x.device)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(experts == e)  # the rows that chose e, and in which slot
            counts[e] = token.numel()
            if token.numel() == 0:
                continue
            y = expert(flat.index_select(0, token))  # (n_e, D): only its tokens
            out.index_add_(0, token, y * gates[token, slot, None])
        if self.shared is not None:
            out = out + self.shared(flat)
        self.last_routing, self.tokens_per_expert = (gates, experts, probs), counts
        return out.view(x.shape)


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE's router z-loss (Zoph et al., 2022): the square of each token's log-sum-exp of
    its router logits, averaged over the tokens. ``logits (N, E)``. It keeps the logits small,
    where exp's rounding in low precision cannot destabilise training; ST-MoE weighted it
    1e-3. As transformers' Switch Transformer computes it."""
    require_tensor("logits", logits)
    if logits.dim() != 2:
        raise ValueError(f"logits must be (tokens, experts); got shape {tuple(logits.shape)}")
    return torch.logsumexp(logits, dim=-1).square().mean()  # (N,) -> a scalar


__all__ = [
    "route",
    "deepseek_route",
    "deepseek_port_route",
    "update_bias",
    "load_balancing_loss",
    "router_z_loss",
    "ClampedSwiGLU",
    "MoEFeedForward",
    "ROUTERS",
]
