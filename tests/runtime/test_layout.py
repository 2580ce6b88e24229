"""Where a compact batch's rows sit in a step (runtime/layout.py)."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.layout import gap_filling_order, row_groups, step_layout
from runtime.search import in_place_order


def test_new_orders_keep_what_can_stay_in_place():
    assert gap_filling_order([0, 1, 2]) == [0, 1, 2]  # nobody left
    assert gap_filling_order([0, 2, 3]) == [0, 2, 1]  # 1 left: 3 takes its place, 2 stays
    assert gap_filling_order([2, 5, 7]) == [1, 2, 0]  # 0, 1: 5 and 7 fill them, 2 stays
    # Beam search: each origin's first child stays on the origin's row, the rest fill the rows left.
    assert in_place_order([0, 0, 1, 2]) == [0, 2, 3, 1]
    assert in_place_order([3, 3, 3]) == [0, 1, 2]  # origin 3 has no row among three: rank order
    assert in_place_order([2, 0]) == [1, 0]


def test_a_step_layout_is_kept_for_its_shape_and_read_only():
    """Greedy and beam sources in one batch: each takes its own number of candidates; the layout of a shape that
    comes back is the same arrays, which nobody may write (batches bind them)."""
    groups, row_position, source_index, bias, k = step_layout((2, 1), (4, 1))  # a beam of 2 and a greedy source
    assert k == 4 and groups.tolist() == [[0, 1], [2, 2]] and source_index.tolist() == [0, 0, 1]
    assert (bias[0] == 0).all()  # both rows of the beam, all four candidates
    assert (bias[1, 0] == [0, -np.inf, -np.inf, -np.inf]).all() and (bias[1, 1] == -np.inf).all()  # one, once
    assert step_layout((2, 1), (4, 1))[0] is groups
    with pytest.raises(ValueError, match="read-only"):
        groups[0, 0] = 1


def test_row_groups_put_each_sources_rows_in_one_block():
    groups, row_position, source_index = row_groups(np.array([2, 1, 3]))  # rows 0-1, 2, 3-5
    assert groups.tolist() == [[0, 1, 1], [2, 2, 2], [3, 4, 5]]  # a source with fewer rows repeats its last
    assert source_index.tolist() == [0, 0, 1, 2, 2, 2]
    assert groups.reshape(-1)[row_position].tolist() == list(range(6))  # each row finds itself in the blocks
    groups, row_position, _ = row_groups(np.zeros(0, np.int64))
    assert groups.shape == (0, 1) and row_position.shape == (0,)
