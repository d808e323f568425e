"""Prices: the built-in table, a file on top, and cost by kind of token."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.pricing import DEFAULT_PRICES, Price, PricesError, PriceTable, load_prices
from protocol.events import Usage


def test_cost_prices_each_kind_of_token_at_its_rate() -> None:
    price = Price(input=4.0, cached_input=0.4, output=16.0, audio_input=32.0, audio_output=64.0)
    usage = Usage(
        input=1_000_000, output=1_000_000, cached=200_000, input_audio=300_000, output_audio=500_000
    )
    # text in 0.5M*4 + cached 0.2M*0.4 + audio in 0.3M*32 + text out 0.5M*16 + audio out 0.5M*64
    assert price.cost(usage) == pytest.approx(2.0 + 0.08 + 9.6 + 8.0 + 32.0)
    # Parts larger than the whole (a provider's rounding) never give a negative text count.
    assert Price(input=1.0).cost(Usage(input=10, output=0, cached=50)) == pytest.approx(10e-6)


def test_gpt_live_is_priced_by_the_active_minute() -> None:
    table = PriceTable()
    ninety_seconds = Usage(input=0, output=0, seconds=90.0)
    # $0.05 a minute, billed per second: 90 s is $0.075, not two minutes' $0.10.
    assert table.cost("openai", "gpt-live-1.1", ninety_seconds) == pytest.approx(0.075)
    assert table.cost("openai", "gpt-live-1", ninety_seconds) == pytest.approx(0.075)
    assert table.cost("openai", "gpt-realtime-2.1", ninety_seconds) == 0.0  # priced by token


def test_unknown_models_cost_nothing_and_fallbacks_apply() -> None:
    table = PriceTable()
    assert table.cost("openai", "gpt-realtime", Usage(input=1_000_000, output=0)) == pytest.approx(
        4.0
    )
    assert table.cost(
        "gemini", "any-live-model", Usage(input=0, output=1_000_000)
    ) == pytest.approx(2.0)
    assert table.cost("openai", "no-such-model", Usage(input=10**9, output=10**9)) == 0.0
    assert table.cost("sim", "sim", Usage(input=10**6, output=10**6)) == 0.0


def test_a_prices_file_overrides_and_extends(tmp_path: Path) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(
        '[openai."gpt-realtime"]\ninput = 5.0\noutput = 20.0\n[sim."*"]\ninput = 1.0\noutput = 2.0\n'
    )
    table = load_prices(path)
    assert table.cost("openai", "gpt-realtime", Usage(input=10**6, output=10**6)) == pytest.approx(
        25.0
    )
    assert table.cost("sim", "x", Usage(input=10**6, output=10**6)) == pytest.approx(3.0)
    # Untouched entries keep their built-in prices.
    assert (
        table.price("openai", "gpt-realtime-mini") == DEFAULT_PRICES["openai"]["gpt-realtime-mini"]
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[openai\n", "not valid TOML"),
        ('openai = "cheap"\n', "must be a table of models"),
        ('[openai."m"]\ninput = -1.0\n', "openai.'m'"),
        ('[openai."m"]\nprice = 1.0\n', "input, output"),
    ],
)
def test_a_bad_prices_file_says_where_and_what_to_write(
    tmp_path: Path, text: str, says: str
) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(text)
    with pytest.raises(PricesError, match=str(path)) as info:
        load_prices(path)
    assert says in str(info.value)


def test_a_missing_prices_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PricesError, match="cannot read the prices file"):
        load_prices(tmp_path / "nope.toml")
