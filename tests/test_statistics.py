"""Embedding-ID statistics against independent plain-Python computations."""
import math

import numpy as np
import pytest

from components.embedding_preprocess import statistics


def test_batch_table_stats_div_and_mod():
    batches = [[0, 1, 1, 5, 9], [2, 2, 7], [9, 9]]  # the last batch is partial
    ids = np.array([i for b in batches for i in b])
    batch_of = np.array([k for k, b in enumerate(batches) for _ in b])
    out = statistics.batch_table_stats("train", "t", ids, batch_of, np.array([True, True, False]), 10, [2, 3])
    for n in (2, 3):
        block = math.ceil(10 / n)
        for strategy, shard in (("div", lambda i: i // block), ("mod", lambda i: i % n)):
            load = [sum(1 for i in ids if shard(i) == s) for s in range(n)]
            assert out[f"vec/train/table/t/{strategy}/{n}/load"].tolist() == load  # partial batch included
            per_batch = [[sum(1 for i in b if shard(i) == s) for s in range(n)] for b in batches[:2]]
            uniq = [[sum(1 for i in set(b) if shard(i) == s) for s in range(n)] for b in batches[:2]]
            assert out[f"max/train/table/t/{strategy}/{n}/max_ids_per_shard"] == max(map(max, per_batch))
            assert out[f"max/train/table/t/{strategy}/{n}/max_unique_ids_per_shard"] == max(map(max, uniq))
    assert out["train/table/t/batches"] == 2
    assert out["train/table/t/batch_ids"] == 8 and out["max/train/table/t/batch_ids"] == 5
    assert out["train/table/t/batch_unique_ids"] == 4 + 2 and out["max/train/table/t/batch_unique_ids"] == 4
    partial = statistics.batch_table_stats("train", "t", ids, batch_of, np.array([False] * 3), 10, [2])
    assert not any(k.startswith("max/") for k in partial)  # a partial batch says nothing about a step


def test_hot_rows_load_first_shard_under_div_but_spread_under_mod():
    rng = np.random.default_rng(0)
    ids = np.minimum(rng.zipf(1.3, 100000) - 1, 9999)  # frequency-ordered vocabulary: hot rows first
    raw = statistics.batch_table_stats("train", "t", ids, np.zeros(len(ids), np.int64), np.array([True]), 10000, [8])
    summary = statistics.shard_summary(raw, "train", "t", [8], headroom=0.2)["8"]
    # div puts the whole hot head on shard 0 (~7x the mean here); mod spreads all but the hottest row
    assert summary["div"]["max_over_mean_load"] > 6
    assert summary["mod"]["max_over_mean_load"] < summary["div"]["max_over_mean_load"] / 2
    limits = summary["suggested_sparsecore_limits"]
    assert limits["max_ids_per_table"] == math.ceil(summary["mod"]["max_ids_per_shard_per_batch"] * 1.2)


def test_vocabulary_stats_coverage_and_skew():
    counts = [8, 4, 2, 1, 1]
    top = [(b"a", 8), (b"b", 4)]
    info = statistics.vocabulary_stats("v", statistics.CountHistogram.of(counts), kept=3, top=top)["info/vocab/v"]
    assert info["coverage_curve"] == [
        {"top": 1, "share": 0.5}, {"top": 2, "share": 0.75}, {"top": 4, "share": 15 / 16}, {"top": 5, "share": 1.0}
    ]
    assert info["covered_by_vocabulary"] == 14 / 16
    assert info["hottest_values"][0] == {"value": "a", "count": 8, "share": 0.5}
    diffs = sum(abs(a - b) for a in counts for b in counts)
    gini = diffs / (2 * len(counts) ** 2 * np.mean(counts))
    assert info["skew"]["gini"] == pytest.approx(gini)


def _direct_distribution(counts, kept):
    """The distribution figures computed value by value, from the counts in descending order."""
    desc = np.sort(np.asarray(counts))[::-1]
    total = desc.sum()
    cum = np.cumsum(desc)
    n, tops = len(desc), []
    t = 1
    while t < n:
        tops.append(cum[t - 1] / total)
        t *= 2
    asc = desc[::-1].astype(np.float64)
    gini = 2 * np.sum(np.arange(1, n + 1) * asc) / (n * total) - (n + 1) / n
    return tops, gini, cum[max(1, n // 100) - 1] / total, cum[kept - 1] / total


@pytest.mark.parametrize("weighted", [False, True])
def test_count_histogram_equals_the_value_by_value_figures_and_merges_by_adding(weighted):
    rng = np.random.default_rng(7)
    counts = np.minimum(rng.zipf(1.4, 5000), 10**6)
    if weighted:
        counts = counts * rng.uniform(0.5, 1.5, len(counts))
    parts = np.array_split(rng.permutation(counts), 7)
    hist = statistics.CountHistogram.merge(statistics.CountHistogram.of(p) for p in parts)
    assert hist.distinct == len(counts) and hist.occurrences() == pytest.approx(counts.sum(), rel=1e-12)
    if not weighted:
        assert len(hist.values) < len(counts) // 4  # integer counts: one entry per distinct count
    info = statistics.distribution_stats(hist, [], kept=1234)
    tops, gini, top1, kept_share = _direct_distribution(counts, 1234)
    assert [c["share"] for c in info["coverage_curve"][:-1]] == pytest.approx(tops, rel=1e-12)
    assert [c["top"] for c in info["coverage_curve"]] == [2**i for i in range(len(tops))] + [len(counts)]
    assert info["skew"]["gini"] == pytest.approx(gini, rel=1e-9)
    assert info["skew"]["top_1pct_share"] == pytest.approx(top1, rel=1e-12)
    assert info["covered_by_vocabulary"] == pytest.approx(kept_share, rel=1e-12)
    empty = statistics.distribution_stats(statistics.CountHistogram.of([]), [], kept=0)
    assert empty["distinct_values"] == 0 and empty["occurrences"] == 0 and empty["coverage_curve"] == []


def test_merge_rules():
    a = {"n": 1, "max/m": 3, "vec/v": np.array([1, 2]), "info/x": {"k": 1}}
    b = {"n": 2, "max/m": 5, "vec/v": np.array([1, 1, 1]), "info/x": {"k": 1}}
    m = statistics.merge_stats([a, b])
    assert m["n"] == 3 and m["max/m"] == 5 and m["vec/v"].tolist() == [2, 3, 1] and m["info/x"] == {"k": 1}
    assert a["vec/v"].tolist() == [1, 2]  # inputs are not modified


def test_pooling_summary_percentiles():
    hist = [0, 50, 40, 9, 1]  # 50 examples with 1 ID, 40 with 2, ...
    s = statistics.pooling_summary(hist)
    values = sorted(v for v, c in enumerate(hist) for _ in range(c))
    assert s["p50"] == values[49] and s["p90"] == values[89] and s["p99"] == values[98]
    assert s["max"] == 4 and s["mean"] == pytest.approx(np.mean(values))


def test_arrow_ordering_equals_python_ordering():
    import random

    import pyarrow as pa

    from components.config.schema import VocabularyOptions
    from components.embedding_preprocess import vocabulary

    rng = random.Random(3)
    counts = {bytes(rng.choice(b"ab\xff\x00z") for _ in range(rng.randint(1, 4))): rng.randint(1, 5) for _ in range(400)}
    items = list(counts.items())
    tokens, cnts = vocabulary.order_arrays(pa.array([t for t, _ in items], pa.binary()), pa.array([c for _, c in items]))
    for options in (VocabularyOptions(), VocabularyOptions(min_frequency=3), VocabularyOptions(top_k=10, min_frequency=2)):
        expected = vocabulary.order_vocabulary(items, options)
        kept = vocabulary.prune(cnts, options)
        assert list(zip(tokens.to_pylist()[:kept], cnts.to_pylist()[:kept])) == expected


def test_batch_table_stats_counting_and_sorting_paths_agree(monkeypatch):
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 500, 3000)
    batch_of = np.sort(rng.integers(0, 12, 3000))
    full = np.array([True] * 11 + [False])
    counted = statistics.batch_table_stats("train", "t", ids, batch_of, full, 500, [2, 4])
    monkeypatch.setattr(statistics, "_PRESENCE_LIMIT", 0)  # every table through np.unique
    sorted_ = statistics.batch_table_stats("train", "t", ids, batch_of, full, 500, [2, 4])
    assert counted.keys() == sorted_.keys()
    for k in counted:
        np.testing.assert_array_equal(counted[k], sorted_[k], err_msg=k)


def test_dense_quantile_sketches_merge_and_are_written_as_percentiles():
    """`sketch/` partials: each record batch's quantiles sketch (a stride sample of at most
    QUANTILE_SAMPLE values) merges into the accumulator without changing the partials, and the
    merged partial is written as the 101 percentiles, near the exact ones."""
    import json

    from components.embedding_preprocess import partials as partials_lib

    rng = np.random.default_rng(7)
    batches = [rng.lognormal(size=16384).astype(np.float32) for _ in range(6)] + [np.float32([1e6])]
    key = partials_lib.dense_quantiles("train", "d")
    partials = [{key: statistics.quantiles_sketch(statistics.quantile_sample(b)), "train/dense/d/missing": 0} for b in batches]
    assert len(statistics.quantile_sample(batches[0])) == statistics.QUANTILE_SAMPLE and len(statistics.quantile_sample(batches[-1])) == 1
    merged = statistics.merge_stats(partials)
    assert all(merged[key] is not p[key] for p in partials)
    first = statistics.sketch_quantiles(partials[0][key])  # the partial itself is unchanged by the merge
    assert first == statistics.sketch_quantiles(statistics.quantiles_sketch(statistics.quantile_sample(batches[0])))
    written = json.loads(json.dumps(statistics.jsonable(merged)))[key]
    assert len(written) == statistics.QUANTILE_POINTS + 1 and written == sorted(written)
    everything = np.concatenate(batches)
    sampled = np.concatenate([statistics.quantile_sample(b) for b in batches])
    assert written[0] == float(sampled.min()) and written[-1] == 1e6  # the sample's minimum and maximum kept
    exact = np.percentile(everything, np.arange(101))
    ranks = np.searchsorted(np.sort(everything), written[1:-1]) / len(everything)
    assert np.abs(ranks - np.arange(1, 100) / 100).max() < 0.01, (ranks, exact)


def test_compacted_sketches_are_bounded_and_keep_the_percentiles():
    """MergeStatsFn.compact (what a worker sends on): a sketch of many batches becomes
    QUANTILE_COMPACT + 1 weighted points, a bounded size whatever the rows, and merging compacted
    bundles gives the percentiles of the uncompacted merge to within a fraction of a percent of rank."""
    import pickle

    from components.embedding_preprocess import partials as partials_lib
    from components.embedding_preprocess.beam_pipeline import MergeStatsFn

    rng = np.random.default_rng(3)
    key, count = partials_lib.dense_quantiles("train", "d"), partials_lib.dense_quantile_values("train", "d")
    fn = MergeStatsFn()
    bundles, values = [], []
    for _ in range(8):  # 8 worker bundles of 50 batches each
        acc = fn.create_accumulator()
        for _ in range(50):
            batch = rng.gamma(2.0, size=statistics.QUANTILE_SAMPLE)
            values.append(batch)
            acc = fn.add_input(acc, {key: statistics.quantiles_sketch(batch), count: len(batch)})
        compact = fn.compact(acc)
        assert compact.values[count] == 50 * statistics.QUANTILE_SAMPLE
        assert len(pickle.dumps(compact)) < len(pickle.dumps(acc)) / 10 and len(pickle.dumps(compact)) < 64_000
        bundles.append(compact)
    merged = fn.extract_output(fn.merge_accumulators(bundles))
    got = np.asarray(statistics.sketch_quantiles(merged[key]))
    everything = np.sort(np.concatenate(values))
    ranks = np.searchsorted(everything, got[1:-1]) / len(everything)
    assert np.abs(ranks - np.arange(1, 100) / 100).max() < 0.005
    small = {key: statistics.quantiles_sketch(np.arange(10.0)), count: 10}
    assert statistics.compact_sketches(small)[key] is small[key]  # nothing to gain under QUANTILE_COMPACT values
