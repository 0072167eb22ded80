"""Energy and its cost: the integral of sampled GPU power (remote/energy/, record/energy.py) and the cluster's tariff
(remote/config/tariff.py). Power samples: a replayed card at a constant and at a varying draw (numbers chosen
here, the exact integral known), and the samples the stats agent read from a real H100 under load
(tests/fixtures/gpu/h100-80gb-hbm3/agent_nvml.jsonl)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from homegpu.remote.config import ConfigError, parse_cluster
from homegpu.remote.config.tariff import Tariff
from homegpu.remote.energy import COUNTER, INTEGRATED, JOULES_PER_KWH, MIXED, integrate
from homegpu.remote.record.energy import gpu_energy
from homegpu.remote.record.timeline_schema import GpuTimeline, Series

H100_SAMPLES = Path(__file__).parent / "fixtures" / "gpu" / "h100-80gb-hbm3" / "agent_nvml.jsonl"
NODE = '[[nodes]]\nname = "a"\nhost = "10.0.0.1"\n'


def at(hour: int, minute: int) -> float:
    """Today's hh:mm in local time (tariffs are the controller's local time of day)."""
    day = time.localtime()
    return time.mktime((day.tm_year, day.tm_mon, day.tm_mday, hour, minute, 0, 0, 0, -1))


def test_a_constant_draw_is_power_times_time():
    times = [float(t) for t in range(0, 101)]
    energy = integrate(times, [300.0] * len(times))
    assert energy.joules == pytest.approx(300 * 100) and energy.seconds == 100 and energy.gap_seconds == 0
    assert energy.kwh == pytest.approx(300 * 100 / JOULES_PER_KWH)


def test_a_varying_draw_sampled_each_second_is_within_1_percent_of_its_integral():
    def watts(t: float) -> float:
        return 200 + 150 * math.sin(2 * math.pi * t / 47) + 0.1 * t  # a load that swings and creeps up

    times = [i * 1.0 for i in range(601)]
    exact = 200 * 600 + 150 * 47 / (2 * math.pi) * (1 - math.cos(2 * math.pi * 600 / 47)) + 0.05 * 600 ** 2
    assert integrate(times, [watts(t) for t in times]).joules == pytest.approx(exact, rel=0.01)


def test_the_recorded_h100_samples():
    samples = [json.loads(line) for line in H100_SAMPLES.read_text().splitlines()]
    times = [sample["t"] for sample in samples]
    watts = [sample["gpus"][0]["power"] for sample in samples]
    energy = integrate(times, watts)
    assert energy.seconds == pytest.approx(times[-1] - times[0])
    assert min(watts) * energy.seconds <= energy.joules <= max(watts) * energy.seconds
    assert energy.joules == pytest.approx(sum(watts) / len(watts) * energy.seconds, rel=0.01)  # ~700 W, steady


def test_a_gap_is_counted_as_a_gap_never_filled():
    times = [0.0, 1.0, 2.0, 90.0, 91.0, 92.0]  # the node was offline from 2 s to 90 s
    energy = integrate(times, [100.0] * 6)
    assert (energy.joules, energy.seconds, energy.gap_seconds) == (400.0, 4.0, 88.0)
    unread = integrate([0.0, 1.0, 2.0, 3.0], [100.0, None, 100.0, 100.0])  # a sample without a power reading
    assert (unread.joules, unread.gap_seconds) == (100.0, 2.0)


def test_a_run_across_the_night_tariff_pays_each_rate_for_its_part():
    tariff = Tariff(0.30, "EUR", parse_cluster('[cluster]\nprice_per_kwh = 0.30\ncurrency = "EUR"\n'
                                               'tariffs = { "22:00-06:00" = 0.10 }\n' + NODE).tariff.periods)
    start = at(21, 30)
    times = [start + i for i in range(3601)]  # 21:30 to 22:30 at 1 kW: 0.5 kWh at each rate
    energy = integrate(times, [1000.0] * len(times), price_at=tariff.price_at)
    assert energy.kwh == pytest.approx(1.0)
    assert energy.cost == pytest.approx(0.5 * 0.30 + 0.5 * 0.10, abs=0.30 / 3600)


def test_the_tariff_wraps_midnight_and_falls_back_to_the_price():
    tariff = parse_cluster('[cluster]\nprice_per_kwh = 0.35\ntariffs = { "22:00-06:00" = 0.18, '
                           '"12:00-14:00" = 0.05 }\n' + NODE).tariff
    assert [tariff.price_at(at(h, m)) for h, m in ((23, 0), (3, 0), (6, 0), (12, 30), (21, 59))] == \
        [0.18, 0.18, 0.35, 0.05, 0.35]
    assert Tariff.from_dict(tariff.as_dict()) == tariff  # run.json keeps what priced the run
    assert not Tariff.from_dict(None).priced and Tariff().price_at(at(12, 0)) == 0.0


def test_a_period_may_end_at_midnight_as_24_00_and_cover_the_whole_day():
    """"00:00-24:00" is the whole day (it was refused as empty) and "22:00-24:00" the last two hours; run.json
    writes them back as they were written."""
    whole = parse_cluster('[cluster]\nprice_per_kwh = 0.35\ntariffs = { "00:00-24:00" = 0.18 }\n' + NODE).tariff
    assert [whole.price_at(at(h, m)) for h, m in ((0, 0), (12, 0), (23, 59))] == [0.18, 0.18, 0.18]
    evening = parse_cluster('[cluster]\nprice_per_kwh = 0.35\ntariffs = { "22:00-24:00" = 0.10 }\n' + NODE).tariff
    assert [evening.price_at(at(h, m)) for h, m in ((21, 59), (22, 0), (23, 59), (0, 0))] == [0.35, 0.10, 0.10, 0.35]
    assert [p.text for p in (*whole.periods, *evening.periods)] == ["00:00-24:00", "22:00-24:00"]
    assert Tariff.from_dict(evening.as_dict()) == evening


@pytest.mark.parametrize("cluster, key, words", [
    ("price_per_kwh = -0.1", "price_per_kwh", "must be from 0 to 1000"),
    ('price_per_kwh = "cheap"', "price_per_kwh", "expected a number"),
    ('currency = "euros of the realm"', "currency", "is not a short name"),
    ('tariffs = { "22:00-06:00" = 0.18 }', "tariffs", "tariffs without price_per_kwh"),
    ('price_per_kwh = 0.3\ntariffs = { "10pm-6am" = 0.18 }', "tariffs.10pm-6am", "is not HH:MM-HH:MM"),
    ('price_per_kwh = 0.3\ntariffs = { "06:00-06:00" = 0.18 }', "tariffs.'06:00-06:00'", "is empty"),
    ('price_per_kwh = 0.3\ntariffs = { "10:00-24:30" = 0.18 }', "tariffs.'10:00-24:30'", "is not HH:MM-HH:MM"),
    ('price_per_kwh = 0.3\ntariffs = { "00:00-24:00" = 0.18, "22:00-06:00" = 0.1 }', "tariffs.'22:00-06:00'",
     "overlaps '00:00-24:00'"),
    ('price_per_kwh = 0.3\ntariffs = { "22:00-06:00" = 0.18, "05:00-07:00" = 0.2 }', "tariffs.'05:00-07:00'",
     "overlaps '22:00-06:00'"),
    ('price_per_kwh = 0.3\ntariffs = { "22:00-06:00" = true }', "tariffs.'22:00-06:00'", "expected a number"),
])
def test_a_bad_price_is_one_line_naming_it(cluster, key, words):
    with pytest.raises(ConfigError) as err:
        parse_cluster(f"[cluster]\n{cluster}\n" + NODE, "home.toml")
    message = str(err.value)
    assert "\n" not in message and message.startswith("home.toml:") and f"[cluster].{key}: " in message, message
    assert words in message


def gpu(times, watts, joules=None) -> GpuTimeline:
    times = tuple(times)
    return GpuTimeline(0, Series(), Series(), None, Series(), Series(times, tuple(watts)), Series(),
                       Series(times, tuple(joules)) if joules is not None else Series())


def test_the_counter_is_used_where_both_samples_have_it():
    """NVML's counter (joules since the driver loaded) says what the samples missed between them: a burst the
    1 s power readings did not catch is in it. A step without it on both ends is integrated."""
    times = [float(t) for t in range(11)]
    watts = [100.0] * 11
    joules = [5000.0 + 100 * t + (50 if t >= 5 else 0) for t in range(11)]  # a 50 J burst between two samples
    measured = gpu_energy(gpu(times, watts, joules))
    assert (measured.joules, measured.method) == (1050.0, COUNTER)
    assert gpu_energy(gpu(times, watts)).method == INTEGRATED  # an older card: no counter
    partial = integrate(times, watts, joules[:5] + [None] + joules[6:])  # the sample after the burst lacks it
    assert (partial.joules, partial.method) == (8 * 100 + 2 * 100, MIXED)  # 8 steps counted, the 2 around it not


def test_a_counter_that_goes_back_is_a_gap():
    """The driver reloaded (the machine slept, the module was reloaded): its count starts again from 0."""
    energy = integrate([0.0, 1.0, 2.0, 3.0, 4.0], [100.0] * 5, [9000.0, 9100.0, 9200.0, 40.0, 140.0])
    assert (energy.joules, energy.seconds, energy.gap_seconds) == (300.0, 3.0, 1.0)


@pytest.mark.parametrize("alerts", ["budget_per_day = 5.0", "budget_per_run = 1.5"])
def test_a_budget_needs_a_price(alerts):
    with pytest.raises(ConfigError) as err:
        parse_cluster(NODE + f"\n[alerts]\n{alerts}\n", "home.toml")
    assert "without a price; set price_per_kwh (and currency) in [cluster]" in str(err.value)
    priced = parse_cluster('[cluster]\nprice_per_kwh = 0.3\n' + NODE + f"\n[alerts]\n{alerts}\n")
    assert priced.alerts.enabled
