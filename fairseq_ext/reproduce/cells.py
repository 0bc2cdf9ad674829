"""The text of a table cell, both ways: the paper's printed cells read (their number, marks,
text and durations) and our numbers written (decimals, signs, durations)."""
import re
from typing import Optional

_NUMBER = re.compile(r"([-−+])?\s*(\d+(?:\.\d+)?|\.\d+)")
_DURATION = re.compile(r"(\d+)\s*h\s*(\d+)\s*min")
MARK_CHARS = "†‡*"


def printed_value(printed: Optional[str]) -> Optional[float]:
    """The first number of a printed cell ("28.24(-0.13)†" -> 28.24, "+ 18.11" -> 18.11,
    "−0.22" -> -0.22, "38.3 ± .8" -> 38.3); None for "-"."""
    if printed is None:
        return None
    m = _NUMBER.search(str(printed))
    if not m:
        return None
    value = float(m.group(2))
    return -value if m.group(1) in ("-", "−") else value


def printed_mark(printed: Optional[str]) -> str:
    return "".join(c for c in str(printed or "") if c in MARK_CHARS)


def printed_text(printed: Optional[str]) -> str:
    """A printed cell as the paper prints it, spaces normalised ("+ 18.11" -> "+18.11")."""
    if printed is None:
        return "–"
    text = re.sub(r"\s+", " ", str(printed)).strip()
    return re.sub(r"^([-+−]) (?=\d)", r"\1", text)


def printed_decimals(printed: Optional[str]) -> Optional[int]:
    """The decimals of a printed cell's first number (None when it prints none)."""
    m = _NUMBER.search(str(printed or ""))
    if not m:
        return None
    number = m.group(2)
    return len(number.split(".")[1]) if "." in number else 0


def printed_as_difference(printed: Optional[str]) -> bool:
    """Whether a cell prints a difference to another row ("+0.3", "−1.2"), not a value."""
    return str(printed or "").strip().startswith(("+", "-", "−"))


def parse_duration(printed: Optional[str]) -> Optional[float]:
    """Seconds of a printed duration ("33h33min" -> 120780)."""
    m = _DURATION.search(str(printed or ""))
    return int(m.group(1)) * 3600 + int(m.group(2)) * 60 if m else printed_value(printed)


def format_duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "–"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)}min{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}min"


def format_number(value: Optional[float], digits: int = 2, signed: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"
