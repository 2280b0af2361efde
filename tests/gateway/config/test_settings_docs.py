"""docs/configuration.md lists every setting as the model has it (regenerate the table with
`python -m gateway.config.reference`)."""

from __future__ import annotations

from gateway.config.reference import DOC, END, RABBITMQ, START, render_table
from gateway.config.sources import env_name, setting_fields


def test_the_document_holds_the_generated_table() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert START in text and END in text
    assert render_table() in text, "run: .venv/bin/python -m gateway.config.reference"


def test_every_setting_has_a_row_and_a_rabbitmq_column() -> None:
    assert set(RABBITMQ) == set(setting_fields())
    table = render_table()
    for key in setting_fields():
        assert f"| `{key}` |" in table and f"`{env_name(key)}`" in table
