"""Where ssdmoe keeps its files (platformdirs; XDG_* variables are honoured on Linux).

`SSDMOE_HOME`, when set, puts data, cache and config under one folder: tests and
CI use it to run against a throwaway tree.
"""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import PlatformDirs

_APP = "ssdmoe"


def _dirs() -> PlatformDirs:
    return PlatformDirs(_APP, appauthor=False)


def _home_override(sub: str) -> Path | None:
    home = os.environ.get("SSDMOE_HOME")
    return Path(home) / sub if home else None


def data_dir() -> Path:
    """Demo model, sessions."""
    return _home_override("data") or Path(_dirs().user_data_dir)


def cache_dir() -> Path:
    """Expert indexes, the native reader build, lock files."""
    return _home_override("cache") or Path(_dirs().user_cache_dir)


def config_dir() -> Path:
    return _home_override("config") or Path(_dirs().user_config_dir)


def sessions_dir() -> Path:
    return data_dir() / "sessions"


def demo_model_dir() -> Path:
    return data_dir() / "demo-model"
