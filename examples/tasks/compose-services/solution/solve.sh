#!/bin/bash
set -euo pipefail
curl -fsS -X POST http://api-server:5000/items -H "Content-Type: application/json" -d '{"name": "harbor"}'
curl -fsS http://api-server:5000/items > /app/items.json
