"""Strict streaming client input (`client.records`): blocks bounded by the batch,
each embedding's format and range, clipping only when asked and counted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from svtagg.client.embeddings import marginals_embedding, sparse_mean_embedding
from svtagg.client.records import InputError, ReadStats, Spec, read_input


def _csv(tmp_path: Path, rows: list[list[float]] | str, name: str = "x.csv") -> Path:
    p = tmp_path / name
    text = rows if isinstance(rows, str) else "".join(",".join(map(str, r)) + "\n" for r in rows)
    p.write_text(text)
    return p


def test_blocks_are_bounded_by_the_batch(tmp_path: Path):
    rng = np.random.default_rng(3)
    x = rng.random((2503, 4))
    path = _csv(tmp_path, x.tolist())
    stats = ReadStats()
    blocks = list(read_input(path, Spec(4, "matrix"), batch=100, stats=stats))
    assert [len(b) for b in blocks] == [100] * 25 + [3]
    assert stats.rows == 2503
    np.testing.assert_allclose(np.vstack(blocks), x)


def test_npy_categories_and_matrix(tmp_path: Path):
    cats = tmp_path / "c.npy"
    np.save(cats, np.array([[0, 3], [2, 1]]))
    got = np.vstack(list(read_input(cats, Spec(4, "categories", "heavy_hitters"))))
    assert got.tolist() == [[1, 0, 0, 1], [0, 1, 1, 0]]
    np.save(cats, np.array([[0, 4]]))
    with pytest.raises(InputError, match="outside"):
        list(read_input(cats, Spec(4, "categories", "heavy_hitters")))
    m = tmp_path / "m.npy"
    np.save(m, np.array([[0.0, 1.0, 0.5]]))
    with pytest.raises(InputError, match="row 1, column 3"):
        list(read_input(m, Spec(3, "matrix", "heavy_hitters")))
    np.save(m, np.zeros((2, 3, 1)))
    with pytest.raises(InputError, match="2-d"):
        list(read_input(m, Spec(3, "matrix")))


def test_records_embeddings(tmp_path: Path):
    # marginals: a binary attributes per row, d = a(a-1)/2 pairs.
    x = [[1, 1, 0], [1, 1, 1]]
    got = np.vstack(list(read_input(_csv(tmp_path, x), Spec(3, "records", "marginals"))))
    np.testing.assert_array_equal(got, marginals_embedding(np.array(x)))
    with pytest.raises(InputError, match="not a pair count"):
        list(read_input(_csv(tmp_path, x), Spec(4, "records", "marginals")))
    with pytest.raises(InputError, match="not 0 or 1"):
        list(read_input(_csv(tmp_path, [[1, 2, 0]]), Spec(3, "records", "marginals")))
    # sparse_mean: refused beyond B, clipped and counted with clip=True.
    y = [[0.5, -4.0], [5.0, 1.0], [0.0, 0.0]]
    spec = Spec(2, "records", "sparse_mean", {"clip": 3.0})
    with pytest.raises(InputError, match="row 1, column 2: -4 is outside"):
        list(read_input(_csv(tmp_path, y), spec))
    stats = ReadStats()
    spec.clip = True
    got = np.vstack(list(read_input(_csv(tmp_path, y), spec, stats=stats)))
    np.testing.assert_allclose(got, sparse_mean_embedding(np.array(y), 3.0))
    assert (stats.clipped, stats.first_clipped, stats.by_column) == (2, (1, 2), {1: 1, 2: 1})
    # fp_loss needs its bound and exponent.
    with pytest.raises(InputError, match="bound=..., p="):
        Spec(2, "records", "fp_loss")


def test_matrix_clip_counts(tmp_path: Path):
    stats = ReadStats()
    spec = Spec(3, "matrix", clip=True)
    got = np.vstack(list(read_input(_csv(tmp_path, [[0.5, 2, -1], [0, 1, 1]]), spec, stats=stats)))
    assert got.tolist() == [[0.5, 1, 0], [0, 1, 1]]
    assert stats.clipped == 2
    # NaN is never clipped.
    with pytest.raises(InputError, match="not a finite"):
        list(read_input(_csv(tmp_path, "0,nan,1\n"), spec))


def test_crlf_header_and_long_lines(tmp_path: Path):
    path = _csv(tmp_path, "a,b\r\n0,1\r\n1,0\r\n")
    got = np.vstack(list(read_input(path, Spec(2, "matrix"), header=True)))
    assert got.tolist() == [[0, 1], [1, 0]]
    long = _csv(tmp_path, "x" * 100_000 + "\n0,1\n")
    with pytest.raises(InputError, match="row 1 is longer than"):
        list(read_input(long, Spec(2, "matrix"), header=True))


def test_front_door_category_input_reads_rows_not_labels() -> None:
    """A DataFrame of category ids is read row by row (iterating it would give
    its column labels); a Series or 1-D array is one id per user; booleans,
    NaN and inf are refused with the row and column."""
    import pandas as pd

    from svtagg.client.records import InputError, ReadStats, Spec, embed_block
    from svtagg.deploy.connection import _category_rows

    spec = Spec(5, "categories", "heavy_hitters", {})
    counts = embed_block(spec, _category_rows(pd.DataFrame({"c": [1, 3, 4]})), 1, ReadStats())
    assert counts.sum(axis=0).tolist() == [0, 1, 0, 1, 1]
    counts = embed_block(spec, _category_rows(pd.Series([0, 2])), 1, ReadStats())
    assert counts.sum(axis=0).tolist() == [1, 0, 1, 0, 0]
    for bad in (np.bool_(True), float("nan"), float("inf")):
        with pytest.raises(InputError, match="row 1, column 1"):
            embed_block(spec, [[bad]], 1, ReadStats())


def test_a_field_only_python_reads_is_refused_cleanly(tmp_path: Path) -> None:
    """'1_000' is a float to Python but not to numpy's reader: a one-line
    InputError naming the rows, not numpy's bare ValueError."""
    path = tmp_path / "u.csv"
    path.write_text("0.5,1_000\n")
    with pytest.raises(InputError, match="row 1: a field numpy cannot read"):
        list(read_input(path, Spec(2, "matrix", None, {})))


def test_header_on_a_file_without_one_is_refused(tmp_path: Path) -> None:
    """--header on a file whose first line is a user would drop that user:
    refused in one line; a real header line is still skipped."""
    with pytest.raises(InputError, match="row 1 holds only numbers"):
        list(read_input(_csv(tmp_path, "0.5,1\n0,1\n"), Spec(2, "matrix"), header=True))
    with pytest.raises(InputError, match="row 1 holds only numbers"):
        list(
            read_input(
                _csv(tmp_path, "3\n1\n"), Spec(4, "categories", "heavy_hitters"), header=True
            )
        )
    got = list(
        read_input(_csv(tmp_path, "x;y\n0.5;1\n"), Spec(2, "matrix"), header=True, delimiter=";")
    )
    assert np.vstack(got).tolist() == [[0.5, 1.0]]
