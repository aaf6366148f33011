import sys
import unittest

sys.path.insert(0, "/app")
from stats import mean, median, spread  # noqa: E402


class HiddenStatsTest(unittest.TestCase):
    def test_median_single(self):
        self.assertEqual(median([7]), 7)

    def test_median_even_unsorted(self):
        self.assertEqual(median([10, 2, 8, 4]), 6)

    def test_median_does_not_mutate(self):
        data = [3, 1, 2]
        median(data)
        self.assertEqual(data, [3, 1, 2])

    def test_median_empty(self):
        with self.assertRaises(ValueError):
            median([])

    def test_mean_and_spread_unchanged(self):
        self.assertEqual(mean([2, 4]), 3)
        self.assertEqual(spread([1, 1]), 0)


if __name__ == "__main__":
    unittest.main()
