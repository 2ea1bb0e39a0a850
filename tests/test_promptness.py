"""The serving tests' rule for "answers promptly" tells a freeze from a hiccup."""

from __future__ import annotations

import pytest

from tests.support.promptness import assert_answered_promptly


def test_one_stalled_probe_among_many_prompt_ones_is_a_neighbours_burst():
    assert_answered_promptly([0.05] * 129 + [1.04])


@pytest.mark.parametrize(
    "seconds",
    [
        [],  # nothing answered
        [0.05] * 50 + [6.0],  # one request held until something else ended
        [0.05] * 90 + [1.2, 1.3],  # two late in a hundred: a site slowing down
        [1.5] * 20,  # every request late
    ],
    ids=["none", "held", "two-late", "all-late"],
)
def test_a_held_request_or_a_slow_site_fails(seconds):
    with pytest.raises(AssertionError):
        assert_answered_promptly(seconds)
