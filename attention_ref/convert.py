"""Load Hugging Face ``transformers`` causal language models into the course's modules:
notebook 13.

- the GPT-2 family into :class:`GPT2`, the GPT of notebook 11 shaped like GPT-2 (learned
  positions added to unscaled token embeddings, LayerNorm, a GELU feed-forward, the output
  layer tied to the token embedding);
- the Llama family (Llama, Qwen2, Mistral) into :class:`~attention_ref.modern.ModernGPT`,
  optionally built with the learner's own ``RMSNorm`` and ``SwiGLU`` classes.

Everything here is written from the architectures' equations: the weights are read from
the model's ``state_dict()`` by name and reshaped; no code of ``transformers`` is used
except to build the models (in the notebook and the tests, from small configurations with
random weights: nothing is downloaded).

Two things differ in how the weights are stored:

- GPT-2's ``Conv1D`` layers store their weight as ``(in_features, out_features)`` and
  compute ``x @ W + b``; an ``nn.Linear`` stores ``(out, in)``: transpose. Its ``c_attn``
  holds the query, key and value projections side by side: split.
- Hugging Face's Llama code rotates the two *halves* of each head (feature ``i`` with
  feature ``i + d/2``, "rotate_half"); notebook 05's :func:`~attention_ref.positional.rope`
  rotates *adjacent* pairs (``2i`` with ``2i+1``), with the same frequency for pair ``i`` in
  both. Reordering the rows of each head of ``W_q`` and ``W_k`` by
  :func:`rotate_half_permutation` makes one rotation the other; the dot product of a query
  and a key is a sum over features, which a reordering of both does not change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .encoder import FeedForward
from .gpt import GPT, causal_mask_like
from .modern import ModernGPT, RMSNorm, SwiGLU

LLAMA_FAMILY = ("llama", "qwen2", "mistral")


# ----------------------------------------------------------------------------- GPT-2
class GELUFeedForward(FeedForward):
    """:class:`~attention_ref.encoder.FeedForward` with GPT-2's activation, the tanh
    approximation of GELU: ``linear2(gelu_tanh(linear1(x)))``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = nn.functional.gelu(self.linear1(x), approximate="tanh")  # (..., d_ff)
        return self.linear2(self.dropout(hidden))  # (..., d_model)


class GPT2(GPT):
    """The GPT of notebook 11 shaped like GPT-2: token embeddings are *not* scaled by
    ``sqrt(d_model)`` (GPT-2 initialises them small instead), the feed-forward network uses
    GELU (tanh approximation), LayerNorm's epsilon is configurable. Same attribute names as
    :class:`~attention_ref.gpt.GPT`.

    forward(ids ``(B, T)``, attention_mask optional ``(B, T)``, 1 = real token) returns
    logits ``(B, T, vocab)``.
    """

    def __init__(self, vocab_size: int, d_model: int, n_heads: int, n_layers: int, d_ff: int,
                 max_len: int, eps: float = 1e-5) -> None:  # fmt: skip
        super().__init__(vocab_size, d_model, n_heads, n_layers, d_ff, max_len)
        for block in self.blocks:
            block.ff = GELUFeedForward(d_model, d_ff)
            block.ln1.eps = block.ln2.eps = eps
        self.ln_f.eps = eps

    def embed(self, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        T = ids.shape[1]
        if start + T > self.max_len:
            raise ValueError(f"{start + T} positions exceed the model's max_len={self.max_len}")
        positions = torch.arange(start, start + T, device=ids.device)
        return self.drop(self.tok(ids) + self.pos(positions))  # (B, T, D), no sqrt(D)

    def forward(self, ids: torch.Tensor, attention_mask=None, return_weights: bool = False):
        if attention_mask is None:
            return super().forward(ids, return_weights=return_weights)
        T = ids.shape[1]
        keys = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T): padded keys masked
        mask = causal_mask_like(T, ids.device) & keys  # (B, 1, T, T)
        x = self.embed(ids)
        weights = []
        for block in self.blocks:
            h = block.ln1(x)
            a, w = block.attn(h, h, h, mask)
            x = x + block.dropout(a)
            x = x + block.dropout(block.ff(block.ln2(x)))
            weights.append(w)
        logits = self.head(x)
        return (logits, weights) if return_weights else logits


def _state(hf_model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in hf_model.state_dict().items()}


def from_gpt2(hf_model: nn.Module) -> GPT2:
    """A :class:`GPT2` with the weights of a ``transformers`` GPT-2 model
    (``GPT2LMHeadModel``), on its device and in its dtype."""
    cfg = hf_model.config
    if getattr(cfg, "activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise NotImplementedError(f"activation {cfg.activation_function!r}: only GELU (tanh)")
    if getattr(cfg, "scale_attn_by_inverse_layer_idx", False):
        raise NotImplementedError("scale_attn_by_inverse_layer_idx=True is not supported")
    D, H, L = cfg.n_embd, cfg.n_head, cfg.n_layer
    F = cfg.n_inner or 4 * D
    sd = _state(hf_model)
    p = "transformer."
    w = next(iter(sd.values()))
    model = GPT2(cfg.vocab_size, D, H, L, F, cfg.n_positions, cfg.layer_norm_epsilon)
    model = model.to(device=w.device, dtype=w.dtype)
    new = {"tok.weight": sd[p + "wte.weight"], "pos.weight": sd[p + "wpe.weight"]}
    new["ln_f.weight"], new["ln_f.bias"] = sd[p + "ln_f.weight"], sd[p + "ln_f.bias"]
    for i in range(L):
        h, b = f"{p}h.{i}.", f"blocks.{i}."
        for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
            new[b + ours + ".weight"] = sd[h + theirs + ".weight"]
            new[b + ours + ".bias"] = sd[h + theirs + ".bias"]
        # Conv1D: weight (in, out), y = x @ W + b. c_attn's columns: queries, keys, values.
        w_qkv, b_qkv = sd[h + "attn.c_attn.weight"], sd[h + "attn.c_attn.bias"]  # (D, 3D), (3D,)
        for j, name in enumerate(("w_q", "w_k", "w_v")):
            new[f"{b}attn.{name}.weight"] = w_qkv[:, j * D : (j + 1) * D].T  # (D, D) as (out, in)
            new[f"{b}attn.{name}.bias"] = b_qkv[j * D : (j + 1) * D]
        for ours, theirs in (("attn.w_o", "attn.c_proj"), ("ff.linear1", "mlp.c_fc"),
                             ("ff.linear2", "mlp.c_proj")):  # fmt: skip
            new[f"{b}{ours}.weight"] = sd[f"{h}{theirs}.weight"].T
            new[f"{b}{ours}.bias"] = sd[f"{h}{theirs}.bias"]
    lm_head = sd.get("lm_head.weight")
    if lm_head is not None and not torch.equal(lm_head, new["tok.weight"]):
        raise NotImplementedError("GPT-2 with an output layer not tied to its embedding")
    model.load_state_dict({k: v.contiguous() for k, v in new.items()})
    return model.eval()


# ----------------------------------------------------------------------------- Llama family
def rotate_half_permutation(d_head: int) -> torch.Tensor:
    """The order of the features of one head that turns Hugging Face's "rotate_half" layout
    into adjacent pairs: ``perm[2i] = i``, ``perm[2i + 1] = i + d_head / 2``.

    In the halves layout, feature ``i`` is rotated with feature ``i + d/2`` by the angle
    ``p * base^(-2i/d)``; in the adjacent layout, feature ``2i`` with ``2i + 1`` by the same
    angle. So ``rope(x[..., perm]) == rotate_half_rope(x)[..., perm]``: reorder the rows of
    each head of ``W_q`` and ``W_k`` (``W[perm]``) and the course's rope computes the same
    rotated queries and keys, in another order, which ``q . k`` does not see.
    """
    half = d_head // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=-1).flatten()


def _permute_heads(t: torch.Tensor, n_heads: int, d_head: int) -> torch.Tensor:
    """Rows of ``t`` (``(n_heads * d_head, ...)``, a weight or a bias) reordered within each
    head by :func:`rotate_half_permutation`."""
    perm = rotate_half_permutation(d_head).to(t.device)
    heads = t.reshape(n_heads, d_head, *t.shape[1:])  # (H, d_head, ...)
    return heads[:, perm].reshape(t.shape)  # (H * d_head, ...)


def rope_base(cfg) -> float:
    """The rotary base (``rope_theta``) of a Llama-family configuration; only unscaled
    rotary positions are supported."""
    params = getattr(cfg, "rope_parameters", None) or {}
    scaling = getattr(cfg, "rope_scaling", None) or {}
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    kind = params.get("rope_type", kind) if params else kind
    if kind != "default":
        raise NotImplementedError(f"rotary scaling {kind!r} is not supported (only 'default')")
    theta = getattr(cfg, "rope_theta", None)
    return float(params.get("rope_theta", theta if theta is not None else 10000.0))


def from_llama(
    hf_model: nn.Module,
    *,
    norm: Callable[..., nn.Module] = RMSNorm,
    ff: Callable[..., nn.Module] = SwiGLU,
) -> ModernGPT:
    """A :class:`~attention_ref.modern.ModernGPT` with the weights of a ``transformers``
    model of the Llama family (``LlamaForCausalLM``, ``Qwen2ForCausalLM``,
    ``MistralForCausalLM``), on its device and in its dtype. ``norm`` and ``ff`` build the
    norms and the feed-forward networks (the learner's ``RMSNorm`` and ``SwiGLU`` may be
    passed: their parameters must be named ``weight`` and ``w_gate``, ``w_up``, ``w_down``).

    Mistral's sliding window is not modelled: the course's model is limited to
    ``max_len = sliding_window`` positions, where the two are the same.
    """
    cfg = hf_model.config
    if cfg.model_type not in LLAMA_FAMILY:
        raise ValueError(f"not a Llama-family model: model_type={cfg.model_type!r}")
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise NotImplementedError(f"activation {cfg.hidden_act!r}: only SiLU (SwiGLU)")
    D, H, L = cfg.hidden_size, cfg.num_attention_heads, cfg.num_hidden_layers
    G = getattr(cfg, "num_key_value_heads", None) or H
    dh = getattr(cfg, "head_dim", None) or D // H
    sd = _state(hf_model)
    p = "model.layers.0."
    bias = p + "self_attn.q_proj.bias" in sd
    out_bias = p + "self_attn.o_proj.bias" in sd
    if p + "mlp.gate_proj.bias" in sd:
        if ff is not SwiGLU:
            raise NotImplementedError("a feed-forward network with biases needs the reference")
        ff = lambda d_model, d_ff: SwiGLU(d_model, d_ff, bias=True)  # noqa: E731
    max_len = cfg.max_position_embeddings
    window = getattr(cfg, "sliding_window", None)
    if window and (cfg.model_type == "mistral" or getattr(cfg, "use_sliding_window", False)):
        max_len = min(max_len, window)
    tie = bool(getattr(cfg, "tie_word_embeddings", False))
    w = next(iter(sd.values()))
    model = ModernGPT(
        cfg.vocab_size, D, H, L, G, cfg.intermediate_size, max_len=max_len, eps=cfg.rms_norm_eps,
        base=rope_base(cfg), d_head=dh, bias=bias, out_bias=out_bias, tie=tie, embed_scale=1.0,
        norm=norm, ff=ff,
    )  # fmt: skip
    model = model.to(device=w.device, dtype=w.dtype)
    new = {"tok.weight": sd["model.embed_tokens.weight"], "norm_f.weight": sd["model.norm.weight"]}
    if not tie:
        new["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(L):
        h, b = f"model.layers.{i}.", f"blocks.{i}."
        new[b + "norm1.weight"] = sd[h + "input_layernorm.weight"]
        new[b + "norm2.weight"] = sd[h + "post_attention_layernorm.weight"]
        for ours, theirs, heads in (("w_q", "q_proj", H), ("w_k", "k_proj", G),
                                    ("w_v", "v_proj", None), ("w_o", "o_proj", None)):  # fmt: skip
            for kind in ("weight", "bias"):
                t = sd.get(f"{h}self_attn.{theirs}.{kind}")
                if t is None:
                    continue
                # Queries and keys: halves layout -> adjacent pairs, head by head.
                new[f"{b}attn.{ours}.{kind}"] = t if heads is None else _permute_heads(t, heads, dh)
        for ours, theirs in (("w_gate", "gate_proj"), ("w_up", "up_proj"), ("w_down", "down_proj")):
            for kind in ("weight", "bias"):
                if f"{h}mlp.{theirs}.{kind}" in sd:
                    new[f"{b}ff.{ours}.{kind}"] = sd[f"{h}mlp.{theirs}.{kind}"]
    # Every parameter comes from the checkpoint; buffers the learner's classes may keep
    # (an eps, cos/sin tables) keep the values their __init__ gave them.
    result = model.load_state_dict(new, strict=False)
    params = dict(model.named_parameters())
    missing = [k for k in result.missing_keys if k in params]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"the weights do not fit the model: parameters not loaded {missing}, unexpected "
            f"{result.unexpected_keys}"
        )
    return model.eval()


def from_hf(hf_model: nn.Module, **kwargs) -> nn.Module:
    """:func:`from_gpt2` or :func:`from_llama`, by the model's ``config.model_type``."""
    kind = hf_model.config.model_type
    if kind == "gpt2":
        return from_gpt2(hf_model)
    if kind in LLAMA_FAMILY:
        return from_llama(hf_model, **kwargs)
    raise NotImplementedError(f"model_type {kind!r}: only gpt2, {', '.join(LLAMA_FAMILY)}")


# ----------------------------------------------------------------------------- float64
def float64_internals(hf_model: nn.Module) -> nn.Module:
    """Make a Llama-family model of ``transformers`` compute *everything* in its own dtype.

    Its RMSNorm casts to float32 and its rotary embedding computes the angles, cosines and
    sines in float32 whatever the model's dtype (sensible for float16 and bfloat16), so in
    float64 its logits carry float32 rounding errors (about 1e-7 relative). This replaces,
    on this model's instances only, those two computations by the same equations in the
    model's dtype, so that float64 logits can be compared to float64 precision. Returns the
    model.
    """
    cfg = hf_model.config
    dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    base = rope_base(cfg)
    for module in hf_model.modules():
        name = type(module).__name__
        if name.endswith("RMSNorm"):
            module.forward = _rms_forward(module)
        elif name.endswith("RotaryEmbedding"):
            module.forward = _rotary_forward(base, dh)
    return hf_model


def _rms_forward(module: nn.Module):
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6))

    def forward(x: torch.Tensor) -> torch.Tensor:
        return module.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    return forward


def _rotary_forward(base: float, d_head: int):
    def forward(x: torch.Tensor, position_ids: torch.Tensor):
        two_i = torch.arange(0, d_head, 2, dtype=x.dtype, device=x.device)
        inv_freq = 1.0 / base ** (two_i / d_head)  # (d/2,)
        angles = position_ids.to(x.dtype)[..., None] * inv_freq  # (B, T, d/2)
        angles = torch.cat([angles, angles], dim=-1)  # (B, T, d): the halves layout
        return angles.cos(), angles.sin()

    return forward


# ----------------------------------------------------------------------------- small models
#: The architectures :func:`tiny_hf_model` builds, and the configuration class of each.
TINY_KINDS = ("gpt2", "llama", "qwen2", "mistral")


def tiny_hf_model(kind: str, seed: int = 0, vocab_size: int = 97, max_len: int = 64):
    """A small ``transformers`` causal LM of the architecture ``kind`` (``"gpt2"``,
    ``"llama"``, ``"qwen2"`` or ``"mistral"``) built from a configuration, with seeded random
    weights: every matrix ``N(0, 1/fan_in)``, every norm weight and bias ``N(default, 0.3^2)``
    (the defaults, ones and zeros, would hide a misplaced norm or bias). Nothing is
    downloaded. d_model 32, 2 layers, 4 query heads (2 key/value heads for Llama and Qwen2,
    1 for Mistral), in float32 and eval mode.
    """
    import transformers as tf

    common = dict(vocab_size=vocab_size, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    llama = dict(hidden_size=32, intermediate_size=72, num_hidden_layers=2,
                 num_attention_heads=4, max_position_embeddings=max_len)  # fmt: skip
    configs = {
        "gpt2": lambda: tf.GPT2Config(
            n_positions=max_len, n_embd=32, n_layer=2, n_head=4, **common
        ),  # fmt: skip
        "llama": lambda: tf.LlamaConfig(num_key_value_heads=2, **llama, **common),
        # Qwen2: biases on q, k and v; a larger rotary base; the output layer tied.
        "qwen2": lambda: tf.Qwen2Config(
            num_key_value_heads=2, rope_theta=1e6, tie_word_embeddings=True, **llama, **common
        ),  # fmt: skip
        "mistral": lambda: tf.MistralConfig(
            num_key_value_heads=1, sliding_window=max_len, **llama, **common
        ),  # fmt: skip
    }
    if kind not in configs:
        raise ValueError(f"kind must be one of {TINY_KINDS}; got {kind!r}")
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(configs[kind]())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
                continue
            conv1d = kind == "gpt2" and (".attn." in name or ".mlp." in name)  # (in, out)
            fan_in = p.shape[0] if conv1d else p.shape[-1]
            p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)
    return model.eval()


# ----------------------------------------------------------------------------- the hub
def hub_reachable(host: str = "huggingface.co", timeout: float = 2.0) -> bool:
    """Whether a real checkpoint could be downloaded now: False at once when
    ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` is set or nbgrader is autograding, else
    whether a TCP connection to ``host:443`` opens within ``timeout`` seconds (name lookup
    included: the attempt runs in a thread that is given up after ``timeout``)."""
    import os
    import socket
    import threading

    from .training import under_autograde

    if under_autograde() or any(
        os.environ.get(v, "").lower() in ("1", "true", "yes")
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    ):
        return False
    result: list[bool] = []

    def attempt() -> None:
        try:
            socket.create_connection((host, 443), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout)
    return bool(result and result[0])


# ----------------------------------------------------------------------------- benchmark
@dataclass
class ConversionResult:
    """What :func:`bench_convert` measured, for ``python -m attention_ref.bench apps``."""

    metric: str
    value: float
    train_seconds: float
    diffs: dict[str, float]
    greedy_equal: dict[str, bool]

    def extras(self) -> str:
        parts = [f"{k}={v:.1e}" for k, v in self.diffs.items()]
        same = sum(self.greedy_equal.values())
        parts.append(f"greedy32_equal={same}/{len(self.greedy_equal)}")
        ok = self.value <= 1e-5 and all(
            v <= 1e-10 for k, v in self.diffs.items() if k.endswith("_f64")
        )
        parts.append(f"targets_met={ok and same == len(self.greedy_equal)}")
        return " ".join(parts)


def bench_convert(seed: int = 1) -> ConversionResult:
    """Every architecture of :data:`TINY_KINDS`, converted: the worst max |logit
    difference| over batches of 1, 7 and 33 tokens and a batch padded on the right and on the
    left, in float32 and (transformers' float32 internals made float64) in float64; and
    whether 32 greedy tokens with the course's KV cache equal ``generate(do_sample=False)``.
    ``value``: the worst float32 difference."""
    import time

    from .sampling import generate

    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(seed)
    batches = [(torch.randint(0, 97, (3, T), generator=g), None) for T in (1, 7, 33)]
    ids = torch.randint(0, 97, (3, 12), generator=g)
    right = torch.ones(3, 12, dtype=torch.long)
    right[0, 8:] = 0
    right[2, 3:] = 0
    batches += [(ids, right), (ids, right.flip(1))]
    prompt = torch.randint(0, 97, (2, 5), generator=g)
    diffs, greedy = {}, {}
    for kind in TINY_KINDS:
        for dtype, tag in ((torch.float32, "f32"), (torch.float64, "f64")):
            hf = tiny_hf_model(kind, seed=seed).to(dtype)
            if dtype == torch.float64 and kind != "gpt2":
                float64_internals(hf)
            ours = from_hf(hf)
            diffs[f"{kind}_{tag}"] = max(max_logit_difference(ours, hf, i, m) for i, m in batches)
            if dtype == torch.float32:
                mask = torch.ones_like(prompt)
                with torch.no_grad():
                    theirs = hf.generate(
                        prompt, attention_mask=mask, max_new_tokens=32, do_sample=False,
                        pad_token_id=0,
                    )  # fmt: skip
                    greedy[kind] = torch.equal(generate(ours, prompt, 32, temperature=0), theirs)
    worst = max(v for k, v in diffs.items() if k.endswith("_f32"))
    return ConversionResult(
        "max_logit_diff_float32", worst, time.perf_counter() - t0, diffs, greedy
    )


# ----------------------------------------------------------------------------- checking
def max_logit_difference(ours: nn.Module, theirs: nn.Module, ids: torch.Tensor,
                         attention_mask: torch.Tensor | None = None) -> float:  # fmt: skip
    """``max |logits_ours - logits_theirs|`` over the real tokens of ``ids (B, T)``
    (``attention_mask`` ``(B, T)``, 1 = real token; None: all real)."""
    with torch.no_grad():
        a = ours(ids, attention_mask=attention_mask)  # (B, T, V)
        b = theirs(input_ids=ids, attention_mask=attention_mask).logits  # (B, T, V)
    real = (
        torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    )
    return float((a - b)[real].abs().max())


__all__ = [
    "GPT2",
    "GELUFeedForward",
    "from_gpt2",
    "from_llama",
    "from_hf",
    "rotate_half_permutation",
    "rope_base",
    "float64_internals",
    "max_logit_difference",
    "tiny_hf_model",
    "hub_reachable",
    "bench_convert",
    "TINY_KINDS",
]
