"""Small descriptive statistics helpers."""


def mean(values):
    """Arithmetic mean of a non-empty sequence of numbers."""
    if not values:
        raise ValueError("mean() of an empty sequence")
    return sum(values) / len(values)


def median(values):
    """Median of a non-empty sequence of numbers (the input is not modified)."""
    if not values:
        raise ValueError("median() of an empty sequence")
    n = len(values)
    return values[n // 2]


def spread(values):
    """Difference between the largest and the smallest value."""
    return max(values) - min(values)
