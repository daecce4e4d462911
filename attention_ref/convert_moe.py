"""Today's open mixture-of-experts models on the course's parts: notebook 15.

:class:`OpenGPT` is notebook 13's :class:`~attention_ref.modern.ModernGPT` with the parts
of this notebook: each block's attention is a
:class:`~attention_ref.sliding_window.SlidingWindowAttention` (a window or none, Qwen3's
per-head query and key norms or none) and its feed-forward network a
:class:`~attention_ref.experts.MoEFeedForward` (or a dense SwiGLU). Generation
(:func:`greedy_generate`) keeps a :class:`~attention_ref.sliding_window.RollingKVCache` of
``window - 1`` positions for a windowed layer.

The converters read the weights of a ``transformers`` model by name, as notebook 13's
(:mod:`attention_ref.convert`) do, in the layouts of 4.57 (one module per expert, but
GPT-OSS's experts already fused) and of 5.x (every expert's weights in one tensor,
``experts.gate_up_proj``, the gates' rows first);
queries and keys are reordered from the halves layout of rotary positions to adjacent
pairs (:func:`~attention_ref.convert.rotate_half_permutation`), Qwen3's per-head norm
weights with them:

- :func:`from_mixtral`: ``MixtralForCausalLM`` (4.57: ``block_sparse_moe.experts.j.w1`` is
  the gate, ``w3`` the up and ``w2`` the down projection; 5.x: ``mlp.experts``; router
  ``"mixtral"``);
- :func:`from_qwen3_moe`: ``Qwen3MoeForCausalLM`` (``q_norm``/``k_norm`` per head; dense
  layers where ``mlp_only_layers`` or ``decoder_sparse_step`` say; router ``"qwen3"``);
- :func:`from_gpt_oss`: ``GptOssForCausalLM`` (sliding and full layers alternating,
  attention sinks, biases everywhere, clamped SwiGLU experts, router ``"gpt_oss"``);
- :func:`from_deepseek_v3`: ``DeepseekV3ForCausalLM`` (multi-head latent attention, the
  first layers dense, router ``"deepseek_v3"`` with shared experts).

:func:`tiny_moe_model` builds small random configurations of each (nothing downloaded).
Padding works on either side for the logits (the padded keys are masked; positions are
the slots, as ``transformers``' forward counts them) and on the left for
:func:`greedy_generate`.

In float64, ``transformers`` computes a few things in float32 (:func:`float64_internals_moe`
makes them float64): every RMSNorm and the rotary cosines and sines (all four models); the
router's softmax of Mixtral and Qwen3-MoE (``softmax(..., dtype=torch.float)``); DeepSeek-V3's
router logits (cast to float32), whose float32 gates then meet the float64 states in
``index_add_``, so that its float64 model does not run at all without the patch. GPT-OSS's
router and its attention softmax stay in the model's dtype.
"""

from __future__ import annotations

import torch
from torch import nn

from ._validate import require_tensor
from .convert import _permute_heads, float64_internals, rope_base
from .experts import ClampedSwiGLU, MoEFeedForward, deepseek_port_route, route
from .latent_attention import MultiHeadLatentAttention
from .modern import RMSNorm, SwiGLU
from .sliding_window import (
    RollingKVCache,
    SinkAttention,
    SlidingWindowAttention,
    rolling_cache_size,
)


class OpenBlock(nn.Module):
    """The pre-norm block ``x + attn(norm1(x))``, then ``x + ff(norm2(x))``, with any
    attention (``forward(x, mask)``, ``step(x, cache, keep)``) and feed-forward module."""

    def __init__(self, d_model: int, attn: nn.Module, ff: nn.Module, eps: float = 1e-6) -> None:
        super().__init__()
        self.norm1, self.attn = RMSNorm(d_model, eps=eps), attn
        self.norm2, self.ff = RMSNorm(d_model, eps=eps), ff

    def forward(self, x: torch.Tensor, mask=None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), mask)[0]
        return x + self.ff(self.norm2(x))

    def step(self, x_new: torch.Tensor, cache, keep=None, positions=None) -> torch.Tensor:
        x = x_new + self.attn.step(self.norm1(x_new), cache, keep, positions)
        return x + self.ff(self.norm2(x))


class OpenGPT(nn.Module):
    """A decoder-only model of :class:`OpenBlock` s: ``logits = lm_head(norm_f(blocks(
    tok(ids))))`` (no embedding scale; ``lm_head`` None: tied to ``tok``).

    forward(ids ``(B, T)``, attention_mask optional ``(B, T)``, 1 = real token) returns
    logits ``(B, T, vocab)``. :meth:`step` runs only new tokens with one cache per block.
    """

    def __init__(self, vocab_size: int, d_model: int, blocks: list[OpenBlock], *,
                 eps: float = 1e-6, tie: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(blocks)
        self.norm_f = RMSNorm(d_model, eps=eps)
        self.lm_head = None if tie else nn.Linear(d_model, vocab_size, bias=False)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm_f(x)
        return x @ self.tok.weight.T if self.lm_head is None else self.lm_head(x)

    def forward(self, ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        require_tensor("ids", ids, floating=False)
        if ids.dim() != 2:
            raise ValueError(f"ids must be (batch, seq); got shape {tuple(ids.shape)}")
        if attention_mask is not None and attention_mask.shape != ids.shape:
            raise ValueError(
                f"attention_mask must be (batch, seq) like ids {tuple(ids.shape)}; got "
                f"{tuple(attention_mask.shape)}"
            )
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        x = self.tok(ids)  # (B, T, D)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(x)

    def new_caches(self, max_len: int) -> list[RollingKVCache]:
        """One cache per block: ``window - 1`` slots for a windowed layer, ``max_len`` (it
        never wraps) for a full one."""
        caches = []
        for b in self.blocks:
            if hasattr(b.attn, "new_cache"):  # latent attention keeps its own
                caches.append(b.attn.new_cache(max_len))
            elif b.attn.window is None:
                caches.append(RollingKVCache(max_len))
            else:
                caches.append(RollingKVCache(rolling_cache_size(b.attn.window)))
        return caches

    def step(self, ids_new: torch.Tensor, caches: list, keep=None, positions=None) -> torch.Tensor:
        """Logits ``(B, t, vocab)`` of the new tokens ``(B, t)``; ``keep`` optional bool
        ``(B, t)``: which new tokens are real; ``positions`` optional ``(B, 1, t)``: their
        rotary positions (default: their slots)."""
        x = self.tok(ids_new)
        for block, cache in zip(self.blocks, caches, strict=True):
            x = block.step(x, cache, keep, positions)
        return self.head(x)


@torch.no_grad()
def greedy_generate(
    model: OpenGPT, prompt: torch.Tensor, n_tokens: int, attention_mask=None
) -> torch.Tensor:
    """``prompt (B, T0)`` followed by ``n_tokens`` greedy tokens, ``(B, T0 + n_tokens)``:
    the prompt in one step, then one token per step, with :meth:`OpenGPT.new_caches`.

    ``attention_mask`` (optional ``(B, T0)``, 1 = real token) for a left-padded prompt: as
    ``transformers``' ``generate`` does, a token's rotary position counts the real tokens
    before it (``cumsum(mask) - 1``), while the window and the cache go by slots.
    """
    B, T0 = prompt.shape
    caches = model.new_caches(T0 + n_tokens)
    keep, positions = None, None
    if attention_mask is not None:
        if attention_mask.shape != prompt.shape:
            raise ValueError(
                f"attention_mask must be (batch, seq) like the prompt {tuple(prompt.shape)}; "
                f"got {tuple(attention_mask.shape)}"
            )
        keep = attention_mask.bool()
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, None, :]  # (B,1,T0)
    ids, new = prompt, prompt
    for _ in range(n_tokens):
        nxt = model.step(new, caches, keep, positions)[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        ids, new = torch.cat([ids, nxt], dim=1), nxt
        if positions is not None:
            keep = torch.ones(B, 1, dtype=torch.bool, device=prompt.device)
            positions = positions[:, :, -1:] + 1  # (B, 1, 1)
    return ids


# ----------------------------------------------------------------------------- converters
#: A weight each converter reads, by ``model_type``: the layout of ``transformers`` 4.57.
#: A weight each architecture has in the layouts the converters read (transformers 4.57:
#: one module per expert, GPT-OSS's fused; 5.x: every expert's weights in one tensor,
#: ``experts.gate_up_proj``).
LAYOUT = {
    "mixtral": (
        "model.layers.0.block_sparse_moe.experts.0.w1.weight",
        "model.layers.0.mlp.experts.gate_up_proj",
    ),
    "qwen3_moe": ("model.layers.0.self_attn.q_norm.weight",),
    "gpt_oss": ("model.layers.0.mlp.experts.gate_up_proj",),
    "deepseek_v3": ("model.layers.0.self_attn.kv_a_proj_with_mqa.weight",),
}


def _state(hf_model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights by name; NotImplementedError if they are not laid out as the
    converters expect (other versions of ``transformers`` may store experts otherwise)."""
    sd = {k: v.detach() for k, v in hf_model.state_dict().items()}
    kind = hf_model.config.model_type
    if not any(name in sd for name in LAYOUT[kind]):
        import transformers

        raise NotImplementedError(
            f"this {kind} model of transformers {transformers.__version__} has none of the "
            f"weights {LAYOUT[kind]}: the converters read the layouts of transformers 4.57 "
            "and 5.x"
        )
    return sd


def _attention(cfg, sd, h: str, window: int | None, qk_norm: bool,
               cls: type = SlidingWindowAttention) -> SlidingWindowAttention:  # fmt: skip
    D, H = cfg.hidden_size, cfg.num_attention_heads
    G = getattr(cfg, "num_key_value_heads", None) or H
    dh = getattr(cfg, "head_dim", None) or D // H
    attn = cls(
        D, H, G, rope_base(cfg), window=window, qk_norm=qk_norm, eps=cfg.rms_norm_eps,
        d_head=dh, bias=h + "self_attn.q_proj.bias" in sd,
        out_bias=h + "self_attn.o_proj.bias" in sd,
    )  # fmt: skip
    new = {}
    for ours, theirs, heads in (("w_q", "q_proj", H), ("w_k", "k_proj", G),
                                ("w_v", "v_proj", None), ("w_o", "o_proj", None)):  # fmt: skip
        for kind in ("weight", "bias"):
            t = sd.get(f"{h}self_attn.{theirs}.{kind}")
            if t is not None:  # queries and keys: halves layout -> adjacent pairs
                new[f"{ours}.{kind}"] = t if heads is None else _permute_heads(t, heads, dh)
    if qk_norm:  # (d_head,) weights, reordered like each head's features
        new["q_norm.weight"] = _permute_heads(sd[h + "self_attn.q_norm.weight"], 1, dh)
        new["k_norm.weight"] = _permute_heads(sd[h + "self_attn.k_norm.weight"], 1, dh)
    if cls is SinkAttention:
        new["sinks"] = sd[h + "self_attn.sinks"]
    _load(attn, new)
    return attn


def _swiglu(sd, prefix: str, names: tuple[str, str, str]) -> SwiGLU:
    gate, up, down = (sd[f"{prefix}{n}.weight"] for n in names)
    ff = SwiGLU(gate.shape[1], gate.shape[0])
    _load(ff, {"w_gate.weight": gate, "w_up.weight": up, "w_down.weight": down})
    return ff


def _expert_weights(sd, prefix: str, j: int, names) -> tuple[torch.Tensor, ...]:
    """Expert ``j``'s (gate, up, down) weights, ``(d_ff, D), (d_ff, D), (D, d_ff)``: from
    its own module (transformers 4.57: ``experts.j.<name>.weight``) or from the tensors of
    every expert (5.x: ``experts.gate_up_proj (E, 2 d_ff, D)``, the gate's rows first, and
    ``experts.down_proj (E, D, d_ff)``)."""
    fused = sd.get(prefix + "experts.gate_up_proj")
    if fused is None:
        return tuple(sd[f"{prefix}experts.{j}.{n}.weight"] for n in names)
    gate, up = fused[j].chunk(2, dim=0)  # (2 d_ff, D) -> two (d_ff, D)
    return gate, up, sd[prefix + "experts.down_proj"][j]


def _moe(sd, prefix: str, n_experts: int, top_k: int, router: str, names, **kw):
    gate = sd[prefix + "gate.weight"]  # (E, D)
    d_ff = _expert_weights(sd, prefix, 0, names)[0].shape[0]
    moe = MoEFeedForward(gate.shape[1], d_ff, n_experts, top_k, router, **kw)
    new = {"gate.weight": gate}
    for j in range(n_experts):
        weights = _expert_weights(sd, prefix, j, names)
        for ours, w in zip(("w_gate", "w_up", "w_down"), weights, strict=True):
            new[f"experts.{j}.{ours}.weight"] = w
    if moe.shared is not None:  # DeepSeek's shared experts, one SwiGLU
        for ours, theirs in zip(("w_gate", "w_up", "w_down"), names, strict=True):
            new[f"shared.{ours}.weight"] = sd[f"{prefix}shared_experts.{theirs}.weight"]
    if moe.e_score_correction_bias is not None:  # DeepSeek's selection bias (a buffer)
        new["e_score_correction_bias"] = sd[prefix + "gate.e_score_correction_bias"]
    _load(moe, new)
    return moe


def _load(module: nn.Module, new: dict[str, torch.Tensor]) -> None:
    w = next(iter(new.values()))
    module.to(device=w.device, dtype=w.dtype)
    result = module.load_state_dict(new, strict=False)
    params = dict(module.named_parameters())
    missing = [k for k in result.missing_keys if k in params]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"the weights do not fit {type(module).__name__}: not loaded {missing}, "
            f"unexpected {result.unexpected_keys}"
        )


def _model(cfg, sd, blocks: list[OpenBlock]) -> OpenGPT:
    tie = bool(getattr(cfg, "tie_word_embeddings", False))
    model = OpenGPT(cfg.vocab_size, cfg.hidden_size, blocks, eps=cfg.rms_norm_eps, tie=tie)
    w = sd["model.embed_tokens.weight"]
    model.tok.to(device=w.device, dtype=w.dtype)
    model.norm_f.to(device=w.device, dtype=w.dtype)
    new = {"tok.weight": w, "norm_f.weight": sd["model.norm.weight"]}
    if not tie:
        model.lm_head.to(device=w.device, dtype=w.dtype)
        new["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(cfg.num_hidden_layers):
        h = f"model.layers.{i}."
        new[f"blocks.{i}.norm1.weight"] = sd[h + "input_layernorm.weight"]
        new[f"blocks.{i}.norm2.weight"] = sd[h + "post_attention_layernorm.weight"]
        blocks[i].norm1.to(device=w.device, dtype=w.dtype)
        blocks[i].norm2.to(device=w.device, dtype=w.dtype)
    result = model.load_state_dict(new, strict=False)
    if result.unexpected_keys:
        raise RuntimeError(f"unexpected weights {result.unexpected_keys}")
    return model.eval()


def from_mixtral(hf_model: nn.Module) -> OpenGPT:
    """An :class:`OpenGPT` with the weights of a ``MixtralForCausalLM``: every layer
    windowed by ``config.sliding_window`` (None: full attention), every feed-forward a
    mixture of ``num_local_experts`` experts, ``num_experts_per_tok`` per token."""
    cfg = hf_model.config
    if cfg.model_type != "mixtral":
        raise ValueError(f"not a Mixtral model: model_type={cfg.model_type!r}")
    sd = _state(hf_model)
    blocks = []
    for i in range(cfg.num_hidden_layers):
        h = f"model.layers.{i}."
        attn = _attention(cfg, sd, h, cfg.sliding_window, qk_norm=False)
        block = "block_sparse_moe." if h + "block_sparse_moe.gate.weight" in sd else "mlp."
        ff = _moe(sd, h + block, cfg.num_local_experts, cfg.num_experts_per_tok,
                  "mixtral", ("w1", "w3", "w2"))  # fmt: skip
        blocks.append(OpenBlock(cfg.hidden_size, attn, ff, cfg.rms_norm_eps))
    return _model(cfg, sd, blocks)


def from_qwen3_moe(hf_model: nn.Module) -> OpenGPT:
    """An :class:`OpenGPT` with the weights of a ``Qwen3MoeForCausalLM``: per-head query
    and key norms, every layer windowed when ``use_sliding_window`` (``config.sliding_window``
    is then set), a mixture of experts in layer ``i`` unless ``i in mlp_only_layers`` or
    ``(i + 1) % decoder_sparse_step != 0`` (then a dense SwiGLU)."""
    cfg = hf_model.config
    if cfg.model_type != "qwen3_moe":
        raise ValueError(f"not a Qwen3-MoE model: model_type={cfg.model_type!r}")
    sd = _state(hf_model)
    blocks = []
    names = ("gate_proj", "up_proj", "down_proj")
    for i in range(cfg.num_hidden_layers):
        h = f"model.layers.{i}."
        attn = _attention(cfg, sd, h, cfg.sliding_window, qk_norm=True)
        sparse = i not in cfg.mlp_only_layers and (i + 1) % cfg.decoder_sparse_step == 0
        if sparse and cfg.num_experts > 0:
            ff = _moe(sd, h + "mlp.", cfg.num_experts, cfg.num_experts_per_tok, "qwen3", names,
                      norm_topk_prob=cfg.norm_topk_prob)  # fmt: skip
        else:
            ff = _swiglu(sd, h + "mlp.", names)
        blocks.append(OpenBlock(cfg.hidden_size, attn, ff, cfg.rms_norm_eps))
    return _model(cfg, sd, blocks)


def from_gpt_oss(hf_model: nn.Module) -> OpenGPT:
    """An :class:`OpenGPT` with the weights of a ``GptOssForCausalLM``: attention with
    sinks (:class:`~attention_ref.sliding_window.SinkAttention`) and biases, windowed in the
    layers ``config.layer_types`` marks ``"sliding_attention"`` (every other one, from the
    first), full in the others; a mixture of :class:`~attention_ref.experts.ClampedSwiGLU`
    experts with router ``"gpt_oss"`` (a bias on the router). Its experts are stored as
    ``gate_up_proj (E, D, 2 d_ff)`` in ``x @ W`` layout with the gate and up columns
    interleaved (even: gate, odd: up): transposed and split. Only unscaled rotary positions
    (``rope_scaling=None``; the released checkpoints use YaRN)."""
    cfg = hf_model.config
    if cfg.model_type != "gpt_oss":
        raise ValueError(f"not a GPT-OSS model: model_type={cfg.model_type!r}")
    sd = _state(hf_model)
    blocks = []
    for i in range(cfg.num_hidden_layers):
        h = f"model.layers.{i}."
        window = cfg.sliding_window if cfg.layer_types[i] == "sliding_attention" else None
        attn = _attention(cfg, sd, h, window, qk_norm=False, cls=SinkAttention)
        E, k = cfg.num_local_experts, cfg.num_experts_per_tok
        gate_up = sd[h + "mlp.experts.gate_up_proj"]  # (E, D, 2 d_ff), x @ W layout
        gate_up_b = sd[h + "mlp.experts.gate_up_proj_bias"]  # (E, 2 d_ff)
        down, down_b = sd[h + "mlp.experts.down_proj"], sd[h + "mlp.experts.down_proj_bias"]
        moe = MoEFeedForward(cfg.hidden_size, down.shape[1], E, k, "gpt_oss", router_bias=True,
                             expert=ClampedSwiGLU)  # fmt: skip
        new = {"gate.weight": sd[h + "mlp.router.weight"], "gate.bias": sd[h + "mlp.router.bias"]}
        for j in range(E):
            e = f"experts.{j}."
            new[e + "w_gate.weight"] = gate_up[j][:, 0::2].T  # (d_ff, D): the even columns
            new[e + "w_gate.bias"] = gate_up_b[j][0::2]
            new[e + "w_up.weight"] = gate_up[j][:, 1::2].T  # the odd columns
            new[e + "w_up.bias"] = gate_up_b[j][1::2]
            new[e + "w_down.weight"] = down[j].T  # (D, d_ff)
            new[e + "w_down.bias"] = down_b[j]
        _load(moe, new)
        blocks.append(OpenBlock(cfg.hidden_size, attn, moe, cfg.rms_norm_eps))
    return _model(cfg, sd, blocks)


def from_deepseek_v3(hf_model: nn.Module) -> OpenGPT:
    """An :class:`OpenGPT` with the weights of a ``DeepseekV3ForCausalLM``: multi-head latent
    attention (:class:`~attention_ref.latent_attention.MultiHeadLatentAttention`; the
    parameter names are DeepSeek's, nothing is reordered: with ``rope_interleave=True``
    DeepSeek rotates adjacent pairs, as the course's rope does); the first
    ``first_k_dense_replace`` feed-forward networks dense, the others a mixture with router
    ``"deepseek_v3"`` (sigmoid, the correction bias for selection only, group-limited top-k,
    ``routed_scaling_factor``) and ``n_shared_experts`` shared experts. Only unscaled rotary
    positions (``rope_scaling=None``; the released checkpoints use YaRN)."""
    cfg = hf_model.config
    if cfg.model_type != "deepseek_v3":
        raise ValueError(f"not a DeepSeek-V3 model: model_type={cfg.model_type!r}")
    if not cfg.rope_interleave:
        raise NotImplementedError("rope_interleave=False (the halves layout) is not supported")
    sd = _state(hf_model)
    names = ("gate_proj", "up_proj", "down_proj")
    blocks = []
    for i in range(cfg.num_hidden_layers):
        h = f"model.layers.{i}."
        hf_attn = hf_model.model.layers[i].self_attn
        attn = MultiHeadLatentAttention(
            cfg.hidden_size, cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_nope_head_dim,
            cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.q_lora_rank, base=rope_base(cfg),
            eps=hf_attn.kv_a_layernorm.variance_epsilon, bias=bool(cfg.attention_bias),
        )  # fmt: skip
        d_q = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        if abs(hf_attn.scaling - d_q**-0.5) > 1e-12 * d_q**-0.5:
            # YaRN's mscale multiplies transformers' scaling; the course's MLA (sdpa in forward,
            # absorbed_scores in step) always divides by sqrt(d_q): refuse, never differ silently
            raise NotImplementedError(
                f"layer {i} scales its scores by {hf_attn.scaling!r}, not 1/sqrt(qk_head_dim="
                f"{d_q}) = {d_q**-0.5!r} (rope_scaling={cfg.rope_scaling!r}): only unscaled "
                "attention is supported"
            )
        prefix = h + "self_attn."
        _load(attn, {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)})
        if i < cfg.first_k_dense_replace:
            ff = _swiglu(sd, h + "mlp.", names)
        else:
            ff = _moe(sd, h + "mlp.", cfg.n_routed_experts, cfg.num_experts_per_tok,
                      "deepseek_v3", names, norm_topk_prob=cfg.norm_topk_prob,
                      n_group=cfg.n_group, topk_group=cfg.topk_group,
                      routed_scaling_factor=cfg.routed_scaling_factor,
                      n_shared=cfg.n_shared_experts)  # fmt: skip
        blocks.append(OpenBlock(cfg.hidden_size, attn, ff, cfg.rms_norm_eps))
    return _model(cfg, sd, blocks)


# ----------------------------------------------------------------------------- float64
def float64_internals_moe(hf_model: nn.Module) -> nn.Module:
    """:func:`~attention_ref.convert.float64_internals` (RMSNorm and rotary angles in the
    model's dtype), and the router of each sparse block too: Mixtral's and Qwen3-MoE's
    compute ``softmax(router_logits, dtype=float32)``, so in a float64 model the gates carry
    float32 rounding. Their forward is replaced, on this model's instances only, by the same
    routing (:func:`~attention_ref.experts.route`; DeepSeek-V3's, whose logits are float32,
    :func:`~attention_ref.experts.deepseek_port_route`) in the model's dtype. Returns the
    model."""
    float64_internals(hf_model)
    if hasattr(hf_model, "set_experts_implementation"):  # 5.x: grouped matmuls, no float64
        hf_model.set_experts_implementation("eager")
    cfg = hf_model.config
    for module in hf_model.modules():
        name = type(module).__name__
        if name in ("MixtralSparseMoeBlock", "Qwen3MoeSparseMoeBlock") and isinstance(
            module.experts, nn.ModuleList
        ):  # transformers 4.57: the block routes, then runs each expert
            module.forward = _moe_forward(module, cfg)
        elif name in ("MixtralTopKRouter", "Qwen3MoeTopKRouter"):  # 5.x: a router of its own
            module.forward = _topk_router_forward(module, cfg)
        elif type(module).__name__ == "GptOssRotaryEmbedding":  # cos, sin of d_head / 2
            module.forward = _half_rotary_forward(rope_base(cfg), cfg.head_dim)
        elif type(module).__name__ == "DeepseekV3TopkRouter":  # logits in float32
            module.forward = _deepseek_router_forward(module, cfg)
    return hf_model


def _deepseek_router_forward(router: nn.Module, cfg):
    import transformers

    three = int(transformers.__version__.split(".")[0]) >= 5  # 5.x: (logits, gates, experts)

    def forward(x: torch.Tensor):
        logits = x.reshape(-1, cfg.hidden_size) @ router.weight.T  # (N, E), the model's dtype
        gates, experts, _ = deepseek_port_route(
            logits, router.e_score_correction_bias, cfg.num_experts_per_tok,
            norm_topk_prob=cfg.norm_topk_prob, n_group=cfg.n_group, topk_group=cfg.topk_group,
            routed_scaling_factor=cfg.routed_scaling_factor,
        )  # fmt: skip
        return (logits, gates, experts) if three else (experts, gates)

    return forward


def _topk_router_forward(router: nn.Module, cfg):
    """transformers 5.x's Mixtral and Qwen3-MoE routers (softmax in float32), in the
    model's dtype: ``(logits (N, E), gates (N, k), experts (N, k))``."""
    kind = "mixtral" if cfg.model_type == "mixtral" else "qwen3"
    norm = bool(getattr(cfg, "norm_topk_prob", True))

    def forward(x: torch.Tensor):
        logits = x.reshape(-1, router.weight.shape[1]) @ router.weight.T  # (N, E)
        gates, experts, _ = route(logits, router.top_k, kind, norm_topk_prob=norm)
        return logits, gates, experts

    return forward


def _half_rotary_forward(base: float, d_head: int):
    def forward(x: torch.Tensor, position_ids: torch.Tensor):
        two_i = torch.arange(0, d_head, 2, dtype=x.dtype, device=x.device)
        angles = position_ids.to(x.dtype)[..., None] / base ** (two_i / d_head)  # (B, T, d/2)
        return angles.cos(), angles.sin()

    return forward


def _moe_forward(block: nn.Module, cfg):
    router = "mixtral" if cfg.model_type == "mixtral" else "qwen3"
    norm = bool(getattr(cfg, "norm_topk_prob", True))

    def forward(x: torch.Tensor):
        flat = x.reshape(-1, x.shape[-1])  # (N, D)
        logits = block.gate(flat)  # (N, E)
        gates, experts, _ = route(logits, block.top_k, router, norm_topk_prob=norm)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(block.experts):
            token, slot = torch.where(experts == e)
            if token.numel():
                out.index_add_(0, token, expert(flat[token]) * gates[token, slot, None])
        return out.view(x.shape), logits

    return forward


# ----------------------------------------------------------------------------- small models
MOE_KINDS = ("mixtral", "qwen3_moe", "gpt_oss", "deepseek_v3")


def tiny_moe_model(kind: str, seed: int = 0, vocab_size: int = 97, window: int | None = 6):
    """A small ``transformers`` mixture-of-experts model built from a configuration with
    seeded random weights (as :func:`~attention_ref.convert.tiny_hf_model`: matrices
    ``N(0, 1/fan_in)``, norm weights ``N(1, 0.3^2)``): d_model 32, 4 query heads over 2
    key/value heads, 4 experts with 2 per token, ``sliding_window=window``.
    ``"mixtral"``: 2 layers; ``"qwen3_moe"``: 3 layers, head_dim 8 with q/k norms, the
    middle layer dense (``mlp_only_layers=[1]``), ``norm_topk_prob=True``. float32, eval.
    Unscaled rotary positions (transformers 5.x gives GPT-OSS YaRN unless told otherwise)
    and, on 5.x, its eager experts (a loop over the experts, as 4.57's; its default grouped
    matrix products do not run in float64).
    """
    import transformers as tf

    v5 = int(tf.__version__.split(".")[0]) >= 5

    common = dict(
        vocab_size=vocab_size, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=128, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        num_experts_per_tok=2,
    )  # fmt: skip
    if kind == "mixtral":
        cfg = tf.MixtralConfig(num_hidden_layers=2, intermediate_size=48, num_local_experts=4,
                               sliding_window=window, **common)  # fmt: skip
    elif kind == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(
            num_hidden_layers=3, intermediate_size=64, moe_intermediate_size=24, head_dim=8,
            num_experts=4, norm_topk_prob=True, mlp_only_layers=[1],
            use_sliding_window=window is not None, sliding_window=window, **common,
        )  # fmt: skip
    elif kind == "gpt_oss":
        cfg = tf.GptOssConfig(
            num_hidden_layers=2, intermediate_size=24, head_dim=8, num_local_experts=4,
            sliding_window=window or 128, rope_scaling=None, **common,
            **({"rope_parameters": {"rope_type": "default", "rope_theta": 150000.0}} if v5 else {}),
        )  # fmt: skip
    elif kind == "deepseek_v3":
        common.pop("num_key_value_heads")
        cfg = tf.DeepseekV3Config(
            num_hidden_layers=3, first_k_dense_replace=1, intermediate_size=48,
            moe_intermediate_size=16, n_routed_experts=8, n_group=4, topk_group=2,
            n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=16,
            kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
            rope_scaling=None, num_key_value_heads=4, **common,
        )  # fmt: skip
    else:
        raise ValueError(f"kind must be one of {MOE_KINDS}; got {kind!r}")
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg)
    if v5 and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
            else:  # GPT-OSS's experts (E, in, out): fan_in is dim 1; biases (E, out): 8
                fan_in = p.shape[1] if p.dim() == 3 else p.shape[-1]
                fan_in = 64 if name.endswith("_bias") else fan_in
                p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek's selection bias
                b.copy_(0.3 * torch.randn(b.shape, generator=g))
    return model.eval()


def conversion_figures(kinds=MOE_KINDS, seed: int = 1, n_tokens: int = 32) -> list[dict]:
    """For each architecture of ``kinds`` (:func:`tiny_moe_model`), converted: the worst
    max |logit difference| over batches of 1, 7 and 33 tokens and a batch of 12 padded on
    the right and on the left, in float32 and in float64 (:func:`float64_internals_moe`),
    and whether ``n_tokens`` greedy tokens with the course's caches
    (:func:`greedy_generate`) equal ``generate(do_sample=False)``. Table-ready rows
    ``{"model", "float32", "float64", "greedy_equal"}``."""
    from .convert import max_logit_difference

    def batches():
        g = torch.Generator().manual_seed(seed)
        out = [(torch.randint(0, 97, (3, T), generator=g), None) for T in (1, 7, 33)]
        ids = torch.randint(0, 97, (3, 12), generator=g)
        right = torch.ones(3, 12, dtype=torch.long)
        right[0, 8:] = 0
        right[2, 3:] = 0
        return out + [(ids, right), (ids, right.flip(1))]

    rows = []
    for kind in kinds:
        row = {"model": kind}
        for dtype, name in ((torch.float32, "float32"), (torch.float64, "float64")):
            hf = tiny_moe_model(kind, seed=seed).to(dtype)
            if dtype == torch.float64:
                float64_internals_moe(hf)
            ours = from_hf_moe(hf)
            row[name] = max(max_logit_difference(ours, hf, i, m) for i, m in batches())
        hf = tiny_moe_model(kind, seed=seed)
        prompt = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            theirs = hf.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n_tokens,
                do_sample=False, pad_token_id=0,
            )  # fmt: skip
        row["greedy_equal"] = torch.equal(
            greedy_generate(from_hf_moe(hf), prompt, n_tokens), theirs
        )
        rows.append(row)
    return rows


def from_hf_moe(hf_model: nn.Module) -> OpenGPT:
    """:func:`from_mixtral`, :func:`from_qwen3_moe` or :func:`from_gpt_oss`, by
    ``config.model_type``."""
    kind = hf_model.config.model_type
    if kind == "deepseek_v3":
        return from_deepseek_v3(hf_model)
    if kind == "gpt_oss":
        return from_gpt_oss(hf_model)
    if kind == "mixtral":
        return from_mixtral(hf_model)
    if kind == "qwen3_moe":
        return from_qwen3_moe(hf_model)
    raise NotImplementedError(f"model_type {kind!r}: only {', '.join(MOE_KINDS)}")


__all__ = [
    "OpenBlock",
    "OpenGPT",
    "greedy_generate",
    "from_mixtral",
    "from_qwen3_moe",
    "from_gpt_oss",
    "from_deepseek_v3",
    "from_hf_moe",
    "float64_internals_moe",
    "tiny_moe_model",
    "conversion_figures",
    "MOE_KINDS",
]
