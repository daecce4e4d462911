"""Every mistake the checks can name, each with a stable id, its message and its hint.

A check names a mistake by id (``ctx.fail(..., mistake="scale_missing")``,
``Mistake.of("scale_missing", model=...)``); the feedback gives the message and the hint
worded here, and ends with a line ``[mistake: scale_missing]`` that the class report
reads and a learner can ignore. Reword a message here and every check that names it
follows. Ids are a public API (instructors count mistakes by them): never rename one;
retire it and add a new one instead.

A message may hold ``{placeholders}``, filled by the check (``named(id, axis=0)``). An
entry whose message is empty tags a failure that the feedback's first line already
describes (a wrong shape, an exception): the id is printed, no "Likely mistake" line.
"""

from __future__ import annotations


class Named(str):
    """A named mistake's message (a ``str``, so it reads as one wherever a message goes)
    that carries its stable ``id`` and its ``hint``."""

    id: str
    hint: str

    def __new__(cls, id: str, message: str, hint: str = "") -> Named:  # noqa: A002
        self = super().__new__(cls, message)
        self.id = id
        self.hint = hint
        return self

    def __reduce__(self):
        return Named, (self.id, str(self), self.hint)


#: One row per mistake, grouped by where it is made: ``[id] message`` (empty for a tag),
#: then ``hint: ...``; a line that starts with spaces continues the line above (joined with
#: one space).
_TABLE = """
# --- every exercise: failures the first line of the feedback already describes
[wrong_values]
[parametrization_not_settable]
  hint: use a parametrization with a right_inverse (e.g. weight_norm), or a plain
    nn.Linear for the check.
[lazy_not_initialised]
  hint: declare the layers with their sizes (nn.Linear(in_features, out_features)) or
    make sure forward uses every layer.
[mask_not_boolean]
  hint: a comparison such as `{comparison}` already gives a bool tensor; or pass
    dtype=torch.bool.
[parameter_names]
[unexpected_parameters]
  hint: declare exactly the parts of the exercise ({parts}); anything else is left at a
    random value and changes the output.
[raw_parameter]
[no_value_error]
  hint: start with: if {condition}: raise ValueError(f"{message}")
[value_error_vague]
  hint: e.g. ValueError(f"d_model must be even; got d_model={d_model}")
[pad_id_not_stored]
  hint: self.pad_id = pad_id in __init__.
[wrong_type]
[wrong_default]
[wrong_shape]
[wrong_dtype]
  hint: keep the result in the dtype the spec asks for (the inputs', unless it says otherwise):
    create tensors with dtype=x.dtype, torch.zeros_like(x) or x.new_zeros(...), and cast a
    result computed in another dtype back with .to(x.dtype), x being an input tensor (the
    logits, q, ...).
[wrong_device] a tensor is built on the CPU, not on the inputs' device.
  hint: build every tensor on the inputs' device: torch.arange(n, device=x.device),
    x.new_zeros(...), torch.zeros_like(x); a tensor made without device= is on the CPU, and
    on a GPU it cannot meet the inputs.
[not_a_tuple]
[input_modified]
  hint: use out-of-place operations (x = x - m, masked_fill rather than masked_fill_) so
    the caller's tensors are left untouched.
[code_raised]
[not_implemented]
  hint: replace `raise NotImplementedError()` with your code.
[reference_used]
  hint: write the computation yourself; the point of the exercise is to see every step.
    (Calling your own earlier functions is fine.)
[not_a_module_class]
[not_a_function]
[check_timed_out]
[check_could_not_finish]
[check_not_in_source]
  hint: a graded test cell runs the checks its source (the instructor's) makes, in order.
[kernel_stopped_answering]
  hint: under grading, the check runs outside your notebook and calls your code in it; your
    notebook's kernel stopped answering it (it died, hung or closed the connection).

# --- every exercise: recognised from an exception's line and message
[batched_dot_t] K.T reverses all axes of a batched array, not just the last two.
  hint: swap only the last two axes: np.swapaxes(K, -1, -2) in NumPy, k.transpose(-2, -1) (or
    k.mT) in PyTorch.
[view_non_contiguous] view() on a transposed (non-contiguous) tensor.
  hint: use .reshape(...) or .contiguous().view(...) after a transpose.
[dtypes_mixed] tensors of different dtypes are mixed (float32 with float64).
  hint: create new tensors with dtype=x.dtype (and device=x.device), e.g. torch.zeros_like(x) or
    x.new_zeros(...).
[linear_weight_transposed] x @ self.w_q.weight multiplies by the transposed matrix: nn.Linear
    stores its weight as (out_features, in_features).
  hint: call the layer, self.w_q(x), or write x @ self.w_q.weight.T.

# --- every exercise: recognised from the values (float64 inputs)
[precision_loss] precision loss: your result is right to float32 precision (about 7 significant
    digits) but not to float64 precision: part of the computation runs in float32 although the
    inputs are float64 (a .float(), dtype=torch.float32, or a tensor created without dtype=
    somewhere).
  hint: keep every step in the input's dtype: create tensors with dtype=x.dtype (or
    torch.zeros_like / x.new_zeros) and do not cast to float32 on the way.
[epsilon_in_denominator] a small constant in a denominator (e.g. sum + 1e-6): every value is
    smaller than the exact one by about the same tiny factor, which float32 rounding (errors of
    either sign) would not do.
  hint: drop the epsilon: once the maximum is subtracted, a softmax's sum includes exp(0) = 1,
    so it is never 0 (a fully masked row is the one case to handle, and not with an epsilon).
[rows_not_normalised] the weights of row {row} sum to {total}, not {want}: each row of weights
    is a softmax over the keys the query may attend to.

# --- every exercise (check framework)
[nan_or_inf] an exponential overflowed, or a row with no allowed position divided 0 by 0.
  hint: subtract the row maximum before exp; give fully masked rows zero weights explicitly.
[infinite_loop] a loop whose condition never becomes false (a while loop whose variable is never
    updated, an index that is never advanced), recursion that never reaches its base case, or
    code far slower than it needs to be (a Python loop over every element where a tensor
    operation would do).
  hint: on these small inputs a correct answer takes well under a second; each call of
    your code in a check may take at most {limit} (set {env} to change it).

# --- 01 softmax and dot-product attention
[mask_not_applied_before_softmax] the mask is not applied before the softmax.
  hint: fill masked scores with -inf before the softmax.
[scale_missing] the scores are not scaled by 1/sqrt(d_k).
  hint: divide q @ k^T by math.sqrt(d_k), where d_k = q.shape[-1].
[scale_by_d_k] the scores are divided by d_k instead of sqrt(d_k).
  hint: the scale is 1/sqrt(d_k): math.sqrt(q.shape[-1]).
[scale_by_d_v] the scores are scaled by the wrong dimension (sqrt(d_v), from v).
  hint: d_k is the last dimension of q and k, not of v.
[scale_by_n_k] the scores are scaled by the wrong dimension (sqrt(n_k), the number of keys).
  hint: use d_k = q.shape[-1], the size of each query vector.
[softmax_over_queries] softmax over the wrong axis: the weights are normalised over the queries
    (axis -2) instead of the keys (axis -1).
  hint: each query's weights over the keys must sum to 1: softmax along the last axis.
[mask_after_softmax_weights] the mask is applied after the softmax, so the weights no longer sum
    to 1.
  hint: fill the masked scores with -inf before the softmax.
[mask_multiplied_weights] the scores are multiplied by the mask instead of being filled, so
    masked positions still get weight.
  hint: masked_fill(~mask, float('-inf')) (or np.where) before the softmax.
[mask_ignored] the mask is ignored.
  hint: apply the mask to the scores before the softmax.
[fully_masked_row_uniform_fill] a fully masked row gets uniform weights: filling with a large
    negative number (-1e9) makes every masked score equal, so softmax spreads the weight evenly
    instead of giving zeros.
  hint: after the softmax, set the weights of rows with no allowed key to 0 (e.g.
    torch.where(mask.any(-1, keepdim=True), w, 0)).
[additive_mask_full_row] an additive mask (scores + (1 - mask) * -1e10, the convention of much
    published code): on a row where every key is masked, every score gets the same constant, and
    softmax ignores a constant shift, so the row attends as if there were no mask (zeros are
    required).
  hint: an additive mask is fine where a query has at least one allowed key; rows with no
    allowed key must still get zero weights: torch.where(mask.any(dim, keepdim=True), w, 0).
[mask_inverted] the mask is inverted: True must mean 'may attend'.
  hint: keep the scores where the mask is True and fill where it is False (~mask).
[outputs_swapped] returned (weights, out) instead of (out, weights).
[softmax_axis_ignored] the axis argument is ignored: the softmax is always taken over the last
    axis.
  hint: pass axis=axis to np.max and np.sum.
[softmax_wrong_axis] softmax over the wrong axis (axis 0).
  hint: normalise along the given axis: np.max(x, axis=axis, keepdims=True), and the same for
    np.sum.
[softmax_global_sum] the sum is taken over the whole array rather than along axis, so the
    entries of each slice do not sum to 1.
  hint: np.sum(e, axis=axis, keepdims=True).
[keepdims_missing] keepdims=True is missing, so the max or the sum broadcasts along the wrong
    axis.
  hint: np.max(x, axis=axis, keepdims=True) keeps a size-1 axis that broadcasts correctly.
[mask_not_applied] the mask is not applied, or applied with the wrong convention.
[softmax_unstable] softmax is not numerically stable: np.exp overflows for large inputs (or
    underflows to 0/0 when the maximum is taken over the whole array).
  hint: subtract np.max(x, axis=axis, keepdims=True) before np.exp; the result is unchanged
    mathematically.
[scale_float32] the scale sqrt(d_k) is computed in float32 (torch.tensor(d_k,
    dtype=torch.float32), or torch.tensor(float(d_k)), whose default dtype is float32) and
    divides float64 scores: the result is float64, but only as exact as float32's rounding of
    sqrt(d_k) (about 7 significant digits).
  hint: compute the scale in q's dtype: math.sqrt(d_k) (a Python float), or
    torch.sqrt(torch.tensor(d_k, dtype=q.dtype, device=q.device)).
[softmax_shift_not_max] the scores are shifted by something other than their maximum (the
    row's minimum or mean): on a row whose values lie far apart, x - min (or x - mean) still
    leaves an exponent above exp's range (709.8 in float64, 88.7 in float32), so np.exp
    overflows to inf and inf / inf is NaN.
  hint: subtract the maximum, np.max(x, axis=axis, keepdims=True): then every exponent is at
    most 0, and the largest is exactly exp(0) = 1.
[outputs_swapped_order] returned (weights, out) instead of (out, weights).
  hint: end with `return out, weights`.
[mask_inverted_nan_rows] the mask is inverted: True must mean 'may attend'. Filling where the
    mask is True leaves those queries no key at all, and softmax of a row that is all -inf is
    NaN.
  hint: keep the scores where the mask is True and fill where it is False (np.where(mask,
    scores, -np.inf), or masked_fill(~mask, ...)).

# --- 02 masking
[masked_softmax_mask_not_applied] the mask is not applied to the scores before the softmax.
[mask_transposed] the mask is transposed: rows must be the batch, columns the positions.
[padding_mask_inverted] the mask is inverted: it is True at the padding, but True must mark the
    real tokens (the positions that may be attended).
  hint: use positions < lengths, not >=.
[padding_mask_off_by_one_long] off by one: the mask includes the first padding position (<=
    instead of <).
  hint: position t is real when t < length (positions start at 0).
[padding_mask_off_by_one_short] off by one: the last real token is masked out (are positions
    counted from 1?).
  hint: positions start at 0, so position t is real when t < length.
[causal_mask_inverted] the mask is inverted: it is True for the future, but True must mean 'may
    attend' (key j <= query i).
  hint: use torch.tril, not ~tril.
[causal_mask_triu] the mask lets each query see the future, not the past (triu instead of tril).
  hint: row i is the query: True where column j <= i, i.e. torch.tril.
[causal_mask_no_diagonal] off by one: a query may not attend to itself (the diagonal is masked).
  hint: the diagonal (j == i) must be True: torch.tril(..., diagonal=0).
[causal_mask_diagonal_1] off by one: each query also sees the next token (diagonal=1).
  hint: use the default diagonal=0.
[fully_masked_row_nan] softmax of a row that is all -inf divides 0 by 0.
  hint: give rows with no allowed position zero weights explicitly, e.g.
    torch.where(mask.any(dim, keepdim=True), weights, 0).
[mask_after_softmax] the mask is applied after the softmax (weights * mask), so the weights no
    longer sum to 1.
  hint: fill the masked scores with -inf before the softmax.
[mask_multiplied] the scores are multiplied by the mask instead of being filled.
  hint: masked_fill(~mask, float('-inf')) before the softmax.
[softmax_dim_ignored] the softmax is taken over the wrong dimension (dim is ignored).
  hint: pass dim=dim to the softmax, the max and the sum.
[dead_rows_found_along_last_dim] the rows with no allowed position are found along the last
    dimension (mask.any(-1)), not along dim: with dim=0 a fully masked column still comes out
    NaN.
  hint: look for them along the softmax's dimension: mask.any(dim=dim, keepdim=True).
[fully_masked_row_uniform] a fully masked row gets uniform weights instead of zeros: every score
    of the row became the same large negative number (masked_fill(~mask, -1e9), the 0/1-mask
    idiom scores * mask - 1e9 * (1 - mask), or, in float32, an additive mask whose constant
    swamps the scores).
  hint: set rows with no allowed position to 0 after the softmax, e.g. torch.where(mask.any(dim,
    keepdim=True), weights, 0).

# --- 03 self-attention
[sa_extra_w_o] this exercise has no output projection (W_O comes in notebook 04): out is weights
    @ v.
[sa_values_from_w_k] the values are computed with w_k or w_q (copy-paste): v must be
    self.w_v(x), which has d_v outputs.
[queries_keys_swapped] queries and keys are swapped: the scores are K Q^T instead of Q K^T, so
    the score matrix is transposed (row i should be query i).
  hint: scores = q @ k.transpose(-2, -1) with q = self.w_q(x) and k = self.w_k(x).
[keys_from_w_q] the keys are computed with w_q (copy-paste): k must be self.w_k(x).
  hint: q = self.w_q(x), k = self.w_k(x), v = self.w_v(x): three different projections.
[queries_from_w_k] the queries are computed with w_k (copy-paste): q must be self.w_q(x).
  hint: q = self.w_q(x), k = self.w_k(x), v = self.w_v(x): three different projections.
[scale_by_d_in] the scores are scaled by sqrt(d_in), the input width, instead of sqrt(d_k).
  hint: d_k is the size of each query and key vector: q.shape[-1] (or self.d_k).
[weights_times_x] the weights multiply x instead of the values V = w_v(x).
  hint: out = weights @ v with v = self.w_v(x).
[values_from_w_k] the values are computed with w_k (copy-paste): v must be self.w_v(x).
  hint: q = self.w_q(x), k = self.w_k(x), v = self.w_v(x): three different projections.
[causal_mask_by_default] a causal mask is applied although no mask was given: self-attention
    lets every token see every other token unless a mask says otherwise.
  hint: apply a mask only when mask is not None.
[parametrization_changes_weight] the parametrization constrains or changes the weight (or has a
    right_inverse that does not invert it); this exercise's weights are free.
  hint: remove the parametrization from {name}, or give it a right_inverse that
    inverts it exactly.
[linear_in_out_swapped] the in and out sizes of the nn.Linear are swapped: nn.Linear(in, out)
    maps `in` features to `out` features.
[bias_by_default] nn.Linear adds a bias by default; pass bias=False.
[bias_argument_ignored] the bias argument is ignored: pass bias=bias to every nn.Linear.
[position_dependent] the output depends on the tokens' positions: a mask applied by default, a
    positional term, or mixing up the token and batch axes.
  hint: with mask=None every token may attend to every token; nothing in self-attention knows
    the order of the tokens.

# --- 04 multi-head attention
[mask_not_applied_heads] the mask is not applied to every head before the softmax.
  hint: fill masked scores with -inf before the softmax.
[split_heads_not_moved] the last dimension is split into heads, but the heads are not moved in
    front of the tokens.
  hint: add .transpose(1, 2): (B, T, H, D/H) -> (B, H, T, D/H).
[split_heads_folded] batch and heads are folded into one dimension (B*H, T, D/H).
  hint: keep them separate: the result is (B, H, T, D/H).
[split_heads_last_axes_swapped] the last two axes are swapped: the result is (B, H, D/H, T).
  hint: x.view(B, T, H, D // H).transpose(1, 2) moves only axes 1 and 2.
[merge_heads_not_flattened] the heads are moved back but not flattened into one feature axis.
  hint: reshape the result to (B, T, H * d_head).
[merge_heads_wrong_axes] the wrong axes are flattened together.
  hint: the heads join the features: (B, T, H, d_head) -> (B, T, H * d_head).
[mha_shared_head_projection] a d_head x d_head projection shared by all heads is the
    non-standard variant: each projection maps all d_model features to all d_model features
    (every head sees the whole input), so it is ({D}, {D}), not ({dh}, {dh}).
[mha_w_o_missing] W_O is missing: multi-head attention ends with an output projection that mixes
    the heads.
[assert_instead_of_value_error] an assert (AssertionError) or an error from a later line instead
    of an explicit check.
  hint: check d_model % n_heads first and raise ValueError with a clear message.
[mha_split_view] split_heads: `view` without `transpose`: x.view(B, H, T, D/H) (or reshape)
    keeps the memory order (B, T, H, D/H), so each 'head' gets a jumble of several tokens'
    features.
  hint: split the last dimension first, then move the heads forward: x.view(B, T, H, D //
    H).transpose(1, 2).
[mha_merge_without_transpose] merge_heads: the heads are merged without moving them back next to
    the features: x.reshape(B, T, H*d_head) straight from (B, H, T, d_head) mixes tokens.
  hint: x.transpose(1, 2).reshape(B, T, H * d_head).
[mha_split_interleaved] split_heads: the features are interleaved: head h gets every H-th
    feature (x.view(B, T, D/H, H)) instead of the contiguous block h*D/H .. (h+1)*D/H - 1.
  hint: view the last dimension as (H, D // H), heads first: x.view(B, T, H, D // H).
[mha_merge_wrong_order] merge_heads: the heads are merged in the wrong order: the features come
    out interleaved (feature i of every head, then feature i+1 ...) instead of head 0's block,
    then head 1's block, ...
  hint: put the head axis right before the feature axis, (B, T, H, d_head), then flatten the
    last two: x.transpose(1, 2).reshape(B, T, H * d_head).
[w_o_not_applied] W_O is not applied: the merged heads must go through the output projection.
  hint: return self.w_o(merge_heads(out)), weights.
[scale_missing_head] the scores are not scaled by 1/sqrt(d_head).
  hint: divide q @ k^T by math.sqrt(d_head), d_head = d_model // n_heads.
[queries_keys_swapped_heads] queries and keys are swapped: the scores are K Q^T.
  hint: q = split_heads(self.w_q(query)), k = split_heads(self.w_k(key)), scores = q @
    k.transpose(-2, -1).
[scale_by_d_model] the scores are scaled by sqrt(d_model) instead of sqrt(d_head): each head
    works with d_head = d_model // n_heads features.
  hint: divide by math.sqrt(self.d_model // self.n_heads) (the size of one head's queries,
    q.shape[-1] after split_heads).
[softmax_over_queries_heads] softmax over the wrong axis: the weights are normalised over the
    queries.
  hint: softmax along the last axis (the keys).
[values_from_key] the values are projected from `key` instead of `value`.
  hint: v = self.w_v(value): keys and values are separate inputs.
[mask_inverted_heads] the mask is inverted: True must mean 'may attend'.
  hint: fill the scores where the mask is False (~mask). (nn.MultiheadAttention's
    key_padding_mask and boolean attn_mask mean the opposite: True = blocked.)
[mask_ignored_heads] the mask is ignored.
  hint: apply the mask to the scores of every head before the softmax.
[fully_masked_row_uniform_heads] a fully masked row gets uniform weights: filling with a large
    negative number (-1e9) makes every masked score equal, so softmax spreads the weight evenly
    instead of giving zeros.
  hint: give rows with no allowed key zero weights (e.g. reuse masked_softmax from notebook 02).
[mask_repeat_wrong_order] the mask is repeated for the heads in the wrong order: mask.repeat(H,
    1, 1) puts the copies head-major, so .view(B, H, ...) gives batch element b the masks of
    other batch elements.
  hint: mask.unsqueeze(1) broadcasts over the heads with no copy; if you repeat, use
    mask.repeat_interleave(H, dim=0).
[split_view_without_transpose] `view` without `transpose`: x.view(B, H, T, D/H) (or reshape)
    keeps the memory order (B, T, H, D/H), so each 'head' gets a jumble of several tokens'
    features.
  hint: split the last dimension first, then move the heads forward: x.view(B, T, H, D //
    H).transpose(1, 2).
[split_interleaved] the features are interleaved: head h gets every H-th feature (x.view(B, T,
    D/H, H)) instead of the contiguous block h*D/H .. (h+1)*D/H - 1.
  hint: view the last dimension as (H, D // H), heads first: x.view(B, T, H, D // H).
[merge_without_transpose] the heads are merged without moving them back next to the features:
    x.reshape(B, T, H*d_head) straight from (B, H, T, d_head) mixes tokens.
  hint: x.transpose(1, 2).reshape(B, T, H * d_head).
[merge_wrong_order] the heads are merged in the wrong order: the features come out interleaved
    (feature i of every head, then feature i+1 ...) instead of head 0's block, then head 1's
    block, ...
  hint: put the head axis right before the feature axis, (B, T, H, d_head), then flatten the
    last two: x.transpose(1, 2).reshape(B, T, H * d_head).
[mask_no_head_axis] the (B, n_q, n_k) mask is not given a head axis, so it broadcasts against
    (B, H, n_q, n_k) with its batch axis lined up with the heads.
  hint: mask = mask.unsqueeze(1): (B, n_q, n_k) -> (B, 1, n_q, n_k), the same mask for every
    head.
[heads_not_merged] the heads are not merged: use merge_heads, then W_O.
[tokens_mixed_in_heads] tokens are mixed up when splitting or merging heads (a view without a
    transpose), or the keys and values are paired wrongly.
[weights_averaged_over_heads] the weights are averaged over the heads (or there is only one
    map).
  hint: return the weights of every head, (B, H, n_q, n_k); (nn.MultiheadAttention averages them
    unless average_attn_weights=False).
[batch_heads_folded] batch and heads are folded into one axis (B*H, n_q, n_k).
  hint: keep them separate: (B, H, n_q, n_k).
[keys_from_query] the keys are projected from `query` instead of `key`.
  hint: k = self.w_k(key), v = self.w_v(value).

# --- 05 positional encoding
[rope_not_rotated] the pairs are not rotated: each pair (x[2i], x[2i+1]) must be multiplied by
    the rotation [[cos, -sin], [sin, cos]] of its own angle.
  hint: rotations compose: R(m)^T R(n) = R(n - m), which is what makes the score relative.
[pe_swapped] sin and cos are swapped: the even columns hold cosines and the odd columns sines.
  hint: PE[p, 2i] = sin(...) and PE[p, 2i+1] = cos(...); row 0 must be (0, 1, 0, 1, ...).
[pe_half_exponent] the frequency exponent is i/d instead of 2i/d (i counts the pairs, so the
    exponent must use 2i, the even column index).
  hint: with i = 0 .. d/2 - 1 the exponent is 2*i/d; or loop over the even columns 0, 2, 4, ...
    and use column/d.
[pe_column_exponent] the exponent uses each column's own index j (j/d), so the cos of a pair
    gets a different frequency from its sin; both columns 2i and 2i+1 must use 2i/d.
  hint: compute one frequency per pair, from the even column index 2i, and use it for both the
    sin and the cos.
[pe_from_one] positions are counted from 1: the first row must be position 0 (sin 0 = 0, cos 0 =
    1).
  hint: use torch.arange(n_positions) for the positions.
[pe_concat] the sines and cosines are concatenated as two halves [sin | cos] instead of
    interleaved (sin in the even columns, cos in the odd ones).
  hint: write pe[:, 0::2] = sin and pe[:, 1::2] = cos, or torch.stack([sin, cos], -1) and then
    flatten the last two dimensions.
[pe_half_layout_t2t] the [sin | cos] half layout of tensor2tensor and fairseq: all sines, then
    all cosines, with the frequencies 10000^(-i/(d/2 - 1)) instead of 10000^(-2i/d). It is a
    valid encoding, but not this exercise's (nor the paper's).
  hint: interleave the pairs, pe[:, 0::2] = sin and pe[:, 1::2] = cos, with the angle p *
    10000^(-2i/d) for pair i = 0 .. d/2 - 1.
[pe_multiplied] the position is multiplied by 10000^(2i/d) instead of divided by it, so the
    frequencies grow instead of shrinking.
  hint: the angle is p / 10000^(2i/d) = p * 10000^(-2i/d).
[pe_int_division] integer division: the exponent 2i/d was computed with // (or on integers), so
    it is 0 and every frequency is 1.
  hint: use true division on floats, e.g. torch.arange(0, d_model, 2) / d_model.
[rope_reversed] the rotation goes the opposite direction: the sign of sin is flipped.
  hint: out[2i] = x[2i] cos - x[2i+1] sin and out[2i+1] = x[2i] sin + x[2i+1] cos.
[rope_swapped] sin and cos are swapped in the rotation.
  hint: out[2i] = x[2i] * cos(theta) - x[2i+1] * sin(theta); cos multiplies the feature itself.
[rope_rotate_half] the features are paired as (i, i + d/2) (the 'rotate_half' layout of
    GPT-NeoX/LLaMA code) instead of consecutive pairs (2i, 2i+1).
  hint: take x[..., 0::2] and x[..., 1::2] as the two members of each pair, and write the
    results back to the same places.
[rope_concat] the rotated pairs are concatenated as two halves [even | odd] instead of being
    written back in place (interleaved).
  hint: torch.stack([out_even, out_odd], dim=-1).flatten(-2) puts each pair back at 2i, 2i+1.
[rope_overwritten] the even features are overwritten before the odd ones are computed, so
    out[2i+1] uses the rotated out[2i] instead of the original x[2i].
  hint: compute both outputs from the original x[2i] and x[2i+1] (keep copies, or build new
    tensors).
[rope_half_exponent] the frequency exponent is i/d instead of 2i/d.
  hint: the angle of pair i is p * base^(-2i/d), i = 0 .. d/2 - 1.
[rope_half_layout_t2t] the [sin | cos] half layout of tensor2tensor and fairseq: all sines, then
    all cosines, with the frequencies 10000^(-i/(d/2 - 1)) instead of 10000^(-2i/d). It is a
    valid encoding, but not this exercise's (nor the paper's).
  hint: interleave the pairs, pe[:, 0::2] = sin and pe[:, 1::2] = cos, with the angle p *
    10000^(-2i/d) for pair i = 0 .. d/2 - 1.
[rope_multiplied] the position is multiplied by base^(2i/d) instead of divided by it.
  hint: the angle of pair i is p / base^(2i/d) = p * base^(-2i/d).
[rope_ignores_positions] the positions argument is ignored: the angles always use 0 .. T-1.
  hint: use torch.arange(T) only when positions is None; otherwise use the positions you were
    given.
[rope_from_one] positions are counted from 1: by default the first vector is at position 0,
    where the rotation is the identity.
  hint: default to torch.arange(T).
[rope_added] the sinusoidal encoding is added to x instead of rotating each pair.
  hint: RoPE multiplies: each pair (x[2i], x[2i+1]) is rotated by the angle p * w_i.
[rope_fixed_base] the base argument is ignored: 10000 is used whatever base was passed (as
    GPT-J's code hard-codes it).
  hint: w_i = base ** (-2i/d) with the base you were given.
[rope_partial] only some of the features are rotated and the rest pass through unchanged (partial
    rotary, GPT-NeoX's rotary_pct): the spec rotates every pair.
  hint: rotate all d/2 pairs (x[2i], x[2i+1]), i = 0 .. d/2 - 1, with w_i = base^(-2i/d).
[rope_llama3_scaling] the frequencies are rescaled as in Llama 3.1 (the slow ones divided by 8,
    blended between the wavelengths 2048 and 8192): a long-context extension, not this
    exercise's rope.
  hint: use w_i = base^(-2i/d) unchanged.
[pe_sin_cos_half] the [sin | cos] half layout: the first d/2 columns hold sines and the last d/2
    their cosines (as some codebases lay it out), and the frequencies are not 10000^(-2i/d)
    either.
  hint: interleave the pairs, pe[:, 0::2] = sin and pe[:, 1::2] = cos, with the angle p *
    10000^(-2i/d) for pair i = 0 .. d/2 - 1.

# --- 06 the encoder block
[built_without_bias] the layer is built with bias=False.
[residual_missing_attention] there is no residual connection around the self-attention sublayer.
  hint: add the sublayer's input back: x + dropout1(attention output){then}
[residual_missing_ff] there is no residual connection around the feed-forward sublayer.
  hint: add the sublayer's input back: x + dropout2(ff(...)){then}
[residual_missing] there are no residual connections: each sublayer's input must be added back
    to its output.
  hint: x + sublayer(x) around both the attention and the feed-forward network.
[norms_swapped] norm1 and norm2 are swapped: norm1 belongs to the attention sublayer, norm2 to
    the feed-forward sublayer.
  hint: use norm1 with self_attn and norm2 with ff.
[norms_never_applied] the layer norms are never applied.
  hint: each sublayer has its LayerNorm: norm1 around self_attn, norm2 around ff.
[ff_given_layer_input] the feed-forward network is given the layer's input x instead of the
    output of the attention sublayer.
  hint: the two sublayers run one after the other: update x after attention, then feed that x to
    the feed-forward sublayer.
[norm_first_ignored] norm_first=True is ignored: this is the post-norm layer (norm after the
    residual add). Pre-norm normalises the input of each sublayer instead.
  hint: if self.norm_first: x = x + dropout1(attn(norm1(x))); x = x + dropout2(ff(norm2(x))).
[pre_norm_on_sublayer_output] pre-norm with the norm in the wrong place: the LayerNorm is
    applied to the sublayer's output (x + norm(f(x))) instead of its input (x + f(norm(x))).
  hint: normalise what goes into the sublayer: h = self.norm1(x); x = x + dropout1(self_attn(h,
    h, h, mask)).
[pre_norm_residual_normalised] pre-norm with the residual taken from the normalised x: h =
    norm(x); h + f(h). The residual path must carry the un-normalised x.
  hint: x = x + dropout1(attn(norm1(x))): add the sublayer output to x itself.
[pre_norm_although_post] the layer is pre-norm although norm_first=False: the original
    (post-norm) layer normalises after the residual add.
  hint: if not self.norm_first: x = norm1(x + dropout1(attn(x))); x = norm2(x +
    dropout2(ff(x))).
[post_norm_before_residual] post-norm with the norm in the wrong place: the LayerNorm is applied
    to the sublayer's output before the residual add (x + norm(f(x))).
  hint: normalise the sum: x = norm1(x + dropout1(attn(x))).
[encoder_layer_mask_ignored] the mask is ignored: it must be passed on to the self-attention.
  hint: self.self_attn(x, x, x, mask) (or with the normalised h for pre-norm).
[relu_missing] the ReLU is missing: without it the two linear layers collapse into one.
  hint: linear2(dropout(relu(linear1(x)))): the ReLU sits between the two layers.
[relu_after_linear2] the ReLU is applied after linear2: the output of the network must be able
    to be negative, and the nonlinearity belongs between the two layers.
  hint: linear2(dropout(relu(linear1(x)))), with nothing after linear2.
[activation_gelu] the activation is GELU (or another one); this network uses ReLU.
  hint: use torch.relu (or nn.ReLU()) between linear1 and linear2.
[activation_gelu_tanh] the activation is the tanh-approximate GELU (nn.GELU(approximate='tanh'),
    as in GPT-2 and BERT code); this network uses ReLU, as in the paper and
    nn.TransformerEncoderLayer.
  hint: use torch.relu (or nn.ReLU()) between linear1 and linear2.
[tokens_mixed] the tokens are mixed (e.g. a reshape that flattens the sequence into the
    features).
  hint: nn.Linear acts on the last dimension; apply it to x directly.
[ff_dropout_ignored] the dropout argument is ignored, or self.dropout is never used in forward.
  hint: self.dropout = nn.Dropout(dropout) in __init__, and apply it to the hidden activations
    in forward.
[dropout_after_linear2] dropout is applied to the output of linear2 instead of the hidden
    activations between the layers.
  hint: linear2(self.dropout(torch.relu(self.linear1(x)))).
[ff_dropout_not_rescaled] the hidden activations are dropped but the kept ones are not
    rescaled by 1/(1-p): in eval mode, where nothing is dropped, the next layer then sees
    larger activations on average than in training.
  hint: use nn.Dropout(dropout) (it rescales the kept values), or divide by (1 - p) after
    multiplying by a random mask.
[ff_dropout_on_input] dropout is applied to the input x (before linear1) instead of the hidden
    activations.
  hint: linear2(self.dropout(torch.relu(self.linear1(x)))): drop the hidden units, not the
    input's features.
[dropout_misplaced] dropout is not applied (only) to the hidden activations: it belongs between
    relu(linear1(x)) and linear2, once.
  hint: linear2(self.dropout(torch.relu(self.linear1(x)))).
[encoder_dropout_hard_coded] dropout is active although dropout=0.0: the dropout argument is
    ignored (e.g. nn.Dropout(0.1) hard-coded).
  hint: self.dropout1 = nn.Dropout(dropout), and pass dropout on to FeedForward(d_model, d_ff,
    dropout).
[encoder_mask_ignored] the mask is ignored, or not passed to the self-attention.
  hint: self.self_attn(h, h, h, mask) with the mask given to forward.
[encoder_dropout_ignored] the dropout argument is ignored (or the dropout modules are never used
    in forward).
  hint: self.dropout1 = nn.Dropout(dropout), self.dropout2 = nn.Dropout(dropout) applied to each
    sublayer's output before the residual add, and FeedForward(d_model, d_ff, dropout).
[sublayer_dropout_missing] {name}'s output is not dropped before the residual add.
  hint: self.{dropout} = nn.Dropout(dropout), applied to what self.{name} returns before it is
    added to the residual stream, as PyTorch's layer does: dropout on the attention weights
    and inside the feed-forward network does not replace it.
[dropout_on_residual_stream] a dropout acts on the residual stream: on the sum x + sublayer(x)
    (e.g. norm1(dropout1(x + a)), or x = dropout1(x + a)) or on a norm's output (e.g.
    dropout1(norm1(x + a))), so the stream itself loses values in training mode.
  hint: apply {dropouts} to each sub-layer's output only, before the residual add: post-norm x =
    norm1(x + dropout1(a)), pre-norm x = x + dropout1(a), where a is what the sub-layer returns.
[attention_dropout_not_passed] the dropout is not passed on to the self-attention.
  hint: self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout) (as a keyword:
    the third positional argument is bias).
[ff_dropout_hard_coded] dropout is active although dropout=0.0: the dropout argument is ignored
    (e.g. nn.Dropout(0.1) hard-coded).
  hint: self.dropout = nn.Dropout(dropout), with the constructor's argument.

# --- 07 the decoder
[dropout_not_passed_on] the dropout is not passed on to {name}.
  hint: self.{name} = MultiHeadAttention(d_model, n_heads, dropout=dropout) (as a keyword: the
    third positional argument is bias).
[decoder_norm_order] wrong norm order: the layer computes {computed} although
    norm_first={norm_first}.
  hint: norm_first=True: y = y + sublayer(norm(y)); norm_first=False: y = norm(y + sublayer(y)).
    Store norm_first in __init__ and branch on it in forward.
[decoder_cross_kv_from_decoder] the cross-attention takes its keys and values from the decoder
    instead of the encoder output (memory).
  hint: queries come from the decoder, keys and values from memory: self.cross_attn(y, memory,
    memory, memory_mask).
[decoder_residual_missing] a residual connection is missing: each sub-layer's output must be
    ADDED to its input.
  hint: post-norm: y = norm(y + sublayer(y)); pre-norm: y = y + sublayer(norm(y)).
[transformer_no_causal_mask] no causal mask in the decoder's self-attention: each target
    position sees the tokens after it (which, with teacher forcing, include the answer).
  hint: self_mask = causal (T, T) AND target padding (B, 1, 1, T) -> (B, 1, T, T).
[transformer_memory_mask_not_passed] the source padding mask is not passed to the
    cross-attention (memory_mask).
  hint: decode(tgt_in, memory, src_mask) must hand src_mask to every decoder layer as
    memory_mask.
[transformer_causal_encoder] a causal mask is put on the encoder: the encoder may look at the
    whole source sentence, in both directions.
  hint: the encoder gets only the source padding mask (B, 1, 1, S); only the decoder's
    self-attention is causal.
[tgt_embed_not_scaled] the target embeddings are not scaled by sqrt(d_model).
  hint: y = self.tgt_embed(tgt_in) * math.sqrt(d_model) + PE[:T].
[tgt_no_positional_encoding] no positional encoding is added to the target embeddings.
  hint: add sinusoidal_encoding(max_len, d_model)[:T] to the scaled target embeddings.
[tgt_embedding_dropout_missing] the target embeddings (plus positions) are not passed through
    the model's dropout in decode: in training mode nothing but the layers is dropped.
  hint: y = self.dropout(y + self.pe[:T]) before the decoder layers, as the encoder does
    with the source.
[decoder_self_mask_ignored] the self-attention mask (self_mask, the causal mask) is ignored:
    every target position sees the future.
  hint: pass self_mask to self.self_attn(y, y, y, self_mask).
[decoder_memory_mask_ignored] the memory mask (source padding) is ignored in the
    cross-attention.
  hint: pass memory_mask to self.cross_attn(y, memory, memory, memory_mask).
[transformer_final_norm_missing] the final LayerNorm after the last decoder layer is missing
    (pre-norm needs it: its residual stream is never normalised otherwise).
  hint: logits = self.out_proj(self.final_norm(y)).
[out_proj_missing] the output projection to the target vocabulary (out_proj) is missing.
[src_mask_not_used] the source padding mask is not used in the encoder or in the
    cross-attention.
[decoder_dropout_ignored] the dropout argument is ignored (or the dropout modules are never used
    in forward).
  hint: self.dropout1..3 = nn.Dropout(dropout) on each sub-layer's output, and
    FeedForward(d_model, d_ff, dropout).
[cross_kv_from_decoder] the cross-attention takes its keys and values from the decoder instead
    of the encoder output (memory).
[self_mask_not_applied] the causal self_mask is not applied in the self-attention.
[tgt_embed_init] tgt_embed keeps nn.Embedding's N(0, 1) initialisation; multiplied by
    sqrt(d_model), the tokens would drown the positional encoding.
  hint: self.tgt_embed = init_embedding(nn.Embedding(tgt_vocab, d_model)), with init_embedding
    from attention_ref.encoder.
[decoder_no_causal_mask] no causal mask in the decoder's self-attention.
  hint: self_mask = causal (T, T) AND target padding -> (B, 1, T, T).
[cross_q_from_memory] the cross-attention takes its queries from memory and keys from y.

# --- 08 translation
[target_not_shifted] {name} keeps the whole target: teacher forcing needs the target shifted by
    one (tgt_in drops the last position, tgt_out drops <bos>).
[beam_greedy] beam_size is ignored: only the single best hypothesis is kept (greedy decoding).
  hint: keep the beam_size best candidates of ALL hypotheses x ALL tokens at each step.
[beam_last_only] the score is not accumulated: hypotheses are ranked by their last token's
    log-probability only.
  hint: a candidate's score is its parent's score PLUS the new token's log-probability.
[beam_probabilities] probabilities are added instead of log-probabilities.
  hint: the probability of a sequence is a product; in logs it is the SUM of the
    log-probabilities step_fn returns (use them as they are).
[beam_first_finished] the search stops at the first finished hypothesis instead of returning the
    best finished one.
  hint: collect finished hypotheses and keep searching while an unfinished one could still score
    higher; return the highest-scoring finished hypothesis.
[beam_stop_against_worst] the search stops as soon as the best finished hypothesis scores at
    least the WORST unfinished one, while a better unfinished hypothesis could still finish higher.
  hint: stop early only when the best finished score is at least the BEST unfinished score (or
    run until no unfinished hypothesis is left).
[beam_length_normalised] the scores are divided by the length (length normalisation), which this
    exercise does not use.
  hint: compare raw sums of log-probabilities.
[beam_past_eos] hypotheses are extended past <eos> instead of being finished.
  hint: a kept candidate whose last token is eos_id goes to the finished list and is not
    extended further.
[beam_eos_not_scored] the score leaves out the log-probability of <eos>.
  hint: <eos> is a token like any other: add its log-probability when the hypothesis ends.
[masked_targets_as_indices] the targets at masked positions are used as indices: there they are
    arbitrary (here -100, PyTorch's ignore_index, or an id outside the vocabulary), so gather,
    indexing or F.cross_entropy without ignore_index fails on them.
  hint: replace them by a valid id before indexing, e.g. torch.where(mask, targets, 0), or use
    F.cross_entropy(..., ignore_index=-100) on targets.masked_fill(~mask, -100).
[padded_on_left] the sequences are padded on the left; pad on the right, after the last token
    (positions must start at 0 for every sentence).
  hint: write each sequence at the start of its row: ids[b, :len(s)] = s.
[pad_with_zero] the padding uses 0 instead of the pad_id argument.
  hint: fill with pad_id, e.g. torch.full((B, T), pad_id, dtype=torch.long).
[tgt_in_out_swapped] tgt_in and tgt_out are swapped: the decoder must READ tgt[:, :-1] (starting
    with <bos>) and PREDICT tgt[:, 1:] (ending with <eos>).
  hint: tgt_in = tgt[:, :-1]; tgt_out = tgt[:, 1:].
[loss_padding_averaged] the padding is averaged in: the mean runs over every position, padding
    included.
  hint: multiply by the mask (or select the real positions) before summing, and divide by the
    number of real tokens.
[loss_per_padded_length] a sequence loss divided by the padded length: the masked sum is divided
    by every position of the padded batch (B * T, or each sentence's sum by the padded length T
    and then averaged), not by the number of real tokens, so the loss shrinks as padding grows.
  hint: divide the masked sum by mask.sum(), the number of real tokens.
[loss_per_batch] divides by the batch size, not by the number of real tokens.
  hint: the loss is an average per real token: divide by mask.sum().
[loss_summed] sums the losses instead of averaging them.
  hint: divide the masked sum by the number of real tokens, mask.sum().
[loss_per_sentence] averages each sentence first, then the sentences: short sentences get more
    weight per token.
  hint: sum over all real tokens of the batch and divide once, by mask.sum().
[loss_mask_inverted] the mask is inverted: the loss averages over the padding, not the real
    tokens.
  hint: keep the positions where mask is True.
[loss_no_log_softmax] no log-softmax: the raw logits are used as log-probabilities.
  hint: apply torch.log_softmax(logits, dim=-1) before picking the target entries.
[loss_probabilities] probabilities are used instead of log-probabilities.
  hint: the cross-entropy is -log p(target): use log_softmax, not softmax.
[output_includes_bos] the returned tokens include <bos>.
  hint: return the hypothesis without its leading bos_id (and without the final eos_id).
[output_includes_eos] the returned tokens include <eos>.
  hint: return the hypothesis without its final eos_id.
[loss_item] the loss was turned into a Python number (.item() or float()), which cuts it off
    from the gradient.
  hint: return the tensor itself; call .item() only to print it.
[loss_left_autograd] the computation left autograd (.detach(), .item(), NumPy).
  hint: use torch operations on logits all the way to the result.
[loss_log_underflow] the log of a softmax probability that underflowed to 0, or NaN from the
    padding (0 * inf).
  hint: use torch.log_softmax (stable) and select the real positions with the mask rather than
    multiplying garbage by 0.
[tgt_mask_whole_target] tgt_mask covers the whole target; it must line up with tgt_out (drop the
    first position).
[tgt_mask_inverted] tgt_mask is inverted: it is True at the padding, but True must mark the real
    tokens of tgt_out (the positions the loss counts).
  hint: tgt_mask = tgt_out != pad_id.
[tgt_mask_from_tgt_in] tgt_mask is taken from tgt_in, not tgt_out: it counts the <bos> position
    and misses the final <eos>, which the model must learn to predict.
  hint: the mask belongs to what is predicted: tgt_mask = tgt_out != pad_id.
[tgt_mask_no_eos] tgt_mask leaves out <eos>: the model never learns to stop.
  hint: <eos> is a real target token; only padding is masked.

# --- 09 question answering
[span_end_before_start] the end may come before the start: start and end are chosen
    independently (two argmaxes, or every pair scored without requiring s <= e).
  hint: score every pair: scores[s, e] = start_logits[s] + end_logits[e], keep only the pairs
    with s <= e (an upper-triangular mask), and take the best pair.
[span_mask_ignored] the mask is ignored: the span uses question or padding positions.
  hint: only pairs with mask[s] and mask[e] True are allowed.
[span_mask_ignored_unordered] the mask is ignored and the end may come before the start.
  hint: allow only pairs inside the mask with s <= e.
[span_no_single_token] off by one: one-token answers (s == e) are not allowed (s < e instead of
    s <= e).
  hint: the diagonal s == e is a valid span of one token.
[span_max_len_ignored] max_len is ignored: spans longer than max_len tokens are allowed.
  hint: also require e - s + 1 <= max_len when max_len is not None.
[span_max_len_off_by_one] off by one in max_len: spans of max_len + 1 tokens are allowed (e - s
    <= max_len).
  hint: a span from s to e has e - s + 1 tokens.
[span_start_end_swapped] start and end are swapped (e.g. flat index decoded as (flat % T, flat
    // T)).
  hint: for a flattened (T_start, T_end) grid, start = flat // T and end = flat % T.
[span_loss_not_averaged] the loss is not averaged over the batch.
  hint: average the per-example losses with .mean().
[span_loss_mask_not_applied] the mask is not applied: the softmax runs over every position,
    question and padding included, so padding is not ignored.
  hint: set the logits outside the mask to -inf (masked_fill(~mask, float('-inf'))) before the
    log-softmax.
[span_loss_summed_ends] the start and end losses are summed; the loss is their average.
  hint: return (loss_start + loss_end) / 2.
[span_loss_summed_batch] the loss is summed over the batch instead of averaged.
  hint: average over the examples (.mean(), or reduction='mean').
[span_loss_one_end] only the start (or only the end) is in the loss.
  hint: the loss is the average of the start and the end cross-entropies.
[span_loss_probabilities] probabilities are used where log-probabilities belong (softmax, not
    log_softmax).
  hint: the cross-entropy is -log p(true position): use torch.log_softmax.
[span_loss_start_end_swapped] start and end are swapped: the start logits are scored against the
    true end.
  hint: pair start_logits with start and end_logits with end.
[span_loss_not_differentiable] the loss does not reach the logits through autograd (detached,
    or computed in NumPy or Python numbers and wrapped in torch.tensor), so it cannot train the
    model.
  hint: compute it with torch operations on the logits themselves (masked_fill, log_softmax,
    indexing), without .detach(), .numpy() or torch.tensor(...).

# --- 10 summarization
[pool_summed] the token vectors are summed, not averaged.
  hint: divide each sentence's sum by its number of tokens.
[pool_divided_by_length] each sum is divided by the sequence length T (or by all real tokens),
    not by the number of tokens in that sentence.
  hint: count the tokens of each sentence: onehot.sum(-1), clamped to at least 1.
[pool_header_in_sentence_0] tokens with sentence id -1 (header, padding) are counted in sentence
    0 (the ids were clamped, or -1 wrapped around when used as an index).
  hint: tokens with id -1 belong to no sentence: compare ids with each slot s, so -1 never
    matches.
[pool_off_by_one] off by one: sentence s gets the tokens of sentence s - 1.
  hint: slot s averages the tokens whose id equals s (ids start at 0).
[select_returns_indices] the indices of the chosen sentences are returned (e.g.
    topk(...).indices)
[select_padding] padding is selected: the mask is not applied before ranking.
  hint: give padding slots a score of -inf before ranking, and AND the result with the mask.
[select_mask_after_topk] the mask is applied after ranking: the k best slots are picked with
    padding among them, then the padding is dropped, so a document can get fewer than k
    sentences although it has k real ones.
  hint: give padding slots a score of -inf before ranking (masked_fill(~mask, float('-inf'))),
    then pick the k best.
[select_k_above_slots] k can exceed the number of sentence slots S, and topk(k) then raises:
    a document with fewer real sentences than k gets all of them.
  hint: take topk(min(k, S)) (per row: min(k_b, n_real_b)), or compare each sentence's rank
    with k, which works for any k.
[select_lowest] the lowest scores are selected, not the highest.
  hint: rank in descending order (topk picks the largest by default).
[select_threshold] k is ignored: sentences are selected by a threshold (score > 0).
  hint: select exactly the k best real sentences of each document.

# --- 11 GPT
[greedy_last_tie] greedy picks the last of the tied maxima; the spec asks for the lowest index.
  hint: logits.argmax(-1) returns the first maximum.
[greedy_after_top_k] with temperature 0, top_k/top_p are applied before the greedy choice, and
    they reorder the tied maxima: temperature 0 ignores top_k and top_p and returns the lowest
    index among ties.
  hint: check temperature == 0 first: return logits.argmax(-1).
[greedy_other_tie] greedy returns one of the tied maxima, but not the lowest index, which the
    spec asks for.
  hint: logits.argmax(-1) returns the first maximum.
[greedy_not_argmax] temperature 0 does not return the argmax (greedy).
  hint: logits.argmax(-1) returns the first maximum.
[temperature_zero_not_handled] temperature 0 is not handled separately (dividing by 0 gives
    inf/nan logits).
  hint: if temperature == 0: return logits.argmax(-1).
[block_no_mask] no causal mask: every position attends to the future tokens too.
  hint: pass mask = torch.ones(T, T, dtype=torch.bool).tril() (True where key j <= query i).
[block_strict] the causal mask excludes the diagonal (j < i): a position cannot attend to
    itself.
  hint: use .tril() (diagonal included), not .tril(-1).
[block_upper] the causal mask is inverted (upper triangle): positions see the future, not the
    past.
  hint: True must mean 'may attend': key j <= query i is torch.ones(T, T).tril().
[block_post_norm] post-norm instead of pre-norm: LayerNorm is applied after the residual
    addition (x = ln(x + attn(x))).
  hint: pre-norm normalises the input of each sub-layer and adds to the raw stream: x = x +
    attn(ln1(x)); x = x + ff(ln2(x)).
[block_normed_residual] the residual adds the normalised x (h = ln1(x); x = h + attn(h)) instead
    of the raw stream.
  hint: keep x untouched: h = self.ln1(x); x = x + attn(h, h, h, mask).
[block_no_residual] the residual connection around the attention is missing (x = attn(ln1(x))).
  hint: x = x + attn_out.
[block_ff_no_norm] ln2 is not applied before the feed-forward network (x + ff(x)).
  hint: x = x + ff(ln2(x)).
[block_gelu] the feed-forward network uses GELU (as GPT-2 does) where the spec asks for notebook
    06's FeedForward, whose activation is ReLU.
  hint: self.ff = FeedForward(d_model, d_ff, dropout) from attention_ref.encoder, imported at
    the top of the notebook.
[sampler_p_exclusive] top-p excludes the token that crosses p: the kept set must be the smallest
    set whose probability reaches top_p, so the token that takes the total over top_p is
    included.
  hint: keep token i when the probability of the tokens strictly more probable than i is < top_p
    (the sum before i, not including it).
[sampler_after_softmax] temperature applied after the softmax (or not at all): dividing
    probabilities by T and renormalising changes nothing.
  hint: divide the logits by the temperature before the softmax: softmax(logits / T).
[sampler_times] the logits are multiplied by the temperature instead of divided by it.
  hint: scores = logits / temperature (T > 1 flattens, T < 1 sharpens).
[sampler_k_exact] top-k keeps exactly k tokens: a token tied with the k-th largest score is
    dropped.
  hint: keep every token whose score is >= the k-th largest: kth = scores.topk(k).values[...,
    -1:]; scores.masked_fill(scores < kth, -inf).
[sampler_k_exact_high] top-k keeps exactly k tokens, and of the tokens tied with the k-th it
    keeps the highest indices: every token tied with the k-th largest score must be kept.
  hint: keep every token whose score is >= the k-th largest: kth = scores.topk(k).values[...,
    -1:]; scores.masked_fill(scores < kth, -inf).
[sampler_p_before_k] top-p is applied before top-k (on the full distribution): top-k comes
    first, then top-p on the renormalised distribution of the tokens top-k kept.
  hint: apply top-k to the scores, then softmax, then top-p.
[sampler_p_sorted_ties] top-p breaks ties by sort order: tokens as probable as a kept token must
    be kept too (the spec counts only the tokens *strictly* more probable).
  hint: for each token compute the total probability of the strictly more probable tokens, e.g.
    (p[..., None, :] * (p[..., None, :] > p[..., :, None])).sum(-1), and keep it when that is <
    top_p.
[sampler_p_sorted_ties_high] top-p breaks ties by sort order, keeping the higher index of tied
    tokens (as sorting in ascending order and cutting from the bottom does): tokens as probable
    as a kept token must be kept too (the spec counts only the tokens *strictly* more probable).
  hint: for each token compute the total probability of the strictly more probable tokens, e.g.
    (p[..., None, :] * (p[..., None, :] > p[..., :, None])).sum(-1), and keep it when that is <
    top_p.
[sampler_p_le] top-p keeps a token while the mass before it is <= top_p; the spec keeps it only
    while that mass is < top_p (when the tokens before it already reach top_p exactly, it is not
    needed).
  hint: keep token i when the probability of the tokens strictly more probable than i is
    strictly less than top_p.
[gqa_repeat] K/V heads repeated in the wrong order: repeat() tiles the key/value heads (0, 1, 0,
    1), so query head h uses kv head h % n_kv_heads; consecutive query heads must share (0, 0,
    1, 1): kv head h // (n_heads // n_kv_heads).
  hint: k.repeat_interleave(n_heads // n_kv_heads, dim=1), not k.repeat(1, group, 1, 1).
[gqa_no_scale] the scores are not scaled by 1/sqrt(d_head).
  hint: use the course's sdpa, or divide q @ k^T by math.sqrt(d_head).
[gqa_no_mask] the mask is ignored.
  hint: pass the mask on to the attention (sdpa(q, k, v, mask)).
[gqa_no_w_o] the output projection w_o is missing.
  hint: return self.w_o(merge_heads(out)), weights.
[gqa_uniform_masked] a query row whose mask allows no key gets uniform weights (a large negative
    number in place of -inf, or such a row patched to 1/n_k): the course's convention (notebook
    02) is all-zero weights, so the row's attention output is zero.
  hint: use the course's sdpa, which gives fully masked rows zero weights, or set their weights
    to 0 after the softmax (e.g. weights * mask.any(-1, keepdim=True)).
[block_no_causal_mask] no causal mask (or an inverted one).
  hint: mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril().
[block_dropout_never_applied] dropout is never applied to the sub-layer outputs.
  hint: x = x + self.dropout(attn_out); x = x + self.dropout(ff_out).
[block_dropout_on_residual] dropout is applied to the residual sum (self.dropout(x + out)), so
    in training mode it drops the residual stream itself, not only the sub-layer's output.
  hint: x = x + self.dropout(out): drop what the sub-layer returns, then add it to x.
[block_sublayer_dropout_missing] {name}'s output is not dropped before the residual add.
  hint: x = x + self.dropout(...) around what self.{name} returns: the feed-forward network's
    own dropout (on its hidden units) does not replace it.
[block_dropout_misplaced] the dropout acts somewhere other than on {name}'s output (on the
    sub-layer's input, after the norm, or without nn.Dropout's 1/(1 - p) rescaling).
  hint: h = self.ln1(x), out, weights = self.attn(h, h, h, mask), x = x + self.dropout(out);
    the same with ln2 and ff.
[generator_ignored] the generator argument is ignored (the global random state is used).
  hint: pass it on: torch.multinomial(probs, 1, generator=generator).
[gqa_full_projections_reduced] the keys and values are projected to all n_heads heads (d_model
    features) and then reduced: the point of grouped-query attention is that only n_kv_heads
    heads are computed and cached.
  hint: nn.Linear(d_model, n_kv_heads * d_head).
[gqa_full_projections] the keys and values are projected to all n_heads heads (d_model
    features): grouped-query attention computes and caches only n_kv_heads key/value heads.

# --- 12 efficient attention
[flash_causal_ignored] causal=True is ignored: queries attend to future keys.
  hint: with causal=True, mask each tile with key_position <= query_position and skip key blocks
    that start after the query block ends.
[kv_appended_twice] the new keys and values are appended twice.
  hint: call cache.append(k, v) once per call, with the t new positions.
[kv_appended_wrong_count] the wrong number of positions is appended.
  hint: call cache.append(k, v) once per call, with the t new positions.
[online_sum_not_rescaled] the running sum is not rescaled when the maximum grows: l must become
    l * exp(m_old - m_new) + sum(exp(block - m_new)).
  hint: multiply the sum so far by exp(m - m_new) before adding the new block's terms.
[online_last_block_dropped] the last partial block is dropped: when n is not a multiple of
    block_size the last n % block_size entries are never read.
  hint: loop with range(0, n, block_size) and slice x[start:start + block_size]; the last slice
    is simply shorter.
[online_max_starts_at_0] the running maximum starts at 0 instead of -inf, so when every entry is
    far below 0 all exponentials underflow to 0 and the result is 0/0.
  hint: start with m = -inf (float('-inf')) and l = 0.
[online_no_max] no maximum is subtracted: exp(x) overflows for large entries.
  hint: keep a running maximum m and exponentiate x - m.
[online_block_max_only] no running maximum: m is set to each block's own maximum instead of
    max(m, block max).
  hint: m_new = max(m, block.max()); exponentials are then never above 1.
[flash_running_sum_l] the running sum l is not rescaled when the maximum grows (l must become l
    * exp(m_old - m_new) + the new block's sum).
  hint: rescale both running quantities, l and the accumulator, by alpha = exp(m - m_new).
[flash_accumulator_rescaled_when] the accumulator is not rescaled when the maximum grows: acc
    must become acc * exp(m_old - m_new) + p @ v_block.
  hint: rescale both running quantities, l and the accumulator, by alpha = exp(m - m_new).
[flash_running_maximum] no running maximum: each block is exponentiated with its own maximum and
    the running sums are not rescaled (m_new must be max(m, block max)).
  hint: keep m per query; m_new = torch.maximum(m, s.amax(-1, keepdim=True)); rescale by exp(m -
    m_new).
[flash_last_partial_block] the last partial block is dropped: when n_k is not a multiple of
    block_size the last keys are never read.
  hint: loop with range(0, n_k, block_size) and slice k[..., j0:j0 + block_size, :].
[flash_causal_block_skip] the causal block skip is off by one: the key block on the diagonal is
    skipped, so queries never see the keys of their own block.
  hint: for the query block [i0, i1) read key blocks starting at j0 < i1 (not j0 < i0); mask
    inside the diagonal block with key j <= query i.
[flash_causal_mask_strict] the causal mask is strict (j < i): a query may not attend to itself.
  hint: allowed = key_position <= query_position.
[flash_scores_scaled_1] the scores are not scaled by 1/sqrt(d_k).
  hint: multiply q (or each tile of scores) by 1 / math.sqrt(d_k).
[kv_no_mask] the new positions attend to later new positions: with several new tokens at once (t
    > 1) the causal mask inside the new chunk is missing.
  hint: when t > 1 pass a mask (t, T) with True where key j <= len_before + i.
[kv_unshifted] the causal mask is not shifted by the number of cached positions: new position i
    is at absolute position len_before + i, so it sees keys j <= len_before + i.
  hint: build the mask as torch.ones(t, T, dtype=torch.bool, device=x_new.device).tril(T - t).
[kv_only_new] the new queries attend only to the new keys, not to the cached ones.
  hint: attend to all keys and values that cache.append(k, v) returns.
[kv_no_w_o] the output projection w_o is missing.
  hint: return mha.w_o(merge_heads(out)).
[kv_mask_wrong_device] a tensor (the mask, most likely) is built on the CPU, not on the device
    of x_new: on a GPU the step fails.
  hint: pass device=x_new.device wherever you create a tensor: torch.ones(t, T,
    dtype=torch.bool, device=x_new.device).tril(T - t).
[online_inplace_autograd] an in-place update (l.mul_(alpha), acc.mul_(...), s.exp_()) overwrites
    a tensor that autograd saved for the backward pass: the output is right, but section 5's
    backward pass through your function fails.
  hint: update out of place: l = alpha * l + p.sum(-1, keepdim=True), p = torch.exp(s -
    m_new). Writing each finished query block into out (out[..., i0:i1, :] = acc / l) is fine.
[online_no_autograd] autograd cannot differentiate your function: its output is not connected
    to q, k and v (computed under torch.no_grad(), detached, or via .data or .item()).
  hint: compute with ordinary tensor operations on q, k and v; section 5 runs autograd's
    backward pass through your function.
[flash_future_blocks_not_skipped] the key blocks entirely in the future are not skipped (they
    are only masked), or the causal block skip is off by one and reads one block too many.
  hint: process queries in blocks of block_size too; for the query block [i0, i1) loop over key
    blocks j0 in range(0, i1, block_size) only.
[flash_full_score_matrix] the whole score matrix (or a full n_q x n_k mask) is built, e.g. q @
    k.transpose(-2, -1) over all keys at once.
  hint: work on one tile of keys at a time: s = q @ k[..., j0:j1, :].mT; build each tile's
    causal mask from its positions, never an n x n mask.
[online_two_passes] two passes over the blocks: every block's maximum first, then the sum of
    exponentials with the global maximum. The exercise asks for one pass, in which the sum is
    rescaled whenever the maximum grows.
  hint: in the same loop: m_new = max(m, block max); l = l * exp(m - m_new) + sum(exp(block -
    m_new)); m = m_new.
[online_global_max_first] the maximum (or the sum) is computed over the whole vector first,
    which is the ordinary two-pass softmax.
  hint: keep a running maximum and a running sum, updated block by block.
[cache_not_appended] cache.append(k, v) is never called with the new keys and values (the next
    step would not see these tokens).
  hint: k_all, v_all = cache.append(k, v) with k, v of shape (B, H, t, d_head), then attend to
    k_all, v_all.
[not_an_autograd_function] the candidate is not a torch.autograd.Function class: the exercise
    asks for a class with static forward(ctx, ...) and backward(ctx, grad_out) methods.
  hint: write class FlashAttention(torch.autograd.Function) and pass the class itself:
    check("flash_attention", FlashAttention).
[flash_bwd_gradient_count] backward returns the wrong number of values: it must return one per
    input of forward (q, k, v, block_size, causal), None for block_size and causal.
  hint: end backward with return dq, dk, dv, None, None.
[flash_bwd_no_gradient] backward returns None in place of a gradient of q, k or v.
  hint: return dq, dk and dv, each of its input's shape, then None, None.
[flash_bwd_gradient_order] a gradient is not its input's: backward must return the gradients
    in the order of forward's inputs (autograd matches them by position: q, k, v, block_size,
    causal), each of its input's shape.
  hint: return dq, dk, dv, None, None, with dq of q's shape, dk of k's and dv of v's (dk =
    torch.zeros_like(k), not like q).
[flash_bwd_no_delta] D is missing: dS = P * dP leaves out the term the softmax's normalisation
    contributes, dS = P * (dP - D) with D = rowsum(dO * O).
  hint: before the loop, D = (grad_out * out).sum(-1, keepdim=True) (one number per query); in
    each tile, ds = p * (dp - D[..., i0:i1, :]).
[flash_bwd_delta_per_tile] D is summed over one tile of keys only (rowsum(P * dP) of the tile),
    not over all of a query's keys: D = rowsum(dO * O) needs the whole row, which O already
    holds.
  hint: compute D = (grad_out * out).sum(-1, keepdim=True) once, from the saved output, not
    from each tile's P and dP.
[flash_bwd_unnormalised_weights] the recomputed weights are not normalised: P must be exp(S -
    L) with the log-sum-exp L = m + log(l) of the whole row; exp(S - m), exp(S) or exp(S -
    log l) are P times a per-query factor.
  hint: in the forward pass save L = m + torch.log(l) after the last key block; in the backward
    pass p = torch.exp(s - L[..., i0:i1, :]).
[flash_bwd_scale] dQ or dK has the wrong scale: S = Q K^T / sqrt(d_k), so dQ = dS K / sqrt(d_k)
    and dK = dS^T Q / sqrt(d_k), each scaled exactly once.
  hint: if you use the scaled queries q * scale in dK = dS^T q, do not scale dK again; dQ = dS K
    always needs the factor scale = 1 / math.sqrt(d_k).
[flash_bwd_transposes] a transpose is missing or misplaced: dV = P^T dO, dQ = dS K and dK = dS^T
    Q (with square tiles the wrong products still have the right shapes).
  hint: the gradient of a key (or value) sums over the queries: transpose the tile, p.mT @ do
    and ds.mT @ q; the gradient of a query sums over the keys: ds @ k.
[flash_bwd_causal_mask] the backward pass does not apply the causal mask: the tiles on the
    diagonal (or the future tiles) give weight to keys after the query.
  hint: recompute each tile exactly as the forward pass does: mask the scores of a tile that
    crosses the diagonal with key j <= query i before p = exp(s - L), and skip the future
    tiles.
[flash_bwd_future_tiles] the backward pass computes the key tiles entirely in the future of a
    causal query block (masked to zero, but computed): they contribute nothing.
  hint: in the backward pass loop over the same tiles as the forward pass: for the query block
    [i0, i1), key blocks j0 in range(0, i1, block_size).
[flash_bwd_saves_weights] the forward pass keeps n_q x n_k numbers for the backward pass (the
    weights or scores of every tile, or autograd's graph through the tiles): FlashAttention
    saves only the output and one log-sum-exp per query.
  hint: ctx.save_for_backward(q, k, v, out, L) with L of shape (..., n_q, 1); recompute each
    tile's weights in backward as exp(s - L).
[flash_bwd_full_matrix] a tensor of n_q x n_k elements is built (the scores or the weights of
    all keys at once, or a full mask), in the forward or the backward pass.
  hint: in both passes work on one tile at a time: s = q[..., i0:i1, :] @ k[..., j0:j1, :].mT
    and its causal mask from the tile's positions.
[flash_bwd_quadratic_memory] the backward pass holds n_q x n_k numbers at once, in pieces
    (autograd's graph through recomputed tiles, from torch.autograd.grad or .backward() inside
    backward, or a list of every tile): its memory grows with n^2 although no one tensor is
    that large.
  hint: compute each tile's contributions yourself with the formulas, dv += p.mT @ do_blk, ds =
    p * (dp - D), dq += ds @ k_blk * scale, dk += ds.mT @ q_blk, and let the tile go before
    the next one.
[flash_bwd_state_outside_ctx] what backward needs is kept outside ctx (on the class, in a
    global or another object shared by every call): a second call of forward overwrites it
    before the first call's backward pass, as the two attention layers of a model do.
  hint: keep everything on ctx: ctx.save_for_backward(q, k, v, out, L) for the tensors and
    ctx.block_size = block_size for the rest, never FlashAttention.L = L or a global.

# --- 13 the modern decoder
[rms_eps_outside_root] epsilon is added outside the square root: x / (sqrt(mean(x^2)) + eps).
    The spec (like Llama) adds it inside: x / sqrt(mean(x^2) + eps).
  hint: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.
[rms_sum_not_mean] the sum of squares (or the vector's norm) is used instead of their mean:
    the result is smaller by a factor sqrt(d_model).
  hint: x.pow(2).mean(-1, keepdim=True), not .sum(...) or x.norm(...).
[rms_centred] the mean is subtracted first, as LayerNorm does: RMSNorm divides x itself by its
    root mean square, without centring it.
  hint: mean_square = x.pow(2).mean(-1, keepdim=True); no x - x.mean(...).
[rms_std] the standard deviation (x.std(), centred and with n - 1) is used instead of the root
    mean square.
  hint: sqrt(mean(x^2) + eps) over the last axis: x.pow(2).mean(-1, keepdim=True).
[rms_mean_all_axes] the mean of squares is taken over the whole tensor, not over each vector's
    last axis.
  hint: x.pow(2).mean(dim=-1, keepdim=True): one statistic per position.
[rms_no_weight] the learned scale weight is not applied.
  hint: multiply the normalised x by self.weight.
[rms_eps_ignored] the eps argument is ignored (a fixed epsilon is used instead).
  hint: store eps in __init__ (self.eps = eps) and use self.eps in forward.
[rms_eps_missing] no epsilon: x / sqrt(mean(x^2)) divides by zero for an all-zero vector (and
    is far too large for a tiny one); the spec adds eps inside the root.
  hint: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps), with eps=1e-6 by default.
[rms_default_eps] the default epsilon is not 1e-6 as the spec asks.
  hint: def __init__(self, d_model, eps=1e-6).
[rms_mean_not_squared] the mean of x is used instead of the mean of its squares: where a
    vector's mean is negative, the square root of mean(x) + eps is NaN.
  hint: mean_square = x.pow(2).mean(-1, keepdim=True), then x / sqrt(mean_square + eps).
[rms_weight_init] the scale weight does not start at ones, as the spec asks (a model built
    from your class would start with every feature scaled by it).
  hint: self.weight = nn.Parameter(torch.ones(d_model)).
[swiglu_silu_on_up] SiLU is applied to the wrong branch: silu(w_up(x)) * w_gate(x). The gate
    goes through SiLU: silu(w_gate(x)) * w_up(x).
  hint: self.w_down(F.silu(self.w_gate(x)) * self.w_up(x)).
[swiglu_silu_after_product] SiLU is applied after the product (silu(w_gate(x) * w_up(x))),
    not to the gate alone.
  hint: self.w_down(F.silu(self.w_gate(x)) * self.w_up(x)).
[swiglu_sigmoid_gate] the gate uses sigmoid (the original GLU) instead of SiLU (x * sigmoid(x)).
  hint: F.silu(z) = z * torch.sigmoid(z).
[swiglu_gelu] the gate uses GELU (GEGLU) instead of SiLU.
  hint: F.silu, not F.gelu.
[swiglu_gelu_tanh] the gate uses the tanh approximation of GELU (GeGLU as in Gemma,
    F.gelu(gate, approximate="tanh")) instead of SiLU: the spec asks for SwiGLU.
  hint: F.silu(self.w_gate(x)) * self.w_up(x), not F.gelu(...).
[swiglu_up_unused] the up projection is not used: w_down(silu(w_gate(x))) is the ungated
    feed-forward.
  hint: multiply the activated gate by w_up(x) elementwise before w_down.
[swiglu_relu_gate] the gate uses ReLU (ReGLU) instead of SiLU.
  hint: F.silu(self.w_gate(x)), not F.relu.
[swiglu_no_activation] the gate has no activation: w_down(w_gate(x) * w_up(x)) is a bilinear
    layer, not SwiGLU.
  hint: pass the gate through SiLU: F.silu(self.w_gate(x)) * self.w_up(x).
[swiglu_default_hidden] without d_ff the hidden size must be 8 * d_model // 3 (2/3 of 4 *
    d_model, so the three matrices hold as many weights as a 4 * d_model ReLU feed-forward).
  hint: if d_ff is None: d_ff = 8 * d_model // 3.
[rope_not_applied] no rotary positions: the queries and keys are not rotated.
  hint: q = rope(q); k = rope(k) on the heads (B, H, T, d_head), before the scores.
[rope_on_values] the values are rotated too: rotary positions apply to queries and keys only
    (their dot product is what must depend on the relative position).
  hint: rotate q and k; leave v as it is.
[rope_queries_only] only the queries (or only the keys) are rotated: the score then depends
    on the absolute position, not on the offset m - n.
  hint: apply rope to both q and k.
[rope_before_split] rope is applied to the whole d_model vector before the heads are split:
    the frequencies run over d_model, not over each head's d_head features.
  hint: split the heads first, (B, H, T, d_head), then rotate q and k.
[rope_heads_as_positions] rope is applied in the layout (B, T, H, d_head), where the
    second-to-last axis is the head, not the position: each head is rotated by its head index.
  hint: transpose to (B, H, T, d_head) before rope: rope rotates by the index of axis -2.
[rotary_rotate_half] the two halves of each head are rotated together (feature i with i +
    d_head/2, Hugging Face's "rotate_half"); the spec rotates adjacent pairs (2i, 2i + 1), as
    notebook 05's rope does.
  hint: use attention_ref.rope on (B, H, T, d_head), or pair x[..., 0::2] with x[..., 1::2].
[rope_base_ignored] the base argument is ignored (10000 is used whatever was passed).
  hint: store base in __init__ and pass it on: rope(q, base=self.base).
[rotary_no_causal_mask] no causal mask: a position attends to the positions after it.
  hint: mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril(), passed to sdpa.

# --- 14 attention as a Triton kernel
[triton_tail_loaded_as_zero] the tail of the block, past the end of the row (or of the keys),
    is loaded as 0 and not masked: each of those positions adds exp(0 - max) to the sum.
  hint: load with mask=offs < n and other=-float("inf") (the softmax), or set the scores of keys
    past n_k to -inf with tl.where(offs_n[None, :] < n_k, s, -float("inf")) before the max.
[triton_softmax_no_max] the maximum is not subtracted before exp: large entries overflow to
    inf and give NaN.
  hint: e = tl.exp(x - tl.max(x, axis=0)); the masked tail (-inf) then gives exp(-inf) = 0.
[triton_strides_contiguous] the kernel computes addresses as if the tensor were contiguous
    (offsets from its sizes), not from its strides: a transposed view is read in the wrong
    order.
  hint: pass x.stride(0), x.stride(1) (q.stride(0..3), ...) to the kernel and use them in every
    pointer: X + row * stride_row + cols * stride_col.
[triton_max_not_carried] the running maximum is not carried from tile to tile: each tile is
    exponentiated against its own maximum and what was summed before is not rescaled.
  hint: m_new = tl.maximum(m_i, tl.max(s, axis=1)); alpha = tl.exp(m_i - m_new); l_i = l_i * alpha
    + tl.sum(p, axis=1); acc = acc * alpha[:, None] + tl.dot(p, v); m_i = m_new.
[triton_causal_tile_bound] the causal loop over key tiles stops one block too early: it ends at
    the first query of the block (start_m * BLOCK_M) instead of its last ((start_m + 1) *
    BLOCK_M), so the diagonal tile is never visited.
  hint: the keys a block of queries may see end at min(n_k, (start_m + 1) * BLOCK_M + n_k - n_q);
    loop up to there and mask the tiles that cross the diagonal.
[triton_diagonal_tile_unmasked] the future tiles are skipped but the tile on the diagonal is not
    masked: its queries see the keys just after them.
  hint: in a tile that crosses the diagonal, s = tl.where(offs_n[None, :] <= offs_m[:, None] +
    n_k - n_q, s, -float("inf")).
[triton_causal_offset] the causal mask ignores n_k - n_q: with n_q != n_k query i must see keys j
    <= i + (n_k - n_q) (the queries are the last n_q positions), not j <= i.
  hint: offset = n_k - n_q; mask with offs_n[None, :] <= offs_m[:, None] + offset and end the
    loop at (start_m + 1) * BLOCK_M + offset.
[triton_exp2_without_log2e] exp2 is applied to the scores without multiplying them by log2(e):
    2^s is not e^s, so the weights are too flat.
  hint: exp(x) = exp2(x * log2(e)): fold 1.4426950408889634 into the scale of the scores, and
    divide the log-sum-exp by it at the end.
[triton_lse_base2] lse is in base 2 (m + log2(l) with exp2): it must be the natural
    logarithm, as the backward pass computes P = exp(S - lse).
  hint: with exp2 and scores in log2 units, lse = (m_i + tl.log2(l_i)) / log2(e) (that is, times
    ln 2).
[triton_lse_wrong] lse is not log(sum_j exp(s_ij)) of the keys the query sees: it must be m_i +
    log(l_i) from the final running maximum and sum (-inf for a query that sees no key).
  hint: after the loop, lse = m_i + tl.log(l_i) where l_i > 0 (else -inf); store it with
    tl.store at L + offs_m * stride, masked to offs_m < n_q.
[triton_score_matrix_allocated] the code creates a tensor as large as the n_q x n_k scores: the
    kernel keeps one tile of scores at a time, in registers.
  hint: allocate only out (like q) and lse (B, H, n_q) in the launcher; everything else lives
    in the kernel.
[triton_dot_upcast] with float16 inputs, tl.dot multiplies float32 tiles (q, k or v upcast
    before the product, or p not rounded to v's dtype): on a GPU that is a TF32 product at half
    the speed of float16's tensor cores, for no accuracy.
  hint: load q, k and v in their dtype and pass them to tl.dot as they are; accumulate the
    scores and acc in float32 (tl.dot returns float32) and write tl.dot(p.to(v.dtype), v).
[triton_future_tiles_loaded] the key tiles entirely in the future of a block of queries are
    still loaded (and only masked): causal attention should do about half the work.
  hint: end the loop over key tiles at min(n_k, (start_m + 1) * BLOCK_M + n_k - n_q) when causal.
[triton_future_tiles_computed] the loop still visits the key tiles entirely in the future of a
    block of queries: their loads are masked off, but tl.dot multiplies them, so causal attention
    does all of the arithmetic.
  hint: end the loop itself (not only its loads) at min(n_k, (start_m + 1) * BLOCK_M + n_k - n_q)
    when causal.
[triton_split_missing] the causal loop is not split: every tile it visits is masked, although
    only the tiles that cross the diagonal (or the end of the keys) hold a key some query of
    the block must not see; the full tiles before them pay for a mask that changes nothing.
  hint: two loops: the whole tiles below lo = (start_m * BLOCK_M + n_k - n_q + 1) // BLOCK_N *
    BLOCK_N (clamped to 0 .. n_k first) without any tl.where, then lo .. min(n_k, (start_m + 1)
    * BLOCK_M + n_k - n_q) with the mask.
[triton_split_full_tile_masked] the split falls a tile (or more) early: full tiles, whose keys
    every query of the block sees, go through the masked stage. The values are right, but those
    tiles pay for a mask that changes nothing.
  hint: the first query of the block, start_m * BLOCK_M, sees keys j <= start_m * BLOCK_M + n_k -
    n_q: the tiles that end at or before one past that are full: lo = (start_m * BLOCK_M + n_k -
    n_q + 1) // BLOCK_N * BLOCK_N, clamped to 0 .. n_k (rounded down, never up).
[triton_split_diagonal_unmasked] the tile that crosses the first query's diagonal is not
    masked, so the block's first queries see keys in their future: the split falls a tile late
    (that tile goes through the unmasked stage; a tile past the end of the keys adds scores of
    0), or the masked stage's mask has no causal term (when the diagonal is the only masked
    tile, as with n_q = n_k and BLOCK_M = BLOCK_N, the two give the same output).
  hint: round the split down: lo = (start_m * BLOCK_M + n_k - n_q + 1) // BLOCK_N * BLOCK_N, the
    end of the whole tiles the block's first query sees; the masked stage starts there and
    masks offs_n[None, :] <= offs_m[:, None] + n_k - n_q as well as the keys past n_k.
[triton_split_without_offset] a bound of the two stages leaves out n_k - n_q (start_m * BLOCK_M
    and (start_m + 1) * BLOCK_M, as Triton's tutorial 06 splits, right only when n_q = n_k):
    with n_k > n_q the masked stage ends before the last keys a block sees; with n_k < n_q the
    unmasked stage takes keys in the future.
  hint: offset = n_k - n_q in both: lo from start_m * BLOCK_M + offset + 1 (rounded down to a
    tile), hi = min(n_k, (start_m + 1) * BLOCK_M + offset), each clamped to 0 .. n_k.
[triton_causal_end_short] the causal loop ends one key too early ((start_m + 1) * BLOCK_M + n_k -
    n_q - 1): when that end falls just past a tile's start, the last tile a query of the block
    sees is never visited.
  hint: the last query of the block, start_m * BLOCK_M + BLOCK_M - 1, sees keys up to itself + n_k
    - n_q; the loop's end is one past that: min(n_k, (start_m + 1) * BLOCK_M + n_k - n_q).
[triton_unit_column_stride] the kernel assumes a column stride of 1 (X + row * stride_row + cols,
    as Triton's tutorial 02 does): in a transposed view the columns are not adjacent.
  hint: pass x.stride(1) too and use it: X + row * stride_row + cols * stride_col.
[triton_v_strides_of_k] v is addressed with k's strides: when k and v have different layouts, v
    is read in the wrong order.
  hint: pass all four strides of v (v.stride()) and use them in v's pointers.
[triton_batch_head_one_axis] the kernel offsets each (batch, head) by bh * stride_h, as if the
    batch and the heads were one axis of B * H heads (as Triton's early tutorial 06 did): that
    holds only where stride_b = H * stride_h, as in a contiguous tensor, not in a transposed view
    of (B, n, H, d).
  hint: split the program's id, b, h = bh // H, bh % H, and offset by b * stride_b + h * stride_h
    (pass all four strides of each tensor).
[triton_load_out_of_bounds] {detail}: a tl.load without the mask of its rows or columns (q's rows
    past n_q, say) reads memory the kernel was not given; on a GPU that is garbage or a crash.
  hint: give every tl.load the mask of the elements that exist (mask=offs_m[:, None] < n_q for q,
    offs_n < n_k for k and v) and other=0.0; if it has one, look for offsets below 0 (a loop
    that starts before row 0: clamp its start with tl.maximum(..., 0)).
[triton_store_out_of_bounds] {detail}: a tl.store without the mask of its rows or columns writes
    outside the rows of its own program. Unwatched, the interpreter writes past the tensor (a crash
    or corrupted memory) or over another program's rows; it runs the programs one after another,
    so it hides the race such a store has on a GPU, where programs run at once.
  hint: store with the mask of the rows (and columns) that exist: mask=offs_m[:, None] < n_q for
    out, offs_m < n_q for lse, cols < n_cols for a softmax row.
[triton_finite_mask] the mask is a finite number (-1.0e6, as Triton's tutorial 06 has it), not
    -inf: a query that sees no key of a tile gets weights exp(0) = 1 for masked keys, so a query
    that sees no key at all gets the mean of their values instead of 0, and a finite lse.
  hint: mask with -float("inf"), and guard the rows that have seen nothing (m_i = -inf) by
    exponentiating against 0; at the end l_i = 0 marks them: out = 0, lse = -inf.
[triton_weights_tile_max] the weights of a tile are exponentiated against the tile's own maximum
    while the sum and the accumulator are rescaled against the running one: the tiles are summed
    on different scales.
  hint: p = tl.exp(s - m_new[:, None]) with m_new = tl.maximum(m_i, tl.max(s, axis=1)), the same
    m_new that gives alpha = tl.exp(m_i - m_new).
[triton_scale_twice] the scores are scaled by 1/sqrt(d) twice (q scaled before the kernel and the
    scores again, say): the weights are too flat.
  hint: scale once: s = tl.dot(q, kT) * scale with scale = 1 / sqrt(d), and q as given.
[triton_exp_of_log2_scores] the scores are in log2 units (log2(e) folded into the scale, as
    Triton's tutorial 06 does) but exponentiated with tl.exp: the weights are too sharp.
  hint: with log2(e) in the scale use tl.exp2 everywhere (p, alpha), and lse = (m_i +
    tl.log2(l_i)) / log2(e); or leave log2(e) out and use tl.exp.
[triton_bwd_causal_offset] the backward pass's causal mask or a loop bound ignores n_k - n_q
    (notebook 12's j <= i and min(n_k, i1), written for n_q = n_k): with n_q != n_k query i sees
    keys j <= i + n_k - n_q, as in the forward kernel. The bound is the end of a loop over key
    tiles (notebook 12's loop, the dQ kernel's) or the start of the dK/dV kernel's loop over
    query tiles.
  hint: mask with keys > rows + n_k - n_q, exactly as the forward pass masks; end a loop over key
    tiles at min(n_k, i1 + n_k - n_q), and start the dK/dV kernel's loop over query tiles at
    max(start_n * BLOCK_N - (n_k - n_q), 0) // BLOCK_M * BLOCK_M.
[triton_bwd_float16_mixed] with float16 inputs the backward pass multiplies float16 tensors by
    float32 ones: the kernel's lse is float32 whatever the inputs' dtype, so the weights p =
    exp(s - lse) are float32, while q, k, v, out or grad_out are still float16.
  hint: upcast at the start of backward, q, k, v, out, lse = (t.float() for t in
    ctx.saved_tensors) and do = grad_out.float(), and return each gradient cast back to its
    input's dtype (dq.to(q.dtype), ...).

[triton_bwd_no_delta] D is missing: dS = P * (dP - D) with D_i = rowsum(dO_i * O_i), the term
    the softmax's normalisation contributes; without it dS = P * dP.
  hint: a pre-pass kernel, one program per block of queries: delta = tl.sum(o.to(tl.float32) *
    do.to(tl.float32), axis=1), stored in a float32 (B, H, n_q) buffer; each tile then takes
    ds = p * (dp - delta[:, None]).
[triton_bwd_delta_of_v] D is computed from V in place of O: D_i = rowsum(dO_i * O_i) needs the
    forward pass's output out (the argument out), not the values v.
  hint: pass out and its strides to the pre-pass kernel and load O there.
[triton_bwd_weights_not_lse] the recomputed weights are not normalised: P must be exp(S * scale
    - lse) with the saved log-sum-exp lse of the whole row; exp(S - rowmax) or exp(S) are P times
    a per-query factor.
  hint: load lse for the block's queries (mask the rows past n_q) and p = tl.exp(s - lse[:,
    None]), with s = tl.dot(q, kt) * scale masked as the forward pass masks it.
[triton_bwd_scale] dQ or dK has the wrong scale: S = Q K^T / sqrt(d), so dQ = dS K / sqrt(d) and
    dK = dS^T Q / sqrt(d), each scaled exactly once (not left out, not twice).
  hint: accumulate dk += tl.dot(tl.trans(ds), q) and dq += tl.dot(ds, k) over the loop, then
    multiply each by scale = 1 / sqrt(d) once before the store.
[triton_bwd_scores_scale] the recomputed scores are not the forward pass's: S must be Q K^T /
    sqrt(d) (scaled once) before exp(S - lse), as lse was computed from the scaled scores.
  hint: s = tl.dot(q, kt) * scale with scale = 1 / sqrt(d), and p = tl.exp(s - lse[:, None]).
[triton_bwd_causal_mask] the backward kernels do not mask the future: a tile that crosses the
    diagonal gives weight to keys after the query (P = exp(S - lse) is not 0 there).
  hint: in both kernels mask each tile exactly as the forward kernel does: p = tl.where(allowed,
    p, 0.0) with allowed = (offs_n[None, :] <= offs_m[:, None] + n_k - n_q) & (offs_n[None, :] <
    n_k) & (offs_m[:, None] < n_q).
[triton_bwd_dv_from_ds] dV is computed from dS: dV = P^T dO (the weights, not their gradient),
    as out = P V.
  hint: dv += tl.dot(tl.trans(p.to(do.dtype)), do), before dS is computed.
[triton_bwd_dk_dv_swapped] dK and dV are swapped: dV = P^T dO and dK = dS^T Q / sqrt(d); the
    function returns (dq, dk, dv) in that order, and each kernel stores into its own output.
  hint: check the order of the pointers DK and DV in the launch and of the returned tuple.
[triton_bwd_dot_upcast] with float16 inputs, a tl.dot of the backward kernels multiplies a
    float32 tile (p or dS not rounded to the inputs' dtype, or q, k, v or dO upcast): on a GPU
    that is a TF32 product at half the speed of float16's tensor cores.
  hint: keep q, k, v and dO in their dtype and round p and ds before their products:
    tl.dot(tl.trans(p.to(do.dtype)), do), tl.dot(tl.trans(ds.to(q.dtype)), q), tl.dot(ds.to(
    kt.dtype), tl.trans(kt)); the accumulators stay float32 (tl.dot returns float32).
[triton_bwd_future_tiles] the backward kernels visit tiles that no query of the tile sees
    (causal): they are masked to 0, but their tl.dot products are computed for nothing.
  hint: in the dK/dV kernel start the loop over query tiles at max(start_n * BLOCK_N - (n_k -
    n_q), 0) // BLOCK_M * BLOCK_M (the first query that sees the tile's first key); in the dQ
    kernel end the loop over key tiles at min(n_k, (start_m + 1) * BLOCK_M + n_k - n_q),
    clamped to 0.
[triton_bwd_dq_race] several programs add to the same rows of dQ by a tl.load and a tl.store:
    the interpreter runs the programs one after another, so the sums come out right, but on a GPU
    they run at once and race (one program's load misses another's store).
  hint: add with tl.atomic_add (into a float32 buffer), or compute dQ in a kernel of its own, one
    program per tile of queries.
[triton_bwd_dq_end_block_n] the dQ kernel's causal loop over key tiles ends at (start_m + 1) *
    BLOCK_N + n_k - n_q: its block of queries is BLOCK_M long, so with BLOCK_M > BLOCK_N the
    last tiles of keys its queries see are left out of dQ.
  hint: end the dQ kernel's loop at min(n_k, (start_m + 1) * BLOCK_M + n_k - n_q), clamped to 0:
    the keys the block's last query sees.
[triton_bwd_nan] the gradients hold NaN or inf: a tl.dot carries a NaN of any element it reads
    into a whole row or column, even one multiplied by a weight of 0 (0 * NaN is NaN).
  hint: look for a tile's padding loaded as NaN or inf (other= of a masked tl.load must be 0.0),
    a score exponentiated before its mask, or a division by a sum of 0.
[triton_bwd_nan_no_key] the weights exp(s - lse) are computed before the mask: for a query that
    sees no key lse is -inf, so exp(s - lse) is inf and a mask by multiplication (inf * 0) or
    scores set to -inf (-inf - -inf) give NaN, which the products carry into dQ, dK and dV.
  hint: mask the weights with tl.where, and subtract a finite lse where the query sees no key:
    p = tl.where(allowed, tl.exp(s - tl.where(allowed, lse[:, None], 0.0)), 0.0).
[triton_bwd_not_in_kernel] the gradients are not computed by Triton kernels: PyTorch multiplied
    matrices on your function's path (autograd or tensor products), or the interpreter saw fewer
    tl.dot multiply-adds than the five products every (query, key) pair needs (S, dP, dV, dK, dQ).
  hint: launch your kernels (kernel[grid](...)) and compute the products inside them with
    tl.dot.
[triton_bwd_delta_float16] D = rowsum(dO * O) is computed or kept in float16 (the products and
    the sum in the inputs' dtype, or a float16 buffer for D): where grad_out is as large as a
    loss scale makes it, D passes float16's 65,504 although dO and O do not, and becomes inf, so
    dS = P * (dP - D) and dQ and dK are inf or NaN in those rows.
  hint: upcast before the product and sum in float32: delta = tl.sum(o.to(tl.float32) *
    do.to(tl.float32), axis=1), stored in a float32 (B, H, n_q) buffer.
[triton_bwd_do_strides_of_out] grad_out is addressed with out's strides (one set of strides for
    O and dO, as they have the same shape): grad_out may be any view (a transposed one here), and
    is then read in the wrong order, in D or in every kernel.
  hint: pass grad_out.stride() (all four) to every kernel that loads dO, next to out.stride(),
    and use each tensor's own strides in its pointers.
[triton_bwd_causal_mask_strict] the backward kernels' causal mask is strict (j < i + n_k - n_q):
    a query does not see the key on its own diagonal, which the forward pass (and its lse)
    counted.
  hint: mask exactly as the forward kernel does: allowed = offs_n[None, :] <= offs_m[:, None] +
    n_k - n_q (and offs_n < n_k, offs_m < n_q).
[result_cached_by_shape] called on other inputs of the shape (and dtype and strides) it has seen
    before, your function returned what it returned for the earlier inputs: a result kept from
    an earlier call (cached by shape) is not this input's.
  hint: compute every result from the inputs of that call; cache only what depends on the shape
    alone (a compiled kernel, a launch grid), never a result.
[result_buffer_reused] a result your function returned changed when it was called again: it
    returns one buffer that every call of that shape overwrites, so an earlier caller's result
    becomes the later call's.
  hint: return a new tensor each call (torch.empty(...) inside the function), not a buffer kept
    between calls.

# --- 15 the attention of today's open models
[window_not_causal] the window is symmetric or not causal: a query sees the keys after it
    (within the window) as well as before.
  hint: keep the causal condition too: allowed = (k <= q) & (k > q - window).
[window_off_by_one_wide] the window is one too wide: each query sees window + 1 keys
    (k >= q - window), as when window counts the keys besides the query (flash-attention's
    left).
  hint: a query sees window keys, itself included: q - window < k <= q, i.e. k > q - window.
[window_off_by_one_narrow] the window is one too narrow: each query sees window - 1 keys
    (k > q - window + 1), as when flash-attention's left = window - 1 is used with the test
    k > q - left meant for window.
  hint: a query sees window keys, itself included: q - window < k <= q, i.e. k > q - window.
[window_empty_slots_attended] an empty slot of the rolling cache (position -1) is attended: it
    passes the causal test -1 <= q.
  hint: also require k >= 0: a negative key position marks a slot that holds nothing yet.
[window_padding_ignored] key_padding is ignored: padded keys are attended.
  hint: with key_padding (B, n_k) return allowed & key_padding[:, None, None, :], shape
    (B, 1, n_q, n_k).
[window_mask_not_boolean] the mask is not boolean (True = may attend).
  hint: build it from comparisons (k <= q, k > q - window) combined with &, which give bool.
[window_mask_wrong_device] a tensor of the mask is built on the CPU while the positions are
    on another device (a GPU): the mask cannot be combined with them there, or comes back on
    the wrong device.
  hint: build everything from the inputs (q_positions[:, None], k_positions[None, :]) or pass
    device=q_positions.device wherever you create a tensor.
[ring_overwrites_newest] once the ring is full, each new position overwrites the newest
    entry (the last slot written) instead of the oldest: the keys still in the window are lost.
  hint: position p goes to slot p % size, the slot of position p - size, the oldest entry.
[ring_slot_off_by_one] an entry goes to the slot next to the one where its position is
    recorded (off by one): the entries no longer match their positions.
  hint: write the entry and its position to the same slot: slots[..., p % size, :] and
    positions[p % size], with p = start + i for the i-th new entry, counting from 0.
[ring_positions_not_recorded] the ring's positions are not updated where a new entry was
    written: those slots keep a stale position (or -1, empty), so the mask attends to the wrong
    keys or skips the right ones.
  hint: set positions[p % size] = p wherever you write slots[..., p % size, :].
[ring_first_new_kept] with more new entries than slots, the ring keeps the first size of
    them instead of the last size.
  hint: only the last min(t, size) new positions survive: start + t - size .. start + t - 1
    (or write them all in order, so that the later ones overwrite the earlier).
[ring_written_before_read] what the queries attend to is the ring after writing, followed by
    the new entries: the new ones appear twice and the overwritten ones, still in the window,
    are lost.
  hint: build attend = cat([slots, new], dim=-2) from the ring as it was, before writing into
    a copy of it.
[ring_new_entries_not_attended] attend holds only the ring after writing (as Mistral's cache
    does: W slots, written, then read, in slot or in time order): the new entries must follow
    the ring as it was (size + t of them), since this ring has window - 1 slots, with no room
    for both the new key and the oldest one still in the window.
  hint: attend = torch.cat([slots, new], dim=-2), attend_positions = torch.cat([positions,
    torch.arange(start, start + t, device=positions.device)]).
[mla_scale_without_rope_dims] the scores are divided by sqrt(d_nope), the width of the
    queries' parts without positions: the rotary part counts too.
  hint: each head's query is d_nope + d_rope wide (the key's two parts as well): scale by
    1 / sqrt(d_nope + d_rope).
[mla_scale_by_latent_width] the scores are divided by sqrt(r), the latent's width: the
    absorbed query lives in the latent space, but the score is still a dot product of
    d_nope + d_rope features.
  hint: absorbing w_uk changes how the score is computed, not its value: scale by
    1 / sqrt(d_nope + d_rope), as the explicit form would.
[mla_scale_by_latent_and_rope_width] the scores are divided by sqrt(r + d_rope), the width
    of the cached latent and rotary key: the score is still a dot product of d_nope + d_rope
    features, the explicit form's.
  hint: scale by 1 / sqrt(d_nope + d_rope), with d_nope = q_nope.shape[-1] (not c_kv's r).
[mla_scores_wrong_device] a tensor of the scores is built on the CPU while the inputs are on
    another device (a GPU).
  hint: pass device=q_nope.device (and dtype=q_nope.dtype) wherever you create a tensor, or
    build everything from the inputs.
[mla_scores_not_scaled] the scores are not scaled.
  hint: multiply them by 1 / sqrt(d_nope + d_rope), with d_nope = q_nope.shape[-1] and
    d_rope = q_rope.shape[-1].
[mla_rotary_part_dropped] the scores hold only the latent part q_nope . k_nope: the rotary
    part, which carries the positions, is missing.
  hint: add q_rope @ k_rope^T (k_rope shared by every head: k_rope[:, None] broadcasts over
    them) before scaling.
[mla_up_projection_transposed] the up-projection is used transposed: each head's key is
    w_uk[h] @ c_kv (w_uk[h] is d_nope x r), so the query is absorbed as w_uk[h]^T @ q_nope.
  hint: torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk) (or q_nope @ w_uk) maps each query into
    the latent space; it then meets c_kv directly.
[ring_positions_wrong_device] the new positions are built on the CPU while the ring is on
    another device (a GPU): torch.arange(start, start + t) without device= cannot be mixed
    with them there.
  hint: build them where the ring lives: torch.arange(start, start + t,
    device=positions.device).
[route_gates_not_renormalised] the gates are the top k of the softmax over all experts,
    not renormalised: they sum to less than 1.
  hint: Mixtral (whatever norm_topk_prob says) and Qwen3 with norm_topk_prob=True (route's
    default, and the released Qwen3-MoE checkpoints'; transformers' Qwen3MoeConfig defaults to
    False) divide the chosen probabilities by their sum; GPT-OSS takes the softmax of the top k
    logits only.
[route_norm_topk_prob_ignored] norm_topk_prob=False is ignored: the chosen probabilities are
    renormalised although the model does not do it.
  hint: for router "qwen3", divide the gates by their sum only when norm_topk_prob is True.
[route_softmax_over_tokens] the softmax runs over the tokens (dim 0), not over each token's
    experts.
  hint: probs = logits.softmax(dim=-1): each row (a token) sums to 1 over the experts.
[route_wrong_device] a tensor of the router is built on the CPU while the logits are on
    another device (a GPU).
  hint: derive everything from the logits (softmax, topk), or pass device=logits.device
    wherever you create a tensor.
[route_experts_not_indices] experts must be each token's top_k distinct expert indices, an
    integer tensor (N, top_k).
  hint: gates, experts = probs.topk(top_k, dim=-1) gives the indices as torch.long.
[deepseek_gates_include_bias] the gates are taken from the biased scores s + b: the bias
    only chooses the experts, the gates are their plain sigmoid scores s.
  hint: choose on scores + bias, then gates = scores.gather(1, experts) (not the biased
    values), normalised, times routed_scaling_factor.
[deepseek_softmax_scores] the scores are a softmax over the experts, not a sigmoid of each
    logit: DeepSeek-V3 scores every expert independently.
  hint: scores = logits.sigmoid(); the gates are normalised to sum to 1 only among the chosen.
[deepseek_bias_ignored] the experts are chosen on the scores s alone: the bias b, which
    DeepSeek-V3 adjusts to balance the load, must steer the choice.
  hint: rank the experts (and the groups) by scores + bias.
[deepseek_group_score_max] each group is scored by its best expert alone, as DeepSeek's gate
    does without a bias (and DeepSeek-V2): DeepSeek-V3 sums the two best s + b of each group.
  hint: group_score = grouped.topk(2, dim=-1).values.sum(-1), grouped being (N, n_group,
    E / n_group) of scores + bias.
[deepseek_groups_scored_without_bias] the groups are ranked on the scores s alone: the bias,
    which chooses the experts, chooses their groups too (DeepSeek-V3 scores a group by the
    sum of its two best s + b).
  hint: score the groups on choice = scores + bias, viewed as (N, n_group, E / n_group).
[deepseek_groups_masked_with_zero] the experts outside the chosen groups are given 0 (as
    transformers' port does), not -inf: where an eligible expert's s + b is negative, an
    expert outside the groups wins, which DeepSeek's gate never allows.
  hint: masked_fill(~eligible, float("-inf")) before the top k.
[deepseek_no_group_limit] the experts are chosen among all E, not only among the topk_group
    best groups.
  hint: score the groups, keep the topk_group best, and mask the other groups' experts out
    before the top k.
[deepseek_gates_not_normalised] the chosen scores are not divided by their sum: DeepSeek-V3's
    gates sum to routed_scaling_factor.
  hint: gates = gates / gates.sum(-1, keepdim=True), then times routed_scaling_factor.
[deepseek_scaling_factor_missing] the gates are not multiplied by routed_scaling_factor (2.5
    in DeepSeek-V3), or it is applied before the normalisation, which undoes it.
  hint: normalise first, then multiply by routed_scaling_factor.
[aux_loss_wrong_axis] the mean router probability is taken over the wrong axis: over each
    token's experts (a constant 1/E, or 1/top_k over its gates) instead of over the tokens, so
    the loss no longer depends on the router: N * top_k summed, or E / top_k with a mean (as
    transformers 4.36's Mixtral loss returned).
  hint: P = probs.mean(dim=0), shape (E,): expert i's mean probability over the tokens.
[aux_loss_fraction_of_slots] f_i is divided by the number of slots (N * top_k), not by the
    number of tokens N: the loss is top_k times too small.
  hint: f_i = (assignments to expert i) / N, so the f_i sum to top_k (as in transformers'
    load_balancing_loss_func).
[aux_loss_first_choice_only] f_i counts only each token's first choice (experts[:, 0]), as
    DeepSpeed's and GShard's top-2 loss does (balanced, it gives 1): this loss counts every
    assignment, so the f_i sum to top_k (balanced, it gives top_k).
  hint: count all of experts, every column: torch.bincount(experts.flatten(), minlength=E) / N.
[aux_loss_missing_num_experts] the factor E (the number of experts) is missing: the loss is
    E times too small and its balanced value depends on E.
  hint: return E * (f * P).sum(), with E = probs.shape[-1].
[aux_loss_probs_of_chosen_only] P_i averages only the probabilities of the experts each
    token chose (the others counted as 0; or their gates, renormalised, as MaxText once did),
    not every token's probability of expert i.
  hint: P = probs.mean(dim=0) over all tokens, whatever they chose.
[aux_loss_not_differentiable] the loss does not reach probs through autograd (detached, or
    rebuilt from Python numbers), so it cannot train the router.
  hint: compute it with torch operations on probs itself; only the counts f_i are constants.
[aux_loss_wrong_device] a tensor of the loss (the counts, most likely) is built on the CPU
    while probs is on another device (a GPU).
  hint: torch.zeros(E, dtype=probs.dtype, device=probs.device), or torch.bincount of experts
    (which lives where experts does).
"""


def _rows(table: str) -> list[tuple[str, str, str]]:
    """``(id, message, hint)`` of each row of ``table``."""
    rows: list[list[str]] = []
    field = 1
    for line in table.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("["):
            mistake_id, _, message = line[1:].partition("]")
            rows.append([mistake_id, message.strip(), ""])
            field = 1
        elif line.startswith("  hint: "):
            rows[-1][2] = line[len("  hint: ") :].strip()
            field = 2
        else:
            rows[-1][field] += " " + line.strip()
    return [(r[0], r[1], r[2]) for r in rows]


MISTAKES: dict[str, Named] = {}
for _id, _message, _hint in _rows(_TABLE):
    if _id in MISTAKES:
        raise RuntimeError(f"mistake id {_id!r} is defined twice")
    MISTAKES[_id] = Named(_id, _message, _hint)


def named(mistake_id: str, **params: object) -> Named:
    """The mistake ``mistake_id``, its ``{placeholders}`` filled from ``params``."""
    m = MISTAKES[mistake_id]
    if not params:
        return m
    return Named(m.id, m.format(**params), m.hint.format(**params))


def pair(mistake_id: str, **params: object) -> tuple[Named, str]:
    """``(message, hint)`` of ``mistake_id``, for a table of mistake models whose rows
    read ``(*pair("scale_missing"), model options)``."""
    m = named(mistake_id, **params)
    return m, m.hint


def tag(mistake_id: str) -> str:
    """The feedback's last line naming ``mistake_id``, for a program to read."""
    return f"\n  [mistake: {mistake_id}]"


def mistake_id(feedback: str) -> str:
    """The id a feedback message names on its last line (``""`` if none)."""
    last = feedback.rstrip().rsplit("\n", 1)[-1].strip()
    if last.startswith("[mistake: ") and last.endswith("]"):
        return last[len("[mistake: ") : -1]
    return ""
