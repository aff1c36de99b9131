"""Resource amounts: parse specs, validate requests, exact fixed-point arithmetic.

Every amount is held as an integer count of UNIT-ths (1/10,000), the same fixed point
Ray uses, so ten tasks of 0.1 GPU fit exactly in one GPU and capacity never drifts
after any number of grants and releases. Floats exist only at the edges (user input,
display).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any

from .errors import ResourceSpecError

UNIT = 10_000
# 1 PB (in bytes) is the largest amount we accept; its unit count still fits msgpack's uint64.
MAX_AMOUNT = Decimal("1e15")
GPU = "GPU"
CPU = "CPU"
MEMORY = "MEMORY"
GPU_MEMORY = "GPU_MEMORY"   # memory on one device, from NVML or declared
MAX_NAME = 128               # characters in a resource name

Units = dict[str, int]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]*\Z")
# Lower-case "m" is refused: Kubernetes reads "500m" as 0.5, we would read 500e6.
_NUMBER = re.compile(
    r"(?P<num>[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|(?i:[+-]?(?:inf|infinity|nan)))"
    r"\s*(?P<suffix>[kKMGTPgtp]i?)?[Bb]?\Z"
)
_SUFFIX = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}


def amount_to_units(name: str, value: Any) -> int:
    """Convert one amount (int, float, Decimal or string like "64GiB") to units."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        raise ResourceSpecError(
            f"resource {name!r}: amount must be a number or a string like '100GB', "
            f"not {type(value).__name__}")
    if isinstance(value, str):
        amount = _parse_number(name, value)
    else:
        if isinstance(value, float) and not math.isfinite(value):
            raise ResourceSpecError(f"resource {name!r}: amount must be finite, got {value}")
        amount = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
        if not amount.is_finite():
            raise ResourceSpecError(f"resource {name!r}: amount must be finite, got {value}")
    return _decimal_to_units(name, amount)


def _parse_number(name: str, text: str) -> Decimal:
    m = _NUMBER.match(text.strip())
    if not m:
        raise ResourceSpecError(f"resource {name!r}: {text!r} is not a number")
    try:
        amount = Decimal(m["num"])
    except InvalidOperation:  # pragma: no cover - the regex admits only valid decimals
        raise ResourceSpecError(f"resource {name!r}: {text!r} is not a number") from None
    if not amount.is_finite():
        raise ResourceSpecError(f"resource {name!r}: amount must be finite, got {text!r}")
    if m["suffix"]:
        suffix = m["suffix"]
        try:
            amount *= _SUFFIX[suffix[0].upper() + suffix[1:]]
        except ArithmeticError:  # decimal.Overflow past the context's exponent limit
            raise ResourceSpecError(
                f"resource {name!r}: amount {text!r} is larger than 1e15") from None
    return amount


def _decimal_to_units(name: str, amount: Decimal) -> int:
    if amount < 0:
        raise ResourceSpecError(f"resource {name!r}: amount must be >= 0, got {amount}")
    if amount > MAX_AMOUNT:
        raise ResourceSpecError(f"resource {name!r}: amount {amount} is larger than 1e15")
    units = int((amount * UNIT).to_integral_value(ROUND_HALF_EVEN))
    # A tiny positive amount must never round to "no constraint at all".
    return max(units, 1) if amount > 0 else 0


def check_name(name: Any) -> str:
    """Return NAME if it is a valid resource name, else raise ResourceSpecError."""
    if isinstance(name, str) and len(name) > MAX_NAME:
        raise ResourceSpecError(f"resource name {name[:40]!r}... is longer than {MAX_NAME} "
                                "characters")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ResourceSpecError(
            f"invalid resource name {name!r}: use letters, digits and _ . : / -, "
            "starting with a letter or _")
    return name


def _check_gpu(units: Units) -> None:
    gpu = units.get(GPU, 0)
    if gpu > UNIT and gpu % UNIT:
        raise ResourceSpecError(
            f"resource 'GPU': {format_amount(GPU, gpu)} is not allowed; a GPU request above 1 "
            "must be a whole number (fractions pack onto one device and never span two)")


def parse_spec(text: str) -> Units:
    """Parse "GPU=2 MEMORY=100e9" or "foo=1,bar=2" into units; raise on any bad part."""
    out: Units = {}
    for part in (p for p in re.split(r"[\s,]+", text.strip()) if p):
        name, eq, value = part.partition("=")
        if not eq or not name or not value:
            raise ResourceSpecError(f"invalid resource spec {part!r}: expected NAME=NUMBER")
        try:
            check_name(name)
            if name in out:
                raise ResourceSpecError(f"{name} is given twice")
            out[name] = amount_to_units(name, value)
        except ResourceSpecError as exc:
            raise ResourceSpecError(
                f"invalid resource spec {part!r}: {_strip_prefix(str(exc), name)}") from None
    return out


def _strip_prefix(message: str, name: str) -> str:
    prefix = f"resource {name!r}: "
    return message[len(prefix):] if message.startswith(prefix) else message


def mapping_to_units(resources: Mapping[str, Any]) -> Units:
    """Validate a {name: amount} mapping (amounts may be strings like "70GB")."""
    if not isinstance(resources, Mapping):
        raise ResourceSpecError(
            f"resources must be a dict like {{'GPU': 1}}, not {type(resources).__name__}")
    return {check_name(name): amount_to_units(name, value) for name, value in resources.items()}


def task_request(resources: Mapping[str, Any] | None) -> Units:
    """Turn a submit's resources= into the units the task asks for.

    A task asks for CPU=1 unless it names CPU itself (CPU=0 is allowed). Zero amounts
    are dropped: asking for none of something constrains nothing.
    """
    units = mapping_to_units(resources or {})
    units.setdefault(CPU, UNIT)
    _check_gpu(units)
    return {name: amount for name, amount in units.items() if amount > 0}


def fits(free: Mapping[str, int], request: Mapping[str, int]) -> bool:
    """Return whether every amount in REQUEST is available in FREE."""
    return all(free.get(name, 0) >= amount for name, amount in request.items())


def add(into: Units, amounts: Mapping[str, int]) -> None:
    """Add AMOUNTS into INTO in place."""
    for name, amount in amounts.items():
        into[name] = into.get(name, 0) + amount


def subtract(into: Units, amounts: Mapping[str, int]) -> None:
    """Subtract AMOUNTS from INTO in place (may go negative after a capacity cut)."""
    for name, amount in amounts.items():
        into[name] = into.get(name, 0) - amount


_BINARY = (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def is_bytes(name: str) -> bool:
    """Whether resource NAME counts bytes (MEMORY, GPU_MEMORY, any ...MEMORY)."""
    return name.endswith(MEMORY)


def format_amount(name: str, units: int) -> str:
    """Render an amount for people: 2, 0.25, 100G; bytes (``is_bytes``) in binary units,
    as memory is given and sold: 64 GiB, 512 MiB, 93.13 GiB (100e9 bytes). The one
    formatter of amounts: status, the dashboard, notebooks and reasons all use it."""
    amount = Decimal(units) / UNIT
    if is_bytes(name):
        return format_bytes(amount)
    if amount >= 10**6:
        for suffix, size in (("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6)):
            if amount >= size:
                return f"{float(amount / size):.4g}{suffix}"
    text = f"{amount:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_bytes(amount: Decimal | int | float) -> str:
    """Render a number of bytes in binary units: 64 GiB, 1.5 KiB, 100 B."""
    amount = Decimal(amount)
    for suffix, size in _BINARY:
        if amount >= size:
            return f"{_digits(amount / size)} {suffix}"
    return f"{_digits(amount)} B"


def _digits(amount: Decimal) -> str:
    """AMOUNT with at most four significant digits (and at least its whole part), no
    trailing zeros: 64, 93.13, 1.5, 1023."""
    text = f"{float(amount):.4g}" if amount < 10**4 else f"{float(amount):.0f}"
    return text.rstrip("0").rstrip(".") if "." in text and "e" not in text else text


def format_units(units: Mapping[str, int]) -> str:
    """Render a whole request, e.g. "CPU=1 GPU=0.5"."""
    return " ".join(f"{n}={format_amount(n, u)}" for n, u in sorted(units.items())) or "nothing"


def units_to_float(units: Mapping[str, int]) -> dict[str, float]:
    """Return plain floats, for showing a grant to user code."""
    return {name: u / UNIT for name, u in units.items()}


def token_devices(units: Mapping[str, int]) -> tuple[str, ...]:
    """Return the devices named by per-device tokens gpu0, gpu1, ... (as in Guild's queues).

    An agent offering ``gpu0=1 gpu1=1`` offers device 0 and device 1 one job at a time; a
    grant of gpuN puts device N in the job's CUDA_VISIBLE_DEVICES.
    """
    found = sorted(int(name[3:]) for name in units
                   if name.startswith("gpu") and name[3:].isdigit() and units[name] > 0)
    return tuple(str(n) for n in found)
