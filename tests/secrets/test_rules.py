"""What a change of an app's secrets may be (wakeful/secrets/rules.py, pure): the bodies of
the set and the unset, read by hand; the checks against the app's secrets and manifests. No
refusal quotes a value."""

from __future__ import annotations

import re

import pytest

from wakeful.domain.models import MAX_SECRET_BYTES, MAX_SECRETS
from wakeful.secrets.errors import ChangeRefused
from wakeful.secrets.rules import (
    Change,
    check_change,
    read_set,
    read_unset,
    replaces_missing_key,
    shown_name,
)

VALUE = "s3cr3t-value-never-shown"


@pytest.mark.parametrize(
    ("body", "wanted"),
    [
        pytest.param({"values": {"A": "1"}}, Change({"A": "1"}, [], True), id="restart by default"),
        pytest.param(
            {"values": {"A": "1", "B": ""}, "restart": False},
            Change({"A": "1", "B": ""}, [], False),
            id="two values, no restart",
        ),
    ],
)
def test_a_set_body_is_read(body: object, wanted: Change) -> None:
    assert read_set(body) == wanted


@pytest.mark.parametrize(
    ("body", "said"),
    [
        pytest.param(
            [VALUE], "must be a JSON object with values, restart, not a list", id="a list"
        ),
        pytest.param({}, "values: must be an object of names to values, not null", id="no values"),
        pytest.param({"values": [VALUE]}, "values: must be an object", id="values a list"),
        pytest.param(
            {"values": {"A": 1234567}},
            "values.'A': the value must be a string, not a number",
            id="a number for a value",
        ),
        pytest.param(
            {"values": {"A": [VALUE]}}, "the value must be a string, not a list", id="a list value"
        ),
        pytest.param(
            {"values": {"A": "1"}, "restart": "no"},
            "restart: must be true or false, not a string",
            id="restart a string",
        ),
        pytest.param(
            {"values": {}, f"X={VALUE}": 1},
            "1 field(s) other than values and restart, not named here",
            id="a stray field counted, never named",
        ),
    ],
)
def test_a_bad_set_body_names_the_field_never_the_value(body: object, said: str) -> None:
    with pytest.raises(ChangeRefused) as refused:
        read_set(body)
    assert refused.value.kind == "invalid"
    assert said in str(refused.value)
    assert VALUE not in str(refused.value) and "1234567" not in str(refused.value)


@pytest.mark.parametrize(
    ("body", "result"),
    [
        pytest.param({"names": ["A", "B", "A"]}, Change({}, ["A", "B"], True), id="deduplicated"),
        pytest.param({"names": ["A"], "restart": False}, Change({}, ["A"], False), id="no restart"),
        pytest.param({"names": "A"}, "names: must be a list of names, not a string", id="a string"),
        pytest.param({"names": [1]}, "names[0]: must be a name, not a number", id="a number"),
        pytest.param({"values": {}}, "other than names and restart", id="the set's field"),
    ],
)
def test_an_unset_body_is_read_or_refused(body: object, result: Change | str) -> None:
    if isinstance(result, Change):
        assert read_unset(body) == result
        return
    with pytest.raises(ChangeRefused, match=re.escape(result)):
        read_unset(body)


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        pytest.param("API_KEY", "'API_KEY'", id="a name as it is"),
        pytest.param(f"API_KEY={VALUE}", "'API_KEY=…'", id="NAME=VALUE pasted: cut at the ="),
        pytest.param("A" * 70, repr("A" * 64 + "…"), id="cut at 64 characters"),
    ],
)
def test_a_name_in_a_refusal_never_shows_what_follows_an_equals(name: str, shown: str) -> None:
    assert shown_name(name) == shown


PRESENT = {"DB_PASSWORD": 10, "API_KEY": 20}
MANIFESTS = {"v3": ["LOG_LEVEL", "REGION"]}


@pytest.mark.parametrize(
    ("change", "kind", "said"),
    [
        pytest.param(Change(), "invalid", "nothing to set or unset", id="an empty change"),
        pytest.param(
            Change({"DB-PASS": VALUE}),
            "invalid",
            "the name 'DB-PASS' is not",
            id="a dash in a name",
        ),
        pytest.param(
            Change({"PORT": VALUE}), "invalid", "set by wakeful for every sandbox", id="PORT"
        ),
        pytest.param(
            Change({"A": "x" * (MAX_SECRET_BYTES + 1)}),
            "invalid",
            f"values.A: the value is {MAX_SECRET_BYTES + 1} bytes",
            id="a value too large: its size, not its text",
        ),
        pytest.param(
            Change({"A": VALUE + "\0"}), "invalid", "holds a NUL character", id="a NUL in a value"
        ),
        pytest.param(
            Change({}, ["MISSING"]), "unknown", "web has no secret named MISSING", id="unset a typo"
        ),
        pytest.param(
            Change({"REGION": VALUE}),
            "conflict",
            "secret REGION: the manifest of web v3 sets REGION in env too",
            id="a name the manifest's env sets: both named",
        ),
        pytest.param(
            Change({f"S{i}": "v" for i in range(MAX_SECRETS - 1)}),
            "invalid",
            f"web would have {MAX_SECRETS + 1} secrets",
            id="past the number of names an app may have",
        ),
        pytest.param(
            Change({f"S{i}": "v" * MAX_SECRET_BYTES for i in range(16)}),
            "invalid",
            "secrets would come to",
            id="past the bytes an app may hold",
        ),
    ],
)
def test_a_change_is_refused_whole_naming_why(change: Change, kind: str, said: str) -> None:
    with pytest.raises(ChangeRefused) as refused:
        check_change(change, "web", PRESENT, MANIFESTS)
    assert refused.value.kind == kind
    assert said in str(refused.value)
    assert VALUE not in str(refused.value)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(Change({"NEW": VALUE}), id="a new name"),
        pytest.param(Change({"DB_PASSWORD": VALUE}), id="a new value for a name"),
        pytest.param(Change({}, ["API_KEY"]), id="an unset of a name the app has"),
        pytest.param(
            Change({f"S{i}": "v" for i in range(MAX_SECRETS - 2)}), id="up to the names allowed"
        ),
    ],
)
def test_a_change_within_the_rules_passes(change: Change) -> None:
    check_change(change, "web", PRESENT, MANIFESTS)


@pytest.mark.parametrize(
    ("sealed", "leading", "led", "replaces"),
    [
        pytest.param(False, True, True, True, id="leading, nothing sealed: replaced"),
        pytest.param(False, False, False, True, id="none leads, nothing sealed: replaced"),
        pytest.param(False, False, True, False, id="another leads with it: refused"),
        pytest.param(True, True, True, False, id="a value sealed: refused, leading or not"),
        pytest.param(True, False, False, False, id="a value sealed, none leads: refused"),
    ],
)
def test_replaces_missing_key(sealed: bool, leading: bool, led: bool, replaces: bool) -> None:
    assert replaces_missing_key(sealed, leading, led) is replaces
