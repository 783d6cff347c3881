"""The tiling covers every (earlier input, later output) pair exactly once."""

from collections import Counter

import pytest

from titan_models.generate.tiling import tile_size, tiles


@pytest.mark.parametrize(
    "length, start", [(1, 0), (2, 0), (16, 0), (37, 0), (64, 0), (100, 0), (37, 5), (64, 1), (130, 17)]
)
def test_every_earlier_later_pair_exactly_once(length, start):
    covered = Counter()
    for i, size in tiles(length, start):
        assert size & (size - 1) == 0 and start <= i - size  # a power of two, reading generated inputs only
        for s in range(i - size, i):
            for t in range(i, min(i + size, length)):
                covered[s, t] += 1
    expected = {(s, t) for s in range(start, length) for t in range(s + 1, length)}
    assert set(covered) == expected
    assert set(covered.values()) <= {1}


def test_tile_sizes_and_counts():
    assert [tile_size(j) for j in range(1, 13)] == [1, 2, 1, 4, 1, 2, 1, 8, 1, 2, 1, 4]
    # About n / 2^(q+1) tiles of size 2^q: what makes the total O(n log^2 n).
    sizes = Counter(size for _, size in tiles(1024))
    assert sizes[1] == 512 and sizes[2] == 256 and sizes[256] == 2 and sizes[512] == 1
