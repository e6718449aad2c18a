"""Readable NumPy references for every algorithm in the source documents.

These functions are the specification the fast paths are checked against, not fast paths
themselves. Each one is written to follow its document line by line: where a document has a
loop with a loop-carried dependence (a running max, a running sum, an insertion step), the
code has the same Python loop. Passes with no dependence between elements (computing
``exp(x - m) / d`` for every element) are written as array expressions, which changes nothing
but the speed.

Algorithms (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax",
arXiv 1805.02867, and the notes derived from it):

``naive_softmax``
    ``d = sum_j exp(x_j)``, ``y_i = exp(x_i) / d``. Overflows; kept to show why the others exist.
``safe_softmax``
    Three passes: ``m = max_j x_j``, ``d = sum_j exp(x_j - m)``, ``y_i = exp(x_i - m) / d``.
``online_normalizer`` / ``online_softmax``
    One pass computes ``(m, d)`` with the recurrence
    ``m_j = max(m_{j-1}, x_j)``, ``d_j = d_{j-1} exp(m_{j-1} - m_j) + exp(x_j - m_j)``,
    a second pass writes ``y``.
``merge`` / ``tree_normalizer``
    The recurrence is a fold of the associative, commutative operator
    ``(ma, da) (+) (mb, db) = (M, da exp(ma - M) + db exp(mb - M))`` with ``M = max(ma, mb)``,
    whose identity is ``(-inf, 0)``; any reduction tree gives the same ``(m, d)`` up to rounding.
``logsumexp``
    ``m + log(d)`` from the normalizer.
``softmax_topk``
    The paper's fused online normalizer and top-k insertion loop.
``one_pass_attention``
    Attention with the running max, running sum and a rescaled output accumulator in one loop
    over the keys, so the score matrix is never formed.

Precision: maxima, exponentials and the final division happen in the input's floating dtype
(integers are promoted to float64). The one exception is the running sum ``d`` (and the
attention accumulator), which is carried in at least float64, as the CPU reference in the CUDA
log does: a float32 running sum over a thousand terms drifts by up to ~1e-5
relative, which would make a reference no better than the kernels it checks. Functions that
return ``d`` return it in that accumulator dtype; everything else comes back in the input dtype.
"""

from __future__ import annotations

import math
import operator

import numpy as np

__all__ = [
    "naive_softmax",
    "safe_softmax",
    "online_normalizer",
    "online_softmax",
    "merge",
    "tree_normalizer",
    "logsumexp",
    "softmax_topk",
    "one_pass_attention",
    "attention",
]

_NEG_INF = -math.inf


def _as_row(x) -> np.ndarray:
    """Return ``x`` as a 1-D floating array (integers and bools promoted to float64)."""
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    if x.ndim != 1:
        raise ValueError(f"expected a 1-D row, got shape {x.shape}")
    return x


def _acc_dtype(dtype) -> np.dtype:
    """Dtype of running sums: the input's float dtype, widened to at least float64."""
    return np.promote_types(dtype, np.float64)


def naive_softmax(x) -> np.ndarray:
    """Softmax straight from the definition.

    ``d = sum_j exp(x_j)``, ``y_i = exp(x_i) / d``.

    Parameters
    ----------
    x : array_like, shape (V,)

    Returns
    -------
    numpy.ndarray, shape (V,)
        ``nan`` or ``inf`` entries once ``exp(x_j)`` overflows (``x_j > ~88.7`` in float32,
        ``> ~709.8`` in float64); deliberately unguarded.
    """
    x = _as_row(x)
    # Overflow is the point of this function, so the warnings it would raise are noise.
    with np.errstate(over="ignore", invalid="ignore"):
        d = _acc_dtype(x.dtype).type(0)
        for xj in x:
            d = d + np.exp(xj)
        return np.exp(x) / x.dtype.type(d)


def safe_softmax(x) -> np.ndarray:
    """Softmax with the maximum subtracted, in three passes.

    ``m = max_j x_j``, ``d = sum_j exp(x_j - m)``, ``y_i = exp(x_i - m) / d``.

    Parameters
    ----------
    x : array_like, shape (V,)

    Returns
    -------
    numpy.ndarray, shape (V,)
        All ``nan`` for a row of ``-inf`` (``exp(-inf - (-inf))``), as ``torch.softmax`` gives.
    """
    x = _as_row(x)
    with np.errstate(invalid="ignore"):
        m = x.dtype.type(_NEG_INF)
        for xk in x:
            # np.maximum, not max(): a NaN anywhere must reach the output.
            m = np.maximum(m, xk)
        d = _acc_dtype(x.dtype).type(0)
        for xj in x:
            d = d + np.exp(xj - m)
        return np.exp(x - m) / x.dtype.type(d)


def online_normalizer(x) -> tuple:
    """The online normalizer ``(m, d)`` of a row in one pass.

    Starting from ``(m_0, d_0) = (-inf, 0)``::

        m_j = max(m_{j-1}, x_j)
        d_j = d_{j-1} * exp(m_{j-1} - m_j) + exp(x_j - m_j)

    so that ``m_V = max_j x_j`` and ``d_V = sum_j exp(x_j - m_V)``.

    Parameters
    ----------
    x : array_like, shape (V,)

    Returns
    -------
    (m, d) : tuple of NumPy scalars
        ``m`` in the input dtype, ``d`` in the accumulator dtype (at least float64).
        ``(-inf, 0)`` for an empty row or a row of ``-inf``; ``m`` is ``nan`` if any entry is.
    """
    x = _as_row(x)
    m = x.dtype.type(_NEG_INF)
    d = _acc_dtype(x.dtype).type(0)
    with np.errstate(invalid="ignore"):
        for xj in x:
            m_new = np.maximum(m, xj)
            if m_new == _NEG_INF:
                # Every element so far is -inf: each contributes exp(-inf) = 0, but the formula
                # would evaluate exp(-inf - (-inf)) = nan. Same guard as merge's.
                continue
            d = d * np.exp(m - m_new) + np.exp(xj - m_new)
            m = m_new
    return m, d


def online_softmax(x) -> np.ndarray:
    """Softmax from the online normalizer: two passes instead of three.

    ``(m, d) = online_normalizer(x)``, then ``y_i = exp(x_i - m) / d``.

    Parameters
    ----------
    x : array_like, shape (V,)

    Returns
    -------
    numpy.ndarray, shape (V,)
        All ``nan`` for a row of ``-inf`` (``0 / 0``), as ``torch.softmax`` gives.
    """
    x = _as_row(x)
    m, d = online_normalizer(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.exp(x - m) / x.dtype.type(d)


def merge(a, b) -> tuple:
    """Combine two partial normalizers.

    ``(ma, da) (+) (mb, db) = (M, da * exp(ma - M) + db * exp(mb - M))``, ``M = max(ma, mb)``.

    Associative and commutative with identity ``(-inf, 0)``, so the partials of any split of a
    row can be combined in any order or tree shape.

    Parameters
    ----------
    a, b : (m, d) pairs

    Returns
    -------
    (m, d) : tuple
        A side whose ``m`` is ``-inf`` is empty and the other side is returned unchanged (the
        formula would compute ``exp(-inf - (-inf)) = nan``); both empty gives ``(-inf, 0)``.
    """
    ma, da = a
    mb, db = b
    if ma == _NEG_INF and mb == _NEG_INF:
        return ma, np.result_type(da, db).type(0)
    if mb == _NEG_INF:
        return ma, da
    if ma == _NEG_INF:
        return mb, db
    with np.errstate(invalid="ignore"):
        M = np.maximum(ma, mb)
        return M, da * np.exp(ma - M) + db * np.exp(mb - M)


def tree_normalizer(x, leaf_size: int = 1) -> tuple:
    """The online normalizer computed as the parallel form: leaves, then a balanced tree.

    ``(m_V, d_V) = (x_1, 1) (+) (x_2, 1) (+) ... (+) (x_V, 1)``, evaluated by cutting the row
    into leaves of ``leaf_size`` elements (each reduced with :func:`online_normalizer`, as one
    thread would) and combining neighbouring partials with :func:`merge` level by level (as a
    shared-memory tree reduction would).

    Parameters
    ----------
    x : array_like, shape (V,)
    leaf_size : int, >= 1

    Returns
    -------
    (m, d) : tuple
        Equal to ``online_normalizer(x)`` up to rounding.
    """
    x = _as_row(x)
    leaf_size = operator.index(leaf_size)
    if leaf_size < 1:
        raise ValueError(f"leaf_size must be >= 1, got {leaf_size}")
    if x.size == 0:
        return online_normalizer(x)
    level = [online_normalizer(x[i : i + leaf_size]) for i in range(0, x.size, leaf_size)]
    while len(level) > 1:
        nxt = [merge(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            # An odd partial out has no partner at this level; it is merged one level up,
            # like the -inf padding of a power-of-two shared-memory reduction would do.
            nxt.append(level[-1])
        level = nxt
    return level[0]


def logsumexp(x):
    """``log(sum_j exp(x_j))`` from the online normalizer: ``m + log(d)``.

    Parameters
    ----------
    x : array_like, shape (V,)

    Returns
    -------
    NumPy scalar of the input dtype
        With ``torch.logsumexp``'s conventions: ``-inf`` for an empty row or a row of ``-inf``,
        ``+inf`` if any entry is ``+inf`` and none is ``nan``, ``nan`` if any entry is ``nan``.
    """
    x = _as_row(x)
    m, d = online_normalizer(x)
    # The three special cases are all visible in m alone: np.maximum keeps a nan once seen,
    # and once m is +inf, d is exp(inf - inf) = nan, so m + log(d) would be wrong.
    if np.isnan(m) or np.isinf(m):
        return m
    return x.dtype.type(m + np.log(d))


def softmax_topk(x, k: int) -> tuple:
    """The paper's fused online softmax and top-k.

    One pass keeps the online normalizer ``(m, d)`` and a sorted buffer ``u`` (values) / ``p``
    (indices) of length ``K + 1``: each element is written into the spare last slot and moved
    up by insertion while it beats its neighbour. Then
    ``values_i = exp(u_i - m) / d``, ``indices_i = p_i`` for the first ``K`` slots.

    Parameters
    ----------
    x : array_like, shape (V,)
    k : int, 0 <= k <= V

    Returns
    -------
    values : numpy.ndarray, shape (k,), input dtype
        The ``k`` largest softmax probabilities of the row (normalized over the whole row),
        in descending order.
    indices : numpy.ndarray, shape (k,), int64
        Their positions in ``x``; among equal values the lower index comes first.

    Raises
    ------
    ValueError
        If ``k < 0`` or ``k > V``.
    """
    x = _as_row(x)
    K = operator.index(k)
    if not 0 <= K <= x.size:
        raise ValueError(f"k must satisfy 0 <= k <= {x.size}, got {K}")
    m = x.dtype.type(_NEG_INF)
    d = _acc_dtype(x.dtype).type(0)
    u = np.full(K + 1, _NEG_INF, dtype=x.dtype)
    p = np.full(K + 1, -1, dtype=np.int64)
    with np.errstate(invalid="ignore"):
        for j, xj in enumerate(x):
            m_new = np.maximum(m, xj)
            if m_new != _NEG_INF:
                d = d * np.exp(m - m_new) + np.exp(xj - m_new)
                m = m_new
            u[K] = xj
            p[K] = j
            i = K - 1
            # Strict '<' so an equal later element stays behind an earlier one (lower index
            # wins ties); an empty slot (p == -1) loses to anything, -inf entries included.
            while i >= 0 and (p[i] == -1 or u[i] < u[i + 1]):
                u[i], u[i + 1] = u[i + 1], u[i]
                p[i], p[i + 1] = p[i + 1], p[i]
                i -= 1
        values = np.exp(u[:K] - m) / x.dtype.type(d)
    return values, p[:K].copy()


def _check_attention_args(q, k, v, scale):
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    dtype = np.result_type(q, k, v)
    if not np.issubdtype(dtype, np.floating):
        dtype = np.dtype(np.float64)
    q, k, v = q.astype(dtype, copy=False), k.astype(dtype, copy=False), v.astype(dtype, copy=False)
    if q.ndim != 2 or k.ndim != 2 or v.ndim != 2:
        raise ValueError("q, k and v must be 2-D: (Sq, D), (Sk, D), (Sk, Dv)")
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"q and k head dims differ: {q.shape[1]} vs {k.shape[1]}")
    if k.shape[0] != v.shape[0]:
        raise ValueError(f"k and v lengths differ: {k.shape[0]} vs {v.shape[0]}")
    if k.shape[0] == 0:
        raise ValueError("attention over zero keys is undefined")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[1])
    return q, k, v, dtype.type(scale)


def one_pass_attention(q, k, v, scale=None) -> tuple:
    """Attention in one loop over the keys, without forming the score matrix.

    For each query row ``n`` and key ``j = 1..Sk``, with ``x_j = scale * q_n . k_j``::

        g_j = max(g_{j-1}, x_j)
        s_j = s_{j-1} * exp(g_{j-1} - g_j) + exp(x_j - g_j)
        A_j = A_{j-1} * s_{j-1} * exp(g_{j-1} - g_j) / s_j + exp(x_j - g_j) / s_j * v_j

    ``A_j`` is the softmax-weighted mean of ``v_1..v_j`` under the first ``j`` scores, so
    ``A_Sk`` is the attention output and ``g_Sk + log(s_Sk)`` the log-sum-exp of the scores.
    ``s`` and ``A`` are carried in the accumulator dtype (at least float64).

    Parameters
    ----------
    q : array_like, shape (Sq, D)
    k : array_like, shape (Sk, D), Sk >= 1
    v : array_like, shape (Sk, Dv)
    scale : float, optional
        Multiplies the scores; ``1 / sqrt(D)`` by default.

    Returns
    -------
    out : numpy.ndarray, shape (Sq, Dv)
    lse : numpy.ndarray, shape (Sq,)
        Natural-log ``log(sum_j exp(scale * q_n . k_j))`` per query row.
    """
    q, k, v, scale = _check_attention_args(q, k, v, scale)
    Sq, Sk = q.shape[0], k.shape[0]
    acc_dtype = _acc_dtype(q.dtype)
    out = np.empty((Sq, v.shape[1]), dtype=q.dtype)
    lse = np.empty(Sq, dtype=q.dtype)
    with np.errstate(invalid="ignore"):
        for n in range(Sq):
            g = q.dtype.type(_NEG_INF)
            s = acc_dtype.type(0)
            acc = np.zeros(v.shape[1], dtype=acc_dtype)
            for j in range(Sk):
                x = scale * np.dot(q[n], k[j])
                g_new = np.maximum(g, x)
                if g_new == _NEG_INF:
                    continue  # as in online_normalizer: a -inf score adds nothing
                # What the old sum is worth under the new maximum; it rescales both the sum and
                # the accumulator, which was normalized by the old sum.
                carried = s * np.exp(g - g_new)
                e = np.exp(x - g_new)
                s_new = carried + e
                acc = acc * (carried / s_new) + (e / s_new) * v[j]
                g, s = g_new, s_new
            out[n] = acc
            lse[n] = g + np.log(s) if np.isfinite(g) else g
    return out, lse


def attention(q, k, v, scale=None) -> np.ndarray:
    """Attention with the full score matrix, for comparison with :func:`one_pass_attention`.

    ``out = safe_softmax_rows(scale * q @ k.T) @ v``.

    Parameters
    ----------
    q : array_like, shape (Sq, D)
    k : array_like, shape (Sk, D), Sk >= 1
    v : array_like, shape (Sk, Dv)
    scale : float, optional
        ``1 / sqrt(D)`` by default.

    Returns
    -------
    out : numpy.ndarray, shape (Sq, Dv)
    """
    q, k, v, scale = _check_attention_args(q, k, v, scale)
    scores = scale * (q @ k.T)
    probs = np.stack([safe_softmax(row) for row in scores])
    return probs @ v
