"""The machine's thermal state, where the OS tells it, for `ssdmoe bench`'s conditions.

A laptop that throttles halfway through a run decodes slower for reasons no setting
explains, so the bench records the thermal state before and after its measurements.
Linux: the zones and cooling devices of /sys/class/thermal; macOS: `pmset -g therm`
(the CPU speed and scheduler limits). Anything else, or a machine that exposes nothing
(most VMs and containers), reads as "unknown" with the reason.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

UNKNOWN = "unknown"
_SYS_THERMAL = Path("/sys/class/thermal")
_MAX_ENTRIES = 64  # zones or cooling devices read at most (bounded on odd machines)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _int(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def linux_thermal(root: Path = _SYS_THERMAL) -> dict:
    """Zones (type, temperature in deg C) and cooling devices in use (cur_state > 0)."""
    zones = []
    for z in sorted(root.glob("thermal_zone*"))[:_MAX_ENTRIES]:
        milli = _int(_read(z / "temp"))  # sysfs gives millidegrees; unreadable when off
        if milli is not None:
            zones.append({"type": _read(z / "type") or z.name, "temp_c": round(milli / 1000, 1)})
    cooling = []
    for c in sorted(root.glob("cooling_device*"))[:_MAX_ENTRIES]:
        cur, top = _int(_read(c / "cur_state")), _int(_read(c / "max_state"))
        if cur is not None and top:
            cooling.append({"type": _read(c / "type") or c.name, "state": cur, "max_state": top})
    if not zones and not cooling:
        return {"state": UNKNOWN, "source": str(root), "note": f"no thermal zones in {root}"}
    active = [c for c in cooling if c["state"] > 0]
    return {
        "state": "cooling active" if active else "no cooling active",
        "source": str(root),
        "zones": zones,
        "cooling": cooling,
        "max_temp_c": max((z["temp_c"] for z in zones), default=None),
    }


def parse_pmset_therm(text: str) -> dict:
    """`pmset -g therm`: its `KEY = VALUE` limits (100 = not throttled) and its notes."""
    limits: dict[str, int | str] = {}
    notes = []
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            v = value.strip()
            limits[key.strip()] = _int(v) if _int(v) is not None else v
        elif line.strip().startswith("Note:"):
            notes.append(line.strip().removeprefix("Note:").strip())
    speed = limits.get("CPU_Speed_Limit")
    if isinstance(speed, int):
        state = "not throttled" if speed >= 100 else f"throttled (CPU speed limit {speed}%)"
    elif notes:
        state = "; ".join(notes)
    else:
        state = UNKNOWN
    return {"state": state, "source": "pmset -g therm", "limits": limits, "notes": notes}


def mac_thermal() -> dict:
    try:
        out = subprocess.run(["pmset", "-g", "therm"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return {"state": UNKNOWN, "source": "pmset -g therm", "note": str(e)}
    if out.returncode != 0:
        return {"state": UNKNOWN, "source": "pmset -g therm", "note": f"exit {out.returncode}"}
    return parse_pmset_therm(out.stdout.decode(errors="replace"))


def thermal_state() -> dict:
    """This machine's thermal state now, or unknown and why."""
    if sys.platform.startswith("linux"):
        return linux_thermal()
    if sys.platform == "darwin":
        return mac_thermal()
    return {"state": UNKNOWN, "source": "none", "note": f"not probed on {sys.platform}"}
