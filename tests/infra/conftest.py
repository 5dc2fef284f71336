"""Set-up for the emulated clouds' tests (``local_stack`` itself lives in tests/conftest.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Tests in this folder import their helpers (tests/infra/tpu/adapters.py) by folder-relative name.
sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("NO_GCE_CHECK", "true")  # google-auth must never probe a metadata server
