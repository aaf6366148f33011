#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import configparser
import csv
from decimal import ROUND_HALF_UP, Decimal

cfg = configparser.ConfigParser()
cfg.read("/app/data/settings.ini")
warehouse = cfg["report"]["warehouse"].strip()
tax = Decimal(cfg["report"]["tax_percent"])
with open("/app/data/inventory.csv", newline="") as fh:
    total = sum(
        Decimal(row["quantity"]) * Decimal(row["unit_price"])
        for row in csv.DictReader(fh)
        if row["warehouse"] == warehouse
    )
value = (total * (1 + tax / 100)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
with open("/app/report.txt", "w") as out:
    out.write(f"{value}\n")
PY
