#!/bin/bash
# Writes reward.json with correctness / style / efficiency (see score.py).
python3 /tests/score.py
