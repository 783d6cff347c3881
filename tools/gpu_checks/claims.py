"""What a check claims, as data, and the verdict on its recorded figures.

A claim names the figures it is about (glob patterns over the check's flat figure names: its figures, nested
ones joined by '.', and each predicted-vs-real comparison as "<case> <quantity> error") and a bound every
matching figure must be within. A check that ran on a GPU and recorded a figure outside a bound is a `fail`,
whatever else it did, and so is one that recorded no figure a claim names (a typo in a pattern, a figure renamed,
a variant never run), unless the check said why that claim does not apply on this GPU (`not_applicable`: no
float8 matmuls below sm90): a "pass" says each claim was measured and held. In the CPU rehearsal the
claims are evaluated (the driver is proved to produce the figures) but not judged: tiny models in float32 on a
shared CPU say nothing about a GPU's speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fnmatch import fnmatchcase

PASS, FAIL, NOT_MEASURED, NOT_APPLICABLE = "pass", "fail", "not measured", "not applicable"
NOT_JUDGED = "rehearsal: claim not judged on CPU"


@dataclass(frozen=True)
class Bound:
    low: float = -math.inf
    high: float = math.inf
    strict: bool = False  # the ends themselves miss ("faster": a ratio of exactly 1 is not faster)
    text: str = ""

    def holds(self, value: float) -> bool:
        if self.strict:
            return self.low < value < self.high
        return self.low <= value <= self.high

    def __str__(self) -> str:
        return self.text


def within(fraction: float) -> Bound:
    return Bound(-fraction, fraction, text=f"within ±{fraction:.0%}")


def above(value: float) -> Bound:
    return Bound(low=value, strict=True, text=f"> {value:g}")


def at_least(value: float) -> Bound:
    return Bound(low=value, text=f">= {value:g}")


def at_most(value: float) -> Bound:
    return Bound(high=value, text=f"<= {value:g}")


def below(value: float) -> Bound:
    return Bound(high=value, strict=True, text=f"< {value:g}")


def equal_to(value: float) -> Bound:
    return Bound(value, value, text=f"= {value:g}")


TRUE = Bound(1, 1, text="true")  # a yes/no figure (True counts as 1)


@dataclass(frozen=True)
class Claim:
    name: str
    text: str
    figures: tuple[str, ...]  # glob patterns over the flat figure names; every figure they match is judged
    bound: Bound

    def describe(self) -> str:
        return f"{self.name}: {self.text} [{', '.join(self.figures)} {self.bound}]"


def _flatten(figures: dict, prefix: str = "") -> dict[str, float]:
    flat = {}
    for key, value in figures.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        elif isinstance(value, bool | int | float):
            flat[name] = float(value)
    return flat


def flat_figures(record: dict) -> dict[str, float]:
    """Every number a check recorded, by the names its claims use."""
    flat = _flatten(record.get("figures", {}))
    for c in record.get("comparisons", []):
        if c.get("rel_error") is not None:
            flat[f"{c['case']} {c['quantity']} error"] = c["rel_error"]
    return flat


def judge(claim: Claim, figures: dict[str, float]) -> dict:
    """The claim against the figures: pass, fail (naming the figures that missed) or not measured."""
    matched = {n: v for n, v in figures.items() if any(fnmatchcase(n, p) for p in claim.figures)}
    missed = {n: v for n, v in matched.items() if not claim.bound.holds(v)}
    verdict = NOT_MEASURED if not matched else FAIL if missed else PASS
    return {"claim": claim.name, "text": claim.text, "bound": str(claim.bound), "figures": matched,
            "missed": missed, "verdict": verdict}  # fmt: skip


def format_figures(figures: dict[str, float]) -> str:
    return ", ".join(f"{n} = {v:.4g}" for n, v in figures.items())


def apply_claims(record: dict, claims: tuple[Claim, ...], cuda: bool) -> dict:
    """The record with its claims' verdicts; on a GPU a missed or unmeasured claim turns a pass into a fail (a
    check that failed or timed out for its own reason keeps that reason). An unmeasured claim the check named in
    its record's `not_applicable` (claim -> why) is `not applicable`, with that reason."""
    figures = flat_figures(record)
    judged = [judge(claim, figures) for claim in claims]
    if cuda:
        verdicts = [_unmeasured(c, v, record.get("not_applicable", {})) for c, v in zip(claims, judged, strict=True)]
    else:
        verdicts = [{**v, "evaluated": v["verdict"], "verdict": NOT_JUDGED} for v in judged]
    record = {**record, "claims": verdicts}
    missed = [f"claim {v['claim']} missed: {format_figures(v['missed'])} (bound {v['bound']})"
              if v["missed"] else f"claim {v['claim']} {v['reason']}"
              for v in verdicts if v["verdict"] == FAIL]  # fmt: skip
    if missed and record["status"] == PASS:
        record["status"], record["reason"] = FAIL, "; ".join(missed)
    return record


def _unmeasured(claim: Claim, verdict: dict, not_applicable: dict[str, str]) -> dict:
    """On a GPU: a claim no recorded figure matches fails, unless the check said why it does not apply."""
    if verdict["verdict"] != NOT_MEASURED:
        return verdict
    if claim.name in not_applicable:
        return {**verdict, "verdict": NOT_APPLICABLE, "reason": not_applicable[claim.name]}
    patterns = ", ".join(repr(p) for p in claim.figures)
    return {**verdict, "verdict": FAIL, "reason": f"not measured: the check recorded no figure matching {patterns}"}
