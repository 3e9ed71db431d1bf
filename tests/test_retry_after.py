"""Retry-After parsing: delta-seconds, decimals and the three HTTP date forms, against an injected now."""

from __future__ import annotations

import calendar
import math
import string
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime, parsedate_tz

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiqsim.core.retry_after import _utc_date, parse_retry_after

NOW_DT = datetime(2015, 10, 21, 7, 28, 0, tzinfo=UTC)
NOW = float(calendar.timegm(NOW_DT.utctimetuple()))  # 1445412480, computed without a clock


def rfc1123(when: datetime) -> str:
    return format_datetime(when.astimezone(UTC), usegmt=True)  # "Wed, 21 Oct 2015 07:28:00 GMT"


def rfc850(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%A, %d-%b-%y %H:%M:%S GMT")  # "Wednesday, 21-Oct-15 07:28:00 GMT"


def asctime(when: datetime) -> str:
    w = when.astimezone(UTC)
    return f"{w:%a %b} {w.day:2d} {w:%H:%M:%S %Y}"  # "Wed Oct 21 07:28:00 2015", day space-padded


def test_now_is_the_documented_instant() -> None:
    assert NOW == 1445412480.0


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("120", 120.0), ("0", 0.0), (" 7 ", 7.0), ("1.5", 1.5), ("0.25", 0.25), ("86400", 86400.0)],
)
def test_delta_seconds_including_decimals(header: str, seconds: float) -> None:
    assert parse_retry_after(header, NOW) == seconds


@given(whole=st.integers(min_value=0, max_value=10**9), fraction=st.text(alphabet="0123456789", max_size=6))
def test_any_non_negative_decimal_round_trips(whole: int, fraction: str) -> None:
    header = f"{whole}.{fraction}" if fraction else str(whole)
    assert parse_retry_after(header, NOW) == float(header)


@given(st.floats(min_value=0.0, max_value=1e9))
def test_any_non_negative_number_passes_through(seconds: float) -> None:
    assert parse_retry_after(seconds, NOW) == seconds


@pytest.mark.parametrize(
    "header",
    [
        "+1",  # a sign is not 1*DIGIT
        "-0",
        "1e3",  # no exponent
        "1E3",
        "1_000",  # no underscores
        "\u0661",  # ARABIC-INDIC DIGIT ONE
        "\u0661\u0662",
        "\uff11",  # FULLWIDTH DIGIT ONE
        "\u09e7",  # BENGALI DIGIT ONE
        ".5",  # the decimal extension is DIGITS.DIGITS, as providers send it
        "5.",
        "1.5.2",
        "\u00a01",  # NO-BREAK SPACE is not HTTP whitespace
        "1\u2003",  # EM SPACE
        "Infinity",
        "NaN",
    ],
)
def test_delta_seconds_is_ascii_digits_with_an_optional_decimal_fraction(header: str) -> None:
    """RFC 9110 §10.2.3: delta-seconds = 1*DIGIT (ASCII); float()'s wider grammar is refused."""
    assert parse_retry_after(header, NOW) is None


def test_http_whitespace_around_delta_seconds_is_trimmed() -> None:
    assert parse_retry_after("\t 12 \t", NOW) == 12.0


@pytest.mark.parametrize("value", [3, 2.5, 0])
def test_numbers_already_parsed_by_a_client_are_accepted(value: float) -> None:
    assert parse_retry_after(value, NOW) == float(value)


@pytest.mark.parametrize("value", ["-5", "-0.5", "nan", "inf", "-inf", -1, math.nan, math.inf, True, False])
def test_negative_or_non_finite_delays_and_booleans_are_refused(value: str | float) -> None:
    assert parse_retry_after(value, NOW) is None


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("Wed, 21 Oct 2015 07:28:30 GMT", 30.0),  # RFC 1123 / IMF-fixdate, the preferred form
        ("Wednesday, 21-Oct-15 07:29:00 GMT", 60.0),  # obsolete RFC 850
        ("Wed Oct 21 07:30:00 2015", 120.0),  # obsolete asctime: no zone, and HTTP dates are UTC
        ("Thu Oct 22 07:28:00 2015", 86400.0),
        ("Sun Nov  1 07:28:00 2015", 11 * 86400.0),  # space-padded day; UTC, so no DST hour
        ("Wed, 21 Oct 2015 09:28:45 +0200", 45.0),  # an explicit offset is honoured
        ("Wed, 21 Oct 2015 07:28:05 -0000", 5.0),  # "unknown zone" is UTC for HTTP
    ],
)
def test_http_dates_are_measured_from_the_injected_now(header: str, seconds: float) -> None:
    assert parse_retry_after(header, NOW) == seconds


@given(
    delay=st.integers(min_value=0, max_value=400 * 86400), form=st.sampled_from([rfc1123, rfc850, asctime])
)
def test_every_date_form_gives_the_delay_it_encodes(delay: int, form: object) -> None:
    header = form(NOW_DT + timedelta(seconds=delay))  # type: ignore[operator]
    assert parse_retry_after(header, NOW) == float(delay)


@given(
    delay=st.integers(min_value=1, max_value=10 * 365 * 86400),
    form=st.sampled_from([rfc1123, rfc850, asctime]),
)
def test_past_dates_mean_no_wait(delay: int, form: object) -> None:
    header = form(NOW_DT - timedelta(seconds=delay))  # type: ignore[operator]
    assert parse_retry_after(header, NOW) == 0.0


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "   ",
        "soon",
        "12 apples",
        "1,5",
        "0x10",
        "Wed, 32 Oct 2015 07:28:00 GMT",
        "Wed, 21 Foo 2015 07:28:00 GMT",
        "Wed, 21 Oct 2015 25:61:00 GMT",
        "Wed, 21 Oct 99999999999999999999 07:28:00 GMT",  # used to escape as OverflowError
        "Wed, 21 Oct 2015 07:28:00 +99999999999999999999",
    ],
)
def test_garbage_is_none(header: str | None) -> None:
    assert parse_retry_after(header, NOW) is None


@given(st.text(alphabet=string.ascii_letters + string.punctuation + " \t", max_size=40))
def test_text_without_digits_is_never_a_delay(header: str) -> None:
    assert parse_retry_after(header, NOW) is None


@given(st.text(max_size=60))
def test_any_text_parses_to_none_or_a_non_negative_delay_and_never_raises(header: str) -> None:
    result = parse_retry_after(header, NOW)
    assert result is None or (math.isfinite(result) and result >= 0.0)


@pytest.mark.parametrize(
    ("header", "now", "year"),
    [
        # RFC 9110 §5.6.7: a two-digit year more than 50 years ahead is the last such year in the past
        ("Sunday, 06-Nov-68 08:49:37 GMT", NOW_DT, 1968),  # email.utils alone reads 2068
        # the rule is by timestamp, not by year: 2065-11-06 is 50 years and 16 days ahead of NOW
        ("Friday, 06-Nov-65 08:49:37 GMT", NOW_DT, 1965),
        ("Wednesday, 21-Oct-65 07:28:00 GMT", NOW_DT, 2065),  # exactly 50 years ahead: not more
        ("Wednesday, 21-Oct-65 07:28:01 GMT", NOW_DT, 1965),  # one second more
        ("Wednesday, 21-Oct-65 09:28:01 +0200", NOW_DT, 1965),  # the zone counts: 07:28:01 UTC
        ("Tuesday, 01-Jan-01 00:00:00 GMT", datetime(2099, 6, 1, tzinfo=UTC), 2101),  # the next century
        ("Friday, 06-Nov-66 08:49:37 GMT", NOW_DT, 1966),
        ("Tuesday, 01-Jan-69 00:00:00 GMT", datetime(2026, 1, 1, tzinfo=UTC), 2069),  # email.utils: 1969
        ("Wednesday, 01-Jan-76 00:00:00 GMT", datetime(2026, 1, 1, tzinfo=UTC), 2076),
        ("Saturday, 01-Jan-77 00:00:00 GMT", datetime(2026, 1, 1, tzinfo=UTC), 1977),
        ("Sunday, 06-Nov-94 08:49:37 GMT", datetime(1994, 11, 6, tzinfo=UTC), 1994),  # RFC 9110's example
    ],
)
def test_an_rfc850_two_digit_year_is_read_within_50_years_of_now(
    header: str, now: datetime, year: int
) -> None:
    now_s = float(calendar.timegm(now.utctimetuple()))
    parsed = parsedate_tz(header)
    assert parsed is not None
    when = datetime(year, *parsed[1:6], tzinfo=UTC) - timedelta(seconds=parsed[9] or 0)
    assert parse_retry_after(header, now_s) == max(0.0, calendar.timegm(when.utctimetuple()) - now_s)


def test_an_rfc850_29_february_takes_the_latest_year_that_has_one() -> None:
    # 2096 is a leap year but 2096 is more than 50 years after 2026; 1996 is the one before it
    now_s = float(calendar.timegm(datetime(2026, 1, 1, tzinfo=UTC).utctimetuple()))
    assert parse_retry_after("Thursday, 29-Feb-96 00:00:00 GMT", now_s) == 0.0  # 1996: in the past
    now_s = float(calendar.timegm(datetime(2050, 1, 1, tzinfo=UTC).utctimetuple()))
    when = calendar.timegm(datetime(2096, 2, 29, tzinfo=UTC).utctimetuple())
    assert parse_retry_after("Wednesday, 29-Feb-96 00:00:00 GMT", now_s) == when - now_s


@pytest.mark.parametrize(
    "header",
    ["Wed, 21 Oct 2015 23:59:60 GMT", "Wednesday, 21-Oct-15 23:59:60 GMT", "Wed Oct 21 23:59:60 2015"],
)
def test_a_leap_second_is_the_second_after_59(header: str) -> None:
    """RFC 9110 §5.6.7 takes second = 2DIGIT and its meaning from RFC 5322 §3.3, which allows 60."""
    midnight = calendar.timegm(datetime(2015, 10, 22, tzinfo=UTC).utctimetuple())
    assert parse_retry_after(header, NOW) == midnight - NOW


@pytest.mark.parametrize(
    "header",
    ["Wed, 21 Oct 2015 23:59:61 GMT", "Wed, 31 Nov 2015 07:28:00 GMT", "Wed, 21 Oct 2015 24:00:00 GMT",
     "Wed, 21 Oct 2015 07:28:00 +9999"],
)  # fmt: skip
def test_what_is_not_a_date_is_no_retry_after(header: str) -> None:
    assert parse_retry_after(header, NOW) is None


@pytest.mark.parametrize(
    "value", ["9" * 400, "2147483649", "99999999999999999999.5", 10**400, 2**31 + 1, 1e20]
)
def test_delta_seconds_beyond_two_to_the_31_mean_two_to_the_31(value: str | float) -> None:
    # RFC 9111 §1.2.2; "9" * 400 used to overflow to inf and be dropped as "no Retry-After", 10**400 raised
    assert parse_retry_after(value, NOW) == 2**31
    assert parse_retry_after("2147483648", NOW) == 2**31 and parse_retry_after("2147483647", NOW) == 2**31 - 1


def test_a_date_further_away_than_two_to_the_31_seconds_is_clamped_like_delta_seconds() -> None:
    assert parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", NOW) == 2**31
    near = parse_retry_after("Thu, 01 Jan 2037 00:00:00 GMT", NOW)
    assert near is not None and 0 < near < 2**31  # a date within 68 years keeps its own wait


@given(st.integers(min_value=-6 * 10**10, max_value=25 * 10**10), st.sampled_from([0.0, 0.25, 0.999]))
def test_the_clock_free_calendar_agrees_with_datetime(whole_s: int, fraction_s: float) -> None:
    """aiqsim.core reads no clock (tests/test_architecture.py), so it dates an instant by arithmetic."""
    epoch_s = whole_s + fraction_s  # fractions datetime holds exactly (it rounds to microseconds)
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=whole_s)
    assert _utc_date(epoch_s) == (moment.year, moment.month, moment.day)


@pytest.mark.parametrize(
    "header",
    ["Thu, 01 Jan 0030 00:00:00 GMT", "Sat, 01 Jan 0050 00:00:00 -0000", "Fri Jan  1 00:00:00 0068"],
)
def test_a_four_digit_year_below_100_is_that_year_not_this_century(header: str) -> None:
    """RFC 9110's dates have a 4DIGIT year; email.utils reads 0000-0099 as two-digit years (0030 ->
    2030, CPython gh-126845): a garbage date in the past became a wait of years."""
    assert parse_retry_after(header, NOW) == 0.0


@given(year=st.integers(min_value=1, max_value=9999), seconds=st.integers(min_value=0, max_value=86399))
def test_an_imf_fixdate_of_any_four_digit_year_is_that_instant(year: int, seconds: int) -> None:
    from aiqsim.core.retry_after import http_date_epoch

    day = datetime(year, 3, 1, tzinfo=UTC) + timedelta(seconds=seconds)
    header = f"{day:%a}, 01 Mar {year:04d} {day:%H:%M:%S} GMT"
    expected = (day - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds()
    assert http_date_epoch(header, NOW) == expected
