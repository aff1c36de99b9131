"""Resource specs, task requests and exact fixed-point arithmetic (zres.resources)."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest

from zres.core.errors import ResourceSpecError
from zres.core.resources import (
    UNIT,
    add,
    fits,
    format_amount,
    format_units,
    parse_spec,
    subtract,
    task_request,
)

# -- parse_spec ------------------------------------------------------------------------


def test_parse_spec_splits_on_spaces():
    assert parse_spec("GPU=2 MEMORY=100e9") == {"GPU": 2 * UNIT, "MEMORY": 100 * 10**9 * UNIT}


def test_parse_spec_splits_on_commas_and_mixed_separators():
    assert parse_spec("foo=1,bar=2") == {"foo": UNIT, "bar": 2 * UNIT}
    assert parse_spec("  a=1 , b=2,\tc=3\n") == {"a": UNIT, "b": 2 * UNIT, "c": 3 * UNIT}


def test_parse_spec_empty_text_is_no_resources():
    assert parse_spec("") == {}
    assert parse_spec("  , ") == {}


@pytest.mark.parametrize("text, amount", [
    ("x=1e3", 1000),
    ("x=1.5e2", 150),
    ("x=2E-1", Decimal("0.2")),
    ("x=1e-3", Decimal("0.001")),
    ("x=.5", Decimal("0.5")),
    ("x=100e9", 100 * 10**9),
])
def test_parse_spec_scientific_and_decimal_notation(text, amount):
    assert parse_spec(text) == {"x": int(Decimal(amount) * UNIT)}


def test_parse_spec_names_keep_their_case():
    got = parse_spec("gpu0=1 Gpu0=2 GPU0=3 licence.matlab=1")
    assert got == {"gpu0": UNIT, "Gpu0": 2 * UNIT, "GPU0": 3 * UNIT, "licence.matlab": UNIT}
    assert list(got) == ["gpu0", "Gpu0", "GPU0", "licence.matlab"]


@pytest.mark.parametrize("text, amount", [
    ("MEMORY=100GB", 100 * 10**9),
    ("MEMORY=64GiB", 64 * 2**30),
    ("MEMORY=500M", 500 * 10**6),
    ("MEMORY=1k", 1000),
    ("MEMORY=1K", 1000),
    ("MEMORY=2Ki", 2048),
    ("MEMORY=1.5Gi", 3 * 2**29),
    ("MEMORY=1TB", 10**12),
    ("MEMORY=100B", 100),
])
def test_parse_spec_size_suffixes(text, amount):
    assert parse_spec(text) == {"MEMORY": amount * UNIT}


def test_parse_spec_refuses_lower_case_m_rather_than_guess_milli_or_mega():
    with pytest.raises(ResourceSpecError, match="'MEMORY=500m'"):
        parse_spec("MEMORY=500m")


@pytest.mark.parametrize("text, bad", [
    ("foo", "foo"),
    ("GPU=two", "GPU=two"),
    ("GPU=-1", "GPU=-1"),
    ("GPU=nan", "GPU=nan"),
    ("GPU=NaN", "GPU=NaN"),
    ("GPU=inf", "GPU=inf"),
    ("GPU=-inf", "GPU=-inf"),
    ("GPU=Infinity", "GPU=Infinity"),
    ("GPU=1 GPU=2", "GPU=2"),
    ("=3", "=3"),
    ("GPU=", "GPU="),
    ("GPU==1", "GPU==1"),
    ("1GPU=1", "1GPU=1"),
    ("CPU=4 foo MEMORY=1", "foo"),
    ("CPU=4,GPU=two", "GPU=two"),
    ("MEMORY=2e15", "MEMORY=2e15"),
    ("GPU=0x10", "GPU=0x10"),
])
def test_parse_spec_malformed_raises_one_line_quoting_the_bad_part(text, bad):
    with pytest.raises(ResourceSpecError) as info:
        parse_spec(text)
    message = str(info.value)
    assert message.startswith(f"invalid resource spec {bad!r}: ")
    assert "\n" not in message
    # A ValueError too, so callers that catch ValueError see it.
    assert isinstance(info.value, ValueError)


def test_parse_spec_missing_equals_says_what_is_expected():
    with pytest.raises(ResourceSpecError) as info:
        parse_spec("foo")
    assert str(info.value) == "invalid resource spec 'foo': expected NAME=NUMBER"


def test_parse_spec_repeated_name_says_so():
    with pytest.raises(ResourceSpecError, match="GPU is given twice"):
        parse_spec("GPU=1 CPU=2 GPU=1")


@pytest.mark.parametrize("text", ["GPU=1e999999k", "MEMORY=9e999999Gi"])
def test_parse_spec_huge_exponent_with_suffix_is_a_spec_error(text):
    """An absurd amount is a malformed spec, not a decimal.Overflow traceback."""
    with pytest.raises(ResourceSpecError) as info:
        parse_spec(text)
    assert str(info.value).startswith(f"invalid resource spec {text!r}: ")


def test_parse_spec_tiny_positive_amount_never_becomes_zero():
    # A positive request must constrain something; rounding it to 0 would drop it.
    assert parse_spec("x=1e-9") == {"x": 1}


# -- task_request ----------------------------------------------------------------------


def test_task_request_defaults_to_one_cpu():
    assert task_request(None) == {"CPU": UNIT}
    assert task_request({}) == {"CPU": UNIT}
    assert task_request({"GPU": 1}) == {"CPU": UNIT, "GPU": UNIT}


def test_task_request_cpu_zero_is_allowed_and_dropped():
    assert task_request({"CPU": 0}) == {}
    assert task_request({"CPU": 0, "GPU": 1}) == {"GPU": UNIT}


def test_task_request_other_zero_amounts_are_dropped():
    assert task_request({"foo": 0, "GPU": 0.0}) == {"CPU": UNIT}


def test_task_request_accepts_strings_with_suffixes():
    assert task_request({"MEMORY": "70GB"}) == {"CPU": UNIT, "MEMORY": 70 * 10**9 * UNIT}


@pytest.mark.parametrize("value", [True, False, None, -1, -0.5, math.nan, math.inf, -math.inf,
                                   "nan", "-1", [1], {"a": 1}])
def test_task_request_rejects_bad_amounts_naming_the_resource(value):
    with pytest.raises(ValueError, match="'GPU'"):
        task_request({"GPU": value})


@pytest.mark.parametrize("value", [Decimal("NaN"), Decimal("sNaN"), Decimal("-Infinity")])
def test_task_request_rejects_non_finite_decimals_with_value_error(value):
    """Decimal is a documented input type; a NaN must be refused like a float NaN."""
    with pytest.raises(ValueError, match="'GPU'"):
        task_request({"GPU": value})


def test_task_request_error_is_a_resource_spec_error():
    with pytest.raises(ResourceSpecError):
        task_request({"CPU": -1})


def test_task_request_rejects_bad_names():
    with pytest.raises(ValueError, match="1abc"):
        task_request({"1abc": 1})
    with pytest.raises(ValueError):
        task_request({3: 1})


@pytest.mark.parametrize("value", [1.5, "1.5", 2.25])
def test_task_request_gpu_above_one_must_be_whole(value):
    with pytest.raises(ValueError, match="GPU") as info:
        task_request({"GPU": value})
    assert "whole number" in str(info.value)


@pytest.mark.parametrize("value, units", [(0.25, 2500), (0.1, 1000), (1, UNIT), (2, 2 * UNIT),
                                          (2.0, 2 * UNIT), ("0.5", 5000)])
def test_task_request_gpu_fractions_up_to_one_and_whole_numbers_are_fine(value, units):
    assert task_request({"GPU": value}) == {"CPU": UNIT, "GPU": units}


def test_task_request_rejects_a_non_mapping():
    with pytest.raises(ValueError, match="dict"):
        task_request([("GPU", 1)])  # type: ignore[arg-type]


def test_task_request_floats_are_read_as_their_decimal_text():
    # 0.1 is not exactly representable as a float; it must still be exactly 1000 units.
    assert task_request({"CPU": 0.1}) == {"CPU": 1000}
    assert task_request({"CPU": 0.3}) == {"CPU": 3000}


# -- exact arithmetic ------------------------------------------------------------------


def test_ten_tenths_fit_exactly_in_one():
    free = {"GPU": UNIT}
    tenth = task_request({"CPU": 0, "GPU": 0.1})
    granted = []
    for _ in range(10):
        assert fits(free, tenth)
        subtract(free, tenth)
        granted.append(tenth)
    assert free == {"GPU": 0}
    assert not fits(free, tenth)
    for request in granted:
        add(free, request)
    assert free == {"GPU": UNIT}


def test_fits_needs_every_amount_and_missing_names_are_zero():
    free = {"CPU": 2 * UNIT, "GPU": UNIT}
    assert fits(free, {"CPU": 2 * UNIT, "GPU": UNIT})
    assert not fits(free, {"CPU": 2 * UNIT + 1})
    assert not fits(free, {"CPU": UNIT, "foo": 1})
    assert fits(free, {})


def test_add_and_subtract_handle_new_names_and_may_go_negative():
    into = {"CPU": UNIT}
    add(into, {"foo": 5})
    assert into == {"CPU": UNIT, "foo": 5}
    subtract(into, {"CPU": 2 * UNIT})
    assert into == {"CPU": -UNIT, "foo": 5}


def test_a_million_grants_and_releases_leave_capacity_unchanged():
    capacity = parse_spec("GPU=1 CPU=3")
    free = dict(capacity)
    big = task_request({"CPU": 0.3, "GPU": 0.3})
    small = task_request({"CPU": 0.1, "GPU": 0.1})
    for _ in range(500_000):
        subtract(free, big)
        subtract(free, small)
        add(free, big)
        add(free, small)
    assert free == capacity
    # And the whole capacity is still usable: three big plus one small fill the GPU exactly.
    for request in (big, big, big, small):
        assert fits(free, request)
        subtract(free, request)
    assert free["GPU"] == 0


# -- format_amount ---------------------------------------------------------------------


@pytest.mark.parametrize("units, text", [
    (0, "0"),
    (UNIT, "1"),
    (2 * UNIT, "2"),
    (2500, "0.25"),
    (1000, "0.1"),
    (1, "0.0001"),
    (15000, "1.5"),
    (999_999 * UNIT, "999999"),
    (10**6 * UNIT, "1M"),
    (500 * 10**6 * UNIT, "500M"),
    (100 * 10**9 * UNIT, "100G"),
    (64 * 2**30 * UNIT, "68.72G"),
    (3 * 10**12 * UNIT, "3T"),
    (10**15 * UNIT, "1P"),
])
def test_format_amount(units, text):
    assert format_amount("X", units) == text


@pytest.mark.parametrize("name, spec, text", [
    ("MEMORY", "64GiB", "64 GiB"),
    ("MEMORY", "40GiB", "40 GiB"),
    ("MEMORY", "4096MiB", "4 GiB"),
    ("MEMORY", "512MiB", "512 MiB"),
    ("MEMORY", "1.5GiB", "1.5 GiB"),
    ("MEMORY", "100e9", "93.13 GiB"),   # (decimal bytes: in binary units too)
    ("GPU_MEMORY", "80GiB", "80 GiB"),
    ("HOST_MEMORY", "2TiB", "2 TiB"),
    ("MEMORY", "1023GiB", "1023 GiB"),
    ("MEMORY", "100", "100 B"),
])
def test_memory_is_written_in_binary_units_as_it_is_given(name, spec, text):
    assert format_amount(name, parse_spec(f"{name}={spec}")[name]) == text


def test_format_amount_round_trips_small_amounts_through_parse_spec():
    for text in ["0.25", "1", "3", "0.0001", "12.5"]:
        units = parse_spec(f"x={text}")["x"]
        assert format_amount("x", units) == text


def test_format_units_sorts_names_and_says_nothing_when_empty():
    assert format_units({"GPU": 5000, "CPU": UNIT}) == "CPU=1 GPU=0.5"
    assert format_units({}) == "nothing"
