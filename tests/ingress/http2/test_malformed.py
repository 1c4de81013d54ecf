"""A received header block's rules (`http2.rules.malformed_request`, `malformed_trailers`,
`malformed_answer`), which the ingress runs in place of h2's: held to h2's own
`validate_headers`, verdict for verdict, on requests, trailers and h2c answers made malformed
in every way those rules name, one, two and three ways at once; and a malformed request reset
alone, its connection serving on."""

from __future__ import annotations

import random
from collections.abc import Callable

import h2.exceptions
import pytest
from h2.utilities import HeaderValidationFlags, validate_headers

from wakeful.ingress.http2.rules import malformed_answer, malformed_request, malformed_trailers

Fields = list[tuple[bytes, bytes]]
REQUEST = HeaderValidationFlags(
    is_client=False, is_trailer=False, is_response_header=False, is_push_promise=False
)
TRAILERS = HeaderValidationFlags(
    is_client=False, is_trailer=True, is_response_header=False, is_push_promise=False
)
ANSWER = HeaderValidationFlags(
    is_client=True, is_trailer=False, is_response_header=True, is_push_promise=False
)


def _h2_refuses(fields: Fields, flags: HeaderValidationFlags) -> bool:
    try:
        list(validate_headers(list(fields), flags))
    except h2.exceptions.ProtocolError:
        return True
    return False


def _base(rng: random.Random) -> Fields:
    fields = [
        (b":method", rng.choice((b"GET", b"POST", b"OPTIONS"))),
        (b":scheme", b"https"),
        (b":path", rng.choice((b"/", b"/a?b=c", b"*"))),
        (b":authority", b"app.example"),
        (b"user-agent", b"curl/8"),
        (b"accept", b"*/*"),
    ]
    rng.shuffle(fields[:4])  # the pseudo-headers in any order among themselves
    return fields


def _odd(rng: random.Random) -> bytes:
    return bytes([rng.choice((0x00, 0x09, 0x0A, 0x0D, 0x20, 0x3A, 0x41, 0x5A, 0x7F, 0x80, 0xFF))])


def _mutate(fields: Fields, rng: random.Random) -> None:
    i = rng.randrange(len(fields))
    name, value = fields[i]
    how = rng.randrange(17)
    if how == 0:  # an odd octet in a name
        at = rng.randrange(len(name) + 1)
        fields[i] = (name[:at] + _odd(rng) + name[at:], value)
    elif how == 1:  # an odd octet in a value, anywhere
        at = rng.randrange(len(value) + 1)
        fields[i] = (name, value[:at] + _odd(rng) + value[at:])
    elif how == 2:
        fields[i] = (b"", value)
    elif how == 3:
        fields[i] = (name, b"")
    elif how == 4:
        fields.append((b"te", rng.choice((b"trailers", b"TRAILERS", b"gzip", b" trailers", b""))))
    elif how == 5:
        fields.append((rng.choice(sorted(_CONNECTION)), b"close"))
    elif how == 6:  # a field twice (a pseudo-header, or Host)
        fields.insert(rng.randrange(len(fields) + 1), fields[i])
    elif how == 7:  # a field moved anywhere (pseudo-headers after the others)
        fields.insert(rng.randrange(len(fields) + 1), fields.pop(i))
    elif how == 8:
        fields.insert(0, (rng.choice((b":foo", b":", b":status", b":protocol")), b"x"))
    elif how == 9:  # a pseudo-header gone
        gone = rng.choice((b":method", b":scheme", b":path", b":authority"))
        fields[:] = [f for f in fields if f[0] != gone]
    elif how == 10:
        fields.append((b"host", rng.choice((b"app.example", b"other.example", b""))))
    elif how == 11:
        fields[i] = (name, b"CONNECT") if name == b":method" else (b":method", b"CONNECT")
    elif how == 12:
        fields.insert(0, (b":protocol", b"websocket"))
    elif how == 13:
        fields[:] = [(n, b"" if n == b":path" else v) for n, v in fields]
    elif how == 14:  # white space around a value
        fields[i] = (name, rng.choice((b" ", b"\t", b"")) + value + rng.choice((b" ", b"\t", b"")))
    elif how == 15:
        fields[i] = (name.upper(), value)
    else:
        fields.append((b"x-" + _odd(rng) + b"y", b"v"))


_CONNECTION = {b"connection", b"proxy-connection", b"keep-alive", b"transfer-encoding", b"upgrade"}


@pytest.mark.parametrize("mutations", [0, 1, 2, 3])
@pytest.mark.parametrize(
    ("rule", "flags"),
    [(malformed_request, REQUEST), (malformed_trailers, TRAILERS), (malformed_answer, ANSWER)],
    ids=["requests", "trailers", "answers"],
)
def test_the_verdicts_are_h2s(
    rule: Callable[[Fields], str | None], flags: HeaderValidationFlags, mutations: int
) -> None:
    rng = random.Random(mutations + 10 * (rule is malformed_trailers) + 20 * (flags is ANSWER))
    verdicts = {True: 0, False: 0}
    for _ in range(4000):
        fields = _base(rng)
        if rule is malformed_trailers:
            fields = fields[4:] + rng.choice(([], [(b"grpc-status", b"0")]))
        elif rule is malformed_answer:  # an h2c sandbox's head: :status (or none), fields
            status = rng.choice((b"200", b"404", b"100", b""))
            fields = [(b":status", status)] if status else []
            fields += [(b"content-type", b"application/grpc"), (b"server", b"x")]
        for _ in range(mutations):
            if fields:
                _mutate(fields, rng)
        refused = _h2_refuses(fields, flags)
        assert (rule(fields) is not None) == refused, fields
        verdicts[refused] += 1
    if mutations:
        assert min(verdicts.values()) > 20, verdicts  # both verdicts were reached


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ([(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/")], "neither :authority"),
        (
            [(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/"), (b"Host", b"a")],
            "upper",
        ),
        ([(b":method", b"GET"), (b":path", b"/"), (b":authority", b"a")], "no :scheme"),
        (
            [(b":method", b"CONNECT"), (b":authority", b"db:5432"), (b":path", b"/")],
            "a CONNECT with",
        ),
        ([(b":method", b"GET"), (b":scheme", b"h"), (b":path", b"/"), (b"host", b"a\rb")], "CR"),
    ],
)
def test_what_a_malformed_request_is_told(fields: Fields, why: str) -> None:
    error = malformed_request(fields)
    assert error is not None and why in error
