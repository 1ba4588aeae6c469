"""Tests of perfcast.models.correction_store's reading of stored corrections."""

from __future__ import annotations

import pytest

from perfcast.errors import BundleError
from perfcast.models.correction_store import stored_fields

SPEC = {"kind": "test correction", "versions": (1, 2), "allowed": ("a", "b"), "required": ("a",)}


def test_stored_fields_drop_the_schema_version():
    assert stored_fields('{"schema_version": 2, "a": 1}', "f.json", **SPEC) == {"a": 1}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "f.json: invalid JSON"),
        ("[1]", "f.json: not a JSON object but list"),
        ('{"schema_version": 3, "a": 1}', r"not a perfcast test correction \(schema_version one of 1, 2\)"),
        ('{"a": 1}', "not a perfcast test correction"),
        ('{"schema_version": 1, "a": 1, "c": 2}', "unknown field\\(s\\) c; allowed: a, b"),
        ('{"schema_version": 1, "b": 1}', "field 'a' is missing"),
    ],
)
def test_stored_fields_refuse_what_is_not_a_readable_correction(text, message):
    with pytest.raises(BundleError, match=message):
        stored_fields(text, "f.json", **SPEC)
