"""Moments that merge: count, mean and M2 per metric, layer and head (Chan et al.'s parallel variance), so
two shards combined give what one run over both gives, to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np



# --- moments that merge --------------------------------------------------------------------------------


@dataclass
class Moments:
    """count, mean and M2 (sum of squared deviations from the mean) per layer and head, merged with Chan et
    al.'s formula: merging the moments of two sets gives the moments of their union."""

    count: np.ndarray  # (L, H) float64
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def zeros(cls, shape: tuple[int, ...]) -> Moments:
        return cls(np.zeros(shape), np.zeros(shape), np.zeros(shape))

    @classmethod
    def of(cls, values: np.ndarray) -> Moments:
        """The moments of samples (N, ...), NaN samples left out."""
        values = np.asarray(values, np.float64)
        w = np.isfinite(values).astype(np.float64)
        x = np.where(w > 0, values, 0.0)
        count = w.sum(axis=0)
        mean = np.divide(x.sum(axis=0), count, out=np.zeros_like(count), where=count > 0)
        m2 = (w * (x - mean) ** 2).sum(axis=0)
        return cls(count, mean, m2)

    @classmethod
    def combine(cls, counts: np.ndarray, means: np.ndarray, m2s: np.ndarray) -> Moments:
        """The moments of the union of N sets given each set's moments (N, ...)."""
        count = counts.sum(axis=0)
        mean = np.divide((counts * means).sum(axis=0), count, out=np.zeros_like(count), where=count > 0)
        m2 = m2s.sum(axis=0) + (counts * (means - mean) ** 2).sum(axis=0)
        return cls(count, mean, m2)

    def merge(self, other: Moments) -> Moments:
        n = self.count + other.count
        delta = other.mean - self.mean
        safe = np.where(n > 0, n, 1.0)
        mean = np.where(n > 0, self.mean + delta * other.count / safe, 0.0)
        m2 = self.m2 + other.m2 + delta ** 2 * self.count * other.count / safe
        return Moments(n, mean, m2)

    def std(self) -> np.ndarray:
        """Sample standard deviation (n − 1); NaN with fewer than two samples."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.count > 1, np.sqrt(np.maximum(self.m2, 0.0) / (self.count - 1)), np.nan)

    def means(self) -> np.ndarray:
        """The mean; NaN where there was no sample."""
        return np.where(self.count > 0, self.mean, np.nan)


