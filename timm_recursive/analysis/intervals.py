"""95% confidence intervals for the comparisons the studies state: over seeds (Student's t), between two
groups of seeds (Welch), between two models (or two steps) on the same test images (paired: only the
images whose answer differs carry uncertainty), and between two accuracies whose per-image answers were not
kept (unpaired, conservative). Per-image hits travel in JSON as ``pack_hits`` strings."""
import math
import statistics
from typing import List, Optional, Sequence, Tuple

__all__ = ['mean_interval', 'difference_interval', 'paired_gain', 'paired_hits_interval',
           'proportion_difference_interval', 'pack_hits', 'unpack_hits', 'format_interval', 'interval_side']


def mean_interval(values: Sequence[float], level: float = 0.95) -> Tuple[float, float]:
    """The mean of ``values`` (one per seed) and the half-width of its Student-t interval (nan for one value)."""
    n = len(values)
    if n == 0:
        raise ValueError('no values to average')
    mean = statistics.fmean(values)
    if n == 1:
        return mean, math.nan
    from scipy import stats  # here: the paired and proportion intervals need no scipy

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
    from scipy import stats

    dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return difference, stats.t.ppf(0.5 + level / 2, dof) * math.sqrt(va + vb)


def paired_gain(corrected: float, regressed: float, num_images: int) -> Tuple[float, float]:
    """Accuracy gain from one step to another and the half-width of its 95% confidence interval.

    ``corrected`` / ``regressed``: fractions of the images wrong at the first step and right at the
    second / right and then wrong. Both steps see the same images, so the uncertainty comes from the
    images whose prediction changed only (the paired, McNemar-style normal approximation).
    """
    gain = corrected - regressed
    variance = max(corrected + regressed - gain ** 2, 0.) / max(num_images, 1)
    return gain, 1.96 * math.sqrt(variance)


def paired_hits_interval(hits_a: Sequence[bool], hits_b: Sequence[bool]) -> Tuple[float, float]:
    """Accuracy of ``a`` minus that of ``b`` on the same images (fractions) and its 95% half-width, from each
    image's top-1 hit (``paired_gain`` of the images only ``a`` gets right and those only ``b`` gets right)."""
    if len(hits_a) != len(hits_b) or not len(hits_a):
        raise ValueError(f'paired hits must cover the same images: got {len(hits_a)} and {len(hits_b)}')
    only_a = sum(bool(a) and not b for a, b in zip(hits_a, hits_b)) / len(hits_a)
    only_b = sum(bool(b) and not a for a, b in zip(hits_a, hits_b)) / len(hits_a)
    return paired_gain(only_a, only_b, len(hits_a))


def proportion_difference_interval(p_a: float, n_a: int, p_b: float, n_b: int,
                                   level: float = 0.95) -> Tuple[float, float]:
    """``p_a - p_b`` (fractions) and the half-width of the two-proportion (Wald) interval, for accuracies whose
    per-image answers were not kept. On the same images it is conservative: positively correlated answers make
    the paired interval narrower. It covers the sampling of test images only, not a retraining's variation."""
    variance = p_a * (1 - p_a) / n_a + p_b * (1 - p_b) / n_b
    return p_a - p_b, statistics.NormalDist().inv_cdf(0.5 + level / 2) * math.sqrt(variance)


def interval_side(value: float, half_width: float) -> Optional[int]:
    """Where a difference's 95% interval lies: 1 above zero, -1 below, 0 when it covers zero (no difference shown),
    None when there is no interval (one run). Every study words its comparisons from this one rule."""
    if math.isnan(half_width):
        return None
    if value - half_width > 0:
        return 1
    return -1 if value + half_width < 0 else 0


def pack_hits(hits: Sequence[bool]) -> str:
    """Per-image hits as a hex string (4 images a digit, in order) for a JSON record."""
    bits = ''.join('1' if h else '0' for h in hits)
    bits += '0' * (-len(bits) % 4)
    return ''.join(f'{int(bits[i:i + 4], 2):x}' for i in range(0, len(bits), 4))


def unpack_hits(packed: str, num_images: int) -> List[bool]:
    """The hits ``pack_hits`` wrote for ``num_images`` images."""
    if len(packed) != -(-num_images // 4):
        raise ValueError(f'{len(packed)} hex digits cannot hold the hits of {num_images} images')
    bits = ''.join(f'{int(digit, 16):04b}' for digit in packed)
    return [b == '1' for b in bits[:num_images]]


def format_interval(value: float, half_width: float, signed: bool = False, digits: int = 2, unit: str = '') -> str:
    """``value<unit> (low to high)``, or the value and ``(one run: no interval)`` when the half-width is unknown:
    ``format_interval(90.93, 0.47, unit='%')`` is ``90.93% (90.46 to 91.40)``."""
    fmt = f'{{:{"+" if signed else ""}.{digits}f}}'
    if math.isnan(half_width):
        return f'{fmt.format(value)}{unit} (one run: no interval)'
    return f'{fmt.format(value)}{unit} ({fmt.format(value - half_width)} to {fmt.format(value + half_width)})'
