"""95% confidence intervals for the comparisons the studies state: over seeds (Student's t) and between two
groups of seeds (Welch). A comparison over test images of one model pair is ``recursion_trace.paired_gain``."""
import math
import statistics
from typing import Sequence, Tuple

from scipy import stats

__all__ = ['mean_interval', 'difference_interval', 'format_interval']


def mean_interval(values: Sequence[float], level: float = 0.95) -> Tuple[float, float]:
    """The mean of ``values`` (one per seed) and the half-width of its Student-t interval (nan for one value)."""
    n = len(values)
    if n == 0:
        raise ValueError('no values to average')
    mean = statistics.fmean(values)
    if n == 1:
        return mean, math.nan
    return mean, stats.t.ppf(0.5 + level / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)


def difference_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Tuple[float, float]:
    """mean(a) - mean(b) and the half-width of Welch's interval (independent runs, unequal variances; nan
    unless both have two values or more)."""
    if len(a) < 2 or len(b) < 2:
        return statistics.fmean(a) - statistics.fmean(b), math.nan
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    difference = statistics.fmean(a) - statistics.fmean(b)
    if va + vb == 0:
        return difference, 0.
    dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return difference, stats.t.ppf(0.5 + level / 2, dof) * math.sqrt(va + vb)


def format_interval(value: float, half_width: float, signed: bool = False, digits: int = 2) -> str:
    """``value (low to high)``, or the value and ``(one run: no interval)`` when the half-width is unknown."""
    fmt = f'{{:{"+" if signed else ""}.{digits}f}}'
    if math.isnan(half_width):
        return f'{fmt.format(value)} (one run: no interval)'
    return f'{fmt.format(value)} ({fmt.format(value - half_width)} to {fmt.format(value + half_width)})'
