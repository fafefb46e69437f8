#!/usr/bin/env python
"""Fetches the real GGUF weights into the cache (see speculative/fetch.py).

python scripts/fetch_weights.py                      # all three models
python scripts/fetch_weights.py smollm2-135m --cache-dir /data/weights
"""

import sys

from speculative import fetch

if __name__ == "__main__":
    fetch.main(sys.argv[1:] or sorted(fetch.MODELS))
