"""Terminal shading of text by probe score: each token's background runs red (low) - grey - green (high)."""

from __future__ import annotations

import math

LOW, MID, HIGH = (170, 40, 40), (70, 70, 70), (30, 140, 50)


def unit(score: float, activation: str) -> float:
    """A score mapped onto [0, 1]: sigmoid scores as they are, tanh from [-1, 1], linear through a sigmoid."""
    if activation == "sigmoid":
        return min(max(score, 0.0), 1.0)
    if activation == "tanh":
        return min(max((score + 1) / 2, 0.0), 1.0)
    return 1 / (1 + math.exp(-max(min(score, 60.0), -60.0)))


def colour(u: float) -> tuple[int, int, int]:
    a, b, t = (LOW, MID, u * 2) if u < 0.5 else (MID, HIGH, u * 2 - 1)
    return tuple(round(x + (y - x) * t) for x, y in zip(a, b))  # type: ignore[return-value]


def shade(text: str, score: float | None, activation: str) -> str:
    """`text` on a background coloured by its score (24-bit ANSI); unscored text is left plain."""
    if score is None or not text:
        return text
    r, g, b = colour(unit(score, activation))
    return f"\x1b[48;2;{r};{g};{b}m\x1b[97m{text}\x1b[0m"


def legend(name: str, layer: int, activation: str) -> str:
    return (f"probe {name!r} (layer {layer}, {activation}): " + shade(" low ", 0.0 if activation != "tanh" else -1.0, activation)
            + " " + shade(" high ", 1.0, activation if activation != "linear" else "sigmoid"))
