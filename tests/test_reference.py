"""Tests for the NumPy references in :mod:`onlinesoftmax.reference`.

Ground truth is computed independently in float64: ``max`` plus ``math.fsum`` of shifted
exponentials, ``np.argsort`` for top-k, a dense score matrix for attention. Every test that
uses random data draws a fresh seed and prints it; set ONLINESOFTMAX_TEST_SEED to replay one.
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onlinesoftmax import reference as R

INF = math.inf
NAN = math.nan

# ‖out - ref‖ / ‖ref‖ bounds from the brief; the references accumulate d in float64, so a
# float32 result is off by a few float32 roundings only.
TOL = {np.float32: 1e-6, np.float64: 1e-12}
DTYPES = [np.float32, np.float64]


@pytest.fixture
def rng():
    env = os.environ.get("ONLINESOFTMAX_TEST_SEED")
    seed = int(env) if env else np.random.SeedSequence().entropy
    print(f"numpy seed {seed} (replay: ONLINESOFTMAX_TEST_SEED={seed})")
    return np.random.default_rng(seed)


def make_row(rng, n, dtype, scale=3.0):
    """Normal entries with a few outliers times 20, so the softmax is far from uniform."""
    x = rng.standard_normal(n) * scale
    idx = rng.choice(n, size=max(1, n // 50), replace=False)
    x[idx] *= 20.0
    assert np.all(x != 0)
    return x.astype(dtype)


def normalizer64(x):
    """(max, fsum(exp(x - max))) in float64."""
    x = np.asarray(x, dtype=np.float64)
    m = float(np.max(x))
    return m, math.fsum(np.exp(x - m))


def softmax64(x):
    m, d = normalizer64(x)
    return np.exp(np.asarray(x, dtype=np.float64) - m) / d


def rel_err(out, ref):
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


def softmax_from(x, normalizer):
    m, d = normalizer
    return np.exp(x - m) / x.dtype.type(d)


# ---------------------------------------------------------------------------------------------
# Overflow: why the naive form is not used


@pytest.mark.parametrize(
    "dtype, offset", [(np.float32, 100.0), (np.float64, 1000.0)], ids=["float32", "float64"]
)
def test_naive_softmax_overflows_where_safe_and_online_do_not(rng, dtype, offset):
    # Past exp's range (~88.7 in float32, ~709.8 in float64) but well within the dtype.
    x = (offset + make_row(rng, 64, np.float64, scale=0.2)).astype(dtype)
    ref = softmax64(x)
    naive = R.naive_softmax(x)
    assert not np.all(np.isfinite(naive)), "naive softmax was expected to overflow"
    for fn in (R.safe_softmax, R.online_softmax):
        y = fn(x)
        assert y.dtype == dtype
        assert np.all(np.isfinite(y))
        assert rel_err(y, ref) < TOL[dtype], fn.__name__


@pytest.mark.parametrize("dtype", DTYPES)
def test_naive_softmax_is_right_inside_exp_range(rng, dtype):
    x = make_row(rng, 200, dtype, scale=0.5)  # largest |x| ~ 30: no overflow in float32
    y = R.naive_softmax(x)
    assert y.dtype == dtype
    assert rel_err(y, softmax64(x)) < 10 * TOL[dtype]


# ---------------------------------------------------------------------------------------------
# safe / online / tree against float64 ground truth


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 1000])
@pytest.mark.parametrize("fn", [R.safe_softmax, R.online_softmax], ids=["safe", "online"])
def test_softmax_matches_float64(rng, fn, n, dtype):
    x = make_row(rng, n, dtype)
    y = fn(x)
    assert y.dtype == dtype and y.shape == (n,)
    assert rel_err(y, softmax64(x)) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 1000])
def test_online_normalizer_matches_float64(rng, n, dtype):
    x = make_row(rng, n, dtype)
    m, d = R.online_normalizer(x)
    m_ref, d_ref = normalizer64(x)
    assert m == m_ref  # the max is exact: no rounding involved
    assert m.dtype == dtype
    assert abs(d - d_ref) / d_ref < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, leaf_size", [
    (1, 1), (1, 4), (7, 1), (7, 2), (7, 3), (7, 7), (7, 100),
    (1000, 1), (1000, 3), (1000, 7), (1000, 64), (1000, 1000), (1023, 10), (1025, 256),
])
def test_tree_normalizer_matches_float64(rng, n, leaf_size, dtype):
    x = make_row(rng, n, dtype)
    m, d = R.tree_normalizer(x, leaf_size=leaf_size)
    m_ref, d_ref = normalizer64(x)
    assert m == m_ref
    assert abs(d - d_ref) / d_ref < TOL[dtype]
    y = softmax_from(x, (m, d))
    assert rel_err(y, softmax64(x)) < TOL[dtype]


@pytest.mark.parametrize("fn", [R.safe_softmax, R.online_softmax], ids=["safe", "online"])
def test_float32_sum_does_not_drift_on_a_long_row(fn):
    # One large entry, then 20000 equal small terms: a float32 running sum rounds every addition
    # the same way, so its error grows linearly (to ~1e-4 here) instead of as a random walk.
    x = np.concatenate([[1.0], np.full(20000, -8.0)]).astype(np.float32)
    assert rel_err(fn(x), softmax64(x)) < TOL[np.float32]
    m, d = R.online_normalizer(x)
    m_ref, d_ref = normalizer64(x)
    assert abs(d - d_ref) / d_ref < TOL[np.float32]


@pytest.mark.parametrize("n, leaf_size", [(1, 1), (7, 2), (1000, 7), (1000, 1000), (1024, 1)])
def test_tree_normalizer_uses_one_leaf_per_chunk_and_one_merge_per_join(
    rng, monkeypatch, n, leaf_size
):
    leaves, merges = [], []
    real_leaf, real_merge = R.online_normalizer, R.merge

    def leaf(chunk):
        leaves.append(len(chunk))
        return real_leaf(chunk)

    def merge(a, b):
        merges.append(1)
        return real_merge(a, b)

    monkeypatch.setattr(R, "online_normalizer", leaf)
    monkeypatch.setattr(R, "merge", merge)
    x = make_row(rng, n, np.float64)
    m, d = R.tree_normalizer(x, leaf_size=leaf_size)
    n_leaves = -(-n // leaf_size)
    assert len(leaves) == n_leaves
    assert sum(leaves) == n and max(leaves) <= leaf_size
    assert len(merges) == n_leaves - 1  # a reduction tree over L leaves has L - 1 joins
    m_ref, d_ref = normalizer64(x)
    assert m == m_ref and abs(d - d_ref) / d_ref < 1e-12


@pytest.mark.parametrize("leaf_size", [0, -3])
def test_tree_normalizer_rejects_bad_leaf_size(leaf_size):
    with pytest.raises(ValueError):
        R.tree_normalizer(np.ones(4), leaf_size=leaf_size)


def test_rows_must_be_one_dimensional():
    with pytest.raises(ValueError):
        R.online_softmax(np.ones((2, 3)))


# ---------------------------------------------------------------------------------------------
# -inf, +inf and nan


def test_online_normalizer_guard_for_leading_neg_inf():
    m, d = R.online_normalizer(np.array([-INF, -INF, 2.0, -INF, 1.0]))
    assert m == 2.0
    assert d == pytest.approx(1.0 + math.exp(-1.0), rel=1e-15)


@pytest.mark.parametrize("dtype", DTYPES)
def test_neg_inf_entries_get_zero_probability(rng, dtype):
    n = 100
    x = make_row(rng, n, dtype)
    dead = np.concatenate([[0, 1, 2], rng.choice(np.arange(3, n), size=20, replace=False)])
    x[dead] = -INF
    ref = softmax64(x)
    outputs = {
        "safe": R.safe_softmax(x),
        "online": R.online_softmax(x),
        "tree1": softmax_from(x, R.tree_normalizer(x, 1)),
        "tree4": softmax_from(x, R.tree_normalizer(x, 4)),  # first leaf is partly -inf
        "tree2": softmax_from(x, R.tree_normalizer(x, 2)),  # first leaf is all -inf
    }
    for name, y in outputs.items():
        assert not np.any(np.isnan(y)), name
        assert np.all(y[dead] == 0), name
        assert rel_err(y, ref) < TOL[dtype], name


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 5, 16])
def test_all_neg_inf_row(n, dtype):
    x = np.full(n, -INF, dtype=dtype)
    for m, d in [R.online_normalizer(x), R.tree_normalizer(x, 1), R.tree_normalizer(x, 3)]:
        assert m == -INF and d == 0
    # softmax of an all -inf row is nan everywhere, as torch.softmax gives
    for fn in (R.safe_softmax, R.online_softmax, R.naive_softmax):
        y = fn(x)
        assert y.shape == (n,) and np.all(np.isnan(y)), fn.__name__
    assert R.logsumexp(x) == -INF


@pytest.mark.parametrize("special", [NAN, INF])
@pytest.mark.parametrize("fn", [R.safe_softmax, R.online_softmax], ids=["safe", "online"])
def test_nan_or_pos_inf_makes_the_whole_softmax_nan(rng, fn, special):
    # torch.softmax gives nan everywhere for both: exp(inf - inf) poisons the normalizer.
    x = make_row(rng, 9, np.float64)
    x[4] = special
    assert np.all(np.isnan(fn(x)))


def test_empty_row():
    m, d = R.online_normalizer(np.array([]))
    assert m == -INF and d == 0
    assert R.tree_normalizer(np.array([]), 4) == (m, d)
    assert R.logsumexp(np.array([])) == -INF
    assert R.online_softmax(np.array([])).shape == (0,)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 1000])
def test_logsumexp_matches_float64(rng, n, dtype):
    x = make_row(rng, n, dtype)
    m, d = normalizer64(x)
    ref = m + math.log(d)
    out = R.logsumexp(x)
    assert out.dtype == dtype
    assert abs(out - ref) <= TOL[dtype] * max(1.0, abs(ref))


def test_logsumexp_of_large_values_does_not_overflow():
    x = np.array([1000.0, 1000.0, 999.0])
    assert R.logsumexp(x) == pytest.approx(1000.0 + math.log(2.0 + math.exp(-1.0)), rel=1e-15)


@pytest.mark.parametrize("row", [
    [NAN], [NAN, 1.0, 2.0], [1.0, NAN, 2.0], [1.0, 2.0, NAN],
    [INF, NAN], [NAN, INF], [-INF, NAN], [NAN, -INF, -INF], [INF, 1.0, NAN, -INF],
])
def test_logsumexp_propagates_nan(row):
    assert np.isnan(R.logsumexp(np.array(row)))


@pytest.mark.parametrize("row", [
    [INF], [INF, 1.0], [1.0, INF], [INF, INF], [-INF, INF, -INF], [1e308, INF, -5.0],
])
def test_logsumexp_of_pos_inf_is_pos_inf(row):
    assert R.logsumexp(np.array(row)) == INF


def test_logsumexp_special_values_agree_with_torch():
    torch = pytest.importorskip("torch")
    rows = [[-INF, -INF], [INF, 1.0], [1.0, INF, -INF], [NAN, 1.0], [INF, NAN], [0.5, -INF]]
    for row in rows:
        ours = R.logsumexp(np.array(row))
        theirs = torch.logsumexp(torch.tensor(row, dtype=torch.float64), dim=0).item()
        assert (math.isnan(ours) and math.isnan(theirs)) or ours == theirs, row
    y_t = torch.softmax(torch.full((3,), -INF, dtype=torch.float64), dim=0).numpy()
    assert np.array_equal(np.isnan(R.online_softmax(np.full(3, -INF))), np.isnan(y_t))


# ---------------------------------------------------------------------------------------------
# merge: the (m, d) operator

EMPTY = (-INF, 0.0)
partials = st.one_of(
    st.just(EMPTY),
    st.tuples(
        st.floats(min_value=-50.0, max_value=50.0),
        st.floats(min_value=1e-100, max_value=1e100),
    ),
)


def assert_same_partial(p, q, rtol=1e-12):
    assert p[0] == q[0], (p, q)  # max is exact, so m must agree bit for bit
    if p[0] == -INF:
        assert p[1] == 0 and q[1] == 0
    else:
        assert math.isclose(p[1], q[1], rel_tol=rtol), (p, q)


@settings(max_examples=300, deadline=None)
@given(partials, partials)
def test_merge_is_commutative(a, b):
    assert_same_partial(R.merge(a, b), R.merge(b, a))


@settings(max_examples=300, deadline=None)
@given(partials, partials, partials)
def test_merge_is_associative(a, b, c):
    assert_same_partial(R.merge(R.merge(a, b), c), R.merge(a, R.merge(b, c)))


@settings(max_examples=300, deadline=None)
@given(partials)
def test_merge_identity_is_neg_inf_zero(a):
    for p in (R.merge(a, EMPTY), R.merge(EMPTY, a)):
        assert p[0] == a[0] and p[1] == a[1]


@settings(max_examples=300, deadline=None)
@given(partials, partials)
def test_merge_adds_the_represented_sums(a, b):
    # (m, d) stands for the sum d * exp(m); merging must add those sums: in log space,
    # m + log(d) = logaddexp(ma + log(da), mb + log(db)).
    m, d = R.merge(a, b)
    assert m == max(a[0], b[0])
    with np.errstate(divide="ignore"):
        want = np.logaddexp(a[0] + np.log(a[1]), b[0] + np.log(b[1]))
        got = m + np.log(d)
    if want == -INF:
        assert got == -INF
    else:
        assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12)


def test_merge_of_two_empty_partials_is_empty():
    m, d = R.merge(EMPTY, EMPTY)
    assert m == -INF and d == 0


@pytest.mark.parametrize("n", [7, 500])
def test_merge_in_any_split_and_order_gives_the_normalizer(rng, n):
    x = make_row(rng, n, np.float64)
    m_ref, d_ref = normalizer64(x)
    # the paper's form: a fold of (x_j, 1) singletons
    m, d = functools.reduce(R.merge, [(xj, 1.0) for xj in x], EMPTY)
    assert m == m_ref and abs(d - d_ref) / d_ref < 1e-12
    # random cut points, partials merged in a random order
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(n - 1, 5), replace=False))
    parts = [R.online_normalizer(chunk) for chunk in np.split(x, cuts)]
    order = rng.permutation(len(parts))
    m, d = functools.reduce(R.merge, [parts[i] for i in order], EMPTY)
    assert m == m_ref and abs(d - d_ref) / d_ref < 1e-12


# ---------------------------------------------------------------------------------------------
# softmax + top-k


def topk64(x, k):
    """Top-k of the float64 softmax: descending, ties to the lower index (stable sort)."""
    x64 = np.asarray(x, dtype=np.float64)
    idx = np.argsort(-x64, kind="stable")[:k]
    return softmax64(x)[idx], idx


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, k", [(1, 0), (1, 1), (7, 0), (7, 3), (7, 7), (1000, 1), (1000, 5),
                                  (1000, 64)])
def test_softmax_topk_matches_argsort(rng, n, k, dtype):
    x = make_row(rng, n, dtype)
    values, indices = R.softmax_topk(x, k)
    ref_values, ref_indices = topk64(x, k)
    assert indices.dtype == np.int64 and values.dtype == dtype
    assert values.shape == indices.shape == (k,)
    np.testing.assert_array_equal(indices, ref_indices)
    if k:
        assert rel_err(values, ref_values) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_topk_with_k_equal_to_length_sorts_the_whole_softmax(rng, dtype):
    x = make_row(rng, 50, dtype)
    values, indices = R.softmax_topk(x, 50)
    np.testing.assert_array_equal(np.sort(indices), np.arange(50))
    assert np.all(np.diff(values.astype(np.float64)) <= 0)
    assert rel_err(values, softmax64(x)[indices]) < TOL[dtype]
    assert math.fsum(values.astype(np.float64)) == pytest.approx(1.0, rel=1e-5)


@pytest.mark.parametrize("k", [-1, 6, 100])
def test_softmax_topk_rejects_k_out_of_range(k):
    with pytest.raises(ValueError):
        R.softmax_topk(np.arange(5.0), k)


def test_softmax_topk_ties_go_to_the_lower_index():
    x = np.array([1.0, 3.0, 3.0, 2.0, 3.0, -INF, 3.0])
    values, indices = R.softmax_topk(x, 4)
    np.testing.assert_array_equal(indices, [1, 2, 4, 6])
    d = 4.0 + math.exp(-1.0) + math.exp(-2.0)
    np.testing.assert_allclose(values, np.full(4, 1.0 / d), rtol=1e-15)
    # -inf entries tie too, and must still displace the empty slots
    values, indices = R.softmax_topk(np.array([-INF, 0.0, -INF]), 3)
    np.testing.assert_array_equal(indices, [1, 0, 2])
    np.testing.assert_array_equal(values, [1.0, 0.0, 0.0])


def test_softmax_topk_many_ties_matches_stable_argsort(rng):
    x = rng.integers(-3, 3, size=300).astype(np.float64) * 2.5 + 0.5  # never zero, many ties
    values, indices = R.softmax_topk(x, 40)
    ref_values, ref_indices = topk64(x, 40)
    np.testing.assert_array_equal(indices, ref_indices)
    assert rel_err(values, ref_values) < 1e-12


# ---------------------------------------------------------------------------------------------
# one-pass attention


def attention64(q, k, v, scale):
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    s = scale * (q @ k.T)
    m = s.max(axis=1, keepdims=True)
    e = np.exp(s - m)
    total = e.sum(axis=1, keepdims=True)
    return (e / total) @ v, (m + np.log(total))[:, 0]


def make_qkv(rng, sq, sk, d, dtype):
    q = make_row(rng, sq * d, np.float64, scale=1.0).reshape(sq, d).astype(dtype)
    k = rng.standard_normal((sk, d)).astype(dtype)
    v = rng.standard_normal((sk, d)).astype(dtype)
    return q, k, v


# float32 scores carry the rounding of a length-D float32 dot product, and with outlier queries
# (scores in the tens) exp turns that into up to ~6e-6 relative error in the output (seen over
# 900 random cases); the bound leaves room above that.
ATTN_TOL = {np.float32: 3e-5, np.float64: 1e-12}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sq, sk, d", [(1, 1, 4), (3, 7, 16), (8, 64, 32), (2, 200, 8)])
def test_one_pass_attention_matches_references(rng, sq, sk, d, dtype):
    q, k, v = make_qkv(rng, sq, sk, d, dtype)
    scale = 1.0 / math.sqrt(d)
    out, lse = R.one_pass_attention(q, k, v)
    assert out.shape == (sq, d) and lse.shape == (sq,)
    assert out.dtype == dtype and lse.dtype == dtype
    ref_out, ref_lse = attention64(q, k, v, scale)
    assert rel_err(out, ref_out) < ATTN_TOL[dtype]
    assert rel_err(R.attention(q, k, v), ref_out) < ATTN_TOL[dtype]
    assert rel_err(out, R.attention(q, k, v)) < ATTN_TOL[dtype]
    # lse: natural log of the sum of exp of the scaled scores, computed directly
    scores = scale * (q.astype(np.float64) @ k.astype(np.float64).T)
    direct = np.array([math.log(math.fsum(np.exp(row))) for row in scores])
    np.testing.assert_allclose(lse, direct, rtol=ATTN_TOL[dtype], atol=ATTN_TOL[dtype])


def test_one_pass_attention_explicit_scale_and_large_scores(rng):
    q, k, v = make_qkv(rng, 4, 50, 16, np.float64)
    q *= 50.0  # scores in the hundreds and beyond: exp would overflow without the running max
    for scale in (0.3, 2.0):
        out, lse = R.one_pass_attention(q, k, v, scale=scale)
        ref_out, ref_lse = attention64(q, k, v, scale)
        assert np.all(np.isfinite(out))
        assert rel_err(out, ref_out) < 1e-12
        np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)
        assert rel_err(R.attention(q, k, v, scale=scale), ref_out) < 1e-12


def test_one_pass_attention_rejects_zero_keys():
    with pytest.raises(ValueError):
        R.one_pass_attention(np.ones((2, 4)), np.ones((0, 4)), np.ones((0, 4)))
