"""What electricity costs: `[cluster] price_per_kwh` and `currency`, and optional time-of-day `tariffs`.

    [cluster]
    price_per_kwh = 0.35          # the rate when no tariff period applies
    currency = "EUR"
    tariffs = { "22:00-06:00" = 0.18 }   # the night rate: a period may wrap midnight

Periods are in the controller's local time, end exclusive, and may not overlap. Without a price,
energy is still measured and shown; only the cost is not.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from homegpu.remote.config.checks import Validator, show

MAX_PRICE = 1000.0  # per kWh, in any currency: only a typo gets near it
_PERIOD = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-(?!24:(?!00$))([01]\d|2[0-3]|24):([0-5]\d)$")  # an end at 24:00 only
DAY = 24 * 60
_CURRENCY = re.compile(r"^[^\x00-\x1f\x7f]{1,8}$")


@dataclass(frozen=True)
class Period:
    """[start, end) in minutes after midnight; end < start wraps past midnight, and an end of 24:00 (DAY) is
    midnight at the period's end, so "00:00-24:00" is the whole day."""

    start: int
    end: int
    price: float

    def holds(self, minute: int) -> bool:
        if self.start < self.end:
            return self.start <= minute < self.end
        return minute >= self.start or minute < self.end

    @property
    def text(self) -> str:
        return f"{self.start // 60:02d}:{self.start % 60:02d}-{self.end // 60:02d}:{self.end % 60:02d}"


@dataclass(frozen=True)
class Tariff:
    """The price of a kWh at any moment; `price_per_kwh` None: no price set (energy only)."""

    price_per_kwh: float | None = None
    currency: str = ""
    periods: tuple[Period, ...] = ()

    @property
    def priced(self) -> bool:
        return self.price_per_kwh is not None

    def price_at(self, at: float) -> float:
        """The price of a kWh at Unix time `at` (local time of day); 0 without a price."""
        clock = time.localtime(at)
        return self.price_of_minute(clock.tm_hour * 60 + clock.tm_min)

    def price_of_minute(self, minute: int) -> float:
        """The price of a kWh at `minute` after local midnight; 0 without a price."""
        for period in self.periods:
            if period.holds(minute):
                return period.price
        return self.price_per_kwh or 0.0

    def as_dict(self) -> dict:
        """For run.json: what priced the run (read back with from_dict)."""
        return {"price_per_kwh": self.price_per_kwh, "currency": self.currency,
                "tariffs": {period.text: period.price for period in self.periods}}

    @classmethod
    def from_dict(cls, data: object) -> "Tariff":
        """A Tariff from as_dict()'s output; no price from anything else (an older run.json)."""
        if not isinstance(data, dict) or not isinstance(data.get("price_per_kwh"), (int, float)):
            return cls()
        periods = []
        for text, price in (data.get("tariffs") or {}).items():
            found = _PERIOD.match(str(text))
            if found and isinstance(price, (int, float)):
                periods.append(_period(found, float(price)))
        return cls(float(data["price_per_kwh"]), str(data.get("currency") or ""), tuple(periods))


def parse_tariff(v: Validator, table: dict) -> Tariff:
    """The [cluster] table's price keys, validated (ConfigError naming the line and the fix)."""
    get = v.getter(table, ("cluster",), {"price_per_kwh": (0.0, MAX_PRICE, " per kWh")})
    price = get("price_per_kwh", float, None)
    currency = get("currency", str, "", _check_currency(v))
    tariffs = get("tariffs", dict, {})
    if tariffs and price is None:
        raise v.fail(("cluster", "tariffs"), "tariffs without price_per_kwh",
                     "set price_per_kwh too: the rate outside the tariffs' periods")
    periods = {key: _parse_period(v, key, value) for key, value in tariffs.items()}
    _check_overlaps(v, periods)
    return Tariff(price, currency, tuple(periods.values()))


def _check_currency(v: Validator):
    def check(path: tuple, value: str) -> None:
        if not _CURRENCY.match(value):
            raise v.fail(path, f"currency {show(value)} is not a short name",
                         'use a code or sign of up to 8 characters, such as "EUR", "USD" or "€"')
    return check


def _parse_period(v: Validator, key: str, value: object) -> Period:
    path = ("cluster", "tariffs", key)
    found = _PERIOD.match(key)
    if not found:
        raise v.fail(path, f"tariff period {show(key)} is not HH:MM-HH:MM",
                     'write it like "22:00-06:00" = 0.18 (24-hour clock; it may wrap midnight)')
    price = v.check_type(path, value, float)
    v.in_range(0.0, MAX_PRICE, " per kWh")(path, price)
    period = _period(found, price)
    if period.start == period.end:
        raise v.fail(path, f"tariff period {show(key)} is empty", "give it an end other than its start")
    return period


def _period(found: re.Match, price: float) -> Period:
    start_hour, start_minute, end_hour, end_minute = map(int, found.groups())
    start, end = start_hour * 60 + start_minute, end_hour * 60 + end_minute
    return Period(start, end if start < end else end % DAY, price)  # 24:00 stays the day's end after a start


def _check_overlaps(v: Validator, periods: dict[str, Period]) -> None:
    seen: list[tuple[str, Period]] = []
    for key, period in periods.items():
        for other_key, other in seen:
            if any(other.holds(minute) for minute in _minutes(period)):
                raise v.fail(("cluster", "tariffs", key), f"tariff period {show(key)} overlaps {show(other_key)}",
                             "give each moment of the day one price: make the periods meet, not overlap")
        seen.append((key, period))


def _minutes(period: Period) -> range | list[int]:
    if period.start < period.end:
        return range(period.start, period.end)
    return [*range(period.start, DAY), *range(0, period.end)]
