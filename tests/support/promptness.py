"""What "answers promptly" means in the serving tests, in one place.

A site that freezes holds a request until whatever blocks it ends: a held socket's
client timeout, the last call of a soak, the probe's own 10 s timeout. That is many
seconds, and it holds every request behind it, not one. CI runs two test workers on
two cores, and the other worker's burst (the llama.cpp server at full CPU, a crash
test starting its processes) can stall a single probe of this process past a second
with nothing in the server waiting on anything (CI saw one login probe of 130 take
1.04 s while the other 129 took under 0.25 s).

So the rule is: every probe answered; none near ``HELD``; and at most one in fifty
(at least one) past ``PROMPT``, the second that issue 23 asks for.
"""

from __future__ import annotations

PROMPT = 1.0
HELD = 5.0


def assert_answered_promptly(seconds: list[float]) -> None:
    """Fail when the timings look like a request that waited on another."""
    assert seconds, "no probe was answered"
    worst = sorted(seconds)[-5:]
    assert max(seconds) < HELD, f"a probe waited {max(seconds):.2f} s: {worst}"
    late = [s for s in seconds if s >= PROMPT]
    allowed = max(1, len(seconds) // 50)
    assert len(late) <= allowed, (
        f"{len(late)} of {len(seconds)} probes took {PROMPT} s or more "
        f"(at most {allowed} may, a neighbour's burst): {worst}"
    )
