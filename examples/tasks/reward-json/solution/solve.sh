#!/bin/bash
set -euo pipefail
cat > /app/primes.py <<'PY'
def primes_below(n):
    """All primes smaller than n, ascending (sieve of Eratosthenes)."""
    if n <= 2:
        return []
    sieve = bytearray([1]) * n
    sieve[0] = sieve[1] = 0
    for i in range(2, int(n ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i::i] = bytearray(len(range(i * i, n, i)))
    return [i for i, is_prime in enumerate(sieve) if is_prime]
PY
