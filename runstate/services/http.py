"""A tiny HTTP liveness probe for the moto and fakesnow servers."""

from __future__ import annotations

import urllib.error
import urllib.request


def http_answers(url: str, timeout: float = 1.0) -> bool:
    """Any HTTP response counts (fakesnow answers 404 on `/`); a refused or hung socket does not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False
